//! `--openclaw`: the same load through the same OpenAI-compatible `POST /v1/chat/completions`,
//! against the same fake model process, on agentloop and on OpenClaw, one after the other in
//! one run; a side-by-side table with the ratios.

use std::path::PathBuf;
use std::time::Duration;

use sqlx::PgPool;

use crate::api::{ChatApi, contains_word};
use crate::client::LoadClient;
use crate::openclaw::{OpenClaw, OpenClawConfig, TOKEN};
use crate::phases::{self, Load, PhaseResult, STACK_GROUPS, Via};
use crate::procfs::{self, CpuSnapshot};
use crate::report::pct;
use crate::stack::{self, Stack};

/// Marks the side-by-side section in `bench/RESULTS.md` (kept when the default bench rewrites
/// the rest of the file).
pub const BEGIN: &str = "<!-- openclaw-side-by-side:begin -->";
/// End marker of the section.
pub const END: &str = "<!-- openclaw-side-by-side:end -->";
/// Where this section stands in `bench/RESULTS.md`.
pub const SECTION: crate::section::Markers = crate::section::Markers {
    begin: BEGIN,
    end: END,
};

/// Message counts (OpenClaw takes 130-360 ms per message: kept small, but long enough that
/// agentloop's figures are those of a warm stack and a p50 of a hundred messages).
#[derive(Debug, Clone, Copy)]
pub struct SidePlan {
    /// Warm-up messages per system (not measured; OpenClaw loads lazily on its first).
    pub warm: usize,
    /// Sequential messages, one session.
    pub seq: usize,
    /// Concurrent sessions of the throughput phase.
    pub sessions: usize,
    /// Messages per session in the throughput phase.
    pub per_session: usize,
    /// Sequential phases per system, alternating between the two: a machine whose speed drifts
    /// over minutes moves both systems' figures of a round alike.
    pub rounds: usize,
}

impl Default for SidePlan {
    fn default() -> Self {
        Self {
            warm: 30,
            seq: 200,
            sessions: 10,
            per_session: 6,
            rounds: 3,
        }
    }
}

/// What one system measured.
#[derive(Debug, Default)]
pub struct SystemResult {
    /// Spawn to ready.
    pub start_to_ready: Duration,
    /// What the start covers.
    pub start_what: String,
    /// The warm-up phase (its first message is the first after start).
    pub warm: PhaseResult,
    /// Sequential, one session (the first round).
    pub seq: PhaseResult,
    /// The sequential phases of the later rounds.
    pub more_seq: Vec<PhaseResult>,
    /// Concurrent sessions.
    pub tp: PhaseResult,
    /// CPU groups that count as the system.
    pub groups: Vec<String>,
    /// RSS of the system's processes, KiB, idle after start.
    pub rss_idle: u64,
    /// RSS after the load.
    pub rss_after: u64,
    /// Which processes the RSS covers.
    pub rss_what: String,
}

/// The side-by-side report.
#[derive(Debug, Default)]
pub struct SideBySide {
    /// Date (UTC).
    pub date: String,
    /// Commit.
    pub commit: String,
    /// Cores, CPU model, `free -h` Mem line.
    pub machine: (usize, String, String),
    /// Node version used for OpenClaw.
    pub node_version: String,
    /// Clock ticks per second.
    pub tck: u64,
    /// The plan.
    pub plan: Option<SidePlan>,
    /// agentloop.
    pub agentloop: SystemResult,
    /// OpenClaw.
    pub openclaw: SystemResult,
    /// What agentloop's services ran as (`5 services` or `` `agentloop all` ``).
    pub services: &'static str,
    /// CPU-ms the idle OpenClaw process tree used during agentloop's later rounds, and those
    /// rounds' wall time.
    pub openclaw_idle: (f64, Duration),
    /// The machine's yardsticks before and after the run.
    pub yardsticks: [procfs::Yardsticks; 2],
}

/// Where OpenClaw is installed.
#[derive(Debug, Clone)]
pub struct SideOptions {
    /// Node 24 binary.
    pub node: PathBuf,
    /// npm project holding `node_modules/openclaw`.
    pub package_dir: PathBuf,
    /// Scratch directory for OpenClaw's state.
    pub run_dir: PathBuf,
}

fn load(name: &str, sessions: usize, per: usize, api: &ChatApi, limit: Duration) -> Load {
    Load {
        name: name.to_owned(),
        sessions,
        concurrency: sessions,
        per_session: per,
        max_duration: limit,
        via: Via::Http(api.clone()),
    }
}

async fn agentloop_pids(stack: &Stack, pool: &PgPool) -> anyhow::Result<Vec<(u32, String)>> {
    let mut pids = stack.pids();
    pids.extend(phases::postgres_pids(pool, &stack.db_name).await?);
    Ok(pids)
}

