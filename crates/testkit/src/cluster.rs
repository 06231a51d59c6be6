//! A three-node nats-server cluster on loopback, the way production runs NATS: JetStream on
//! every node, streams replicated, every write synced to disk (`sync_interval: always`). A test
//! kills a node with SIGKILL (the leader of a stream, say) and can start it again. A
//! [`ClusterPlan`] places nodes on other hosts (network namespaces) or behind proxies.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use crate::{free_port, nats_server_bin};

/// Where and how one node runs: its address, its namespace (a "host", see [`crate::Hosts`]),
/// its ports, the route URLs it dials and the one it advertises to the others.
#[derive(Debug, Clone)]
pub struct NodePlan {
    /// `n1`, `n2`, …
    pub name: String,
    /// The address it listens on.
    pub ip: String,
    /// The network namespace it runs in; `None` is the test's own.
    pub netns: Option<String>,
    /// Client port.
    pub port: u16,
    /// Route (cluster) port.
    pub route_port: u16,
    /// Route URLs it dials (every node's, its own included, by default).
    pub routes: Vec<String>,
    /// The route URL it tells the others to dial it at (a proxy in front of it, say).
    pub advertise: Option<String>,
}

/// The nodes of a cluster before they start, so a test can put proxies in front of ports.
#[derive(Debug, Clone)]
pub struct ClusterPlan {
    /// One entry per node.
    pub nodes: Vec<NodePlan>,
}

impl ClusterPlan {
    /// `size` nodes on loopback.
    ///
    /// # Errors
    /// When no free port is left.
    pub fn loopback(size: usize) -> anyhow::Result<Self> {
        Self::placed(&vec![("127.0.0.1".to_owned(), None); size])
    }

    /// One node per `(ip, netns)`; ports picked free on loopback, which a fresh namespace also
    /// has free.
    ///
    /// # Errors
    /// When no free port is left.
    pub fn placed(places: &[(String, Option<String>)]) -> anyhow::Result<Self> {
        let mut nodes = Vec::new();
        for (i, (ip, netns)) in places.iter().enumerate() {
            nodes.push(NodePlan {
                name: format!("n{}", i + 1),
                ip: ip.clone(),
                netns: netns.clone(),
                port: free_port()?,
                route_port: free_port()?,
                routes: Vec::new(),
                advertise: None,
            });
        }
        let routes: Vec<String> = nodes
            .iter()
            .map(|n| format!("nats://{}:{}", n.ip, n.route_port))
            .collect();
        for node in &mut nodes {
            node.routes.clone_from(&routes);
        }
        Ok(Self { nodes })
    }
}

/// One node of a [`NatsCluster`].
struct Node {
    plan: NodePlan,
    conf: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

impl Node {
    fn spawn(&mut self) -> anyhow::Result<()> {
        let bin = nats_server_bin();
        let mut command = crate::netns::command_in(self.plan.netns.as_deref(), &bin);
        let child = command
            .arg("-c")
            .arg(&self.conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("failed to start {}", bin.display()))?;
        self.child = Some(child);
        Ok(())
    }

    fn url(&self) -> String {
        format!("nats://{}:{}", self.plan.ip, self.plan.port)
    }
}

/// nats-server nodes clustered on loopback; every node is killed and its store removed on drop.
pub struct NatsCluster {
    nodes: Vec<Node>,
    dir: PathBuf,
}

impl NatsCluster {
    /// Starts `size` nodes on loopback and waits until JetStream places a stream on all of them.
    ///
    /// # Errors
    /// When a node cannot start or the cluster does not form in 30 s.
    pub async fn start(size: usize) -> anyhow::Result<Self> {
        Self::start_plan(ClusterPlan::loopback(size)?).await
    }

    /// Starts the nodes of `plan` and waits until JetStream places a stream on all of them.
    ///
    /// # Errors
    /// When a node cannot start or the cluster does not form in 30 s.
    pub async fn start_plan(plan: ClusterPlan) -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!(
            "agentloop-nats-cluster-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir)?;
        let mut nodes = Vec::new();
        for plan in plan.nodes {
            let conf = dir.join(format!("{}.conf", plan.name));
            let log = dir.join(format!("{}.log", plan.name));
            std::fs::write(&conf, node_config(&plan, &dir, &log))?;
            nodes.push(Node {
                plan,
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
            .map(Node::url)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Returns the client URL of one node.
    ///
    /// # Panics
    /// When no node has that name.
    pub fn url_of(&self, name: &str) -> String {
        self.node(name).url()
    }

    /// Returns the node names (`n1`, `n2`, …).
    pub fn names(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.plan.name.clone()).collect()
    }

    fn node(&self, name: &str) -> &Node {
        self.nodes
            .iter()
            .find(|n| n.plan.name == name)
            .unwrap_or_else(|| panic!("no node {name}"))
    }

    /// Kills a node with SIGKILL, keeping its store, as a crashed host would.
    pub fn kill(&mut self, name: &str) {
        if let Some(node) = self.nodes.iter_mut().find(|n| n.plan.name == name)
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
            .find(|n| n.plan.name == name)
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
            // A node cut off by a partition never answers the connect: a short timeout.
            let Ok(client) = async_nats::ConnectOptions::new()
                .connection_timeout(Duration::from_millis(500))
                .connect(node.url())
                .await
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
                format!("--- {} ---\n{}", n.plan.name, tail.join("\n"))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Waits until a stream with a copy on every node can be created. A meta leader alone is
    /// not enough: a node whose routes are slow joins the meta group seconds later, and until
    /// then a test's own replicated stream is refused ("no suitable peers for placement").
    async fn wait_formed(&self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        let probe = format!("TESTKIT_PROBE_{}", uuid::Uuid::new_v4().simple());
        let mut refused = String::from("no answer");
        loop {
            if let Ok(client) =
                async_nats::connect(self.urls().split(',').collect::<Vec<_>>()).await
            {
                let js = async_nats::jetstream::new(client);
                let placed = js
                    .create_stream(async_nats::jetstream::stream::Config {
                        name: probe.clone(),
                        subjects: vec![format!("testkit.probe.{probe}")],
                        storage: async_nats::jetstream::stream::StorageType::Memory,
                        num_replicas: self.nodes.len(),
                        ..Default::default()
                    })
                    .await;
                match placed {
                    Ok(_) => {
                        // Best effort: an empty stream in memory left behind changes no test.
                        let _ = js.delete_stream(&probe).await;
                        return Ok(());
                    }
                    Err(err) => refused = err.to_string(),
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "the NATS cluster cannot place a stream on all {} nodes ({refused}); logs:\n{}",
                    self.nodes.len(),
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

/// One node's configuration: its client and route listeners, the routes it dials.
fn node_config(plan: &NodePlan, dir: &Path, log: &Path) -> String {
    let store = dir.join(&plan.name);
    let routes = plan
        .routes
        .iter()
        .map(|r| format!("\"{r}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let advertise = plan
        .advertise
        .as_ref()
        .map(|a| format!("  advertise: \"{a}\"\n"))
        .unwrap_or_default();
    format!(
        "server_name: {name}\n\
         listen: \"{ip}:{port}\"\n\
         log_file: \"{log}\"\n\
         jetstream {{\n  store_dir: \"{store}\"\n  sync_interval: always\n}}\n\
         cluster {{\n  name: agentloop-test\n  listen: \"{ip}:{route_port}\"\n{advertise}  routes: [{routes}]\n  no_advertise: true\n}}\n",
        name = plan.name,
        ip = plan.ip,
        port = plan.port,
        route_port = plan.route_port,
        log = log.display(),
        store = store.display(),
    )
}
