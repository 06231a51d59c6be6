//! A service started as its own operating-system process (`agentloop <service>`), so a test can
//! `kill -9` it, send it SIGTERM and watch it exit, the way an orchestrator would.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// One `agentloop <service>` process with its admin address; killed on drop.
pub struct ServiceProcess {
    name: String,
    child: Child,
    admin: String,
    log: PathBuf,
    exit: Option<ExitStatus>,
}

impl ServiceProcess {
    /// Starts `bin service` with a clean environment plus `env`, its admin endpoints on a free
    /// loopback port (`AGENTLOOP_<SERVICE>__ADMIN_LISTEN`, or `AGENTLOOP_GATEWAY__LISTEN` for the
    /// gateway) and its logs in a file (`RUST_LOG` is passed through, default `info`).
    ///
    /// # Errors
    /// When the process cannot be started.
    pub fn spawn(
        bin: &Path,
        service: &str,
        name: &str,
        env: &[(String, String)],
    ) -> anyhow::Result<Self> {
        Self::spawn_on(bin, service, name, env, None)
    }

    /// Like [`ServiceProcess::spawn`], on another "host": in network namespace `host.netns`,
    /// its admin endpoints on `host.ip` (reachable from the test while the host's link is up).
    ///
    /// # Errors
    /// When the process cannot be started.
    pub fn spawn_in(
        bin: &Path,
        service: &str,
        name: &str,
        env: &[(String, String)],
        host: &crate::Host,
    ) -> anyhow::Result<Self> {
        Self::spawn_on(bin, service, name, env, Some(host))
    }

    fn spawn_on(
        bin: &Path,
        service: &str,
        name: &str,
        env: &[(String, String)],
        host: Option<&crate::Host>,
    ) -> anyhow::Result<Self> {
        let ip = host.map_or("127.0.0.1", |h| h.ip.as_str());
        let admin = format!("{ip}:{}", crate::free_port()?);
        let log = std::env::temp_dir().join(format!(
            "agentloop-{name}-{}.log",
            uuid::Uuid::new_v4().simple()
        ));
        let file = std::fs::File::create(&log)?;
        // In `all` mode the gateway's address serves the admin endpoints of the whole process.
        let admin_key = if service == "gateway" || service == "all" {
            "AGENTLOOP_GATEWAY__LISTEN".to_owned()
        } else {
            format!("AGENTLOOP_{}__ADMIN_LISTEN", service.to_ascii_uppercase())
        };
        let mut command = crate::netns::command_in(host.map(|h| h.netns.as_str()), bin);
        command
            .arg(service)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".to_owned()),
            )
            .env(admin_key, &admin)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file);
        for (key, value) in env {
            command.env(key, value);
        }
        let child = command
            .spawn()
            .with_context(|| format!("failed to start {} {service}", bin.display()))?;
        Ok(Self {
            name: name.to_owned(),
            child,
            admin,
            log,
            exit: None,
        })
    }

    /// Returns the name given at spawn.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Returns the process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Returns the admin address (`host:port`).
    pub fn admin_addr(&self) -> &str {
        &self.admin
    }

    /// Returns whether `/readyz` answers 200.
    pub async fn is_ready(&self) -> bool {
        http_status(&self.admin, "/readyz").await == Some(200)
    }

    /// Waits until `/readyz` answers 200.
    ///
    /// # Errors
    /// When the process exits or `timeout` passes first; the message carries its logs.
    pub async fn wait_ready(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.is_ready().await {
                return Ok(());
            }
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "{} exited with {status} before ready:\n{}",
                    self.name,
                    self.logs()
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "{} not ready after {timeout:?}:\n{}",
                    self.name,
                    self.logs()
                );
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Kills the process with SIGKILL, like a crashed node, and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        if let Ok(status) = self.child.wait() {
            self.exit = Some(status);
        }
    }

    /// Sends SIGTERM, like an orchestrator stopping a pod.
    ///
    /// # Errors
    /// When the signal cannot be sent.
    pub fn terminate(&self) -> anyhow::Result<()> {
        let status = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .context("failed to run kill")?;
        if !status.success() {
            bail!("kill -TERM {} failed", self.pid());
        }
        Ok(())
    }

    /// Waits for the process to exit and returns its status.
    ///
    /// # Errors
    /// When it is still running after `timeout`.
    pub async fn wait_exit(&mut self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.exit {
                return Ok(status);
            }
            if let Some(status) = self.child.try_wait()? {
                self.exit = Some(status);
                return Ok(status);
            }
            if Instant::now() > deadline {
                bail!(
                    "{} still running {timeout:?} after the signal:\n{}",
                    self.name,
                    self.logs()
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Returns what the process logged so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for ServiceProcess {
    fn drop(&mut self) {
        if self.exit.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::env::var_os("TEST_KEEP_LOGS").is_none() {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}

/// Returns the status code of `GET path` on `addr`, or `None` when nothing answers.
pub async fn http_status(addr: &str, path: &str) -> Option<u16> {
    let attempt = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await.ok()?;
        response.split_whitespace().nth(1)?.parse().ok()
    };
    tokio::time::timeout(Duration::from_secs(2), attempt)
        .await
        .ok()
        .flatten()
}
