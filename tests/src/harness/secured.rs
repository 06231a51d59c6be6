//! A stack on a nats-server that runs with the shipped users and permissions
//! (`deploy/base/nats/agentloop-auth.conf`, the file compose and deploy/ use), every service
//! logged in as its own user, as a deployment runs it.

use std::path::PathBuf;
use std::time::Duration;

use agentloop_fake_model::{FakeModel, FakeModelConfig};
use agentloop_testkit::{NatsServer, ServiceHandle, TestDatabase};

use super::handle;

/// The subject prefix the shipped permissions are written for.
pub const PREFIX: &str = "agentloop";

/// The shipped NATS users and permissions.
pub fn auth_conf() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/base/nats/agentloop-auth.conf")
}

/// The password a test gives `user`.
pub fn password(user: &str) -> String {
    format!("test-{user}-secret")
}

/// Starts nats-server with the shipped file, each user's password set through the variable
/// the file reads it from.
pub fn start_nats() -> anyhow::Result<NatsServer> {
    start_nats_from(&auth_conf())
}

/// Like [`start_nats`], with another users file (the shipped one changed by a test).
pub fn start_nats_from(conf: &std::path::Path) -> anyhow::Result<NatsServer> {
    let env: Vec<(String, String)> = [
        "gateway", "router", "runner", "delivery", "tool", "hook", "client", "admin",
    ]
    .iter()
    .map(|user| {
        (
            format!("AGENTLOOP_NATS_{}_PASSWORD", user.to_uppercase()),
            password(user),
        )
    })
    .collect();
    NatsServer::start_with_config(conf, &env)
}

/// The `[bus]` of a service logged in as `user`, with its own inbox as the file requires.
pub fn bus_as(nats: &NatsServer, user: &str) -> agentloop_bus::BusConfig {
    agentloop_bus::BusConfig {
        url: nats.url().to_owned(),
        prefix: PREFIX.to_owned(),
        user: user.to_owned(),
        password: password(user),
        inbox_prefix: format!("_INBOX.{user}"),
        ack_wait_ms: 5_000,
        ..Default::default()
    }
}

/// Connects as `user`; the receiver gets every error the server reports on the connection
/// (permission violations among them).
pub async fn connect_as(
    nats: &NatsServer,
    user: &str,
) -> anyhow::Result<(
    async_nats::Client,
    tokio::sync::mpsc::UnboundedReceiver<String>,
)> {
    let (errors_tx, errors) = tokio::sync::mpsc::unbounded_channel();
    let client =
        async_nats::ConnectOptions::with_user_and_password(user.to_owned(), password(user))
            .custom_inbox_prefix(format!("_INBOX.{user}"))
            .event_callback(move |event| {
                let errors_tx = errors_tx.clone();
                async move {
                    if let async_nats::Event::ServerError(err) = event {
                        let _ = errors_tx.send(err.to_string());
                    }
                }
            })
            .connect(nats.url())
            .await?;
    Ok((client, errors))
}

/// Memory, router, runner, delivery and gateway, each with its own NATS user.
#[allow(dead_code)] // kept alive for the test
pub struct SecuredStack {
    pub nats: NatsServer,
    pub db: TestDatabase,
    pub fake: FakeModel,
    services: Vec<ServiceHandle<String>>,
}

impl SecuredStack {
    pub async fn start() -> anyhow::Result<Self> {
        Self::start_from(&auth_conf(), "").await
    }

    /// Like [`SecuredStack::start`], with the runner's configuration changed by `tweak`.
    pub async fn start_with_runner(tweak: super::RunnerTweak) -> anyhow::Result<Self> {
        Self::start_with(&auth_conf(), "", Some(tweak)).await
    }

    /// Like [`SecuredStack::start`], with another users file and the runner's admin endpoint
    /// on `runner_admin` (empty: none).
    pub async fn start_from(conf: &std::path::Path, runner_admin: &str) -> anyhow::Result<Self> {
        Self::start_with(conf, runner_admin, None).await
    }

