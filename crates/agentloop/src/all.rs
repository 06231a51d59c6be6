//! `agentloop all`: every service in one process, same code paths as separate processes, each
//! on a thread and runtime of its own; the gateway's address serves health, readiness and
//! metrics for the whole process.

use std::future::Future;

use anyhow::Context as _;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use agentloop_agent_runner::RunnerConfig;
use agentloop_delivery::DeliveryConfig;
use agentloop_gateway::{Gateway, GatewayConfig};
use agentloop_lifecycle::{Health, load_config};
use agentloop_memory::{Memory, MemoryConfig};
use agentloop_router::RouterConfig;

/// Starts every service, each on a thread and runtime of its own with `threads` workers, and
/// waits until shutdown or until one of them fails.
pub(crate) async fn run(shutdown: CancellationToken, threads: usize) -> anyhow::Result<()> {
    let memory_config: MemoryConfig = load_config().context("failed to load config")?;
    let mut router_config: RouterConfig = load_config().context("failed to load config")?;
    let mut runner_config: RunnerConfig = load_config().context("failed to load config")?;
    let delivery_config: DeliveryConfig = load_config().context("failed to load config")?;
    let gateway_config: GatewayConfig = load_config().context("failed to load config")?;

    // Keep the fake model alive for the whole process.
    let _fake = if no_provider_configured(&runner_config.models) {
        let fake = agentloop_fake_model::FakeModel::start(
            agentloop_fake_model::FakeModelConfig::default(),
        )
        .await
        .context("failed to start the built-in fake model server")?;
        tracing::warn!(
            fake_model = %fake.openai_base_url(),
            "no model provider configured (set OPENAI_BASE_URL and/or OPENAI_API_KEY, or ANTHROPIC_API_KEY): \
             using the built-in fake model server, which echoes your messages"
        );
        runner_config.models.openai_base_url = fake.openai_base_url();
        runner_config.models.default_model = "openai/fake-echo".to_owned();
        router_config.models.default_model = "openai/fake-echo".to_owned();
        Some(fake)
    } else {
        None
    };

    let health = Health::new();
    let (done_tx, mut done) = mpsc::unbounded_channel();
    let token = shutdown.child_token();
    // Memory stops last, once the others have: their last writes on the way out (a runner's
    // final acknowledgements, the run ends of its drain) go through it.
    let memory_token = CancellationToken::new();
    // Memory listens before the others start, as a separate deployment's would be up.
    let (bound_tx, bound) = oneshot::channel();
    {
        let (t, h) = (memory_token.clone(), health.clone());
        on_own_thread("memory", threads, done_tx.clone(), move || async move {
            let memory = Memory::bind(memory_config, h)
                .await
                .context("memory failed to start")?;
            tracing::info!(grpc = %memory.local_addr(), "memory bound");
            let _ = bound_tx.send(());
            memory.serve(t).await.map_err(anyhow::Error::from)
        })?;
    }
    if bound.await.is_err() {
        // Memory ended before it listened: its error is on `done`.
        let (_, outcome) = done.recv().await.context("memory thread vanished")?;
        return outcome.and_then(|()| Err(anyhow::anyhow!("memory stopped before it listened")));
    }
    {
        let (t, h) = (token.clone(), health.clone());
        on_own_thread("router", threads, done_tx.clone(), move || async move {
            agentloop_router::serve(router_config, h, t)
                .await
                .map_err(anyhow::Error::from)
        })?;
    }
    {
        let (t, h) = (token.clone(), health.clone());
        on_own_thread("runner", threads, done_tx.clone(), move || async move {
            agentloop_agent_runner::serve(runner_config, h, t)
                .await
                .map_err(anyhow::Error::from)
        })?;
    }
    {
        let (t, h) = (token.clone(), health.clone());
        on_own_thread("delivery", threads, done_tx.clone(), move || async move {
            agentloop_delivery::serve(delivery_config, h, t)
                .await
                .map_err(anyhow::Error::from)
        })?;
    }
    {
        let (t, h) = (token.clone(), health);
        on_own_thread("gateway", threads, done_tx, move || async move {
            let gateway = Gateway::bind(gateway_config, h)
                .await
                .context("gateway failed to start")?;
            if let Ok(addr) = gateway.local_addr() {
                tracing::info!(%addr, "health, readiness and metrics for every service at http://{addr}/readyz");
            }
            gateway.serve(t).await.map_err(anyhow::Error::from)
        })?;
    }

    let mut first_error = None;
    let mut others_running = SERVICES - 1;
    while let Some((name, outcome)) = done.recv().await {
        if name != "memory" {
            others_running -= 1;
            if others_running == 0 {
                memory_token.cancel();
            }
        }
        match outcome {
            Ok(()) => tracing::info!(service = name, "stopped"),
            Err(err) => {
                tracing::error!(
                    service = name,
                    error = format!("{err:#}"),
                    "failed, stopping the others"
                );
                token.cancel();
                if name == "memory" {
                    memory_token.cancel();
                }
                first_error.get_or_insert(err.context(format!("{name} failed")));
            }
        }
    }
    match first_error {
        Some(err) => Err(err),
        None => Ok(()),
    }
}

/// The services `all` runs.
const SERVICES: usize = 5;

/// Runs a service on a thread of its own, in a runtime of `threads` workers, as its own process
/// would. On one shared pool of workers the five services' tasks and wakeups crossed threads:
/// one session's latency was 2-29 % above five processes', 10-24 % below it this way
/// (`bench/HISTORY.md`, stop 45). Its outcome (a panic as an error) goes to `done`.
fn on_own_thread<F, Fut>(
    name: &'static str,
    threads: usize,
    done: mpsc::UnboundedSender<(&'static str, anyhow::Result<()>)>,
    service: F,
) -> anyhow::Result<()>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    std::thread::Builder::new()
        .name(format!("{name}-main"))
        .spawn(move || {
            let outcome = match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(threads)
                .thread_name(name)
                .enable_all()
                .build()
            {
                // Spawned onto the worker rather than polled here, as in a process of its own
                // (see `main.rs`).
                Ok(runtime) => runtime
                    .block_on(async move { tokio::spawn(service()).await })
                    .unwrap_or_else(|join| Err(anyhow::anyhow!("{name} panicked: {join}"))),
                Err(err) => Err(anyhow::Error::from(err).context("failed to start its runtime")),
            };
            let _ = done.send((name, outcome));
        })
        .with_context(|| format!("failed to start the {name} thread"))?;
    Ok(())
}

fn no_provider_configured(models: &agentloop_model::ModelsConfig) -> bool {
    let defaults = agentloop_model::ModelsConfig::default();
    models.openai_api_key.is_none()
        && models.anthropic_api_key.is_none()
        && models.openai_base_url == defaults.openai_base_url
        && models.anthropic_base_url == defaults.anthropic_base_url
}
