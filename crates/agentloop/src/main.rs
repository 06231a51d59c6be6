//! `agentloop <gateway|router|runner|memory|delivery|all> [--config PATH]`

mod all;
mod chat;
mod dlq;
mod guard;
mod knowledge;
mod send;
mod trim;
mod watch;

use std::process::ExitCode;

use anyhow::{Context as _, bail};

// Under load glibc's malloc and free took about a quarter of the services' CPU (perf during
// `bench.sh --soak`): small, short-lived allocations on many threads are mimalloc's case.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const USAGE: &str = "usage: agentloop <gateway|router|runner|memory|delivery|all> [--config PATH]
       agentloop send SESSION TEXT [--url URL] [--token TOKEN]   (prints the final reply)
       agentloop chat SESSION [--url URL] [--token TOKEN]        (interactive, streams replies)
       agentloop prompt SESSION [--message TEXT] [--sender ID] [--json]  (what the model would get)
       agentloop agents list [--json]
       agentloop memory list|forget (--user KEY | --principal NAME) [--agent ID] [--id ID | --query TEXT]
       agentloop pairing list [--channel NAME] | approve CODE | revoke CHANNEL SENDER
       agentloop approvals list | resolve ID allow-once|allow-always|deny
       agentloop dlq list [--limit N] [--json] | show ID | retry ID [--edit] | purge --yes
       agentloop events SESSION [--json]   (a session's events as they happen)
       agentloop replay RUN [--json]       (a finished run's events from the EVENTS stream)
       agentloop audit [--limit N] [--source scanner|guardian|pairing|approval|policy] [--json]

Starts one agentloop service, or every service in one process (all).
Configuration: --config PATH or AGENTLOOP_CONFIG (TOML), overridden by AGENTLOOP_<SECTION>__<KEY>,
NATS_URL, DATABASE_URL, AGENTLOOP_MODEL, OPENAI_BASE_URL, OPENAI_API_KEY, ANTHROPIC_BASE_URL,
ANTHROPIC_API_KEY. See README.md.";

#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
struct TelemetrySection {
    telemetry: agentloop_telemetry::TelemetryConfig,
}

fn load<T: serde::de::DeserializeOwned>() -> anyhow::Result<T> {
    agentloop_lifecycle::load_config().context("failed to load config")
}

/// Worker threads of a process that runs one service, unless `AGENTLOOP_WORKER_THREADS` says.
/// Each service is I/O-bound and scales by replicas; with a second worker, most wakeups (a
/// message in, a gRPC answer, a model chunk) also woke the idle worker, and the tasks crossed
/// threads. One thread took 10-15 % less CPU per run in each service (`bench/HISTORY.md`).
const SERVICE_WORKER_THREADS: usize = 1;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            report(&err);
            ExitCode::FAILURE
        }
    }
}

/// Says why the process stops: in its log once logging is up (a JSON log stays JSON, so a log
/// collector shows the cause), on stderr before.
fn report(err: &anyhow::Error) {
    if tracing::dispatcher::has_been_set() {
        tracing::error!(
            error = format!("{err:#}"),
            "agentloop stopped by a fatal error"
        );
    } else {
        eprintln!("Error: {err:?}");
    }
}

fn run() -> anyhow::Result<()> {
    let command = std::env::args()
        .skip(1)
        .scan(false, |skip_next, arg| {
            let skip = *skip_next;
            *skip_next = arg == "--config";
            Some((skip, arg))
        })
        .find(|(skip, arg)| !skip && !arg.starts_with('-'))
        .map(|(_, arg)| arg);
    if std::env::args().any(|a| a == "--help" || a == "-h") || command.is_none() {
        println!("{USAGE}");
        return Ok(());
    }
    let command = command.unwrap_or_default();
    let threads = worker_threads()?;
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(if command == "all" { 1 } else { threads })
        .enable_all()
        .build()
        .context("failed to start the async runtime")?
        .block_on(start(command, threads))
}

/// `AGENTLOOP_WORKER_THREADS` when set, otherwise one: the workers of a single service's
/// runtime, and in `all` of each service's own runtime (the process's own runtime then keeps
/// one, for signals and the built-in fake model).
fn worker_threads() -> anyhow::Result<usize> {
    match std::env::var("AGENTLOOP_WORKER_THREADS") {
        Ok(value) => match value.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => bail!(
                "AGENTLOOP_WORKER_THREADS must be a whole number of at least 1, not {value:?}"
            ),
        },
        Err(_) => Ok(SERVICE_WORKER_THREADS),
    }
}

async fn start(command: String, threads: usize) -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    match command.as_str() {
        "chat" => return chat::run(&args).await,
        "send" => return send::run(&args).await,
        "prompt" => return knowledge::prompt(&args).await,
        "agents" => return knowledge::agents(&args),
        "pairing" => return guard::pairing(&args).await,
        "approvals" => return guard::approvals(&args).await,
        "audit" => return guard::audit(&args).await,
        "dlq" => return dlq::run(&args).await,
        "events" => return watch::events(&args).await,
        "replay" => return watch::replay(&args).await,
        "memory"
            if matches!(
                args.iter()
                    .skip_while(|a| *a != "memory")
                    .nth(1)
                    .map(String::as_str),
                Some("list" | "forget" | "embed")
            ) =>
        {
            return knowledge::memory(&args).await;
        }
        _ => {}
    }
    let telemetry: TelemetrySection =
        agentloop_lifecycle::load_config().context("failed to load config")?;
    let service = format!("agentloop-{command}");
    let _telemetry = agentloop_telemetry::init(&service, &telemetry.telemetry)
        .context("failed to start telemetry")?;
    let shutdown = agentloop_lifecycle::shutdown_on_signals();
    tokio::spawn(trim::run());
    // The future `main` blocks on is polled on the main thread, outside the worker pool: a
    // service loop left there (the runner's, router's and delivery's intake) had every message
    // handed from a worker to the main thread and back, two thread wakeups per message.
    tokio::spawn(serve(command, shutdown, threads))
        .await
        .context("service task panicked")?
}

async fn serve(
    command: String,
    shutdown: tokio_util::sync::CancellationToken,
    threads: usize,
) -> anyhow::Result<()> {
    match command.as_str() {
        "memory" => agentloop_memory::run(load()?, shutdown)
            .await
            .context("memory failed"),
        "router" => agentloop_router::run(load()?, shutdown)
            .await
            .context("router failed"),
        "runner" => agentloop_agent_runner::run(load()?, shutdown)
            .await
            .context("runner failed"),
        "delivery" => agentloop_delivery::run(load()?, shutdown)
            .await
            .context("delivery failed"),
        "gateway" => agentloop_gateway::run(load()?, shutdown)
            .await
            .context("gateway failed"),
        "all" => all::run(shutdown, threads).await,
        other => bail!("unknown command {other:?}\n\n{USAGE}"),
    }
}
