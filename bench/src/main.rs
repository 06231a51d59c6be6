//! `agentloop-bench`: drives the real stack (nats-server, Postgres, the five services as separate
//! processes or in one `agentloop all` process, the fake model answering at once) and reports the
//! overhead latency, throughput, memory, CPU per run, runner scaling and a per-hop profile; writes
//! `bench/RESULTS.md`.
//!
//! Usage: see [`options::USAGE`] (`agentloop-bench --help`).

mod api;
mod burst;
mod client;
mod embed_server;
mod inflight;
mod matrix;
mod openclaw;
mod options;
mod phases;
mod procfs;
mod replicated;
mod replies;
mod report;
mod retrieval;
mod retrieval_data;
mod retrieval_report;
mod section;
mod setup;
mod sidebyside;
mod sidebyside_report;
mod stack;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;

use crate::client::LoadClient;
use crate::options::{Options, parse_args};
use crate::phases::Load;
use crate::report::Report;
use crate::setup::StackMode;
use crate::stack::{Stack, StackConfig};

/// Subject prefix of the stack under test.
pub const PREFIX: &str = "agentloop";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let options = parse_args()?;
    let run_dir = std::env::temp_dir().join(format!(
        "agentloop-bench-{}-{}",
        chrono::Utc::now().format("%Y%m%dT%H%M%S"),
        std::process::id()
    ));
    let mut stack = Stack::new(StackConfig {
        // `--openclaw` checks in the model's requests that each tag reached it.
        model_recorded: if options.openclaw { 1000 } else { 0 },
        ..StackConfig::from_options(&options, run_dir.clone(), options.setup.mode, "info")
    })?;
    let started = Instant::now();
    let outcome = tokio::select! {
        outcome = async {
            if options.openclaw {
                side_by_side(&mut stack, &options, &run_dir).await.map(|s| Output::SideBySide(Box::new(s)))
            } else if options.matrix {
                matrix::run(&options, &run_dir, git_commit()).await.map(|m| Output::Matrix(Box::new(m)))
            } else if options.retrieval {
                retrieval::run(&mut stack, &options, git_commit()).await.map(|r| Output::Retrieval(Box::new(r)))
            } else if options.replicated {
                replicated::run(&options, &run_dir).await.map(Output::Replicated)
            } else if !options.inflight.is_empty() {
                inflight::run(&options, &run_dir).await.map(Output::InFlight)
            } else if let Some(per) = options.soak {
                soak(&mut stack, &options, per).await.map(Output::Soak)
            } else {
                bench(&mut stack, &options).await.map(|r| Output::Report(Box::new(r)))
            }
        } => outcome,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
    };
    eprintln!("stopping the stack");
    stack.shutdown().await;
    if let Err(err) = drop_database(&options.pg_base, &stack.db_name).await {
        eprintln!("warning: failed to drop {}: {err:#}", stack.db_name);
    }
    match &outcome {
        Ok(_) if !options.keep_logs => {
            let _ = std::fs::remove_dir_all(stack.run_dir());
        }
        _ => eprintln!("logs kept in {}", stack.run_dir().join("logs").display()),
    }
    let existing = options
        .out
        .as_ref()
        .and_then(|out| std::fs::read_to_string(out).ok())
        .unwrap_or_default();
    let (printed, file) = match outcome? {
        Output::Soak(line) => (line, existing),
        Output::Report(report) => {
            let markdown = report.markdown();
            // The matrix, side-by-side and retrieval sections come from `--matrix`, `--openclaw`
            // and `--retrieval` runs: keep the last of each.
            let mut file = markdown.clone();
            for section in [
                matrix::SECTION.extract(&existing),
                sidebyside::SECTION.extract(&existing),
                retrieval::SECTION.extract(&existing),
                inflight::SECTION.extract(&existing),
                replicated::SECTION.extract(&existing),
            ]
            .into_iter()
            .flatten()
            {
                file = format!("{file}\n{section}");
            }
            (markdown, file)
        }
        Output::Matrix(m) => placed(&matrix::SECTION, &existing, m.markdown()),
        Output::SideBySide(side) => placed(&sidebyside::SECTION, &existing, side.markdown()),
        Output::Retrieval(r) => placed(&retrieval::SECTION, &existing, r.markdown()),
        Output::InFlight(section) => placed(&inflight::SECTION, &existing, section),
        Output::Replicated(section) => placed(&replicated::SECTION, &existing, section),
    };
    println!("{printed}");
    if let Some(out) = &options.out {
        std::fs::write(out, &file).with_context(|| format!("failed to write {}", out.display()))?;
        eprintln!("wrote {}", out.display());
    }
    eprintln!("bench took {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// What a run produced.
enum Output {
    /// `--soak`: a short summary with CPU and resident memory by process.
    Soak(String),
    Report(Box<Report>),
    SideBySide(Box<sidebyside::SideBySide>),
    /// `--matrix`: the four setups side by side.
    Matrix(Box<matrix::Matrix>),
    /// `--retrieval`: long-term memory search, recall and latency.
    Retrieval(Box<retrieval::Retrieval>),
    /// `--inflight`: one runner's runs in flight while the model takes seconds.
    InFlight(String),
    /// `--replicated`: one nats-server and a replicated cluster side by side.
    Replicated(String),
}

/// A section run's output: the section printed, and the results file with it in its place (a
/// file of its own when there is none yet).
fn placed(markers: &section::Markers, existing: &str, section: String) -> (String, String) {
    let file = if existing.is_empty() {
        format!("# agentloop benchmark results\n\n{section}")
    } else {
        markers.splice(existing, &section)
    };
    (section, file)
}

/// `--openclaw`: the stack, then OpenClaw, under the same HTTP load.
async fn side_by_side(
    stack: &mut Stack,
    options: &Options,
    run_dir: &std::path::Path,
) -> anyhow::Result<sidebyside::SideBySide> {
    step(&format!(
        "starting nats-server, fake model and services (database {})",
        stack.db_name
    ));
    let t0 = Instant::now();
    stack.start().await?;
    let start_to_ready = t0.elapsed();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&stack.database_url)
        .await
        .context("failed to connect to the bench database")?;
    // Every phase goes through the gateway's HTTP API.
    let client =
        LoadClient::connect_unwatched(&stack.nats_url, PREFIX, options.setup.inbound).await?;
    let side_options = sidebyside::SideOptions {
        node: options.node.clone(),
        package_dir: options.openclaw_dir.clone(),
        run_dir: run_dir.join("openclaw"),
    };
    let mut side = sidebyside::run(
        stack,
        start_to_ready,
        &client,
        &pool,
        &side_options,
        sidebyside::SidePlan {
            rounds: options
                .rounds
                .unwrap_or(sidebyside::SidePlan::default().rounds),
            ..sidebyside::SidePlan::default()
        },
    )
    .await?;
    side.commit = git_commit();
    pool.close().await;
    Ok(side)
}

