//! `agentloop all` as a child process: started on free ports and waited for until ready,
//! messages sent the way `nats pub` sends them, stopped with SIGTERM.
#![allow(dead_code)] // each test binary that includes this uses some of it

use std::process::Stdio;
use std::time::Duration;

use futures::StreamExt as _;
use tokio::io::AsyncReadExt as _;

use agentloop_testkit::{NatsServer, TestDatabase, http_status};

/// A free loopback port (bound and released).
pub fn free_port() -> u16 {
    agentloop_testkit::free_port().unwrap()
}

/// A running `agentloop all`, its gateway address and its log.
pub struct Process {
    pub child: tokio::process::Child,
    pub gateway: String,
    // Drained while the process runs so a full pipe never blocks its logging.
    pub stderr: tokio::task::JoinHandle<String>,
}

/// Starts `agentloop all` and waits until it is ready. Its ports are picked free a moment
/// before it binds them, and another process may take one meanwhile (any outgoing connection
/// can get it as its local port): a process that exits while starting is started again on new
/// ports, twice at most, and a third exit fails the test with its log.
pub async fn start_all(
    nats: &NatsServer,
    db: &TestDatabase,
    model_env: &[(&str, String)],
) -> Process {
    let mut logs = Vec::new();
    for _ in 0..3 {
        match try_start_all(nats, db, model_env).await {
            Ok(process) => return process,
            Err(log) => logs.push(log),
        }
    }
    panic!(
        "agentloop all exited while starting, three times; its logs:\n{}",
        logs.join("\n---\n")
    );
}

/// `Err` with the process's log when it exited before it was ready.
pub async fn try_start_all(
    nats: &NatsServer,
    db: &TestDatabase,
    model_env: &[(&str, String)],
) -> Result<Process, String> {
    let memory_port = free_port();
    let gateway = format!("127.0.0.1:{}", free_port());
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentloop"));
    command
        .arg("all")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("NATS_URL", nats.url())
        .env("DATABASE_URL", db.url())
        .env(
            "AGENTLOOP_MEMORY__LISTEN",
            format!("127.0.0.1:{memory_port}"),
        )
        .env(
            "AGENTLOOP_MEMORY__URL",
            format!("http://127.0.0.1:{memory_port}"),
        )
        .env("AGENTLOOP_GATEWAY__LISTEN", &gateway)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (key, value) in model_env {
        command.env(key, value);
    }
    let mut child = command.spawn().unwrap();
    let mut pipe = child.stderr.take().unwrap();
    let stderr = tokio::spawn(async move {
        let mut text = String::new();
        let _ = pipe.read_to_string(&mut text).await;
        text
    });
    let mut process = Process {
        child,
        gateway,
        stderr,
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if http_status(&process.gateway, "/readyz").await == Some(200) {
            return Ok(process);
        }
        if let Ok(Some(_)) = process.child.try_wait() {
            return Err(process.stderr.await.unwrap_or_default());
        }
        if tokio::time::Instant::now() > deadline {
            // Its own log says why (a dependency it kept retrying, say).
            let _ = process.child.start_kill();
            let log = process.stderr.await.unwrap_or_default();
            panic!("agentloop all not ready after 30 s; it logged:\n{log}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub async fn send_like_nats_pub(nats: &NatsServer, key: &str, text: &str) -> serde_json::Value {
    let client = async_nats::connect(nats.url()).await.unwrap();
    let mut replies = client.subscribe("agentloop.deliver.cli.>").await.unwrap();
    let body = serde_json::json!({"sessionKey": key, "text": text}).to_string();
    client
        .publish("agentloop.inbound.cli", body.into())
        .await
        .unwrap();
    client.flush().await.unwrap();
    let msg = tokio::time::timeout(Duration::from_secs(20), replies.next())
        .await
        .unwrap()
        .unwrap();
    serde_json::from_slice(&msg.payload).unwrap()
}

pub async fn stop(mut process: Process) -> String {
    let pid = process.child.id().unwrap();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = tokio::time::timeout(Duration::from_secs(30), process.child.wait())
        .await
        .expect("agentloop all did not exit within 30 s of SIGTERM")
        .unwrap();
    let stderr = process.stderr.await.unwrap();
    assert!(exit.success(), "exit {exit:?}\n{stderr}");
    stderr
}