fn openclaw_pids(stack: &Stack, openclaw: &OpenClaw) -> Vec<(u32, String)> {
    let mut pids: Vec<(u32, String)> = openclaw
        .tree()
        .into_iter()
        .map(|p| (p, "openclaw".to_owned()))
        .collect();
    pids.extend(stack.pids().into_iter().filter(|(_, g)| g == "fake-model"));
    pids
}

/// Which system a phase loads.
enum Target<'a> {
    Agentloop(&'a PgPool),
    OpenClaw(&'a OpenClaw),
}

impl Target<'_> {
    async fn pids(&self, stack: &Stack) -> anyhow::Result<Vec<(u32, String)>> {
        match self {
            Self::Agentloop(pool) => agentloop_pids(stack, pool).await,
            Self::OpenClaw(openclaw) => Ok(openclaw_pids(stack, openclaw)),
        }
    }
}

async fn measured(
    stack: &Stack,
    client: &LoadClient,
    target: &Target<'_>,
    load: &Load,
) -> anyhow::Result<PhaseResult> {
    let model = format!("http://{}/_fake", stack.model_addr());
    let http = reqwest::Client::new();
    let _ = http.post(format!("{model}/reset")).send().await;
    let before_pids = target.pids(stack).await?;
    let before = CpuSnapshot::take(&before_pids);
    let mut result = phases::drive(client, load, 1).await?;
    let mut pids = before_pids;
    pids.extend(target.pids(stack).await?);
    result.cpu_ticks = CpuSnapshot::take(&pids).delta_since(&before);
    // Which tags reached the model (the recorded request bodies hold the user's text).
    let recorded = match http.get(format!("{model}/requests")).send().await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    };
    let mut seen = 0;
    for session in 0..load.sessions {
        for m in 0..load.per_session {
            if contains_word(&recorded, &format!("{}-{session}-{m}", load.name)) {
                seen += 1;
            }
        }
    }
    result.persisted = Some(seen);
    eprintln!(
        "[bench] {}: {} sent, {} ok, {} wrong, {} lost, {} tags reached the model, {:.1} msg/s, p50 {:.1} ms{}",
        result.name,
        result.sent,
        result.ok,
        result.wrong,
        result.lost,
        result.persisted.unwrap_or(0),
        result.rate(),
        pct(&result.totals).p50,
        result
            .first_error
            .as_deref()
            .map(|e| format!("; first error: {e}"))
            .unwrap_or_default()
    );
    Ok(result)
}

/// Waits until the processes `pids` use under 2 % of a core over a second, or 30 s at most.
async fn quiet(pids: &[(u32, String)], tck: u64) {
    for _ in 0..30 {
        let before = CpuSnapshot::take(pids);
        tokio::time::sleep(Duration::from_secs(1)).await;
        let ticks: u64 = CpuSnapshot::take(pids).delta_since(&before).values().sum();
        if (ticks as f64) / (tck as f64) < 0.02 {
            return;
        }
    }
    eprintln!("[bench] OpenClaw still busy after 30 s; loading agentloop anyway");
}

/// How long one phase may take at most.
const PHASE_LIMIT: Duration = Duration::from_secs(90);

/// What the services of `mode` are called in the report.
fn services(mode: crate::setup::StackMode) -> &'static str {
    match mode {
        crate::setup::StackMode::Separate => "5 services",
        crate::setup::StackMode::All => "`agentloop all`",
    }
}