/// Runs a phase with the events watched (first deltas) and, with `trace`, every hop recorded
/// for [`LoadClient::take_traces`].
async fn watched(
    stack: &Stack,
    client: &LoadClient,
    pool: &sqlx::PgPool,
    load: &Load,
    trace: bool,
) -> anyhow::Result<phases::PhaseResult> {
    let watch = client.watch(trace).await?;
    let result = phases::run(stack, client, pool, load, 1).await;
    drop(watch);
    result
}

/// One session sending `messages` in turn (phase `lat1o`), each reply read on `outbound.>`
/// where it first appears (as issue 30 measured), so the client sends its next message then.
async fn lone_on_outbound(
    stack: &Stack,
    client: &LoadClient,
    pool: &sqlx::PgPool,
    messages: usize,
    limit: Duration,
) -> anyhow::Result<phases::PhaseResult> {
    client.answer_on_outbound(true);
    let result = watched(
        stack,
        client,
        pool,
        &load("lat1o", 1, 1, messages, limit),
        false,
    )
    .await;
    client.answer_on_outbound(false);
    result
}

/// How long the bench waits after a load before it reads idle resident memory: the services
/// hand freed memory back once a second, and mimalloc returns it to the system a second later.
const RSS_SETTLE: Duration = Duration::from_secs(3);

