//! A three-node nats-server cluster on loopback, the way production runs NATS: JetStream on
//! every node, streams replicated, every write synced to disk (`sync_interval: always`). A test
//! kills a node with SIGKILL (the leader of a stream, say) and can start it again.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use crate::{free_port, nats_server_bin};

/// One node of a [`NatsCluster`].
struct Node {
    name: String,
    port: u16,
    conf: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

impl Node {
    fn spawn(&mut self) -> anyhow::Result<()> {
        let bin = nats_server_bin();
        let child = Command::new(&bin)
            .arg("-c")
            .arg(&self.conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("failed to start {}", bin.display()))?;
        self.child = Some(child);
        Ok(())
    }
}

/// nats-server nodes clustered on loopback; every node is killed and its store removed on drop.
pub struct NatsCluster {
    nodes: Vec<Node>,
    dir: PathBuf,
}

impl NatsCluster {
    /// Starts `size` nodes and waits until JetStream has a meta leader.
    ///
    /// # Errors
    /// When a node cannot start or the cluster does not form in 30 s.
    pub async fn start(size: usize) -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!(
            "agentloop-nats-cluster-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir)?;
        let mut client_ports = Vec::new();
        let mut route_ports = Vec::new();
        for _ in 0..size {
            client_ports.push(free_port()?);
            route_ports.push(free_port()?);
        }
        let routes: Vec<String> = route_ports
            .iter()
            .map(|p| format!("nats://127.0.0.1:{p}"))
            .collect();
        let mut nodes = Vec::new();
        for i in 0..size {
            let name = format!("n{}", i + 1);
            let conf = dir.join(format!("{name}.conf"));
            let log = dir.join(format!("{name}.log"));
            std::fs::write(
                &conf,
                node_config(&name, client_ports[i], route_ports[i], &routes, &dir, &log),
            )?;
            nodes.push(Node {
                name,
                port: client_ports[i],
                conf,
                log,
                child: None,
            });
        }
        let mut cluster = Self { nodes, dir };
        for node in &mut cluster.nodes {
            node.spawn()?;
        }
        cluster.wait_formed(Duration::from_secs(30)).await?;
        Ok(cluster)
    }

    /// Returns the client URLs of every node, comma-separated (what `NATS_URL` takes).
    pub fn urls(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("nats://127.0.0.1:{}", n.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Returns the client URL of one node.
    ///
    /// # Panics
    /// When no node has that name.
    pub fn url_of(&self, name: &str) -> String {
        format!("nats://127.0.0.1:{}", self.node(name).port)
    }

    /// Returns the node names (`n1`, `n2`, …).
    pub fn names(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.name.clone()).collect()
    }

    fn node(&self, name: &str) -> &Node {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("no node {name}"))
    }

    /// Kills a node with SIGKILL, keeping its store, as a crashed host would.
    pub fn kill(&mut self, name: &str) {
        if let Some(node) = self.nodes.iter_mut().find(|n| n.name == name)
            && let Some(mut child) = node.child.take()
        {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts a killed node again on its port with its store.
    ///
    /// # Errors
    /// When it cannot be started.
    pub fn restart(&mut self, name: &str) -> anyhow::Result<()> {
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.name == name)
            .with_context(|| format!("no node {name}"))?;
        if node.child.is_none() {
            node.spawn()?;
        }
        Ok(())
    }

    /// Returns the name of the node leading `stream`, asking any live node.
    ///
    /// # Errors
    /// When no live node answers or the stream has no leader.
    pub async fn stream_leader(&self, stream: &str) -> anyhow::Result<String> {
        for node in self.nodes.iter().filter(|n| n.child.is_some()) {
            let Ok(client) = async_nats::connect(format!("nats://127.0.0.1:{}", node.port)).await
            else {
                continue;
            };
            // A stream without a leader answers nothing: a short wait, so a caller polling for
            // the new leader sees it within half a second of its election.
            let mut js = async_nats::jetstream::new(client);
            js.set_timeout(Duration::from_millis(500));
            if let Ok(mut handle) = js.get_stream(stream).await
                && let Ok(info) = handle.info().await
                && let Some(leader) = info.cluster.as_ref().and_then(|c| c.leader.clone())
            {
                return Ok(leader);
            }
        }
        bail!("no live node names a leader of {stream}")
    }

    /// Returns every node's log, for a failing test's message.
    pub fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| {
                let text = std::fs::read_to_string(&n.log).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(40).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                format!("--- {} ---\n{}", n.name, tail.join("\n"))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    async fn wait_formed(&self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(client) =
                async_nats::connect(self.urls().split(',').collect::<Vec<_>>()).await
            {
                let js = async_nats::jetstream::new(client);
                if js.query_account().await.is_ok() {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "the NATS cluster did not elect a JetStream leader; logs:\n{}",
                    self.logs()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One node's configuration: its client port, its route port and every node's route.
fn node_config(
    name: &str,
    port: u16,
    route_port: u16,
    routes: &[String],
    dir: &Path,
    log: &Path,
) -> String {
    let store = dir.join(name);
    let routes = routes
        .iter()
        .map(|r| format!("\"{r}\""))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "server_name: {name}\n\
         listen: \"127.0.0.1:{port}\"\n\
         log_file: \"{log}\"\n\
         jetstream {{\n  store_dir: \"{store}\"\n  sync_interval: always\n}}\n\
         cluster {{\n  name: agentloop-test\n  listen: \"127.0.0.1:{route_port}\"\n  routes: [{routes}]\n}}\n",
        log = log.display(),
        store = store.display(),
    )
}
