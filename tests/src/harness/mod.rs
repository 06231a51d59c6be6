//! The sandbox: a whole agentloop stack for one test.

mod hooks;
pub mod secured;

use std::time::Duration;

use anyhow::Context as _;
use futures::StreamExt as _;

use agentloop_fake_model::{FakeModel, FakeModelConfig};
use agentloop_proto::v1::{OutboundMessage, SystemEvent};
use agentloop_testkit::{NatsServer, ServiceHandle, TestDatabase};

/// Adjusts the runner's configuration before it starts.
pub type RunnerTweak = Box<dyn FnOnce(&mut agentloop_agent_runner::RunnerConfig) + Send>;

/// Adjusts memory's configuration before it starts.
pub type MemoryTweak = Box<dyn FnOnce(&mut agentloop_memory::MemoryConfig) + Send>;

/// Adjusts the gateway's settings before it starts.
pub type GatewayTweak = Box<dyn FnOnce(&mut agentloop_gateway::GatewaySettings) + Send>;

/// How to build a sandbox.
#[derive(Default)]
pub struct SandboxOptions {
    /// Points the runner at this OpenAI base URL instead of the fake model.
    pub model_url: Option<String>,
    /// Changes to the runner's configuration (agents, hooks, budgets).
    pub runner: Option<RunnerTweak>,
    /// In-process tools and hooks for the runner.
    pub extensions: agentloop_agent_runner::Extensions,
    /// Runner replicas (owner ids `runner-0`, `runner-1`, ...); 0 means one.
    pub runners: usize,
    /// Overrides `bus.ack_gather_ms`; the ack wait (5 s) grows to ten times it when needed.
    pub ack_gather_ms: Option<u64>,
    /// Changes to memory's configuration (the inbox cap).
    pub memory: Option<MemoryTweak>,
    /// Starts no delivery service: only what the runner itself publishes reaches anyone.
    pub no_delivery: bool,
    /// Delivery replicas sharing the OUTBOUND consumer; 0 means one.
    pub deliveries: usize,
    /// Overrides `bus.ack_wait_ms` (5 s) for every service.
    pub ack_wait_ms: Option<u64>,
    /// `[channels]` of the gateway, router and delivery (chat apps).
    pub channels: Option<agentloop_channels::ChannelsConfig>,
    /// Changes to the gateway's settings (tick interval, limits).
    pub gateway: Option<GatewayTweak>,
}

/// A running stack.
#[allow(dead_code)] // kept alive for the test and read by later scenarios
pub struct Sandbox {
    pub nats: NatsServer,
    pub db: TestDatabase,
    pub fake: FakeModel,
    pub client: async_nats::Client,
    pub prefix: String,
    pub memory_url: String,
    /// The gateway's HTTP/WebSocket address (changes on [`Sandbox::restart_gateway`]).
    pub gateway_addr: std::net::SocketAddr,
    gateway_config: agentloop_gateway::GatewayConfig,
    gateway: Option<ServiceHandle<String>>,
    services: Vec<ServiceHandle<String>>,
    runners: Vec<(String, ServiceHandle<String>)>,
}

fn handle<E: std::fmt::Debug + Send + 'static, F>(
    name: &'static str,
    fut: impl FnOnce(tokio_util::sync::CancellationToken) -> F,
) -> ServiceHandle<String>
where
    F: std::future::Future<Output = Result<(), E>> + Send + 'static,
{
    agentloop_testkit::spawn(name, move |token| {
        let fut = fut(token);
        async move { fut.await.map_err(|e| format!("{e:?}")) }
    })
}

impl Sandbox {
    pub async fn start() -> anyhow::Result<Self> {
        Self::start_with(SandboxOptions::default()).await
    }

    pub async fn start_with(options: SandboxOptions) -> anyhow::Result<Self> {
        Self::start_with_gateway_tokens(options, Vec::new()).await
    }