/// `--soak`: the warm-up, then `sessions` sessions × `per` messages, summarized in a few lines.
async fn soak(stack: &mut Stack, options: &Options, per: usize) -> anyhow::Result<String> {
    let (sessions, runners) = (options.soak_sessions, options.soak_runners);
    stack.start().await?;
    for n in 2..=runners {
        stack.add_runner(&format!("runner-{n}")).await?;
    }
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&stack.database_url)
        .await
        .context("failed to connect to the bench database")?;
    let client = if options.soak_http {
        LoadClient::connect_unwatched(&stack.nats_url, PREFIX, options.setup.inbound).await?
    } else {
        LoadClient::connect(&stack.nats_url, PREFIX, options.setup.inbound).await?
    };
    let limit = Duration::from_secs(120);
    let via = if options.soak_http {
        let gateway = stack
            .gateway_addr()
            .context("the stack has no gateway address")?;
        let keyed = !options.soak_keyless;
        let api = api::ChatApi::new(&format!("http://{gateway}"), None, "agentloop", keyed, true)?;
        phases::Via::Http(api)
    } else {
        phases::Via::Bus
    };
    step("warm-up");
    let mut warm = load("warm", 20, 20, 15, limit);
    warm.via = via.clone();
    phases::run(stack, &client, &pool, &warm, 1).await?;
    step(&format!("soak: {sessions} sessions × {per} messages"));
    client.answer_on_outbound(options.soak_outbound);
    let owners_before = runner_owners(stack, runners).await;
    let rss_before = stack::rss_by_name(stack);
    let mut soak_load = load("soak", sessions, sessions, per, limit);
    soak_load.via = via;
    let p = if options.soak_trace {
        watched(stack, &client, &pool, &soak_load, true).await?
    } else {
        phases::run(stack, &client, &pool, &soak_load, 1).await?
    };
    let hops = if options.soak_trace {
        let rows = phases::hop_rows(&pool, "soak", client.take_traces()).await?;
        format!(
            "\nwhere the time goes ({} runs traced):\n{}",
            rows.len(),
            report::hop_table(&rows)
        )
    } else {
        String::new()
    };
    let owners = runner_owners(stack, runners)
        .await
        .zip(owners_before)
        .map_or("runner: counters not read".to_owned(), |(after, before)| {
            let (runs, claims) = (
                after.0.saturating_sub(before.0),
                after.1.saturating_sub(before.1),
            );
            format!(
                "runner: {runs} runs completed, {claims} session claims ({} runs taken by an owner that already held its session)",
                runs.saturating_sub(claims)
            )
        });
    let rss_after = stack::rss_by_name(stack);
    // What a service gives back once the load is gone is its idle footprint after work.
    tokio::time::sleep(RSS_SETTLE).await;
    let rss_settled = stack::rss_by_name(stack);
    let rss: Vec<String> = rss_before
        .iter()
        .zip(&rss_after)
        .zip(&rss_settled)
        .map(|(((name, before), (_, after)), (_, settled))| {
            let mib = |kib: &u64| *kib as f64 / 1024.0;
            format!(
                "{name} {:.1}/{:.1}/{:.1}",
                mib(before),
                mib(after),
                mib(settled)
            )
        })
        .collect();
    pool.close().await;
    let (calls, batches) = p.batched.unwrap_or_default();
    let tck = procfs::clock_ticks_per_sec();
    let ok = u32::try_from(p.ok.max(1)).unwrap_or(u32::MAX);
    let by_process: Vec<String> = p
        .cpu_ticks
        .iter()
        .map(|(name, ticks)| {
            let ms = Duration::from_secs_f64(*ticks as f64 / tck as f64) / ok;
            format!("{name} {:.3}", ms.as_secs_f64() * 1000.0)
        })
        .collect();
    Ok(format!(
        "{}\n{}\nCPU-ms/run by process: {}\nRSS MiB before / right after / {} s after the soak: {}\nmemory: {calls} enqueue/finish calls in {batches} batches ({:.2} per batch)\n{owners}{hops}",
        options.setup.line(),
        summary_line(&p, tck),
        by_process.join(", "),
        RSS_SETTLE.as_secs(),
        rss.join(", "),
        calls as f64 / batches.max(1) as f64
    ))
}

