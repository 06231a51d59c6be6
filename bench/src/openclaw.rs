//! OpenClaw as a peer under the same load: writes its config (from
//! `bench/openclaw/openclaw.json5`), starts `openclaw gateway run` headless on loopback with its
//! model provider pointed at the bench's fake model, waits for it to be ready, and stops it.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use tokio::process::{Child, Command};

use crate::procfs;

/// The config template; `@PORT@`, `@TOKEN@`, `@RUN@` and `@MODEL_BASE_URL@` are replaced.
const CONFIG_TEMPLATE: &str = include_str!("../openclaw/openclaw.json5");

/// Bearer token of the bench's OpenClaw gateway (loopback only).
pub const TOKEN: &str = "bench-token";

/// How long OpenClaw may take to become ready (PEERS.md: 11.5–19 s).
const READY_LIMIT: Duration = Duration::from_secs(120);

/// Where OpenClaw comes from and how it is wired.
#[derive(Debug, Clone)]
pub struct OpenClawConfig {
    /// The Node 24 binary.
    pub node: PathBuf,
    /// The npm project holding `node_modules/openclaw`.
    pub package_dir: PathBuf,
    /// Scratch directory: home, state, workspace, config, logs.
    pub run_dir: PathBuf,
    /// Loopback port of its gateway.
    pub port: u16,
    /// `http://127.0.0.1:PORT/v1` of the fake model.
    pub model_base_url: String,
}

/// A running OpenClaw gateway.
pub struct OpenClaw {
    child: Child,
    /// The gateway's (main process's) pid.
    pub pid: u32,
    /// `http://127.0.0.1:PORT`
    pub base: String,
    log: PathBuf,
}

impl OpenClaw {
    /// Writes the config, starts the gateway and waits until it answers `/readyz` (or
    /// `/healthz` when there is no `/readyz`). Returns it and the time from spawn to ready.
    ///
    /// # Errors
    /// When the package is missing, the process exits, or it is not ready in time.
    pub async fn start(config: &OpenClawConfig) -> anyhow::Result<(Self, Duration)> {
        let entry = config
            .package_dir
            .join("node_modules/openclaw/openclaw.mjs");
        if !entry.is_file() {
            bail!(
                "{} not found: install OpenClaw first (./scripts/bench.sh --openclaw does)",
                entry.display()
            );
        }
        if !config.node.is_file() {
            bail!("Node binary {} not found", config.node.display());
        }
        let run = &config.run_dir;
        for dir in ["home", "state", "workspace"] {
            std::fs::create_dir_all(run.join(dir))
                .with_context(|| format!("failed to create {}", run.join(dir).display()))?;
        }
        let config_path = run.join("state/openclaw.json");
        let text = CONFIG_TEMPLATE
            .replace("@PORT@", &config.port.to_string())
            .replace("@TOKEN@", TOKEN)
            .replace("@RUN@", &run.display().to_string())
            .replace("@MODEL_BASE_URL@", &config.model_base_url);
        std::fs::write(&config_path, text)
            .with_context(|| format!("failed to write {}", config_path.display()))?;
        let log = run.join("gateway.out.log");
        let out = std::fs::File::create(&log)
            .with_context(|| format!("failed to create {}", log.display()))?;
        let node_dir = config
            .node
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let path = format!(
            "{}:{}",
            node_dir.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut cmd = Command::new(&config.node);
        cmd.arg(&entry)
            .args(["gateway", "run", "--port", &config.port.to_string()])
            .current_dir(&config.package_dir)
            .env_clear()
            .env("PATH", path)
            .env("HOME", run.join("home"))
            .env("OPENCLAW_STATE_DIR", run.join("state"))
            .env("OPENCLAW_CONFIG_PATH", &config_path)
            .env("OPENCLAW_GATEWAY_TOKEN", TOKEN)
            .env("OPENCLAW_SKIP_CHANNELS", "1")
            .env("OPENCLAW_DISABLE_BONJOUR", "1")
            .env("OPENCLAW_NO_RESPAWN", "1")
            .env("OPENCLAW_EXEC_SHELL_SNAPSHOT", "0")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            // Its own process group, so what it spawns can be stopped with it.
            .process_group(0)
            .kill_on_drop(true);
        if let Ok(lang) = std::env::var("LANG") {
            cmd.env("LANG", lang);
        }
        let started = Instant::now();
        let child = cmd.spawn().context("failed to start openclaw")?;
        let pid = child.id().context("openclaw has no pid")?;
        let mut gateway = Self {
            child,
            pid,
            base: format!("http://127.0.0.1:{}", config.port),
            log,
        };
        match gateway.wait_ready(started).await {
            Ok(()) => Ok((gateway, started.elapsed())),
            Err(err) => {
                gateway.stop().await;
                Err(err)
            }
        }
    }

    async fn wait_ready(&mut self, started: Instant) -> anyhow::Result<()> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()?;
        let get = |path: &str| {
            http.get(format!("{}{path}", self.base))
                .bearer_auth(TOKEN)
                .send()
        };
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "openclaw exited with {status} before it was ready; its output:\n{}",
                    self.tail()
                );
            }
            if let Ok(response) = get("/readyz").await {
                let status = response.status().as_u16();
                if status == 200 {
                    return Ok(());
                }
                if status == 404
                    && let Ok(health) = get("/healthz").await
                    && health.status().is_success()
                {
                    return Ok(());
                }
            }
            if started.elapsed() > READY_LIMIT {
                bail!(
                    "openclaw not ready after {READY_LIMIT:?}; its output:\n{}",
                    self.tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The gateway and every process below it.
    pub fn tree(&self) -> Vec<u32> {
        procfs::process_tree(self.pid)
    }

    /// Resident memory of the whole tree, KiB.
    pub fn rss_kib(&self) -> u64 {
        self.tree()
            .iter()
            .filter_map(|p| procfs::sample(*p))
            .map(|s| s.rss_kib)
            .sum()
    }

    /// Freezes its process tree (SIGSTOP): idle, its timers and collector still take a tenth
    /// to a fifth of a core, which the other system's phase should not share.
    pub fn pause(&self) {
        for pid in self.tree() {
            signal("-STOP", &pid.to_string());
        }
    }

    /// Lets a frozen tree run again (SIGCONT).
    pub fn resume(&self) {
        for pid in self.tree() {
            signal("-CONT", &pid.to_string());
        }
    }

    /// The last lines of its output.
    pub fn tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// SIGTERM to the gateway (its workers go with it), SIGKILL to its process group after 15 s.
    pub async fn stop(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        let tree = self.tree();
        // A frozen tree would not act on the TERM.
        self.resume();
        signal("-TERM", &self.pid.to_string());
        if tokio::time::timeout(Duration::from_secs(15), self.child.wait())
            .await
            .is_err()
        {
            eprintln!("openclaw did not stop in 15 s, killing its process group");
            signal("-KILL", &format!("-{}", self.pid));
            let _ = self.child.kill().await;
        }
        // Workers of its process group still alive (they should not be) are killed with it.
        if tree
            .iter()
            .any(|p| *p != self.pid && procfs::sample(*p).is_some())
        {
            signal("-KILL", &format!("-{}", self.pid));
        }
    }
}

fn signal(sig: &str, target: &str) {
    let _ = std::process::Command::new("kill")
        .args([sig, "--", target])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}