    /// Starts a sandbox whose gateway accepts `tokens` (none: loopback only).
    pub async fn start_with_gateway_tokens(
        options: SandboxOptions,
        tokens: Vec<String>,
    ) -> anyhow::Result<Self> {
        agentloop_telemetry::init_for_tests();
        let nats = NatsServer::start()?;
        let db = TestDatabase::create().await?;
        let fake = FakeModel::start(FakeModelConfig::default()).await?;
        let prefix = format!("t{}", &agentloop_bus::nuid()[20..]);
        let mut bus = agentloop_bus::BusConfig {
            url: nats.url().to_owned(),
            prefix: prefix.clone(),
            ..Default::default()
        };
        bus.ack_wait_ms = 5_000;
        if let Some(gather) = options.ack_gather_ms {
            bus.ack_gather_ms = gather;
            bus.ack_wait_ms = bus.ack_wait_ms.max(gather * 10);
        }
        if let Some(wait) = options.ack_wait_ms {
            bus.ack_wait_ms = wait;
        }

        let mut memory_config = agentloop_memory::MemoryConfig::default();
        memory_config.memory.listen = "127.0.0.1:0".to_owned();
        memory_config.memory.database_url = db.url().to_owned();
        if let Some(tweak) = options.memory {
            tweak(&mut memory_config);
        }
        let health = agentloop_lifecycle::Health::new();
        let memory = agentloop_memory::Memory::bind(memory_config, health).await?;
        let memory_url = format!("http://{}", memory.local_addr());
        let mut services = vec![handle("memory", move |t| memory.serve(t))];

        let mut router = agentloop_router::RouterConfig {
            bus: bus.clone(),
            ..Default::default()
        };
        router.memory.url = memory_url.clone();
        router.models.default_model = "openai/fake-echo".to_owned();
        router.channels = options.channels.clone().unwrap_or_default();
        services.push(handle("router", move |t| agentloop_router::run(router, t)));

        let mut runner = agentloop_agent_runner::RunnerConfig {
            bus: bus.clone(),
            ..Default::default()
        };
        runner.memory.url = memory_url.clone();
        runner.models.default_model = "openai/fake-echo".to_owned();
        runner.models.openai_base_url = options
            .model_url
            .clone()
            .unwrap_or_else(|| fake.openai_base_url());
        runner.models.request_timeout_ms = 5_000;
        runner.runner.lease_ttl_ms = 3_000;
        runner.runner.sweep_interval_ms = 500;
        runner.runner.max_turns = 8;
        if let Some(tweak) = options.runner {
            tweak(&mut runner);
        }
        let mut runners = Vec::new();
        for i in 0..options.runners.max(1) {
            let mut replica = runner.clone();
            replica.runner.owner_id = format!("runner-{i}");
            let extensions = options.extensions.clone();
            runners.push((
                replica.runner.owner_id.clone(),
                handle("runner", move |t| {
                    agentloop_agent_runner::run_with(replica, t, extensions)
                }),
            ));
        }

        if !options.no_delivery {
            for _ in 0..options.deliveries.max(1) {
                let delivery = agentloop_delivery::DeliveryConfig {
                    bus: bus.clone(),
                    channels: options.channels.clone().unwrap_or_default(),
                    ..Default::default()
                };
                services.push(handle("delivery", move |t| {
                    agentloop_delivery::run(delivery, t)
                }));
            }
        }

        let mut gateway = agentloop_gateway::GatewayConfig {
            bus: bus.clone(),
            channels: options.channels.clone().unwrap_or_default(),
            ..Default::default()
        };
        gateway.gateway.listen = "127.0.0.1:0".to_owned();
        gateway.gateway.ask_timeout_ms = 20_000;
        gateway.gateway.tokens = tokens.into_iter().map(Into::into).collect();
        gateway.memory.url = memory_url.clone();
        gateway.models.default_model = "openai/fake-echo".to_owned();
        if let Some(tweak) = options.gateway {
            tweak(&mut gateway.gateway);
        }
        let (gateway_handle, gateway_addr) = start_gateway(gateway.clone()).await?;

        let client = async_nats::connect(nats.url()).await?;
        let sandbox = Self {
            nats,
            db,
            fake,
            client,
            prefix,
            memory_url,
            gateway_addr,
            gateway_config: gateway,
            gateway: Some(gateway_handle),
            services,
            runners,
        };
        sandbox.wait_ready(!options.no_delivery).await?;
        Ok(sandbox)
    }