/// Completed runs and session claims so far, summed over the runner processes.
async fn runner_owners(stack: &Stack, runners: usize) -> Option<(u64, u64)> {
    let (mut runs, mut claims) = (0, 0);
    for n in 1..=runners {
        let name = if n == 1 {
            "runner".to_owned()
        } else {
            format!("runner-{n}")
        };
        runs += stack
            .metric(&name, "agentloop_runner_runs_completed_total")
            .await?;
        claims += stack
            .metric(&name, "agentloop_runner_session_claims_total")
            .await?;
    }
    Some((runs, claims))
}

async fn drop_database(pg_base: &str, db_name: &str) -> anyhow::Result<()> {
    let admin =
        sqlx::PgPool::connect(&format!("{}/postgres", pg_base.trim_end_matches('/'))).await?;
    // The name is the bench's own (letters, digits, underscores), never user input.
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS \"{db_name}\" WITH (FORCE)"
    )))
    .execute(&admin)
    .await?;
    admin.close().await;
    Ok(())
}

fn step(what: &str) {
    eprintln!("[bench] {what}");
}

/// Message counts of each phase.
struct Plan {
    lat1: usize,
    /// One session in turn with every hop traced, for the profile.
    hops: usize,
    lat10: usize,
    ask: usize,
    /// WebSocket `agent`, one session in turn.
    ws: usize,
    /// `POST /v1/chat/completions`, one session in turn.
    http: usize,
    /// `POST /v1/chat/completions`: (sessions at once, messages each).
    http_tp: (usize, usize),
    tp: [(usize, usize); 4],
    mem_sessions: usize,
    mem_active: usize,
    phase_limit: Duration,
}

impl Plan {
    fn new(quick: bool) -> Self {
        if quick {
            Self {
                lat1: 100,
                hops: 100,
                lat10: 30,
                ask: 30,
                ws: 100,
                http: 100,
                http_tp: (10, 20),
                tp: [(1, 100), (10, 20), (100, 30), (1000, 2)],
                mem_sessions: 3000,
                mem_active: 1000,
                phase_limit: Duration::from_secs(20),
            }
        } else {
            Self {
                lat1: 300,
                hops: 200,
                lat10: 100,
                ask: 100,
                ws: 300,
                http: 300,
                http_tp: (10, 60),
                tp: [(1, 300), (10, 60), (100, 30), (1000, 5)],
                mem_sessions: 10_000,
                mem_active: 1000,
                phase_limit: Duration::from_secs(45),
            }
        }
    }
}

fn load(name: &str, sessions: usize, concurrency: usize, per: usize, limit: Duration) -> Load {
    Load {
        name: name.to_owned(),
        sessions,
        concurrency,
        per_session: per,
        max_duration: limit,
        via: phases::Via::Bus,
    }
}

fn summary_line(p: &phases::PhaseResult, tck: u64) -> String {
    let t = report::pct(&p.totals);
    let on_outbound = if p.outbounds.is_empty() {
        String::new()
    } else {
        let o = report::pct(&p.outbounds);
        format!(" (on outbound.>: p50 {:.2} ms, p99 {:.2} ms)", o.p50, o.p99)
    };
    format!(
        "{}: {} sent, {} ok, {} lost, {:.0} runs/s, p50 {:.2} ms, p99 {:.2} ms{on_outbound}, {:.2} stack CPU-ms/run, persisted {:?}",
        p.name,
        p.sent,
        p.ok,
        p.lost,
        p.rate(),
        t.p50,
        t.p99,
        p.cpu_ms_per_run(&phases::STACK_GROUPS, tck),
        p.persisted
    )
}