    async fn start_with(
        conf: &std::path::Path,
        runner_admin: &str,
        runner_tweak: Option<super::RunnerTweak>,
    ) -> anyhow::Result<Self> {
        agentloop_telemetry::init_for_tests();
        let nats = start_nats_from(conf)?;
        let db = TestDatabase::create().await?;
        let fake = FakeModel::start(FakeModelConfig::default()).await?;

        let mut memory_config = agentloop_memory::MemoryConfig::default();
        memory_config.memory.listen = "127.0.0.1:0".to_owned();
        memory_config.memory.database_url = db.url().to_owned();
        let memory =
            agentloop_memory::Memory::bind(memory_config, agentloop_lifecycle::Health::new())
                .await?;
        let memory_url = format!("http://{}", memory.local_addr());
        let mut services = vec![handle("memory", move |t| memory.serve(t))];

        let mut router = agentloop_router::RouterConfig {
            bus: bus_as(&nats, "router"),
            ..Default::default()
        };
        router.memory.url = memory_url.clone();
        router.models.default_model = "openai/fake-echo".to_owned();
        services.push(handle("router", move |t| agentloop_router::run(router, t)));

        let mut runner = agentloop_agent_runner::RunnerConfig {
            bus: bus_as(&nats, "runner"),
            ..Default::default()
        };
        runner.memory.url = memory_url.clone();
        runner.models.default_model = "openai/fake-echo".to_owned();
        runner.models.openai_base_url = fake.openai_base_url();
        runner.models.request_timeout_ms = 5_000;
        runner.runner.admin_listen = runner_admin.to_owned();
        if let Some(tweak) = runner_tweak {
            tweak(&mut runner);
        }
        services.push(handle("runner", move |t| {
            agentloop_agent_runner::run(runner, t)
        }));

        let delivery = agentloop_delivery::DeliveryConfig {
            bus: bus_as(&nats, "delivery"),
            ..Default::default()
        };
        services.push(handle("delivery", move |t| {
            agentloop_delivery::run(delivery, t)
        }));

        let mut gateway = agentloop_gateway::GatewayConfig {
            bus: bus_as(&nats, "gateway"),
            ..Default::default()
        };
        gateway.gateway.listen = "127.0.0.1:0".to_owned();
        gateway.gateway.ask_timeout_ms = 20_000;
        gateway.memory.url = memory_url;
        gateway.models.default_model = "openai/fake-echo".to_owned();
        let gateway =
            agentloop_gateway::Gateway::bind(gateway, agentloop_lifecycle::Health::new()).await?;
        services.push(handle("gateway", move |t| gateway.serve(t)));

        let stack = Self {
            nats,
            db,
            fake,
            services,
        };
        if let Err(err) = stack.wait_consuming().await {
            anyhow::bail!("{err}; nats-server logged:\n{}", stack.nats.log());
        }
        Ok(stack)
    }

    /// Waits until router, runner and delivery have their durable consumers, as `admin`.
    async fn wait_consuming(&self) -> anyhow::Result<()> {
        let (admin, _) = connect_as(&self.nats, "admin").await?;
        let js = async_nats::jetstream::new(admin);
        let wanted = [
            ("AGENTLOOP_INBOUND", "router"),
            ("AGENTLOOP_RUNS", "runner"),
            ("AGENTLOOP_OUTBOUND", "delivery"),
        ];
        agentloop_testkit::wait_until("services consuming", Duration::from_secs(20), || {
            let js = js.clone();
            async move {
                for (stream, consumer) in wanted {
                    js.get_stream(stream)
                        .await
                        .ok()?
                        .get_consumer::<async_nats::jetstream::consumer::pull::Config>(consumer)
                        .await
                        .ok()?;
                }
                Some(())
            }
        })
        .await
    }

    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        for service in std::mem::take(&mut self.services).into_iter().rev() {
            service.shutdown().await?;
        }
        self.fake.shutdown().await;
        Ok(())
    }
}
