//! Several "hosts" on one machine: each a Linux network namespace with its own address, joined
//! to the test's own bridge in the root namespace by a veth pair. The root namespace is a host
//! too (the bridge's address; Postgres and whatever the test runs directly live there). A
//! test cuts one host's link (`ip link set … down`: packets vanish, no reset is sent, as when
//! a switch port dies) and heals it. Needs root, which the CI machine has.

use std::process::Command;

use anyhow::{Context as _, bail};

/// One host: a namespace and its address on the bridge.
#[derive(Debug, Clone)]
pub struct Host {
    /// The namespace's name (`ip netns exec <netns> …`).
    pub netns: String,
    /// The host's address on the bridge.
    pub ip: String,
    /// The veth end on the bridge, in the root namespace; down = the host is cut off.
    link: String,
}

/// A bridge and `n` namespaces attached to it; all removed on drop.
pub struct Hosts {
    bridge: String,
    root_ip: String,
    hosts: Vec<Host>,
}

impl Hosts {
    /// Creates the bridge (its address is the root namespace's) and `n` hosts on a random
    /// private /24, so parallel test processes do not collide.
    ///
    /// # Errors
    /// When an `ip` command fails, e.g. without root; the message says which.
    pub fn create(n: usize) -> anyhow::Result<Self> {
        let id = &uuid::Uuid::new_v4().simple().to_string()[..6];
        let bytes = uuid::Uuid::new_v4();
        let bytes = bytes.as_bytes();
        let net = format!("10.{}.{}", 200 + bytes[0] % 50, bytes[1]);
        let mut hosts = Self {
            bridge: format!("al{id}br"),
            root_ip: format!("{net}.1"),
            hosts: Vec::new(),
        };
        ip(&["link", "add", "name", &hosts.bridge, "type", "bridge"])?;
        ip(&["addr", "add", &format!("{net}.1/24"), "dev", &hosts.bridge])?;
        ip(&["link", "set", &hosts.bridge, "up"])?;
        for i in 1..=n {
            let host = Host {
                netns: format!("al{id}h{i}"),
                ip: format!("{net}.{}", 10 + i),
                link: format!("al{id}v{i}"),
            };
            let inner = format!("al{id}p{i}");
            ip(&["netns", "add", &host.netns])?;
            hosts.hosts.push(host.clone());
            ip(&[
                "link", "add", &host.link, "type", "veth", "peer", "name", &inner,
            ])?;
            ip(&["link", "set", &inner, "netns", &host.netns])?;
            ip(&["link", "set", &host.link, "master", &hosts.bridge])?;
            ip(&["link", "set", &host.link, "up"])?;
            let addr = format!("{}/24", host.ip);
            in_netns(&host.netns, &["addr", "add", &addr, "dev", &inner])?;
            in_netns(&host.netns, &["link", "set", &inner, "up"])?;
            in_netns(&host.netns, &["link", "set", "lo", "up"])?;
        }
        Ok(hosts)
    }

    /// Returns the root namespace's address on the bridge.
    pub fn root_ip(&self) -> &str {
        &self.root_ip
    }

    /// Returns host `i` (1-based, as created).
    ///
    /// # Panics
    /// When there is no such host.
    pub fn host(&self, i: usize) -> &Host {
        &self.hosts[i - 1]
    }

    /// Cuts host `i` off: its link goes down, so nothing reaches it and nothing leaves it.
    ///
    /// # Errors
    /// When `ip` fails.
    pub fn cut(&self, i: usize) -> anyhow::Result<()> {
        ip(&["link", "set", &self.host(i).link, "down"])
    }

    /// Brings host `i`'s link back.
    ///
    /// # Errors
    /// When `ip` fails.
    pub fn heal(&self, i: usize) -> anyhow::Result<()> {
        ip(&["link", "set", &self.host(i).link, "up"])
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        // Deleting one end of a veth pair deletes both; a namespace goes once its last
        // process has (the test kills those first).
        for host in &self.hosts {
            let _ = ip(&["link", "del", &host.link]);
            let _ = ip(&["netns", "del", &host.netns]);
        }
        let _ = ip(&["link", "del", &self.bridge]);
    }
}

/// A command running `program` in `netns` (`ip netns exec`, which execs it: the child's pid is
/// the program's), or where the test runs when `None`.
pub(crate) fn command_in(netns: Option<&str>, program: &std::path::Path) -> Command {
    match netns {
        Some(netns) => {
            let mut command = Command::new("ip");
            command.args(["netns", "exec", netns]).arg(program);
            command
        }
        None => Command::new(program),
    }
}

fn in_netns(netns: &str, args: &[&str]) -> anyhow::Result<()> {
    let mut all = vec!["netns", "exec", netns, "ip"];
    all.extend_from_slice(args);
    ip(&all)
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    let output = Command::new("ip")
        .args(args)
        .output()
        .context("failed to run ip (Debian's iproute2)")?;
    if !output.status.success() {
        bail!(
            "ip {} failed (the partition tests need root): {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}