async fn bench(stack: &mut Stack, options: &Options) -> anyhow::Result<Report> {
    let plan = Plan::new(options.quick);
    let tck = procfs::clock_ticks_per_sec();
    let mut report = Report {
        mode: if options.quick { "quick" } else { "full" }.to_owned(),
        date: chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string(),
        commit: git_commit(),
        machine: procfs::machine(),
        yardsticks: procfs::Yardsticks::measure(),
        tck,
        mem_sessions: plan.mem_sessions,
        mem_active: plan.mem_active,
        planned_lat1: plan.lat1,
        setup: options.setup,
        ..Default::default()
    };
    step(&format!(
        "starting nats-server, fake model and services (database {})",
        stack.db_name
    ));
    let t0 = Instant::now();
    stack.start().await?;
    report.start_to_ready = t0.elapsed();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&stack.database_url)
        .await
        .context("failed to connect to the bench database")?;
    report.versions = versions(&options.nats_server, &pool).await;
    let client = LoadClient::connect(&stack.nats_url, PREFIX, options.setup.inbound).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    report.rss_idle = stack::rss_by_name(stack);

    step("warm-up");
    phases::run(
        stack,
        &client,
        &pool,
        &load("warm", 20, 20, 15, plan.phase_limit),
        1,
    )
    .await?;

    // The overhead is measured with only the events watched (the first delta needs them); the
    // hop profile has a phase of its own, so its tracing stays out of the overhead figures.
    step("latency, 1 session");
    let lat1 = watched(
        stack,
        &client,
        &pool,
        &load("lat1", 1, 1, plan.lat1, plan.phase_limit),
        false,
    )
    .await?;
    step(&summary_line(&lat1, tck));
    report.latency.push(lat1);
    step("latency, 1 session, replies read on outbound.>");
    let lat1o = lone_on_outbound(stack, &client, &pool, plan.lat1, plan.phase_limit).await?;
    step(&summary_line(&lat1o, tck));
    report.latency.push(lat1o);

    step("where the time goes, 1 session (tracing every hop)");
    let hops = watched(
        stack,
        &client,
        &pool,
        &load("hops", 1, 1, plan.hops, plan.phase_limit),
        true,
    )
    .await?;
    report.hops = phases::hop_rows(&pool, "hops", client.take_traces()).await?;
    step(&summary_line(&hops, tck));

    step("latency, 10 sessions at once");
    let lat10 = watched(
        stack,
        &client,
        &pool,
        &load("lat10", 10, 10, plan.lat10, plan.phase_limit),
        false,
    )
    .await?;
    step(&summary_line(&lat10, tck));
    report.latency.push(lat10);

    step("latency through the gateway's ask");
    let mut ask = load("ask1", 1, 1, plan.ask, plan.phase_limit);
    ask.via = phases::Via::Ask;
    let ask1 = phases::run(stack, &client, &pool, &ask, 1).await?;
    step(&summary_line(&ask1, tck));
    report.latency.push(ask1);

    let gateway = stack
        .gateway_addr()
        .context("the stack has no gateway address")?;
    step("latency through the gateway's WebSocket `agent`");
    let mut ws = load("ws1", 1, 1, plan.ws, plan.phase_limit);
    ws.via = phases::Via::Ws(format!("ws://{gateway}/ws"));
    let ws1 = phases::run(stack, &client, &pool, &ws, 1).await?;
    step(&summary_line(&ws1, tck));
    report.latency.push(ws1);

    let api = api::ChatApi::new(&format!("http://{gateway}"), None, "agentloop", true, true)?;
    step("latency through POST /v1/chat/completions");
    let mut http = load("http1", 1, 1, plan.http, plan.phase_limit);
    http.via = phases::Via::Http(api.clone());
    let http1 = phases::run(stack, &client, &pool, &http, 1).await?;
    step(&summary_line(&http1, tck));
    report.latency.push(http1);

    let (sessions, per) = plan.http_tp;
    step(&format!(
        "throughput through POST /v1/chat/completions, {sessions} sessions × {per} messages"
    ));
    let mut http = load("http10", sessions, sessions, per, plan.phase_limit);
    http.via = phases::Via::Http(api);
    let http10 = phases::run(stack, &client, &pool, &http, 1).await?;
    step(&summary_line(&http10, tck));
    report.latency.push(http10);

    for (sessions, per) in plan.tp {
        step(&format!("throughput, {sessions} sessions × {per} messages"));
        let name = format!("tp{sessions}");
        let p = phases::run(
            stack,
            &client,
            &pool,
            &load(&name, sessions, sessions, per, plan.phase_limit),
            1,
        )
        .await?;
        step(&summary_line(&p, tck));
        report.throughput.push(p);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    step(&format!(
        "memory: {} new sessions, {} active at once",
        plan.mem_sessions, plan.mem_active
    ));
    tokio::time::sleep(RSS_SETTLE).await;
    report.rss_before_mem = stack::rss_by_name(stack);
    let peak: Arc<Mutex<Vec<(String, u64)>>> = Arc::new(Mutex::new(report.rss_before_mem.clone()));
    let sampler = {
        let pids: Vec<(String, u32)> = stack
            .procs
            .iter()
            .map(|p| (p.name.clone(), p.pid))
            .collect();
        let peak = peak.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let Ok(mut peak) = peak.lock() else { return };
                for (name, pid) in &pids {
                    let now = procfs::sample(*pid).map_or(0, |s| s.rss_kib);
                    if let Some(entry) = peak.iter_mut().find(|(n, _)| n == name) {
                        entry.1 = entry.1.max(now);
                    }
                }
            }
        })
    };
    let mem = phases::run(
        stack,
        &client,
        &pool,
        &load(
            "mem",
            plan.mem_sessions,
            plan.mem_active,
            1,
            plan.phase_limit * 2,
        ),
        1,
    )
    .await?;
    sampler.abort();
    report.rss_peak_mem = peak.lock().map(|p| p.clone()).unwrap_or_default();
    step(&summary_line(&mem, tck));
    report.memory_phase = Some(mem);
    tokio::time::sleep(RSS_SETTLE).await;
    report.rss_after_mem = stack::rss_by_name(stack);

    // Scaling: one runner, two, then one again, back to back on the same database, so the
    // two-runner phase is compared with one-runner phases under the same conditions (the
    // throughput phases above ran before the memory phase grew the tables).
    let (sessions, per) = plan.tp[2];
    let scaling: &[(&str, usize)] = if stack.mode() == StackMode::All {
        step("scaling: skipped, `agentloop all` runs one runner (use --mode separate)");
        &[]
    } else {
        &[("tp100x1", 1), ("tp100x2", 2), ("tp100x1b", 1)]
    };
    for &(name, runners) in scaling {
        match (runners, stack.procs.iter().any(|p| p.name == "runner-2")) {
            (2, false) => stack.add_runner("runner-2").await?,
            (1, true) => stack.stop("runner-2").await?,
            _ => {}
        }
        step(&format!(
            "scaling: {runners} runner(s), {sessions} sessions"
        ));
        let p = phases::run(
            stack,
            &client,
            &pool,
            &load(name, sessions, sessions, per, plan.phase_limit),
            runners,
        )
        .await?;
        step(&summary_line(&p, tck));
        report.scaling.push(p);
    }
    report.runner_completed_metric = stack
        .metric("runner", "agentloop_runner_runs_completed_total")
        .await;
    pool.close().await;
    Ok(report)
}

fn git_commit() -> String {
    let run = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default()
    };
    let commit = run(&["rev-parse", "--short", "HEAD"]);
    // The bench's own output does not make the measured code dirty.
    let dirty = !run(&[
        "status",
        "--porcelain",
        "--untracked-files=no",
        "--",
        ":(top)",
        ":(top,exclude)bench/RESULTS.md",
    ])
    .is_empty();
    if dirty {
        format!("{commit} (with uncommitted changes)")
    } else {
        commit
    }
}

async fn versions(nats_server: &std::path::Path, pool: &sqlx::PgPool) -> String {
    let nats = std::process::Command::new(nats_server)
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let pg: String = sqlx::query_scalar("SHOW server_version")
        .fetch_one(pool)
        .await
        .unwrap_or_default();
    format!("{nats}, Postgres {pg}")
}
