//! A service that cannot start exits at once, non-zero, with the cause in its log: it does not
//! keep answering `/healthz` until an orchestrator sends it a signal. Each service (and `all`)
//! is started as a process against a dependency that refuses it for good; a dependency that is
//! only down is waited for instead (see `cli.rs`). The bound on the exit is a guard against a
//! hang, not a speed target.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a failed fixture should panic the test

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use agentloop_testkit::{NatsServer, ServiceProcess, free_port};

const BIN: &str = env!("CARGO_BIN_EXE_agentloop");
/// Long enough for a loaded CI machine to start and stop a process; a service that waits for
/// a signal instead never gets under it.
const EXIT_WITHIN: Duration = Duration::from_secs(20);

/// Starts `agentloop <service>` with `env`, waits for it to exit and returns its log, after
/// checking that it failed and that the log names `cause`.
async fn exits_naming(service: &str, env: &[(&str, &str)], cause: &str) -> String {
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
        .collect();
    let mut process = ServiceProcess::spawn(BIN.as_ref(), service, service, &env).unwrap();
    let status = process.wait_exit(EXIT_WITHIN).await.unwrap();
    let logs = process.logs();
    assert!(!status.success(), "{service} exited with {status}:\n{logs}");
    assert!(
        logs.contains(cause),
        "the log of {service} names the cause ({cause}):\n{logs}"
    );
    assert!(
        logs.contains("agentloop stopped by a fatal error"),
        "the log of {service} says it stopped:\n{logs}"
    );
    logs
}

/// The login of the account without JetStream.
const APP_LOGIN: [(&str, &str); 2] = [
    ("AGENTLOOP_BUS__USER", "app"),
    ("AGENTLOOP_BUS__PASSWORD", "app"),
];

/// A nats-server whose one account (login [`APP_LOGIN`]) has no JetStream, though the server
/// itself has it; returns it with its URL.
fn nats_with_an_account_without_jetstream() -> (NatsServer, String) {
    let dir = std::env::temp_dir().join(format!("agentloop-startup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("nats.conf");
    std::fs::write(
        &conf,
        "accounts {\n  APP: { users: [ { user: app, password: app } ] }\n}\n",
    )
    .unwrap();
    let nats = NatsServer::start_with_config(&conf, &[]).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let url = nats.url().to_owned();
    (nats, url)
}

/// A nats-server started without JetStream; killed on drop.
struct NatsWithoutJetStream {
    child: Child,
    url: String,
}

impl NatsWithoutJetStream {
    async fn start() -> Self {
        let port = free_port().unwrap();
        let child = Command::new(agentloop_testkit::nats_server_bin())
            .args(["-a", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let addr = format!("127.0.0.1:{port}");
        agentloop_testkit::wait_until("nats-server to listen", Duration::from_secs(10), || {
            let addr = addr.clone();
            async move { tokio::net::TcpStream::connect(addr).await.ok().map(drop) }
        })
        .await
        .unwrap();
        Self {
            child,
            url: format!("nats://{addr}"),
        }
    }
}

impl Drop for NatsWithoutJetStream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A server that speaks just enough NATS to be connected to, and says it is 2.9.0 (older than
/// agentloop supports). Serves until the test ends.
async fn nats_too_old() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            tokio::spawn(async move {
                let info = r#"INFO {"server_id":"OLD","server_name":"old","version":"2.9.0","proto":1,"headers":true,"max_payload":1048576,"jetstream":true}"#;
                client.write_all(format!("{info}\r\n").as_bytes()).await?;
                let mut buf = [0_u8; 4096];
                loop {
                    let n = client.read(&mut buf).await?;
                    if n == 0 {
                        return Ok::<(), std::io::Error>(());
                    }
                    if buf[..n].windows(4).any(|w| w == b"PING") {
                        client.write_all(b"PONG\r\n").await?;
                    }
                }
            });
        }
    });
    format!("nats://{addr}")
}

#[tokio::test]
async fn a_router_whose_streams_nats_refuses_exits_at_once_naming_the_refusal() {
    let (_nats, url) = nats_with_an_account_without_jetstream();

    exits_naming(
        "router",
        &[("NATS_URL", &url), APP_LOGIN[0], APP_LOGIN[1]],
        "JetStream not enabled for account",
    )
    .await;
}

#[tokio::test]
async fn a_runner_on_a_nats_server_too_old_exits_at_once_naming_the_version() {
    let url = nats_too_old().await;

    exits_naming("runner", &[("NATS_URL", &url)], "nats-server 2.9.0").await;
}

/// `service` on a nats-server without JetStream exits, saying so.
async fn exits_without_jetstream(service: &str) {
    let nats = NatsWithoutJetStream::start().await;
    exits_naming(
        service,
        &[("NATS_URL", &nats.url)],
        "runs without JetStream",
    )
    .await;
}

#[tokio::test]
async fn delivery_on_a_nats_server_without_jetstream_exits_at_once_saying_so() {
    exits_without_jetstream("delivery").await;
}

#[tokio::test]
async fn a_gateway_already_listening_exits_at_once_when_nats_has_no_jetstream() {
    exits_without_jetstream("gateway").await;
}

#[tokio::test]
async fn memory_serving_its_admin_and_grpc_ports_exits_at_once_on_a_database_url_it_cannot_parse() {
    let grpc = format!("127.0.0.1:{}", free_port().unwrap());

    exits_naming(
        "memory",
        &[
            (
                "DATABASE_URL",
                "postgres://postgres@127.0.0.1:5432/x?sslmode=sometimes",
            ),
            ("AGENTLOOP_MEMORY__LISTEN", &grpc),
        ],
        "invalid database url",
    )
    .await;
}

#[tokio::test]
async fn a_service_whose_admin_port_is_taken_exits_at_once_naming_the_address() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();

    exits_naming(
        "runner",
        &[("AGENTLOOP_RUNNER__ADMIN_LISTEN", &addr)],
        &format!("failed to bind admin address {addr}"),
    )
    .await;
}

#[tokio::test]
async fn all_stops_every_service_and_exits_at_once_when_one_cannot_start() {
    // NATS refuses the streams; memory alone could run (it waits for its database).
    let (_nats, url) = nats_with_an_account_without_jetstream();
    let grpc = format!("127.0.0.1:{}", free_port().unwrap());
    let database = format!("postgres://postgres@127.0.0.1:{}/x", free_port().unwrap());

    let logs = exits_naming(
        "all",
        &[
            ("NATS_URL", &url),
            APP_LOGIN[0],
            APP_LOGIN[1],
            ("DATABASE_URL", &database),
            ("AGENTLOOP_MEMORY__LISTEN", &grpc),
            ("AGENTLOOP_MEMORY__URL", &format!("http://{grpc}")),
        ],
        "JetStream not enabled for account",
    )
    .await;

    assert!(
        logs.contains("failed, stopping the others"),
        "the failing service is named as it happens:\n{logs}"
    );
}
