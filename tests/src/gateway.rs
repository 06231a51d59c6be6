//! The gateway's client protocols end to end: `/ws` driven by a WebSocket client, the
//! OpenAI-compatible API (by reqwest and by the official `openai` Python package) and the web
//! chat page in headless Chromium.

use std::path::PathBuf;
use std::time::Duration;

use futures::{SinkExt as _, StreamExt as _};
use serde_json::{Value, json};
use sqlx::Row as _;
use tokio_tungstenite::tungstenite::Message;

use agentloop_proto::v1::ControlMessage;

use crate::harness::{Sandbox, SandboxOptions};

const WAIT: Duration = Duration::from_secs(20);

pub(crate) type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A WebSocket client of the gateway protocol that keeps the events it reads on the way.
pub(crate) struct Client {
    pub(crate) ws: Socket,
    pub(crate) next_id: u64,
    pub(crate) events: Vec<Value>,
}

impl Client {
    pub(crate) async fn open(sandbox: &Sandbox) -> anyhow::Result<Self> {
        Self::open_at(sandbox.gateway_addr).await
    }

    /// Opens `/ws` of the gateway at `addr`.
    pub(crate) async fn open_at(addr: std::net::SocketAddr) -> anyhow::Result<Self> {
        let (ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/ws")).await?;
        Ok(Self {
            ws,
            next_id: 1,
            events: Vec::new(),
        })
    }

    pub(crate) async fn connected(sandbox: &Sandbox, token: Option<&str>) -> anyhow::Result<Self> {
        Self::connected_at(sandbox.gateway_addr, token).await
    }

    /// Opens `/ws` of the gateway at `addr` and completes `connect`, once memory answers.
    pub(crate) async fn connected_at(
        addr: std::net::SocketAddr,
        token: Option<&str>,
    ) -> anyhow::Result<Self> {
        let mut client = Self::open_at(addr).await?;
        let hello = client
            .call("connect", json!({"auth": {"token": token}}))
            .await?;
        anyhow::ensure!(hello["ok"] == true, "connect refused: {hello}");
        // Memory answers UNAVAILABLE until its database is migrated; the sandbox does not wait
        // for that, so the first client does.
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let list = client.call("sessions.list", json!({"limit": 1})).await?;
            if list["ok"] == true {
                break;
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "memory not ready: {list}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(client)
    }

    pub(crate) async fn send(&mut self, method: &str, params: Value) -> anyhow::Result<String> {
        let id = self.next_id.to_string();
        self.next_id += 1;
        let frame = json!({"type": "req", "id": id, "method": method, "params": params});
        self.ws.send(Message::text(frame.to_string())).await?;
        Ok(id)
    }

    /// Returns the next frame, or `None` when the server closed (with its close frame's reason).
    pub(crate) async fn frame(&mut self) -> anyhow::Result<Result<Value, (u16, String)>> {
        loop {
            let msg = tokio::time::timeout(WAIT, self.ws.next())
                .await
                .map_err(|_| anyhow::anyhow!("no frame within {WAIT:?}"))?;
            match msg {
                Some(Ok(Message::Text(text))) => return Ok(Ok(serde_json::from_str(&text)?)),
                Some(Ok(Message::Close(frame))) => {
                    let frame = frame.map(|f| (u16::from(f.code), f.reason.to_string()));
                    return Ok(Err(frame.unwrap_or((1005, String::new()))));
                }
                Some(Ok(_)) => continue,
                Some(Err(err)) => return Ok(Err((1006, err.to_string()))),
                None => return Ok(Err((1006, "stream ended".into()))),
            }
        }
    }

    /// Reads until the response to `id`, keeping events.
    pub(crate) async fn response(&mut self, id: &str) -> anyhow::Result<Value> {
        loop {
            let frame = match self.frame().await? {
                Ok(frame) => frame,
                Err(close) => anyhow::bail!("closed before the response to {id}: {close:?}"),
            };
            if frame["type"] == "event" {
                self.events.push(frame);
            } else if frame["type"] == "res" && frame["id"] == id {
                return Ok(frame);
            }
        }
    }

    pub(crate) async fn call(&mut self, method: &str, params: Value) -> anyhow::Result<Value> {
        let id = self.send(method, params).await?;
        self.response(&id).await
    }
}

pub(crate) async fn runs_of(sandbox: &Sandbox, session_key: &str) -> anyhow::Result<i64> {
    let pool = sandbox.pool().await?;
    let row = sqlx::query(
        "SELECT count(*) AS n FROM runs r JOIN sessions s ON s.id = r.session_id WHERE s.key = $1",
    )
    .bind(session_key)
    .fetch_one(&pool)
    .await?;
    Ok(row.get("n"))
}

#[tokio::test]
async fn agent_answers_accepted_then_final_and_streams_events_in_order() {
    // Arrange
    let sandbox = Sandbox::start().await.unwrap();
    let mut client = Client::connected(&sandbox, None).await.unwrap();

    // Act
    let id = client
        .send(
            "agent",
            json!({"message": "hello over websocket", "sessionKey": "ws:alice", "idempotencyKey": "k-1"}),
        )
        .await
        .unwrap();
    let accepted = client.response(&id).await.unwrap();
    let done = client.response(&id).await.unwrap();

    // Assert
    assert_eq!(accepted["ok"], true, "{accepted}");
    assert_eq!(accepted["payload"]["status"], "accepted");
    let run_id = accepted["payload"]["runId"].as_str().unwrap().to_owned();
    assert!(accepted["payload"]["acceptedAt"].as_u64().unwrap() > 0);
    assert_eq!(done["payload"]["status"], "ok", "{done}");
    assert_eq!(done["payload"]["runId"], run_id.as_str());
    assert_eq!(done["payload"]["text"], "echo: hello over websocket");
    let events: Vec<&Value> = client
        .events
        .iter()
        .filter(|e| e["event"] == "agent")
        .collect();
    assert!(events.len() >= 3, "{events:?}");
    let first = &events[0]["payload"];
    assert_eq!(
        (&first["stream"], &first["phase"]),
        (&json!("lifecycle"), &json!("start"))
    );
    let last = &events[events.len() - 1]["payload"];
    assert_eq!(
        (&last["stream"], &last["phase"]),
        (&json!("lifecycle"), &json!("end"))
    );
    let deltas: String = events
        .iter()
        .filter(|e| e["payload"]["stream"] == "assistant")
        .map(|e| e["payload"]["delta"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(deltas, "echo: hello over websocket");
    for pair in events.windows(2) {
        assert_eq!(pair[0]["payload"]["runId"], run_id.as_str());
        assert!(pair[1]["payload"]["seq"].as_u64() > pair[0]["payload"]["seq"].as_u64());
        assert!(pair[1]["seq"].as_u64() > pair[0]["seq"].as_u64());
    }
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_repeated_idempotency_key_returns_the_first_answer_without_a_second_run_even_after_a_gateway_restart()
 {
    // Arrange
    let mut sandbox = Sandbox::start().await.unwrap();
    let params = json!({"message": "only once please", "sessionKey": "ws:idem", "idempotencyKey": "same-key"});
    let mut client = Client::connected(&sandbox, None).await.unwrap();
    let id = client.send("agent", params.clone()).await.unwrap();
    let first_accepted = client.response(&id).await.unwrap();
    let first = client.response(&id).await.unwrap();
    assert_eq!(first["payload"]["status"], "ok", "{first}");

    // Act: the same key again, then again on a restarted gateway
    let again_id = client.send("agent", params.clone()).await.unwrap();
    let again_accepted = client.response(&again_id).await.unwrap();
    let again = client.response(&again_id).await.unwrap();
    sandbox.restart_gateway().await.unwrap();
    let ready = format!("http://{}/readyz", sandbox.gateway_addr);
    agentloop_testkit::wait_until("restarted gateway ready", WAIT, || {
        let ready = ready.clone();
        async move {
            let status = reqwest::get(ready).await.ok()?.status();
            status.is_success().then_some(())
        }
    })
    .await
    .unwrap();
    let mut client = Client::connected(&sandbox, None).await.unwrap();
    let after_id = client.send("agent", params).await.unwrap();
    let after_accepted = client.response(&after_id).await.unwrap();
    let after = client.response(&after_id).await.unwrap();

    // Assert
    let run_id = &first_accepted["payload"]["runId"];
    for (accepted, done) in [(&again_accepted, &again), (&after_accepted, &after)] {
        assert_eq!(accepted["payload"]["duplicate"], true, "{accepted}");
        assert_eq!(&accepted["payload"]["runId"], run_id);
        assert_eq!(done["payload"]["status"], "ok", "{done}");
        assert_eq!(done["payload"]["text"], "echo: only once please");
    }
    assert_eq!(runs_of(&sandbox, "ws:idem").await.unwrap(), 1);
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn agent_wait_times_out_cleanly_then_returns_the_answer() {
    // Arrange: a run the fake model holds for a while
    let sandbox = Sandbox::start().await.unwrap();
    let mut client = Client::connected(&sandbox, None).await.unwrap();
    let id = client
        .send(
            "agent",
            json!({"message": "[[delay_ms:1500]] slow one", "sessionKey": "ws:wait"}),
        )
        .await
        .unwrap();
    let accepted = client.response(&id).await.unwrap();
    let run_id = accepted["payload"]["runId"].clone();

    // Act
    let mut waiter = Client::connected(&sandbox, None).await.unwrap();
    let short = waiter
        .call("agent.wait", json!({"runId": run_id, "timeoutMs": 100}))
        .await
        .unwrap();
    let long = waiter
        .call("agent.wait", json!({"runId": run_id, "timeoutMs": 15000}))
        .await
        .unwrap();
    let unknown = waiter
        .call(
            "agent.wait",
            json!({"runId": "0190d6c4-0000-7000-8000-000000000000", "timeoutMs": 100}),
        )
        .await
        .unwrap();

    // Assert
    assert_eq!(short["ok"], true, "{short}");
    assert_eq!(short["payload"]["status"], "timeout");
    assert_eq!(long["payload"]["status"], "ok", "{long}");
    assert_eq!(long["payload"]["text"], "echo: slow one");
    assert_eq!(unknown["ok"], false);
    assert_eq!(unknown["error"]["code"], "NOT_FOUND");
    let done = client.response(&id).await.unwrap();
    assert_eq!(done["payload"]["status"], "ok");
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn calls_before_connect_wrong_tokens_and_oversized_frames_are_refused_clearly() {
    // Arrange
    let sandbox =
        Sandbox::start_with_gateway_tokens(SandboxOptions::default(), vec!["s3cret".into()])
            .await
            .unwrap();

    // Act + Assert: a method before connect
    let mut early = Client::open(&sandbox).await.unwrap();
    let refused = early.call("sessions.list", json!({})).await.unwrap();
    assert_eq!(refused["error"]["code"], "NOT_CONNECTED", "{refused}");

    // a wrong token: an error, then the connection is closed
    let mut wrong = Client::open(&sandbox).await.unwrap();
    let denied = wrong
        .call("connect", json!({"auth": {"token": "nope"}}))
        .await
        .unwrap();
    assert_eq!(denied["error"]["code"], "UNAUTHORIZED", "{denied}");
    assert_eq!(denied["error"]["message"], "invalid token");
    let closed = wrong.frame().await.unwrap();
    assert_eq!(closed.unwrap_err().0, 1008);

    // an oversized frame on an authenticated connection
    let mut big = Client::connected(&sandbox, Some("s3cret")).await.unwrap();
    let huge = "x".repeat(600 * 1024);
    big.send("agent", json!({"message": huge})).await.unwrap();
    let error = big.frame().await.unwrap().unwrap();
    assert_eq!(error["error"]["code"], "FRAME_TOO_LARGE", "{error}");
    let closed = big.frame().await.unwrap().unwrap_err();
    assert_eq!(closed.0, 1009, "{closed:?}");

    // unknown methods and bad params
    let mut ok = Client::connected(&sandbox, Some("s3cret")).await.unwrap();
    let unknown = ok.call("agent.dance", json!({})).await.unwrap();
    assert_eq!(unknown["error"]["code"], "UNKNOWN_METHOD");
    let bad = ok.call("agent", json!({"message": 42})).await.unwrap();
    assert_eq!(bad["error"]["code"], "INVALID_REQUEST");
    assert!(
        bad["error"]["message"]
            .as_str()
            .unwrap()
            .contains("invalid params for agent"),
        "{bad}"
    );
    let empty = ok.call("agent", json!({"sessionKey": "x"})).await.unwrap();
    assert_eq!(empty["error"]["message"], "message is required");
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn chat_abort_publishes_an_abort_on_the_sessions_control_subject() {
    // Arrange: the session exists (an abort of an unknown key is NOT_FOUND and creates none).
    let sandbox = Sandbox::start().await.unwrap();
    let mut control = sandbox.subscribe("control.*").await;
    let mut client = Client::connected(&sandbox, None).await.unwrap();
    sandbox.say("ws:abort", "hello").await.unwrap();
    sandbox.finished_runs(1).await.unwrap();

    // Act
    let answer = client
        .call("chat.abort", json!({"sessionKey": "ws:abort"}))
        .await
        .unwrap();

    // Assert
    assert_eq!(answer["payload"]["status"], "abort-requested", "{answer}");
    let session_id = answer["payload"]["sessionId"].as_str().unwrap();
    let msg = tokio::time::timeout(WAIT, control.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        msg.subject.as_str(),
        sandbox.subject(&format!("control.{session_id}"))
    );
    let (abort, _) = agentloop_bus::decode::<ControlMessage>(&msg).unwrap();
    assert_eq!(abort.action, "abort");
    assert_eq!(abort.session_id, session_id);
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn sessions_are_listed_patched_reset_and_their_history_read() {
    // Arrange: a session with one exchange
    let sandbox = Sandbox::start().await.unwrap();
    let mut client = Client::connected(&sandbox, None).await.unwrap();
    let id = client
        .send(
            "agent",
            json!({"message": "remember me", "sessionKey": "ws:sessions"}),
        )
        .await
        .unwrap();
    client.response(&id).await.unwrap();
    client.response(&id).await.unwrap();

    // Act
    let history = client
        .call("chat.history", json!({"sessionKey": "ws:sessions"}))
        .await
        .unwrap();
    let list = client.call("sessions.list", json!({})).await.unwrap();
    let patched = client
        .call(
            "sessions.patch",
            json!({"key": "ws:sessions", "model": "openai/other", "queueMode": "collect", "thinkingLevel": "high"}),
        )
        .await
        .unwrap();
    let bad_mode = client
        .call(
            "sessions.patch",
            json!({"key": "ws:sessions", "queueMode": "shout"}),
        )
        .await
        .unwrap();
    let reset = client
        .call("sessions.reset", json!({"key": "ws:sessions"}))
        .await
        .unwrap();
    let after = client
        .call("chat.history", json!({"sessionKey": "ws:sessions"}))
        .await
        .unwrap();

    // Assert
    let contents: Vec<&str> = history["payload"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(contents, ["remember me", "echo: remember me"]);
    assert!(
        list["payload"]["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["key"] == "ws:sessions"),
        "{list}"
    );
    assert_eq!(patched["payload"]["model"], "openai/other", "{patched}");
    assert_eq!(patched["payload"]["queueMode"], "collect");
    assert_eq!(patched["payload"]["thinkingLevel"], "high");
    assert_eq!(bad_mode["error"]["code"], "INVALID_REQUEST");
    assert_eq!(reset["payload"]["cleared"], 2, "{reset}");
    assert_eq!(reset["payload"]["model"], "openai/other");
    assert_eq!(after["payload"]["messages"], json!([]));
    sandbox.shutdown().await.unwrap();
}

/// Returns the concatenated content of an SSE chat completion stream and its chunk count.
fn sse_content(body: &str) -> (String, usize, bool) {
    let mut content = String::new();
    let mut chunks = 0;
    let mut done = false;
    for line in body.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            done = true;
            continue;
        }
        let chunk: Value = serde_json::from_str(data).unwrap();
        if let Some(text) = chunk["choices"][0]["delta"]["content"].as_str()
            && !text.is_empty()
        {
            chunks += 1;
            content.push_str(text);
        }
    }
    (content, chunks, done)
}

#[tokio::test]
async fn chat_completions_answer_plain_and_streamed_with_bearer_auth() {
    // Arrange
    let sandbox = Sandbox::start_with_gateway_tokens(SandboxOptions::default(), vec!["tok".into()])
        .await
        .unwrap();
    Client::connected(&sandbox, Some("tok")).await.unwrap(); // memory ready
    let url = format!("http://{}/v1/chat/completions", sandbox.gateway_addr);
    let http = reqwest::Client::new();
    let body = |stream: bool, text: &str| {
        json!({"model": "agentloop", "stream": stream, "user": "oa:bob",
               "messages": [{"role": "system", "content": "x"}, {"role": "user", "content": text}]})
    };

    // Act
    let unauthorized = http
        .post(&url)
        .json(&body(false, "hi"))
        .send()
        .await
        .unwrap();
    let plain_request = || {
        http.post(&url)
            .bearer_auth("tok")
            .header("idempotency-key", "plain-1")
            .json(&body(false, "plain words"))
    };
    let plain: Value = plain_request().send().await.unwrap().json().await.unwrap();
    // Sent again at once: the first answer is stored while it is returned, not before.
    let repeated: Value = plain_request().send().await.unwrap().json().await.unwrap();
    // The fake model's directive spaces the answer's pieces 50 ms apart, as a model produces
    // them: pieces that arrive together would go out as one chunk.
    let streamed = http
        .post(&url)
        .bearer_auth("tok")
        .json(&body(true, "streamed words here[[chunk_delay_ms:50]]"))
        .send()
        .await
        .unwrap();
    let content_type = streamed.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    let streamed = streamed.text().await.unwrap();
    let wrong_model = http
        .post(&url)
        .bearer_auth("tok")
        .json(&json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]}))
        .send()
        .await
        .unwrap();
    let authorized = |request: reqwest::RequestBuilder| request.bearer_auth("tok").send();
    // As `curl -d` sends it without `-H 'content-type: application/json'`: labelled a form,
    // which a cross-site page may send too, so it is refused however JSON its body.
    let form_labelled = authorized(
        http.post(&url)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(r#"{"model": "agentloop", "user": "curl:carol", "messages": [{"role": "user", "content": "from curl"}]}"#),
    )
    .await
    .unwrap();
    let form_status = form_labelled.status();
    let form_labelled: Value = form_labelled.json().await.unwrap();
    let not_json = authorized(
        http.post(&url)
            .header("content-type", "application/json")
            .body("model=agentloop"),
    )
    .await
    .unwrap();
    let not_json_status = not_json.status();
    let not_json: Value = not_json.json().await.unwrap();
    let models: Value = http
        .get(format!("http://{}/v1/models", sandbox.gateway_addr))
        .bearer_auth("tok")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();

    // Assert
    assert_eq!(unauthorized.status(), 401);
    assert_eq!(plain["object"], "chat.completion");
    assert_eq!(
        plain["choices"][0]["message"]["content"], "echo: plain words",
        "{plain}"
    );
    assert_eq!(
        repeated["choices"][0]["message"]["content"], "echo: plain words",
        "{repeated}"
    );
    assert_eq!(repeated["id"], plain["id"]);
    assert!(
        content_type.starts_with("text/event-stream"),
        "{content_type}"
    );
    let (content, chunks, done) = sse_content(&streamed);
    assert_eq!(content, "echo: streamed words here");
    assert!(chunks >= 2, "expected several chunks: {streamed}");
    assert!(done);
    assert_eq!(form_status, 415);
    assert!(
        form_labelled["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("Content-Type: application/json"),
        "{form_labelled}"
    );
    assert_eq!(not_json_status, 400);
    let message = not_json["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("expected a JSON chat completion request"),
        "{not_json}"
    );
    assert_eq!(wrong_model.status(), 404);
    assert_eq!(models["data"][0]["id"], "agentloop");
    assert_eq!(runs_of(&sandbox, "oa:bob").await.unwrap(), 2);
    sandbox.shutdown().await.unwrap();
}

/// The interpreter of tests/python/.venv, made by tests/python/setup.sh. ./scripts/test.sh (and
/// so .ci/run) installs it; when it is missing the test fails and says how to make it.
fn python() -> PathBuf {
    let python = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("python/.venv/bin/python");
    assert!(
        python.exists(),
        "tests/python/.venv is missing: run tests/python/setup.sh (./scripts/test.sh does)"
    );
    python
}

async fn run_python(python: &PathBuf, args: &[&str]) -> anyhow::Result<Value> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("python");
    let output = tokio::time::timeout(
        Duration::from_secs(90),
        tokio::process::Command::new(python)
            .current_dir(script)
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await??;
    anyhow::ensure!(
        output.status.success(),
        "{args:?} failed: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout)?;
    let last = stdout.lines().last().unwrap_or_default();
    Ok(serde_json::from_str(last)?)
}

#[tokio::test]
async fn the_official_openai_python_client_gets_a_plain_and_a_streamed_answer() {
    let python = python();
    // Arrange
    let sandbox =
        Sandbox::start_with_gateway_tokens(SandboxOptions::default(), vec!["py-token".into()])
            .await
            .unwrap();
    Client::connected(&sandbox, Some("py-token")).await.unwrap(); // memory ready
    let base_url = format!("http://{}/v1", sandbox.gateway_addr);

    // Act
    let result = run_python(
        &python,
        &["openai_client.py", &base_url, "py-token", "py:carol"],
    )
    .await
    .unwrap();

    // Assert
    assert_eq!(result["plain"], "echo: plain hello", "{result}");
    assert_eq!(result["streamed"], "echo: streamed hello there");
    assert!(result["chunks"].as_u64().unwrap() >= 2, "{result}");
    assert_eq!(result["models"], json!(["agentloop"]));
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_web_chat_page_streams_text_and_shows_a_tool_call_in_headless_chromium() {
    let python = python();
    // Arrange: the model calls the built-in clock tool, then answers slowly enough to watch.
    let sandbox = Sandbox::start().await.unwrap();
    Client::connected(&sandbox, None).await.unwrap(); // memory ready
    sandbox
        .fake
        .push_script(agentloop_fake_model::ScriptedReply::tool_call(
            "current_time",
            json!({}),
        ));
    sandbox.fake.push_script(
        agentloop_fake_model::ScriptedReply::text("it is about noon by the clock")
            .with_chunk_delay(Duration::from_millis(150)),
    );
    let screenshot =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/screenshots/webchat.png");
    std::fs::create_dir_all(screenshot.parent().unwrap()).unwrap();
    let _ = std::fs::remove_file(&screenshot);

    // Act
    let result = run_python(
        &python,
        &[
            "webchat.py",
            &format!("http://{}/", sandbox.gateway_addr),
            "web:dave",
            "what time is it now",
            screenshot.to_str().unwrap(),
        ],
    )
    .await
    .unwrap();

    // Assert
    let full = "it is about noon by the clock";
    let partial = result["partial"].as_str().unwrap();
    assert!(
        !partial.is_empty() && partial.len() < full.len() && full.starts_with(partial),
        "expected a partial, streamed text, got {result}"
    );
    assert_eq!(
        result["assistant"].as_str().unwrap().replace(' ', ""),
        full.replace(' ', "")
    );
    assert!(
        result["tools"][0]
            .as_str()
            .unwrap()
            .contains("current_time"),
        "{result}"
    );
    assert!(
        result["status"].as_str().unwrap().contains("ok"),
        "{result}"
    );
    assert!(std::fs::metadata(&screenshot).unwrap().len() > 1000);
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_web_chat_inbox_shows_a_conversation_of_another_channel_in_headless_chromium() {
    use tokio::io::AsyncBufReadExt as _;
    let python = python();
    // Arrange: the page open (loopback: an admin), its inbox subscribed.
    let sandbox = Sandbox::start().await.unwrap();
    Client::connected(&sandbox, None).await.unwrap(); // memory ready
    let screenshot =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/screenshots/inbox.png");
    std::fs::create_dir_all(screenshot.parent().unwrap()).unwrap();
    let mut page = tokio::process::Command::new(&python)
        .current_dir(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("python"))
        .args([
            "inbox.py",
            &format!("http://{}/", sandbox.gateway_addr),
            screenshot.to_str().unwrap(),
        ])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(page.stdout.take().unwrap()).lines();
    let ready = tokio::time::timeout(Duration::from_secs(90), lines.next_line())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ready.as_deref(), Some("ready"));

    // Act: someone writes on another channel, as the NATS CLI does.
    sandbox
        .say("cli:erin", "hello from the terminal")
        .await
        .unwrap();

    // Assert: the inbox shows that conversation with its reply.
    let shown = tokio::time::timeout(Duration::from_secs(90), lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let shown: Value = serde_json::from_str(&shown).unwrap();
    let item = shown["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["session"] == "cli:erin")
        .unwrap_or_else(|| panic!("no cli:erin conversation: {shown}"));
    assert_eq!(item["channel"], "cli");
    assert_eq!(item["direction"], "out");
    assert_eq!(item["last"], "→ echo: hello from the terminal");
    assert!(page.wait().await.unwrap().success());
    assert!(std::fs::metadata(&screenshot).unwrap().len() > 1000);
    sandbox.shutdown().await.unwrap();
}
