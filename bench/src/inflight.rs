//! `--inflight`: how many runs one runner holds at once, and what each costs, when the model
//! takes seconds per reply. For each model time and count: a fresh stack (separate processes,
//! one runner), one message per session published at once, the fake model streaming each reply
//! over the model time. Measured: runs/s, the runner's resident memory per run in flight, its
//! open file descriptors, CPU-ms per run by process, and the time above the model's (p50/p99).

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context as _;

use crate::client::LoadClient;
use crate::options::Options;
use crate::phases::Load;
use crate::procfs;
use crate::setup::StackMode;
use crate::stack::{Stack, StackConfig};

/// The section of `bench/RESULTS.md` an `--inflight` run writes.
pub const SECTION: crate::section::Markers = crate::section::Markers {
    begin: "<!-- inflight:begin -->",
    end: "<!-- inflight:end -->",
};

/// One measured case.
struct Row {
    model_ms: u64,
    sessions: usize,
    ok: u64,
    lost: u64,
    elapsed: Duration,
    /// Latency above the model's time.
    overheads: Vec<Duration>,
    /// One message alone on the same stack, before the burst.
    alone: Duration,
    rss_base_kib: u64,
    rss_peak_kib: u64,
    fds_peak: u64,
    in_flight_peak: u64,
    cpu_ms_per_run: Vec<(String, f64)>,
}

/// The fake-model directives that make a reply take `model_ms`, streamed: the OpenAI stream of
/// an echo is seven frames, the first after 40 % of the time and the other six a tenth apart.
fn directive(model_ms: u64) -> String {
    let chunk = model_ms / 10;
    format!(
        "[[delay_ms:{}]] [[chunk_delay_ms:{chunk}]]",
        model_ms.saturating_sub(6 * chunk)
    )
}

/// Runs every case and returns the section, table and how it was measured.
///
/// # Errors
/// When a stack does not start (its logs are kept).
pub async fn run(options: &Options, run_dir: &Path) -> anyhow::Result<String> {
    let mut rows = Vec::new();
    for &model_ms in &options.model_ms {
        for &sessions in &options.inflight {
            let dir = run_dir.join(format!("inflight-{model_ms}-{sessions}"));
            let mut stack = Stack::new(StackConfig {
                service_env: limits(sessions),
                ..StackConfig::from_options(options, dir.clone(), StackMode::Separate, "warn")
            })?;
            crate::step(&format!(
                "in flight: {sessions} sessions, model {model_ms} ms"
            ));
            let row = case(&mut stack, options, model_ms, sessions).await;
            stack.shutdown().await;
            if let Err(err) = crate::drop_database(&options.pg_base, &stack.db_name).await {
                eprintln!("warning: failed to drop {}: {err:#}", stack.db_name);
            }
            let row = row.with_context(|| format!("logs in {}", dir.join("logs").display()))?;
            eprintln!("{}", line(&row));
            rows.push(row);
            // Database names carry the second they were made in.
            tokio::time::sleep(Duration::from_millis(1100)).await;
        }
    }
    let (cores, cpu, memory) = procfs::machine();
    Ok(format!(
        "{begin}\n## In flight: one runner while the model takes seconds (`./scripts/bench.sh --inflight {counts} --model-ms {times}`)\n\n\
         - date: {date}; commit: {commit}; machine: {cores} cores, {cpu}; {memory}\n\
         - each row a fresh stack of separate processes (one runner), its limits raised to hold the sessions \
         (`runner.max_concurrent_runs` and `runner.max_concurrent_model_calls` = sessions + 64); \
         one message per session, the publishes spread evenly over the model's time (a steady \
         rate of sessions ÷ model time, so that many runs are in flight once the first replies \
         return); the fake model streams each reply over the model time (first frame at 40 %, \
         six more a tenth apart) and accepts 8,192 connections in its queue\n\
         - overhead: publish → reply minus the model time; one alone: a single message on the same \
         stack before the load; runs in flight: the runner's `agentloop_runner_runs_in_flight`, \
         highest seen (sampled every 250 ms); RSS per session: the runner's highest RSS minus its \
         RSS before the load, over the sessions; fds: the runner's open descriptors, highest seen \
         (one connection per model call on HTTP/1.1){extra_env}\n\n{table}\n{end}\n",
        begin = SECTION.begin,
        end = SECTION.end,
        counts = commas(&options.inflight),
        times = commas(&options.model_ms),
        date = chrono::Utc::now().format("%Y-%m-%d %H:%M UTC"),
        commit = crate::git_commit(),
        table = table(&rows),
        extra_env = match std::env::var("BENCH_SERVICE_ENV") {
            Ok(extra) if !extra.trim().is_empty() => {
                format!(
                    "; the services' environment adds `{}` (`BENCH_SERVICE_ENV`)",
                    extra.trim()
                )
            }
            _ => String::new(),
        },
    ))
}

/// The runner's limits raised to hold `sessions` runs at once; everything else as shipped.
fn limits(sessions: usize) -> Vec<(String, String)> {
    let n = (sessions + 64).to_string();
    vec![
        (
            "AGENTLOOP_RUNNER__MAX_CONCURRENT_RUNS".to_owned(),
            n.clone(),
        ),
        ("AGENTLOOP_RUNNER__MAX_CONCURRENT_MODEL_CALLS".to_owned(), n),
    ]
}