async fn load_system(
    stack: &Stack,
    client: &LoadClient,
    target: &Target<'_>,
    prefix: &str,
    api: &ChatApi,
    plan: SidePlan,
    out: &mut SystemResult,
) -> anyhow::Result<()> {
    let limit = PHASE_LIMIT;
    out.warm = measured(
        stack,
        client,
        target,
        &load(&format!("{prefix}warm"), 1, plan.warm, api, limit),
    )
    .await?;
    out.seq = measured(
        stack,
        client,
        target,
        &load(&format!("{prefix}seq"), 1, plan.seq, api, limit),
    )
    .await?;
    out.tp = measured(
        stack,
        client,
        target,
        &load(
            &format!("{prefix}tp"),
            plan.sessions,
            plan.per_session,
            api,
            limit,
        ),
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    Ok(())
}

fn agentloop_rss(stack: &Stack) -> u64 {
    stack::rss_by_name(stack)
        .iter()
        .filter(|(n, _)| n != "fake-model")
        .map(|(_, v)| v)
        .sum()
}

/// Runs the side-by-side load on a started stack. OpenClaw is started here and always stopped.
///
/// # Errors
/// When OpenClaw cannot be started or the stack's bookkeeping fails.
pub async fn run(
    stack: &Stack,
    stack_start: Duration,
    client: &LoadClient,
    pool: &PgPool,
    options: &SideOptions,
    plan: SidePlan,
) -> anyhow::Result<SideBySide> {
    let mut report = SideBySide {
        date: chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string(),
        machine: procfs::machine(),
        tck: procfs::clock_ticks_per_sec(),
        plan: Some(plan),
        yardsticks: [procfs::Yardsticks::measure(); 2],
        node_version: std::process::Command::new(&options.node)
            .arg("--version")
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default(),
        ..Default::default()
    };
    let gateway = stack
        .gateway_addr()
        .ok_or_else(|| anyhow::anyhow!("the stack has no gateway"))?;

    // agentloop first (OpenClaw is not running yet, so it does not compete for the 2 cores).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let services = services(stack.mode());
    report.services = services;
    let al = &mut report.agentloop;
    al.start_to_ready = stack_start;
    al.start_what = format!("nats-server, fake model, {services}");
    al.groups = STACK_GROUPS.iter().map(|g| (*g).to_owned()).collect();
    al.rss_what = format!("{services} + nats-server (Postgres shared, not counted)");
    al.rss_idle = agentloop_rss(stack);
    // No Idempotency-Key, as the official OpenAI clients send and as OpenClaw gets: the tags in
    // the model's recorded requests show that each message reached it.
    let al_api = ChatApi::new(&format!("http://{gateway}"), None, "agentloop", false, true)?;
    eprintln!("[bench] agentloop through POST /v1/chat/completions");
    load_system(
        stack,
        client,
        &Target::Agentloop(pool),
        "al",
        &al_api,
        plan,
        al,
    )
    .await?;
    al.rss_after = agentloop_rss(stack);

    let config = OpenClawConfig {
        node: options.node.clone(),
        package_dir: options.package_dir.clone(),
        run_dir: options.run_dir.clone(),
        port: stack::free_port()?,
        model_base_url: format!("http://{}/v1", stack.model_addr()),
    };
    eprintln!(
        "[bench] starting OpenClaw gateway on 127.0.0.1:{} (state in {})",
        config.port,
        config.run_dir.display()
    );
    let (mut openclaw, ready) = OpenClaw::start(&config).await?;
    eprintln!("[bench] OpenClaw ready after {:.1} s", ready.as_secs_f64());
    let outcome = async {
        let oc = &mut report.openclaw;
        oc.start_to_ready = ready;
        oc.start_what = "`openclaw gateway run` spawn to `/readyz` 200".to_owned();
        oc.groups = vec!["openclaw".to_owned()];
        oc.rss_what = "gateway process tree".to_owned();
        tokio::time::sleep(Duration::from_secs(5)).await;
        oc.rss_idle = openclaw.rss_kib();
        let mut api = ChatApi::new(
            &openclaw.base,
            Some(TOKEN),
            "openclaw/default",
            false,
            false,
        )?;
        api.accept_echo = true;
        eprintln!("[bench] OpenClaw through POST /v1/chat/completions");
        load_system(
            stack,
            client,
            &Target::OpenClaw(&openclaw),
            "oc",
            &api,
            plan,
            oc,
        )
        .await?;
        oc.rss_after = openclaw.rss_kib();
        // The later rounds: each system's sequential phase again, one after the other.
        let (mut idle_ticks, mut idle_wall) = (0, Duration::ZERO);
        for round in 2..=plan.rounds {
            // OpenClaw alone, without the fake model both systems share.
            let oc_pids: Vec<(u32, String)> = openclaw_pids(stack, &openclaw)
                .into_iter()
                .filter(|(_, group)| group == "openclaw")
                .collect();
            // OpenClaw keeps working for a while after its last answer, and idle its timers
            // still wake it: agentloop's round waits until it is done, then OpenClaw is frozen
            // until the round is over, so the two never share the cores.
            quiet(&oc_pids, report.tck).await;
            openclaw.pause();
            let before = CpuSnapshot::take(&oc_pids);
            let phase = measured(
                stack,
                client,
                &Target::Agentloop(pool),
                &load(&format!("alseq{round}"), 1, plan.seq, &al_api, PHASE_LIMIT),
            )
            .await;
            idle_ticks += CpuSnapshot::take(&oc_pids)
                .delta_since(&before)
                .values()
                .sum::<u64>();
            openclaw.resume();
            let phase = phase?;
            idle_wall += phase.elapsed;
            report.agentloop.more_seq.push(phase);
            // What its timers missed while frozen runs before its own round.
            quiet(&oc_pids, report.tck).await;
            let phase = measured(
                stack,
                client,
                &Target::OpenClaw(&openclaw),
                &load(&format!("ocseq{round}"), 1, plan.seq, &api, PHASE_LIMIT),
            )
            .await?;
            report.openclaw.more_seq.push(phase);
        }
        report.openclaw_idle = (idle_ticks as f64 * 1000.0 / report.tck as f64, idle_wall);
        anyhow::Ok(())
    }
    .await;
    if outcome.is_err() {
        eprintln!("OpenClaw output (last lines):\n{}", openclaw.tail());
    }
    eprintln!("[bench] stopping OpenClaw");
    openclaw.stop().await;
    outcome?;
    report.yardsticks[1] = procfs::Yardsticks::measure();
    Ok(report)
}