    /// Waits until every stream and durable consumer exists, i.e. every service is consuming.
    async fn wait_ready(&self, delivery: bool) -> anyhow::Result<()> {
        // Memory answers UNAVAILABLE until its database is migrated.
        let channel = agentloop_telemetry::traced_channel(&self.memory_url, "")?;
        let memory =
            agentloop_proto::v1::session_service_client::SessionServiceClient::new(channel);
        agentloop_testkit::wait_until("memory ready", Duration::from_secs(20), || {
            let mut memory = memory.clone();
            async move {
                memory
                    .get_history(agentloop_proto::v1::GetHistoryRequest {
                        session_id: uuid::Uuid::nil().to_string(),
                        limit: 1,
                    })
                    .await
                    .ok()
            }
        })
        .await?;
        let js = async_nats::jetstream::new(self.client.clone());
        let upper = self.prefix.to_uppercase();
        let mut wanted = vec![
            (format!("{upper}_INBOUND"), "router"),
            (format!("{upper}_RUNS"), "runner"),
        ];
        if delivery {
            wanted.push((format!("{upper}_OUTBOUND"), "delivery"));
        }
        agentloop_testkit::wait_until("services consuming", Duration::from_secs(20), || {
            let js = js.clone();
            let wanted = wanted.clone();
            async move {
                for (stream, consumer) in &wanted {
                    let stream = js.get_stream(stream).await.ok()?;
                    stream
                        .get_consumer::<async_nats::jetstream::consumer::pull::Config>(consumer)
                        .await
                        .ok()?;
                }
                Some(())
            }
        })
        .await?;
        // The gateway subscribes to ask after connecting; a request proves it.
        agentloop_testkit::wait_until("gateway answering ask", Duration::from_secs(20), || {
            let client = self.client.clone();
            let subject = self.subject("ask");
            async move {
                let reply = tokio::time::timeout(
                    Duration::from_secs(2),
                    client.request(subject, "{}".into()),
                )
                .await
                .ok()?
                .ok()?;
                Some(reply)
            }
        })
        .await?;
        Ok(())
    }

    /// Stops the gateway and starts a fresh one (new port, nothing kept in its memory).
    pub async fn restart_gateway(&mut self) -> anyhow::Result<()> {
        if let Some(gateway) = self.gateway.take() {
            gateway.shutdown().await?;
        }
        let (handle, addr) = start_gateway(self.gateway_config.clone()).await?;
        self.gateway = Some(handle);
        self.gateway_addr = addr;
        Ok(())
    }

    /// Subscribes to `<prefix>.<rest>` with the sandbox's client.
    pub async fn subscribe(&self, rest: &str) -> async_nats::Subscriber {
        let subscriber = self
            .client
            .subscribe(self.subject(rest))
            .await
            .expect("the sandbox's nats-server accepts subscriptions");
        // The subscription must be in place on the server before another connection publishes
        // what the test waits for; a flush only writes it to the socket.
        agentloop_testkit::round_trip(&self.client)
            .await
            .expect("the sandbox's nats-server answers");
        subscriber
    }

    pub fn subject(&self, rest: &str) -> String {
        format!("{}.{}", self.prefix, rest)
    }

    /// Publishes JSON on `<prefix>.inbound.<channel>` the way `nats pub` does.
    pub async fn publish_json(&self, channel: &str, json: serde_json::Value) -> anyhow::Result<()> {
        self.client
            .publish(
                self.subject(&format!("inbound.{channel}")),
                json.to_string().into(),
            )
            .await?;
        self.client.flush().await?;
        Ok(())
    }

    /// Publishes a plain text message to `session_key` on the `cli` channel, as JSON.
    pub async fn say(&self, session_key: &str, text: &str) -> anyhow::Result<()> {
        self.publish_json(
            "cli",
            serde_json::json!({"sessionKey": session_key, "text": text}),
        )
        .await
    }

