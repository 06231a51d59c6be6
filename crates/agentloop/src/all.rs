//! `agentloop all`: every service in one process, same code paths as separate processes; the
//! gateway's address serves health, readiness and metrics for the whole process.

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use agentloop_agent_runner::RunnerConfig;
use agentloop_delivery::DeliveryConfig;
use agentloop_gateway::{Gateway, GatewayConfig};
use agentloop_lifecycle::{Health, load_config};
use agentloop_memory::{Memory, MemoryConfig};
use agentloop_router::RouterConfig;

/// Starts every service and waits until shutdown or until one of them fails.
pub(crate) async fn run(shutdown: CancellationToken) -> anyhow::Result<()> {
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
    let memory = Memory::bind(memory_config, health.clone())
        .await
        .context("memory failed to start")?;
    tracing::info!(grpc = %memory.local_addr(), "memory bound");
    let gateway = Gateway::bind(gateway_config, health.clone())
        .await
        .context("gateway failed to start")?;
    if let Ok(addr) = gateway.local_addr() {
        tracing::info!(%addr, "health, readiness and metrics for every service at http://{addr}/readyz");
    }

    let token = shutdown.child_token();
    // Memory stops last, once the others have: their last writes on the way out (a runner's
    // final acknowledgements, the run ends of its drain) go through it.
    let memory_token = CancellationToken::new();
    let mut tasks = tokio::task::JoinSet::new();
    {
        let t = memory_token.clone();
        tasks.spawn(async move { ("memory", memory.serve(t).await.map_err(anyhow::Error::from)) });
    }
    {
        let (t, h) = (token.clone(), health.clone());
        tasks.spawn(async move {
            (
                "router",
                agentloop_router::serve(router_config, h, t)
                    .await
                    .map_err(anyhow::Error::from),
            )
        });
    }
    {
        let (t, h) = (token.clone(), health.clone());
        tasks.spawn(async move {
            (
                "runner",
                agentloop_agent_runner::serve(runner_config, h, t)
                    .await
                    .map_err(anyhow::Error::from),
            )
        });
    }
    {
        let (t, h) = (token.clone(), health.clone());
        tasks.spawn(async move {
            (
                "delivery",
                agentloop_delivery::serve(delivery_config, h, t)
                    .await
                    .map_err(anyhow::Error::from),
            )
        });
    }
    {
        let t = token.clone();
        tasks.spawn(async move {
            (
                "gateway",
                gateway.serve(t).await.map_err(anyhow::Error::from),
            )
        });
    }
    let mut first_error = None;
    let mut others_running = tasks.len() - 1;
    while let Some(joined) = tasks.join_next().await {
        if matches!(&joined, Ok((name, _)) if *name != "memory") {
            others_running -= 1;
            if others_running == 0 {
                memory_token.cancel();
            }
        }
        match joined {
            Ok((name, Ok(()))) => tracing::info!(service = name, "stopped"),
            Ok((name, Err(err))) => {
                tracing::error!(
                    service = name,
                    error = format!("{err:#}"),
                    "failed, stopping the others"
                );
                token.cancel();
                first_error.get_or_insert(err.context(format!("{name} failed")));
            }
            Err(join) => {
                token.cancel();
                memory_token.cancel();
                first_error.get_or_insert(anyhow::anyhow!("a service panicked: {join}"));
            }
        }
    }
    match first_error {
        Some(err) => Err(err),
        None => Ok(()),
    }
}

fn no_provider_configured(models: &agentloop_model::ModelsConfig) -> bool {
    let defaults = agentloop_model::ModelsConfig::default();
    models.openai_api_key.is_none()
        && models.anthropic_api_key.is_none()
        && models.openai_base_url == defaults.openai_base_url
        && models.anthropic_base_url == defaults.anthropic_base_url
}
