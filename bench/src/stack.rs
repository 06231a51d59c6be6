//! The stack under test: its own nats-server (JetStream, temp store), the fake model and every
//! agentloop service as a separate process (or all of them in one `agentloop all` process) on
//! fixed loopback ports, a fresh Postgres database, and their orderly teardown.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::process::{Child, Command};

use crate::procfs;
use crate::setup::StackMode;

/// The name of the one process of [`StackMode::All`] (also its CPU accounting group).
pub const ALL_PROCESS: &str = "agentloop";

/// Where the stack's pieces come from.
#[derive(Debug, Clone)]
pub struct StackConfig {
    /// Directory holding `agentloop` and `agentloop-fake-model`.
    pub bin_dir: PathBuf,
    /// The nats-server binary (2.11+).
    pub nats_server: PathBuf,
    /// Postgres server URL without a database name.
    pub pg_base: String,
    /// Scratch directory: logs and the JetStream store.
    pub run_dir: PathBuf,
    /// `RUST_LOG` of the services.
    pub rust_log: String,
    /// Requests the fake model keeps for `/_fake/requests` (0: none).
    pub model_recorded: usize,
    /// Separate service processes, or one `agentloop all`.
    pub mode: StackMode,
    /// Settings every service gets on top of the bench's own (`AGENTLOOP_RUNNER__…`).
    pub service_env: Vec<(String, String)>,
    /// nats-server nodes: 1, or a cluster on loopback (each write synced to disk, streams
    /// replicated on every node, the services given every node as a seed).
    pub nats_nodes: usize,
}

impl StackConfig {
    /// The stack `options` describe, in `run_dir`: separate processes or `all` as `mode` says,
    /// one nats-server, the services at `BENCH_RUST_LOG` or `log`.
    pub fn from_options(
        options: &crate::options::Options,
        run_dir: PathBuf,
        mode: StackMode,
        log: &str,
    ) -> Self {
        Self {
            bin_dir: options.bin_dir.clone(),
            nats_server: options.nats_server.clone(),
            pg_base: options.pg_base.clone(),
            run_dir,
            rust_log: std::env::var("BENCH_RUST_LOG").unwrap_or_else(|_| log.to_owned()),
            model_recorded: 0,
            mode,
            service_env: Vec::new(),
            nats_nodes: 1,
        }
    }
}

/// A process the bench started.
pub struct Proc {
    /// Display name (`runner`, `runner-2`, `nats-server`, ...).
    pub name: String,
    /// Its pid.
    pub pid: u32,
    child: Child,
    /// Where `/readyz` answers, for services.
    pub admin: Option<SocketAddr>,
}

/// The running stack.
pub struct Stack {
    config: StackConfig,
    /// Processes in start order.
    pub procs: Vec<Proc>,
    /// `nats://127.0.0.1:<port>`
    pub nats_url: String,
    /// The bench database.
    pub db_name: String,
    /// URL of the bench database.
    pub database_url: String,
    memory_addr: SocketAddr,
    model_addr: SocketAddr,
}