    pub async fn pool(&self) -> anyhow::Result<sqlx::PgPool> {
        self.db.pool().await
    }

    /// Waits until `n` runs are finished: a reply is published just before its run is marked
    /// finished, so a test that saw the reply may be a moment early.
    pub async fn finished_runs(&self, n: i64) -> anyhow::Result<sqlx::PgPool> {
        let pool = self.db.pool().await?;
        agentloop_testkit::wait_until("runs finished", Duration::from_secs(20), || {
            let pool = pool.clone();
            async move {
                let done: i64 =
                    sqlx::query_scalar("SELECT count(*) FROM runs WHERE finished_at IS NOT NULL")
                        .fetch_one(&pool)
                        .await
                        .ok()?;
                (done >= n).then_some(())
            }
        })
        .await?;
        Ok(pool)
    }

    /// Stops one runner replica gracefully.
    pub async fn stop_runner(&mut self, owner_id: &str) -> anyhow::Result<()> {
        let index = self
            .runners
            .iter()
            .position(|(id, _)| id == owner_id)
            .with_context(|| format!("no runner {owner_id}"))?;
        let (_, handle) = self.runners.remove(index);
        handle.shutdown().await
    }

    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        self.stop_services().await?;
        self.fake.shutdown().await;
        Ok(())
    }

    /// Stops every service as a deployment would (SIGTERM), leaving NATS, Postgres and the fake
    /// model up so a test can see what the services left behind.
    pub async fn stop_services(&mut self) -> anyhow::Result<()> {
        // Stop in reverse start order so nothing is left waiting on a stopped dependency.
        if let Some(gateway) = self.gateway.take() {
            gateway.shutdown().await?;
        }
        for (_, runner) in std::mem::take(&mut self.runners) {
            runner.shutdown().await?;
        }
        for service in std::mem::take(&mut self.services).into_iter().rev() {
            service.shutdown().await?;
        }
        Ok(())
    }
}

async fn start_gateway(
    config: agentloop_gateway::GatewayConfig,
) -> anyhow::Result<(ServiceHandle<String>, std::net::SocketAddr)> {
    let gateway =
        agentloop_gateway::Gateway::bind(config, agentloop_lifecycle::Health::new()).await?;
    let addr = gateway.local_addr()?;
    Ok((handle("gateway", move |t| gateway.serve(t)), addr))
}

/// Collects SystemEvents from a subscription until a run's lifecycle end or error.
pub async fn collect_run_events(
    sub: &mut async_nats::Subscriber,
    timeout: Duration,
) -> anyhow::Result<Vec<SystemEvent>> {
    let mut events = Vec::new();
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let msg = tokio::time::timeout_at(deadline, sub.next())
            .await
            .context("timed out waiting for the run's end event")?
            .context("event subscription closed")?;
        let (event, _) = agentloop_bus::decode::<SystemEvent>(&msg)?;
        let done = event.stream == "lifecycle" && (event.phase == "end" || event.phase == "error");
        events.push(event);
        if done {
            return Ok(events);
        }
    }
}

/// The reason a dead letter carries (its error header).
pub fn dead_letter_reason(letter: &async_nats::Message) -> String {
    letter
        .headers
        .as_ref()
        .and_then(|h| h.get(agentloop_bus::HEADER_ERROR))
        .map(|v| v.as_str().to_owned())
        .unwrap_or_default()
}

/// Waits for the next delivered reply on a subscription.
pub async fn next_reply(
    sub: &mut async_nats::Subscriber,
    timeout: Duration,
) -> anyhow::Result<OutboundMessage> {
    let msg = tokio::time::timeout(timeout, sub.next())
        .await
        .context("timed out waiting for a delivered reply")?
        .context("delivery subscription closed")?;
    let (reply, _) = agentloop_bus::decode::<OutboundMessage>(&msg)?;
    Ok(reply)
}

/// The value of the counter `name` (no labels) on a service's `/metrics` at `admin`.
pub async fn metric(admin: &str, name: &str) -> f64 {
    let text = reqwest::get(format!("http://{admin}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
        .trim()
        .parse()
        .unwrap()
}
