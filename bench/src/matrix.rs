//! `--matrix`: what users run, side by side. Each of separate processes and `agentloop all`,
//! with protobuf and with JSON on the inbound subject, gets a fresh stack and the same short
//! phases (closed loop and burst); one markdown table compares them, kept in its own section
//! of `bench/RESULTS.md` so the full run's report and this one replace only themselves.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context as _;

use agentloop_proto::Encoding;

use crate::client::LoadClient;
use crate::options::Options;
use crate::phases::{self, PhaseResult, STACK_GROUPS};
use crate::report::pct;
use crate::setup::{Setup, StackMode};
use crate::stack::{Stack, StackConfig};
use crate::{PREFIX, drop_database, load, step, summary_line, watched};

/// Opens the matrix section of `bench/RESULTS.md`.
pub const BEGIN: &str = "<!-- what-users-run:begin -->";
/// Closes it.
pub const END: &str = "<!-- what-users-run:end -->";
/// Where this section stands in `bench/RESULTS.md`.
pub const SECTION: crate::section::Markers = crate::section::Markers {
    begin: BEGIN,
    end: END,
};

/// The four setups, in column order.
const SETUPS: [(StackMode, Encoding); 4] = [
    (StackMode::Separate, Encoding::Proto),
    (StackMode::Separate, Encoding::Json),
    (StackMode::All, Encoding::Proto),
    (StackMode::All, Encoding::Json),
];

/// Message counts of one column's phases.
struct Plan {
    /// (sessions, messages each) of the warm-up.
    warm: (usize, usize),
    lat1: usize,
    /// Messages of each of the 10 sessions.
    lat10: usize,
    /// Messages of each of the 100 closed-loop sessions.
    tp100: usize,
    /// (sessions, messages each) of the burst.
    burst: (usize, usize),
    phase_limit: Duration,
}

impl Plan {
    fn new(quick: bool) -> Self {
        if quick {
            Self {
                warm: (20, 5),
                lat1: 100,
                lat10: 20,
                tp100: 5,
                burst: (100, 5),
                phase_limit: Duration::from_secs(20),
            }
        } else {
            Self {
                warm: (20, 15),
                lat1: 300,
                lat10: 60,
                tp100: 30,
                burst: (100, 10),
                phase_limit: Duration::from_secs(45),
            }
        }
    }
}

/// One setup's figures.
#[derive(Debug, Clone)]
pub struct Column {
    /// Stack mode and inbound encoding.
    pub setup: Setup,
    /// One session in turn.
    pub lat1: PhaseResult,
    /// Ten sessions at once, each in turn.
    pub lat10: PhaseResult,
    /// A hundred sessions at once, each in turn.
    pub tp100: PhaseResult,
    /// Every message published at once.
    pub burst: PhaseResult,
}

/// The whole matrix, for the report.
#[derive(Debug, Clone)]
pub struct Matrix {
    /// `--quick`.
    pub quick: bool,
    /// When it ran.
    pub date: String,
    /// The measured commit.
    pub commit: String,
    /// Cores, CPU model, memory.
    pub machine: (usize, String, String),
    /// Clock ticks per second, for the CPU figures.
    pub tck: u64,
    /// Burst shape: (sessions, messages each).
    pub burst: (usize, usize),
    /// One per setup, in [`SETUPS`] order.
    pub columns: Vec<Column>,
}

/// Runs the four setups one after the other, each on a stack of its own under `run_dir`.
///
/// # Errors
/// When a stack does not start or its bookkeeping fails (its logs are kept).
pub async fn run(options: &Options, run_dir: &Path, commit: String) -> anyhow::Result<Matrix> {
    let plan = Plan::new(options.quick);
    let mut columns = Vec::with_capacity(SETUPS.len());
    for (mode, inbound) in SETUPS {
        let setup = Setup { mode, inbound };
        let dir = run_dir.join(format!("{}-{}", mode.name(), inbound.name()));
        let mut stack = Stack::new(StackConfig::from_options(
            options,
            dir.clone(),
            mode,
            "info",
        ))?;
        step(&format!("matrix: {}", setup.line()));
        let column = run_one(&mut stack, setup, &plan).await;
        stack.shutdown().await;
        if let Err(err) = drop_database(&options.pg_base, &stack.db_name).await {
            eprintln!("warning: failed to drop {}: {err:#}", stack.db_name);
        }
        let column = column.with_context(|| {
            format!("{} (logs in {})", setup.line(), dir.join("logs").display())
        })?;
        columns.push(column);
        // Database names carry the second they were made in: the next stack gets a new one.
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    Ok(Matrix {
        quick: options.quick,
        date: chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string(),
        commit,
        machine: crate::procfs::machine(),
        tck: crate::procfs::clock_ticks_per_sec(),
        burst: plan.burst,
        columns,
    })
}

async fn run_one(stack: &mut Stack, setup: Setup, plan: &Plan) -> anyhow::Result<Column> {
    let t0 = Instant::now();
    stack.start().await?;
    step(&format!("started in {:.1} s", t0.elapsed().as_secs_f64()));
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&stack.database_url)
        .await
        .context("failed to connect to the bench database")?;
    let client = LoadClient::connect(&stack.nats_url, PREFIX, setup.inbound).await?;
    let tck = crate::procfs::clock_ticks_per_sec();
    let limit = plan.phase_limit;
    let (sessions, per) = plan.warm;
    phases::run(
        stack,
        &client,
        &pool,
        &load("warm", sessions, sessions, per, limit),
        1,
    )
    .await?;
    let lat1 = watched(
        stack,
        &client,
        &pool,
        &load("lat1", 1, 1, plan.lat1, limit),
        false,
    )
    .await?;
    step(&summary_line(&lat1, tck));
    let lat10 = watched(
        stack,
        &client,
        &pool,
        &load("lat10", 10, 10, plan.lat10, limit),
        false,
    )
    .await?;
    step(&summary_line(&lat10, tck));
    let tp100 = load("tp100", 100, 100, plan.tp100, limit);
    let tp100 = phases::run(stack, &client, &pool, &tp100, 1).await?;
    step(&summary_line(&tp100, tck));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (sessions, per) = plan.burst;
    let mut burst = load("burst", sessions, sessions, per, limit);
    burst.via = phases::Via::Burst;
    let burst = phases::run(stack, &client, &pool, &burst, 1).await?;
    step(&summary_line(&burst, tck));
    pool.close().await;
    Ok(Column {
        setup,
        lat1,
        lat10,
        tp100,
        burst,
    })
}

