//! `agentloop <gateway|router|runner|memory|delivery|all> [--config PATH]`

mod all;
mod chat;
mod send;

use anyhow::{Context as _, bail};

// Under load glibc's malloc and free took about a quarter of the services' CPU (perf during
// `bench.sh --soak`): small, short-lived allocations on many threads are mimalloc's case.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const USAGE: &str = "usage: agentloop <gateway|router|runner|memory|delivery|all> [--config PATH]
       agentloop send SESSION TEXT [--url URL] [--token TOKEN]   (prints the final reply)
       agentloop chat SESSION [--url URL] [--token TOKEN]        (interactive, streams replies)

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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
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
    let args: Vec<String> = std::env::args().collect();
    match command.as_str() {
        "chat" => return chat::run(&args).await,
        "send" => return send::run(&args).await,
        _ => {}
    }
    let telemetry: TelemetrySection =
        agentloop_lifecycle::load_config().context("failed to load config")?;
    let service = format!("agentloop-{command}");
    let _telemetry = agentloop_telemetry::init(&service, &telemetry.telemetry)
        .context("failed to start telemetry")?;
    let shutdown = agentloop_lifecycle::shutdown_on_signals();
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
        "all" => all::run(shutdown).await,
        other => bail!("unknown command {other:?}\n\n{USAGE}"),
    }
}