async fn case(
    stack: &mut Stack,
    options: &Options,
    model_ms: u64,
    sessions: usize,
) -> anyhow::Result<Row> {
    stack.start().await?;
    let mut client =
        LoadClient::connect(&stack.nats_url, crate::PREFIX, options.setup.inbound).await?;
    let limit = Duration::from_secs(120 + model_ms / 1000 * 4);
    // Warm: connections, caches, the first sessions.
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&stack.database_url)
        .await
        .context("failed to connect to the bench database")?;
    crate::phases::run(
        stack,
        &client,
        &pool,
        &crate::load("warm", 20, 20, 5, limit),
        1,
    )
    .await?;
    pool.close().await;
    client.set_directive(directive(model_ms));
    let alone = crate::burst::drive(&client, &load("alone", 1, limit)).await?;
    let alone = alone.totals.first().copied().unwrap_or_default();
    tokio::time::sleep(Duration::from_secs(1)).await;

    let runner = stack
        .pids()
        .into_iter()
        .find(|(_, group)| group == "runner")
        .map(|(pid, _)| pid)
        .context("no runner process")?;
    let rss_base_kib = procfs::sample(runner).map_or(0, |s| s.rss_kib);
    let peaks = Peaks::default();
    let done = AtomicBool::new(false);
    // The stack's processes and the database's Postgres backends, memory's pool open by now.
    let mut pids = stack.pids();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&stack.database_url)
        .await
        .context("failed to connect to the bench database")?;
    pids.extend(crate::phases::postgres_pids(&pool, &stack.db_name).await?);
    let cpu_before = procfs::CpuSnapshot::take(&pids);
    let (burst, ()) = tokio::join!(
        async {
            // Spread over the model's time: a steady rate at which `sessions` runs are in
            // flight once the first replies come back.
            let burst = crate::burst::drive_spread(
                &client,
                &load("inflight", sessions, limit),
                Duration::from_millis(model_ms),
            )
            .await;
            done.store(true, Ordering::Relaxed);
            burst
        },
        sample(stack, runner, &peaks, &done)
    );
    let burst = burst?;
    let cpu = procfs::CpuSnapshot::take(&pids).delta_since(&cpu_before);
    pool.close().await;
    let in_flight_peak = peaks.in_flight.load(Ordering::Relaxed);

    let model = Duration::from_millis(model_ms);
    let overheads: Vec<Duration> = burst
        .totals
        .iter()
        .map(|t| t.saturating_sub(model))
        .collect();
    let tck = procfs::clock_ticks_per_sec() as f64;
    let ok = burst.ok.max(1) as f64;
    Ok(Row {
        model_ms,
        sessions,
        ok: burst.ok,
        lost: burst.lost + burst.wrong,
        elapsed: burst.elapsed,
        overheads,
        alone,
        rss_base_kib,
        rss_peak_kib: peaks.rss_kib.load(Ordering::Relaxed),
        fds_peak: peaks.fds.load(Ordering::Relaxed),
        in_flight_peak,
        cpu_ms_per_run: cpu
            .into_iter()
            .map(|(group, ticks)| (group, ticks as f64 / tck * 1000.0 / ok))
            .collect(),
    })
}

fn load(name: &str, sessions: usize, limit: Duration) -> Load {
    crate::load(name, sessions, sessions, 1, limit)
}

/// The runner's highest resident memory, open descriptors and runs in flight seen.
#[derive(Default)]
struct Peaks {
    rss_kib: AtomicU64,
    fds: AtomicU64,
    in_flight: AtomicU64,
}

/// Samples the runner until `done`: resident memory and open descriptors every 50 ms, its
/// `agentloop_runner_runs_in_flight` gauge every 250 ms.
async fn sample(stack: &Stack, pid: u32, peaks: &Peaks, done: &AtomicBool) {
    let fd_dir = format!("/proc/{pid}/fd");
    let mut tick = 0u32;
    while !done.load(Ordering::Relaxed) {
        if let Some(s) = procfs::sample(pid) {
            peaks.rss_kib.fetch_max(s.rss_kib, Ordering::Relaxed);
        }
        if let Ok(entries) = std::fs::read_dir(&fd_dir) {
            peaks
                .fds
                .fetch_max(entries.count() as u64, Ordering::Relaxed);
        }
        if tick.is_multiple_of(5)
            && let Some(n) = stack
                .metric("runner", "agentloop_runner_runs_in_flight")
                .await
        {
            peaks.in_flight.fetch_max(n, Ordering::Relaxed);
        }
        tick += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn line(row: &Row) -> String {
    let overhead = crate::report::pct(&row.overheads);
    let per_run_kib =
        row.rss_peak_kib.saturating_sub(row.rss_base_kib) as f64 / row.sessions.max(1) as f64;
    let cpu: Vec<String> = row
        .cpu_ms_per_run
        .iter()
        .map(|(g, ms)| format!("{g} {ms:.3}"))
        .collect();
    format!(
        "| {} | {} | {}/{} | {:.0} | {:.1} | {:.1} | {:.1} | {} | {:.1} | {:.1} | {} | {} |",
        row.model_ms,
        row.sessions,
        row.ok,
        row.lost,
        row.ok as f64 / row.elapsed.as_secs_f64().max(1e-9),
        row.alone.as_secs_f64() * 1000.0,
        overhead.p50,
        overhead.p99,
        row.in_flight_peak,
        row.rss_base_kib as f64 / 1024.0,
        per_run_kib,
        row.fds_peak,
        cpu.join(", "),
    )
}

fn table(rows: &[Row]) -> String {
    let mut out = String::from(
        "| model ms | sessions | ok/lost | replies/s | one alone ms | overhead p50 ms | overhead p99 ms | runs in flight peak | runner RSS before MiB | runner RSS KiB per session | runner fds peak | CPU-ms per run by process |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for row in rows {
        out.push_str(&line(row));
        out.push('\n');
    }
    out
}

/// `1000,5000`: the values as the command line takes them.
fn commas<T: ToString>(values: &[T]) -> String {
    values
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}