impl Matrix {
    /// The section for `bench/RESULTS.md` (also printed), between [`BEGIN`] and [`END`].
    pub fn markdown(&self) -> String {
        let (cores, model, mem) = &self.machine;
        let (sessions, per) = self.burst;
        let mut out = format!(
            "{BEGIN}\n## What users run: separate and `all`, protobuf and JSON, closed loop and burst \
             (`./scripts/bench.sh --matrix`)\n\n\
             {} run, {}, commit {}, {cores} cores ({model}), memory (`free -h`): {mem}. Each column is a fresh \
             stack (nats-server, Postgres database, fake model answering at once) in that mode, \
             warmed up, then: 1 session sending in turn, 10 sessions at once, 100 sessions at \
             once (closed loop: each session waits for its reply before its next message), and \
             a burst: {sessions} sessions × {per} messages published at once (queue mode \
             `followup`), runs/s from the first publish to the last reply. Latency: publish to \
             reply in ms; CPU: the stack's (services, nats-server, Postgres) per completed run.\n\n",
            if self.quick { "Quick" } else { "Full" },
            self.date,
            self.commit,
        );
        out.push_str("| |");
        for c in &self.columns {
            let mode = match c.setup.mode {
                StackMode::Separate => "separate",
                StackMode::All => "`all`",
            };
            let inbound = match c.setup.inbound {
                Encoding::Proto => "protobuf",
                Encoding::Json => "JSON",
            };
            out.push_str(&format!(" {mode}, {inbound} |"));
        }
        out.push_str("\n|---|");
        out.push_str(&"---:|".repeat(self.columns.len()));
        out.push('\n');
        let cpu = |p: &PhaseResult| format!("{:.2}", p.cpu_ms_per_run(&STACK_GROUPS, self.tck));
        let rows: [(&str, &Cell); 10] = [
            ("1 session, closed loop: p50 ms", &|c| {
                ms(pct(&c.lat1.totals).p50)
            }),
            ("1 session, closed loop: p99 ms", &|c| {
                ms(pct(&c.lat1.totals).p99)
            }),
            ("10 sessions at once: p99 ms", &|c| {
                ms(pct(&c.lat10.totals).p99)
            }),
            ("100 sessions, closed loop: runs/s", &|c| {
                format!("{:.0}", c.tp100.rate())
            }),
            ("100 sessions, closed loop: CPU-ms per run", &|c| {
                cpu(&c.tp100)
            }),
            ("burst: runs/s", &|c| format!("{:.0}", c.burst.rate())),
            ("burst: p50 ms", &|c| ms(pct(&c.burst.totals).p50)),
            ("burst: p99 ms", &|c| ms(pct(&c.burst.totals).p99)),
            ("burst: CPU-ms per run", &|c| cpu(&c.burst)),
            ("burst: replies lost / duplicated, runs persisted", &|c| {
                persisted(&c.burst)
            }),
        ];
        for (name, cell) in rows {
            out.push_str(&format!("| {name} |"));
            for c in &self.columns {
                out.push_str(&format!(" {} |", cell(c)));
            }
            out.push('\n');
        }
        let lost: u64 = self
            .columns
            .iter()
            .flat_map(|c| [&c.lat1, &c.lat10, &c.tp100])
            .map(|p| p.lost + p.wrong)
            .sum();
        if lost > 0 {
            out.push_str(&format!(
                "\n{lost} closed-loop messages were lost or answered wrong.\n"
            ));
        }
        out.push_str(END);
        out.push('\n');
        out
    }
}

/// How a row takes its figure from a column.
type Cell<'a> = dyn Fn(&Column) -> String + 'a;

fn ms(v: f64) -> String {
    format!("{v:.2}")
}

/// Lost (or wrong) and duplicated replies, and whether every completed run is in the runs
/// table: a burst queues many messages per session, where a lost or doubled run would show.
fn persisted(p: &PhaseResult) -> String {
    let all = p
        .persisted
        .is_some_and(|n| n >= i64::try_from(p.ok).unwrap_or(i64::MAX));
    format!(
        "{} / {}, {} of {} ({})",
        p.lost + p.wrong,
        p.tally.duplicates,
        p.persisted.unwrap_or(0),
        p.sent,
        if all && p.ok == p.sent {
            "all"
        } else {
            "not all"
        }
    )
}
