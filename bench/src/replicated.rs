//! `--replicated`: the same load on one nats-server and on a three-node cluster with every
//! stream replicated three ways and every write synced to disk (`sync_interval: always`), as
//! production runs NATS; what replication costs per message, side by side.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;

use crate::client::LoadClient;
use crate::options::Options;
use crate::phases::{PhaseResult, STACK_GROUPS};
use crate::procfs;
use crate::report::pct;
use crate::setup::StackMode;
use crate::stack::{Stack, StackConfig};

/// The section of `bench/RESULTS.md` a `--replicated` run writes.
pub const SECTION: crate::section::Markers = crate::section::Markers {
    begin: "<!-- replicated:begin -->",
    end: "<!-- replicated:end -->",
};

/// One column: the phases on one NATS layout.
struct Column {
    nodes: usize,
    one: PhaseResult,
    ten: PhaseResult,
    hundred: PhaseResult,
}

/// Runs the phases on one node, then on three, and returns the section.
///
/// # Errors
/// When a stack does not start (its logs are kept).
pub async fn run(options: &Options, run_dir: &Path) -> anyhow::Result<String> {
    let mut columns = Vec::new();
    for nodes in [1, 3] {
        let dir = run_dir.join(format!("nats-{nodes}"));
        let mut stack = Stack::new(StackConfig {
            nats_nodes: nodes,
            ..StackConfig::from_options(options, dir.clone(), StackMode::Separate, "warn")
        })?;
        crate::step(&format!("replicated: {nodes} nats-server node(s)"));
        let column = phases(&mut stack, options, nodes).await;
        stack.shutdown().await;
        if let Err(err) = crate::drop_database(&options.pg_base, &stack.db_name).await {
            eprintln!("warning: failed to drop {}: {err:#}", stack.db_name);
        }
        columns.push(column.with_context(|| format!("logs in {}", dir.join("logs").display()))?);
        // Database names carry the second they were made in.
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    Ok(markdown(&columns))
}

async fn phases(stack: &mut Stack, options: &Options, nodes: usize) -> anyhow::Result<Column> {
    stack.start().await?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&stack.database_url)
        .await
        .context("failed to connect to the bench database")?;
    let client = LoadClient::connect(&stack.nats_url, crate::PREFIX, options.setup.inbound).await?;
    let limit = Duration::from_secs(120);
    let run = async |name: &str, sessions: usize, per: usize| {
        crate::phases::run(
            stack,
            &client,
            &pool,
            &crate::load(name, sessions, sessions, per, limit),
            1,
        )
        .await
    };
    run("warm", 20, 15).await?;
    let one = run("one", 1, 300).await?;
    let ten = run("ten", 10, 60).await?;
    let hundred = run("hundred", 100, 20).await?;
    pool.close().await;
    Ok(Column {
        nodes,
        one,
        ten,
        hundred,
    })
}

fn markdown(columns: &[Column]) -> String {
    let tck = procfs::clock_ticks_per_sec();
    let (cores, cpu, memory) = procfs::machine();
    let header: Vec<String> = columns
        .iter()
        .map(|c| {
            if c.nodes == 1 {
                "1 node, streams R1".to_owned()
            } else {
                format!("{} nodes, streams R3, `sync_interval: always`", c.nodes)
            }
        })
        .collect();
    let row = |label: &str, value: &dyn Fn(&Column) -> String| {
        let cells: Vec<String> = columns.iter().map(value).collect();
        format!("| {label} | {} |\n", cells.join(" | "))
    };
    let mut table = format!(
        "| | {} |\n|---|{}\n",
        header.join(" | "),
        "---:|".repeat(columns.len())
    );
    table += &row("1 session, closed loop: p50 / p99 ms", &|c| {
        let l = pct(&c.one.totals);
        format!("{:.2} / {:.2}", l.p50, l.p99)
    });
    table += &row("10 sessions at once: p50 / p99 ms", &|c| {
        let l = pct(&c.ten.totals);
        format!("{:.2} / {:.2}", l.p50, l.p99)
    });
    table += &row("100 sessions, closed loop: runs/s", &|c| {
        format!("{:.0}", c.hundred.rate())
    });
    table += &row("100 sessions: stack CPU-ms per run", &|c| {
        format!("{:.2}", c.hundred.cpu_ms_per_run(&STACK_GROUPS, tck))
    });
    table += &row(
        "100 sessions: nats-server CPU-ms per run (all nodes)",
        &|c| format!("{:.3}", c.hundred.cpu_ms_per_run(&["nats-server"], tck)),
    );
    table += &row("replies ok / lost (all phases)", &|c| {
        format!(
            "{} / {}",
            c.one.ok + c.ten.ok + c.hundred.ok,
            c.one.lost + c.ten.lost + c.hundred.lost
        )
    });
    format!(
        "{begin}\n## One nats-server and a replicated three-node cluster (`./scripts/bench.sh --replicated`)\n\n\
         - date: {date}; commit: {commit}; machine: {cores} cores, {cpu}; {memory}\n\
         - each column a fresh stack of separate processes; the cluster's three nodes run on the \
         same machine (loopback routes), each with JetStream on file storage and every write \
         synced before it is acknowledged; the services get the three nodes as seeds and \
         `bus.replicas = 3`; load as in the throughput tables (closed loop, protobuf inbound)\n\n\
         {table}\n{end}\n",
        begin = SECTION.begin,
        end = SECTION.end,
        date = chrono::Utc::now().format("%Y-%m-%d %H:%M UTC"),
        commit = crate::git_commit(),
    )
}
