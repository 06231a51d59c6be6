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
use crate::procfs::Yardsticks;
use crate::report::pct;
use crate::setup::{Setup, StackMode};
use crate::stack::{Stack, StackConfig};
use crate::{PREFIX, drop_database, load, lone_on_outbound, step, summary_line, watched};

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
    /// One session in turn, each reply taken from `outbound.>`.
    pub lat1o: PhaseResult,
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
    /// Per setup in [`SETUPS`] order, its rounds.
    pub columns: Vec<Vec<Column>>,
    /// The machine's yardsticks before and after the run.
    pub yardsticks: [Yardsticks; 2],
}

/// Runs the four setups one after the other, each on a stack of its own under `run_dir`, and
/// all four again for each further round (`--rounds`): interleaved, so a machine's slow minutes
/// fall on every setup alike.
///
/// # Errors
/// When a stack does not start or its bookkeeping fails (its logs are kept).
pub async fn run(options: &Options, run_dir: &Path, commit: String) -> anyhow::Result<Matrix> {
    let plan = Plan::new(options.quick);
    let mut columns: Vec<Vec<Column>> = vec![Vec::new(); SETUPS.len()];
    let rounds = options.rounds.unwrap_or(1);
    let before = Yardsticks::measure();
    for (round, (i, (mode, inbound))) in
        (0..rounds).flat_map(|round| SETUPS.into_iter().enumerate().map(move |s| (round, s)))
    {
        let setup = Setup { mode, inbound };
        let dir = run_dir.join(format!("{}-{}-{round}", mode.name(), inbound.name()));
        let mut stack = Stack::new(StackConfig::from_options(
            options,
            dir.clone(),
            mode,
            "info",
        ))?;
        step(&format!(
            "matrix, round {} of {rounds}: {}",
            round + 1,
            setup.line()
        ));
        let column = run_one(&mut stack, setup, &plan).await;
        stack.shutdown().await;
        if let Err(err) = drop_database(&options.pg_base, &stack.db_name).await {
            eprintln!("warning: failed to drop {}: {err:#}", stack.db_name);
        }
        let column = column.with_context(|| {
            format!("{} (logs in {})", setup.line(), dir.join("logs").display())
        })?;
        columns[i].push(column);
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
        yardsticks: [before, Yardsticks::measure()],
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
    let lat1o = lone_on_outbound(stack, &client, &pool, plan.lat1, limit).await?;
    step(&summary_line(&lat1o, tck));
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
        lat1o,
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
             the reply in ms, as delivered on `agentloop.deliver.>` by delivery's bus adapter, \
             unless the row says `outbound.>`: there the client reads each reply where it first \
             appears, on the subject `DESIGN.md` gives final replies (as issue 30 measured), \
             and sends its next message then, delivery's copy still counted; \
             CPU: the stack's (services, nats-server, Postgres) per completed run.\n\n",
            if self.quick { "Quick" } else { "Full" },
            self.date,
            self.commit,
        );
        let [before, after] = self.yardsticks;
        out.push_str(&Yardsticks::sentence(before, after));
        out.push_str("\n\n");
        let rounds = self.columns.first().map_or(0, Vec::len);
        if rounds > 1 {
            out.push_str(&format!(
                "{rounds} rounds, the four setups interleaved in each; a cell is the median of the \
                 rounds (their lowest-highest in brackets).\n\n"
            ));
        }
        out.push_str("| |");
        for setup in &self.columns {
            out.push_str(&format!(
                " {} |",
                setup.first().map_or_else(String::new, |c| heading(c.setup))
            ));
        }
        out.push_str("\n|---|");
        out.push_str(&"---:|".repeat(self.columns.len()));
        out.push('\n');
        let rows = self.rows();
        for row in &rows {
            out.push_str(&format!("| {} |", row.name));
            for setup in &self.columns {
                let values: Vec<f64> = setup.iter().map(|c| (row.value)(c)).collect();
                out.push_str(&format!(" {} |", spread_cell(&values, row.decimals)));
            }
            out.push('\n');
        }
        out.push_str("| burst: replies lost / duplicated, runs persisted |");
        for setup in &self.columns {
            out.push_str(&format!(" {} |", persisted(setup.iter().map(|c| &c.burst))));
        }
        out.push('\n');
        out.push_str(&self.against_separate(&rows));
        let lost: u64 = self
            .columns
            .iter()
            .flatten()
            .flat_map(|c| [&c.lat1, &c.lat1o, &c.lat10, &c.tp100])
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

    /// The figures of a column, each with how it reads.
    fn rows(&self) -> Vec<Row<'_>> {
        let tck = self.tck;
        let cpu = move |p: &PhaseResult| p.cpu_ms_per_run(&STACK_GROUPS, tck);
        vec![
            Row::lower(
                "1 session, closed loop: p50 ms",
                2,
                Box::new(|c| pct(&c.lat1.totals).p50),
            ),
            Row::lower(
                "1 session, closed loop: p99 ms",
                2,
                Box::new(|c| pct(&c.lat1.totals).p99),
            ),
            Row::lower(
                "1 session, closed loop, replies read on `outbound.>`: p50 ms",
                2,
                Box::new(|c| pct(&c.lat1o.totals).p50),
            ),
            Row::lower(
                "1 session, closed loop, replies read on `outbound.>`: p99 ms",
                2,
                Box::new(|c| pct(&c.lat1o.totals).p99),
            ),
            Row::lower(
                "10 sessions at once: p99 ms",
                2,
                Box::new(|c| pct(&c.lat10.totals).p99),
            ),
            Row::higher(
                "100 sessions, closed loop: runs/s",
                0,
                Box::new(|c| c.tp100.rate()),
            ),
            Row::lower(
                "100 sessions, closed loop: CPU-ms per run",
                2,
                Box::new(move |c| cpu(&c.tp100)),
            ),
            Row::higher("burst: runs/s", 0, Box::new(|c| c.burst.rate())),
            Row::lower("burst: p50 ms", 2, Box::new(|c| pct(&c.burst.totals).p50)),
            Row::lower("burst: p99 ms", 2, Box::new(|c| pct(&c.burst.totals).p99)),
            Row::lower("burst: CPU-ms per run", 2, Box::new(move |c| cpu(&c.burst))),
        ]
    }

    /// How `all` compares with separate processes, figure by figure (medians), for each inbound
    /// encoding: the target is within 10 % on every figure.
    fn against_separate(&self, rows: &[Row<'_>]) -> String {
        let column = |mode: StackMode, inbound: Encoding| {
            SETUPS
                .iter()
                .position(|s| *s == (mode, inbound))
                .and_then(|i| self.columns.get(i))
        };
        let mut out = String::from(
            "\n| `all` against separate processes (medians) | protobuf | JSON |\n|---|---:|---:|\n",
        );
        for row in rows {
            out.push_str(&format!("| {} |", row.name));
            for inbound in [Encoding::Proto, Encoding::Json] {
                let median_of = |mode| {
                    column(mode, inbound).map(|rounds| {
                        median(&rounds.iter().map(|c| (row.value)(c)).collect::<Vec<_>>())
                    })
                };
                let cell = match (median_of(StackMode::All), median_of(StackMode::Separate)) {
                    (Some(all), Some(separate)) => against(all, separate, row.higher_is_better),
                    _ => "—".to_owned(),
                };
                out.push_str(&format!(" {cell} |"));
            }
            out.push('\n');
        }
        out
    }
}