/// Returns a free loopback port (bound and released; good enough on a quiet machine).
pub fn free_port() -> anyhow::Result<u16> {
    let listener =
        std::net::TcpListener::bind("127.0.0.1:0").context("failed to bind a probe port")?;
    Ok(listener.local_addr()?.port())
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

impl Stack {
    /// Prepares ports and names; nothing is started yet.
    pub fn new(config: StackConfig) -> anyhow::Result<Self> {
        let stamp = chrono::Utc::now().format("%Y%m%d_%H%M%S").to_string();
        let db_name = format!("agentloop_bench_{stamp}_{}", std::process::id());
        let database_url = format!("{}/{}", config.pg_base.trim_end_matches('/'), db_name);
        std::fs::create_dir_all(config.run_dir.join("logs"))
            .with_context(|| format!("failed to create {}", config.run_dir.display()))?;
        Ok(Self {
            nats_url: format!("nats://127.0.0.1:{}", free_port()?),
            memory_addr: loopback(free_port()?),
            model_addr: loopback(free_port()?),
            config,
            procs: Vec::new(),
            db_name,
            database_url,
        })
    }

    /// Starts nats-server, the fake model and the five services (or `agentloop all`), each
    /// waited for.
    ///
    /// # Errors
    /// When a process exits or does not become ready in time.
    pub async fn start(&mut self) -> anyhow::Result<()> {
        if self.config.nats_nodes > 1 {
            self.start_nats_cluster().await?;
        } else {
            self.start_nats().await?;
        }

        let mut model = Command::new(self.config.bin_dir.join("agentloop-fake-model"));
        model.args([
            "--listen",
            &self.model_addr.to_string(),
            "--max-recorded",
            &self.config.model_recorded.to_string(),
        ]);
        self.spawn("fake-model", model, None)?;
        wait_tcp(self.model_addr, Duration::from_secs(15)).await?;

        // The WebSocket phases send faster than the default per-connection rate limit (20/s).
        let gateway_env = [
            ("AGENTLOOP_GATEWAY__RATE_LIMIT_PER_SEC", "1000000"),
            ("AGENTLOOP_GATEWAY__RATE_LIMIT_BURST", "1000000"),
        ];
        if self.config.mode == StackMode::All {
            // The same settings as the separate services get; its gateway's address serves
            // readiness for the whole process.
            self.start_service(ALL_PROCESS, "all", &gateway_env).await?;
            return self.check_external_model();
        }
        // Memory first: it creates the database and runs migrations the others depend on.
        self.start_service("memory", "memory", &[]).await?;
        self.start_service("router", "router", &[]).await?;
        self.start_service("runner", "runner", &[]).await?;
        self.start_service("delivery", "delivery", &[]).await?;
        self.start_service("gateway", "gateway", &gateway_env)
            .await?;
        Ok(())
    }

    /// One nats-server, JetStream on file storage in the run directory.
    async fn start_nats(&mut self) -> anyhow::Result<()> {
        let nats_port: u16 = self
            .nats_url
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .context("nats url has no port")?;
        let store = self.config.run_dir.join("jetstream");
        let mut nats = Command::new(&self.config.nats_server);
        nats.args([
            "-a",
            "127.0.0.1",
            "-p",
            &nats_port.to_string(),
            "-js",
            "-sd",
        ])
        .arg(&store);
        // nats-server's monitoring endpoint (`/jsz`, `/varz`), to watch where messages wait.
        if let Ok(port) = std::env::var("BENCH_NATS_MONITOR_PORT") {
            nats.args(["-m", &port]);
        }
        nats.env("GOMAXPROCS", nats_gomaxprocs());
        self.spawn("nats-server", nats, None)?;
        wait_tcp(loopback(nats_port), Duration::from_secs(15)).await
    }

    /// `nats_nodes` nats-servers clustered on loopback, as production runs them: every write
    /// synced to disk (`sync_interval: always`); the services get every node as a seed and
    /// three-way replicated streams.
    async fn start_nats_cluster(&mut self) -> anyhow::Result<()> {
        let n = self.config.nats_nodes;
        let mut ports = Vec::with_capacity(n);
        for _ in 0..n {
            ports.push((free_port()?, free_port()?));
        }
        let routes: Vec<String> = ports
            .iter()
            .map(|(_, route)| format!("\"nats://127.0.0.1:{route}\""))
            .collect();
        for (i, (client, route)) in ports.iter().enumerate() {
            let name = if i == 0 {
                "nats-server".to_owned()
            } else {
                format!("nats-server-{}", i + 1)
            };
            let conf = self.config.run_dir.join(format!("{name}.conf"));
            std::fs::write(
                &conf,
                format!(
                    "server_name: n{}\nlisten: \"127.0.0.1:{client}\"\n\
                     jetstream {{\n  store_dir: \"{}\"\n  sync_interval: always\n}}\n\
                     cluster {{\n  name: agentloop-bench\n  listen: \"127.0.0.1:{route}\"\n  routes: [{}]\n}}\n",
                    i + 1,
                    self.config
                        .run_dir
                        .join(format!("jetstream-{}", i + 1))
                        .display(),
                    routes.join(", ")
                ),
            )?;
            let mut nats = Command::new(&self.config.nats_server);
            nats.arg("-c").arg(&conf);
            nats.env("GOMAXPROCS", nats_gomaxprocs());
            self.spawn(&name, nats, None)?;
        }
        for (client, _) in &ports {
            wait_tcp(loopback(*client), Duration::from_secs(15)).await?;
        }
        self.nats_url = ports
            .iter()
            .map(|(client, _)| format!("nats://127.0.0.1:{client}"))
            .collect::<Vec<_>>()
            .join(",");
        self.config
            .service_env
            .push(("AGENTLOOP_BUS__REPLICAS".to_owned(), n.min(3).to_string()));
        // The services create their streams once JetStream has a meta leader; they retry
        // until then, so nothing more to wait for here.
        Ok(())
    }

    /// Starts the memory service alone (it creates the database and runs the migrations), for
    /// a bench that only calls its gRPC API; waits until it is ready.
    ///
    /// # Errors
    /// When it exits or does not become ready in time.
    pub async fn start_memory(&mut self) -> anyhow::Result<()> {
        self.start_service("memory", "memory", &[]).await
    }

    /// Where memory's gRPC API answers (`http://127.0.0.1:<port>`).
    pub fn memory_url(&self) -> String {
        format!("http://{}", self.memory_addr)
    }

    /// `agentloop all` starts a fake model of its own when no provider is configured: the bench
    /// gives it the same model settings as the separate services, so it must not have.
    fn check_external_model(&self) -> anyhow::Result<()> {
        let log = std::fs::read_to_string(self.log_path(ALL_PROCESS)).unwrap_or_default();
        if log.contains("built-in fake model") {
            bail!(
                "`agentloop all` started its built-in fake model instead of using the bench's at {}",
                self.model_addr
            );
        }
        Ok(())
    }

    /// Starts one more runner replica (for the scaling phase) and waits until it is ready.
    ///
    /// # Errors
    /// When it does not become ready, or in [`StackMode::All`] (one runner in its process).
    pub async fn add_runner(&mut self, name: &str) -> anyhow::Result<()> {
        if self.config.mode == StackMode::All {
            bail!("`agentloop all` runs one runner: a second runner needs --mode separate");
        }
        self.start_service(name, "runner", &[]).await
    }

    async fn start_service(
        &mut self,
        name: &str,
        command: &str,
        extra_env: &[(&str, &str)],
    ) -> anyhow::Result<()> {
        let admin = loopback(free_port()?);
        let mut cmd = Command::new(self.config.bin_dir.join("agentloop"));
        cmd.arg(command);
        // The bench's stack is defined here alone: no inherited agentloop or provider settings.
        for (key, _) in std::env::vars() {
            if key.starts_with("AGENTLOOP_")
                || key.starts_with("OPENAI_")
                || key.starts_with("ANTHROPIC_")
                || key.starts_with("OTEL_")
                || key == "NATS_URL"
                || key == "DATABASE_URL"
            {
                cmd.env_remove(key);
            }
        }
        // `all` serves health, readiness and metrics of every service on its gateway's address.
        let admin_key = match command {
            "gateway" | "all" => "AGENTLOOP_GATEWAY__LISTEN".to_owned(),
            other => format!("AGENTLOOP_{}__ADMIN_LISTEN", other.to_ascii_uppercase()),
        };
        cmd.env("RUST_LOG", &self.config.rust_log)
            .env("NATS_URL", &self.nats_url)
            .env("DATABASE_URL", &self.database_url)
            .env("AGENTLOOP_BUS__PREFIX", crate::PREFIX)
            .env("AGENTLOOP_MEMORY__LISTEN", self.memory_addr.to_string())
            .env(
                "AGENTLOOP_MEMORY__URL",
                format!("http://{}", self.memory_addr),
            )
            .env("AGENTLOOP_MODEL", "openai/fake")
            .env("OPENAI_BASE_URL", format!("http://{}/v1", self.model_addr))
            .env("OPENAI_API_KEY", "sk-bench")
            .env(admin_key, admin.to_string());
        for (key, value) in extra_env {
            cmd.env(key, value);
        }
        for (key, value) in &self.config.service_env {
            cmd.env(key, value);
        }
        // Experiments: `BENCH_SERVICE_ENV="KEY=value,KEY2=value"` reaches every service.
        if let Ok(pairs) = std::env::var("BENCH_SERVICE_ENV") {
            for (key, value) in pairs.split(',').filter_map(|pair| pair.split_once('=')) {
                cmd.env(key.trim(), value.trim());
            }
        }
        self.spawn(name, cmd, Some(admin))?;
        self.wait_ready(name, Duration::from_secs(60)).await
    }

    fn spawn(
        &mut self,
        name: &str,
        mut cmd: Command,
        admin: Option<SocketAddr>,
    ) -> anyhow::Result<()> {
        let log_path = self.log_path(name);
        let log = std::fs::File::create(&log_path)
            .with_context(|| format!("failed to create {}", log_path.display()))?;
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true);
        let child = cmd
            .spawn()
            .with_context(|| format!("failed to start {name}"))?;
        let pid = child.id().context("child has no pid")?;
        self.procs.push(Proc {
            name: name.to_owned(),
            pid,
            child,
            admin,
        });
        Ok(())
    }

    fn log_path(&self, name: &str) -> PathBuf {
        self.config.run_dir.join("logs").join(format!("{name}.log"))
    }

    async fn wait_ready(&mut self, name: &str, limit: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            let proc = self
                .procs
                .iter_mut()
                .find(|p| p.name == name)
                .context("unknown process")?;
            if let Some(status) = proc.child.try_wait()? {
                bail!(
                    "{name} exited with {status} before it was ready; log:\n{}",
                    tail(&self.log_path(name))
                );
            }
            if let Some(addr) = proc.admin
                && let Ok((200, _)) = http_get(addr, "/readyz").await
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "{name} not ready after {limit:?}; log:\n{}",
                    tail(&self.log_path(name))
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `(pid, group)` of every process whose CPU counts, plus the Postgres processes given.
    pub fn pids(&self) -> Vec<(u32, String)> {
        self.procs
            .iter()
            .map(|p| (p.pid, group_of(&p.name)))
            .collect()
    }

    /// Where the named process answers `/readyz` and `/metrics`: in [`StackMode::All`], every
    /// service's name leads to the one process's gateway address.
    fn admin_of(&self, name: &str) -> Option<SocketAddr> {
        let name = match self.config.mode {
            StackMode::All if SERVICES.contains(&name) => ALL_PROCESS,
            _ => name,
        };
        self.procs.iter().find(|p| p.name == name)?.admin
    }

    /// The stack mode.
    pub fn mode(&self) -> StackMode {
        self.config.mode
    }

    /// Reads one counter from a service's `/metrics`.
    pub async fn metric(&self, name: &str, metric: &str) -> Option<u64> {
        let addr = self.admin_of(name)?;
        let (_, body) = http_get(addr, "/metrics").await.ok()?;
        body.lines()
            .find_map(|l| l.strip_prefix(metric)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    }

    /// Memory's run-path counters: calls carried, and the batches they went in.
    pub async fn memory_batches(&self) -> Option<(u64, u64)> {
        let calls = self
            .metric("memory", "agentloop_memory_batched_calls_total")
            .await?;
        let batches = self
            .metric("memory", "agentloop_memory_batches_total")
            .await?;
        Some((calls, batches))
    }

    /// Stops everything in reverse start order: SIGTERM, then SIGKILL after a grace period.
    pub async fn shutdown(&mut self) {
        while let Some(proc) = self.procs.pop() {
            terminate(proc).await;
        }
    }

    /// Stops one process (a runner replica added for the scaling phases) as [`Self::shutdown`]
    /// stops each.
    ///
    /// # Errors
    /// When no process has that name.
    pub async fn stop(&mut self, name: &str) -> anyhow::Result<()> {
        let at = self
            .procs
            .iter()
            .position(|p| p.name == name)
            .with_context(|| format!("no process named {name}"))?;
        terminate(self.procs.remove(at)).await;
        Ok(())
    }

    /// The gateway's HTTP address (clients, `/ws`, `/v1/chat/completions`).
    pub fn gateway_addr(&self) -> Option<SocketAddr> {
        self.admin_of("gateway")
    }

    /// The fake model's address.
    pub fn model_addr(&self) -> SocketAddr {
        self.model_addr
    }

    /// The scratch directory.
    pub fn run_dir(&self) -> &Path {
        &self.config.run_dir
    }
}

/// SIGTERM, then SIGKILL when the process has not exited after its grace period (a runner
/// drains its runs first, so it gets longer).
async fn terminate(mut proc: Proc) {
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &proc.pid.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    let grace = Duration::from_secs(
        if proc.name.starts_with("runner") || proc.name == ALL_PROCESS {
            10
        } else {
            5
        },
    );
    if tokio::time::timeout(grace, proc.child.wait())
        .await
        .is_err()
    {
        eprintln!("{} did not stop in {grace:?}, killing it", proc.name);
        let _ = proc.child.kill().await;
    }
}

/// The five services' names.
const SERVICES: [&str; 5] = ["memory", "router", "runner", "delivery", "gateway"];

/// The CPU accounting group of a process name (`runner-2` counts as `runner`).
pub fn group_of(name: &str) -> String {
    if name.starts_with("runner") {
        "runner".to_owned()
    } else if name.starts_with("nats-server") {
        "nats-server".to_owned()
    } else {
        name.to_owned()
    }
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

async fn wait_tcp(addr: SocketAddr, limit: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        if Instant::now() > deadline {
            bail!("nothing listens on {addr} after {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    Ok(())
}

/// A minimal HTTP/1.0 GET: returns the status code and body.
async fn http_get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    let io = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await?;
        let mut buf = Vec::new();
        stream.read_to_end(&mut buf).await?;
        anyhow::Ok(String::from_utf8_lossy(&buf).into_owned())
    };
    let text = tokio::time::timeout(Duration::from_secs(2), io)
        .await
        .context("http timeout")??;
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("no http status")?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// RSS per process name.
pub fn rss_by_name(stack: &Stack) -> Vec<(String, u64)> {
    stack
        .procs
        .iter()
        .map(|p| {
            (
                p.name.clone(),
                procfs::sample(p.pid).map_or(0, |s| s.rss_kib),
            )
        })
        .collect()
}

/// One Go scheduler thread: on two cores shared with eight other processes, a second one only
/// added handoffs between threads (A/B in bench/HISTORY.md). BENCH_NATS_GOMAXPROCS overrides it.
fn nats_gomaxprocs() -> String {
    std::env::var("BENCH_NATS_GOMAXPROCS").unwrap_or_else(|_| "1".to_owned())
}
