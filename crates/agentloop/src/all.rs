//! `agentloop all`: every service in one process, same code paths as separate processes; the
//! gateway's address serves health, readiness and metrics for the whole process.
//!
//! Each service runs on its own thread with its own runtime, sized as its own process would be:
//! the services talk over NATS and gRPC exactly as separate deployments do, and no service's
//! wakeup lands on a thread another service is busy on. One runtime shared by all five had every
//! worker woken for every service's messages and tasks moved between workers.

use std::future::Future;
use std::panic::AssertUnwindSafe;

use anyhow::Context as _;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use agentloop_agent_runner::RunnerConfig;
use agentloop_delivery::DeliveryConfig;
use agentloop_gateway::{Gateway, GatewayConfig};
use agentloop_lifecycle::{Health, load_config};
use agentloop_memory::{Memory, MemoryConfig};
use agentloop_router::RouterConfig;

/// A service's thread reports its end: its name and how it ended.
type Ended = (&'static str, anyhow::Result<()>);

/// Starts every service and waits until shutdown or until one of them fails; `threads`: worker
/// threads of each service's runtime.
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
    let token = shutdown.child_token();
    // Memory stops last, once the others have: their last writes on the way out (a runner's
    // final acknowledgements, the run ends of its drain) go through it.
    let memory_token = CancellationToken::new();
    let (ended_tx, mut ended) = mpsc::unbounded_channel::<Ended>();
    let spawn = |name, service| spawn_service(name, threads, ended_tx.clone(), service);

    // Memory and the gateway bind before the others start, so a taken port or a bad database
    // URL stops the process at once with its cause.
    let (bound_tx, bound) = oneshot::channel();
    spawn("memory", {
        let (h, t) = (health.clone(), memory_token.clone());
        Box::new(move || {
            Box::pin(async move {
                let memory =
                    bound_or_report(Memory::bind(memory_config, h).await, bound_tx, |m| {
                        m.local_addr()
                    })?;
                memory.serve(t).await.map_err(anyhow::Error::from)
            })
        })
    })?;
    let addr = wait_bound(bound, "memory").await;
    let addr = stop_on_error(addr, &memory_token)?;
    tracing::info!(grpc = %addr, "memory bound");

    let (bound_tx, bound) = oneshot::channel();
    spawn("gateway", {
        let (h, t) = (health.clone(), token.clone());
        Box::new(move || {
            Box::pin(async move {
                let gateway =
                    bound_or_report(Gateway::bind(gateway_config, h).await, bound_tx, |g| {
                        g.local_addr().ok()
                    })?;
                gateway.serve(t).await.map_err(anyhow::Error::from)
            })
        })
    })?;
    let addr = wait_bound(bound, "gateway").await;
    if let Some(addr) = stop_on_error(addr, &memory_token)? {
        tracing::info!(%addr, "health, readiness and metrics for every service at http://{addr}/readyz");
    }

    {
        let (h, t) = (health.clone(), token.clone());
        spawn(
            "router",
            Box::new(move || {
                Box::pin(async move {
                    agentloop_router::serve(router_config, h, t)
                        .await
                        .map_err(anyhow::Error::from)
                })
            }),
        )?;
    }
    {
        let (h, t) = (health.clone(), token.clone());
        spawn(
            "runner",
            Box::new(move || {
                Box::pin(async move {
                    agentloop_agent_runner::serve(runner_config, h, t)
                        .await
                        .map_err(anyhow::Error::from)
                })
            }),
        )?;
    }
    {
        let (h, t) = (health.clone(), token.clone());
        spawn(
            "delivery",
            Box::new(move || {
                Box::pin(async move {
                    agentloop_delivery::serve(delivery_config, h, t)
                        .await
                        .map_err(anyhow::Error::from)
                })
            }),
        )?;
    }
    drop(ended_tx);

    let mut first_error = None;
    let mut others_running = SERVICES - 1;
    while let Some((name, result)) = ended.recv().await {
        if name != "memory" {
            others_running -= 1;
            if others_running == 0 {
                memory_token.cancel();
            }
        }
        match result {
            Ok(()) => tracing::info!(service = name, "stopped"),
            Err(err) => {
                tracing::error!(
                    service = name,
                    error = format!("{err:#}"),
                    "failed, stopping the others"
                );
                token.cancel();
                first_error.get_or_insert(err.context(format!("{name} failed")));
            }
        }
    }
    match first_error {
        Some(err) => Err(err),
        None => Ok(()),
    }
}

/// How many services `all` runs.
const SERVICES: usize = 5;

/// A service: makes its future on its own runtime, so whatever it binds is driven there.
type Service = Box<
    dyn FnOnce() -> std::pin::Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>>
        + Send
        + 'static,
>;

/// Runs `service` on a new thread with its own runtime of `threads` workers, and reports its end
/// (a panic included) on `ended`.
fn spawn_service(
    name: &'static str,
    threads: usize,
    ended: mpsc::UnboundedSender<Ended>,
    service: Service,
) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name(format!("agentloop-{name}"))
        .enable_all()
        .build()
        .with_context(|| format!("failed to start the {name} runtime"))?;
    std::thread::Builder::new()
        .name(format!("agentloop-{name}-main"))
        .spawn(move || {
            // The service's own future runs on a worker like a separate process's does (the
            // binary's main spawns it for the same reason), not on this blocked thread.
            let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
                runtime.block_on(async move {
                    tokio::spawn(service())
                        .await
                        .unwrap_or_else(|join| Err(anyhow::anyhow!("{name} panicked: {join}")))
                })
            }))
            .unwrap_or_else(|_| Err(anyhow::anyhow!("{name} panicked")));
            // The receiver is gone only once the process is on its way out.
            let _ = ended.send((name, result));
        })
        .with_context(|| format!("failed to start the {name} thread"))?;
    Ok(())
}

/// Hands the bound service's address, or why it could not bind, to the starter waiting for it.
fn bound_or_report<S, A>(
    bound: Result<S, impl Into<anyhow::Error>>,
    report: oneshot::Sender<anyhow::Result<A>>,
    addr: impl FnOnce(&S) -> A,
) -> anyhow::Result<S> {
    match bound {
        Ok(service) => {
            let _ = report.send(Ok(addr(&service)));
            Ok(service)
        }
        Err(err) => {
            let err = err.into();
            let cause = format!("{err:#}");
            let _ = report.send(Err(err));
            Err(anyhow::anyhow!(cause))
        }
    }
}

/// Waits until the service has bound, or says why it has not.
async fn wait_bound<A>(
    bound: oneshot::Receiver<anyhow::Result<A>>,
    name: &str,
) -> anyhow::Result<A> {
    bound
        .await
        .unwrap_or_else(|_| Err(anyhow::anyhow!("it stopped before binding")))
        .with_context(|| format!("{name} failed to start"))
}

/// On a failed start, stops what already runs (memory) before the error ends the process.
fn stop_on_error<A>(started: anyhow::Result<A>, memory: &CancellationToken) -> anyhow::Result<A> {
    if started.is_err() {
        memory.cancel();
    }
    started
}

fn no_provider_configured(models: &agentloop_model::ModelsConfig) -> bool {
    let defaults = agentloop_model::ModelsConfig::default();
    models.openai_api_key.is_none()
        && models.anthropic_api_key.is_none()
        && models.openai_base_url == defaults.openai_base_url
        && models.anthropic_base_url == defaults.anthropic_base_url
}