/// One figure of a column.
struct Row<'a> {
    name: &'static str,
    decimals: usize,
    higher_is_better: bool,
    value: Box<dyn Fn(&Column) -> f64 + 'a>,
}

impl<'a> Row<'a> {
    fn lower(name: &'static str, decimals: usize, value: Box<dyn Fn(&Column) -> f64 + 'a>) -> Self {
        Self {
            name,
            decimals,
            higher_is_better: false,
            value,
        }
    }

    fn higher(
        name: &'static str,
        decimals: usize,
        value: Box<dyn Fn(&Column) -> f64 + 'a>,
    ) -> Self {
        Self {
            name,
            decimals,
            higher_is_better: true,
            value,
        }
    }
}

fn heading(setup: Setup) -> String {
    let mode = match setup.mode {
        StackMode::Separate => "separate",
        StackMode::All => "`all`",
    };
    let inbound = match setup.inbound {
        Encoding::Proto => "protobuf",
        Encoding::Json => "JSON",
    };
    format!("{mode}, {inbound}")
}

/// The median of `values` (the mean of the middle two for an even count); 0 for none.
pub(crate) fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// One round's value, or the median with the rounds' range: `2.61 (2.40-2.93)`.
fn spread_cell(values: &[f64], decimals: usize) -> String {
    let mid = median(values);
    if values.len() < 2 {
        return format!("{mid:.decimals$}");
    }
    let low = values.iter().copied().fold(f64::INFINITY, f64::min);
    let high = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{mid:.decimals$} ({low:.decimals$}-{high:.decimals$})")
}

/// How far `all` is from `separate` on a figure, in the direction that is worse or better.
fn against(all: f64, separate: f64, higher_is_better: bool) -> String {
    if separate == 0.0 {
        return "—".to_owned();
    }
    let change = (all - separate) / separate * 100.0;
    let worse = if higher_is_better { -change } else { change };
    if worse.abs() < 0.5 {
        "same".to_owned()
    } else if worse > 0.0 {
        format!("{worse:.0} % worse")
    } else {
        format!("{:.0} % better", -worse)
    }
}

/// Lost (or wrong) and duplicated replies over the rounds, and whether every completed run is in
/// the runs table: a burst queues many messages per session, where a lost or doubled run would
/// show.
fn persisted<'a>(bursts: impl Iterator<Item = &'a PhaseResult>) -> String {
    let (mut lost, mut duplicated, mut stored, mut sent, mut all) = (0, 0, 0, 0, true);
    for p in bursts {
        lost += p.lost + p.wrong;
        duplicated += p.tally.duplicates;
        stored += p.persisted.unwrap_or(0);
        sent += p.sent;
        all &= p.ok == p.sent
            && p.persisted
                .is_some_and(|n| n >= i64::try_from(p.ok).unwrap_or(i64::MAX));
    }
    format!(
        "{lost} / {duplicated}, {stored} of {sent} ({})",
        if all { "all" } else { "not all" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cell_is_the_median_of_its_rounds_with_their_range() {
        assert_eq!(spread_cell(&[2.5], 2), "2.50");
        assert_eq!(spread_cell(&[3.0, 1.0, 2.0], 1), "2.0 (1.0-3.0)");
        assert_eq!(spread_cell(&[4.0, 1.0, 2.0, 3.0], 1), "2.5 (1.0-4.0)");
        assert_eq!(median(&[]), 0.0);
    }

    #[test]
    fn all_is_worse_when_slower_or_when_it_completes_fewer_runs() {
        assert_eq!(against(2.2, 2.0, false), "10 % worse");
        assert_eq!(against(1.8, 2.0, false), "10 % better");
        assert_eq!(against(900.0, 1000.0, true), "10 % worse");
        assert_eq!(against(1100.0, 1000.0, true), "10 % better");
        assert_eq!(against(1000.0, 1001.0, true), "same");
        assert_eq!(against(1.0, 0.0, true), "—");
    }
}
