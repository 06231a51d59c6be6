//! Principals and session ownership, under attack: each test has one principal (bob) go after
//! another's (alice's) session, or a token reach past its scopes, and shows it refused: a
//! foreign session is `NOT_FOUND` (indistinguishable from a missing one), a missing scope is
//! `FORBIDDEN`, and a read never creates a session.

use std::time::Duration;

use serde_json::{Value, json};

use crate::gateway::{Client, runs_of};
use crate::gateway_attacks::Gateway;
use crate::harness::Sandbox;

const ALICE: &str = "alice-secret";
const BOB: &str = "bob-secret";
const READER: &str = "carol-reads-only";
const ROOT: &str = "ops-is-admin";
/// Alice's session.
const KEY: &str = "alice:diary";

/// A gateway with alice and bob (read, write), carol (read) and ops (admin).
async fn gateway(sandbox: &Sandbox, extra: Value) -> Gateway {
    let mut settings = json!({"tokens": [
        {"token": ALICE, "principal": "alice", "scopes": ["read", "write"]},
        {"token": BOB, "principal": "bob", "scopes": ["read", "write"]},
        {"token": READER, "principal": "carol", "scopes": ["read"]},
        {"token": ROOT, "principal": "ops", "scopes": ["admin"]},
    ]});
    if let (Some(settings), Value::Object(extra)) = (settings.as_object_mut(), extra) {
        settings.extend(extra);
    }
    let gateway = Gateway::start(sandbox, settings).await.unwrap();
    // Its bus connects in the background; a message sent before would be UNAVAILABLE.
    let ready = format!("http://{}/readyz", gateway.addr);
    agentloop_testkit::wait_until("gateway ready", Duration::from_secs(20), || {
        let ready = ready.clone();
        async move {
            let status = reqwest::get(&ready).await.ok()?.status();
            status.is_success().then_some(())
        }
    })
    .await
    .unwrap();
    gateway
}

/// Alice's client, after one answered message on her session; returns it and the run id.
async fn alice_with_a_session(gateway: &Gateway) -> (Client, String) {
    let mut alice = Client::connected_at(gateway.addr, Some(ALICE))
        .await
        .unwrap();
    let id = alice
        .send("agent", json!({"message": "my secret", "sessionKey": KEY}))
        .await
        .unwrap();
    let accepted = alice.response(&id).await.unwrap();
    assert_eq!(accepted["ok"], true, "{accepted}");
    let done = alice.response(&id).await.unwrap();
    assert_eq!(done["payload"]["status"], "ok", "{accepted} {done}");
    let run = accepted["payload"]["runId"].as_str().unwrap().to_owned();
    (alice, run)
}

fn code(response: &Value) -> &str {
    response["error"]["code"].as_str().unwrap_or("<ok>")
}

fn keys(list: &Value) -> Vec<String> {
    list["payload"]["sessions"]
        .as_array()
        .unwrap_or_else(|| panic!("no sessions in {list}"))
        .iter()
        .map(|s| s["key"].as_str().unwrap_or_default().to_owned())
        .collect()
}

async fn sessions_with_key(sandbox: &Sandbox, key: &str) -> i64 {
    let pool = sandbox.pool().await.unwrap();
    sqlx::query_scalar("SELECT count(*) FROM sessions WHERE key = $1")
        .bind(key)
        .fetch_one(&pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn principal_b_reading_a_history_gets_not_found_while_a_and_admin_read_it() {
    // Arrange
    let sandbox = Sandbox::start().await.unwrap();
    let gateway = gateway(&sandbox, json!({})).await;
    let (mut alice, _) = alice_with_a_session(&gateway).await;
    let mut bob = Client::connected_at(gateway.addr, Some(BOB)).await.unwrap();
    let mut ops = Client::connected_at(gateway.addr, Some(ROOT))
        .await
        .unwrap();

    // Act
    let stolen = bob
        .call("chat.history", json!({"sessionKey": KEY}))
        .await
        .unwrap();
    let own = alice
        .call("chat.history", json!({"sessionKey": KEY}))
        .await
        .unwrap();
    let audited = ops
        .call("chat.history", json!({"sessionKey": KEY}))
        .await
        .unwrap();

    // Assert
    assert_eq!(code(&stolen), "NOT_FOUND", "{stolen}");
    assert!(!stolen.to_string().contains("my secret"), "{stolen}");
    assert_eq!(
        own["payload"]["messages"][0]["content"], "my secret",
        "{own}"
    );
    assert_eq!(audited["payload"]["messages"][0]["content"], "my secret");
    gateway.stop().await.unwrap();
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn principal_b_does_not_see_a_session_in_its_list_and_admin_sees_all() {
    // Arrange: bob has a session of his own; an unowned one comes over NATS.
    let sandbox = Sandbox::start().await.unwrap();
    let gateway = gateway(&sandbox, json!({})).await;
    let (mut alice, _) = alice_with_a_session(&gateway).await;
    let mut bob = Client::connected_at(gateway.addr, Some(BOB)).await.unwrap();
    let id = bob
        .send(
            "agent",
            json!({"message": "mine", "sessionKey": "bob:notes"}),
        )
        .await
        .unwrap();
    bob.response(&id).await.unwrap();
    bob.response(&id).await.unwrap();
    sandbox.say("cli:unowned", "over nats").await.unwrap();
    sandbox.finished_runs(3).await.unwrap();
    let mut ops = Client::connected_at(gateway.addr, Some(ROOT))
        .await
        .unwrap();

    // Act
    let bobs = bob.call("sessions.list", json!({})).await.unwrap();
    let alices = alice.call("sessions.list", json!({})).await.unwrap();
    let all = ops.call("sessions.list", json!({})).await.unwrap();

    // Assert
    assert_eq!(keys(&bobs), ["bob:notes"], "{bobs}");
    assert_eq!(keys(&alices), [KEY], "{alices}");
    let mut all = keys(&all);
    all.sort();
    assert_eq!(all, ["alice:diary", "bob:notes", "cli:unowned"]);
    gateway.stop().await.unwrap();
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn principal_b_cannot_reset_patch_abort_wait_on_or_send_to_a_session() {
    // Arrange
    let sandbox = Sandbox::start().await.unwrap();
    let gateway = gateway(&sandbox, json!({})).await;
    let (mut alice, run) = alice_with_a_session(&gateway).await;
    let mut bob = Client::connected_at(gateway.addr, Some(BOB)).await.unwrap();

    // Act
    let mut answers = Vec::new();
    for (method, params) in [
        ("sessions.reset", json!({"key": KEY})),
        ("sessions.patch", json!({"key": KEY, "queueMode": "steer"})),
        ("chat.abort", json!({"sessionKey": KEY})),
        ("chat.abort", json!({"runId": run})),
        ("agent.wait", json!({"runId": run, "timeoutMs": 10})),
        ("agent", json!({"message": "injected", "sessionKey": KEY})),
        (
            "chat.send",
            json!({"message": "injected", "sessionKey": KEY}),
        ),
    ] {
        answers.push((method, bob.call(method, params).await.unwrap()));
    }

    // Assert: every one is NOT_FOUND, and the session is as alice left it.
    for (method, answer) in &answers {
        assert_eq!(code(answer), "NOT_FOUND", "{method}: {answer}");
    }
    assert_eq!(runs_of(&sandbox, KEY).await.unwrap(), 1);
    let history = alice
        .call("chat.history", json!({"sessionKey": KEY}))
        .await
        .unwrap();
    assert_eq!(history["payload"]["messages"].as_array().unwrap().len(), 2);
    let list = alice.call("sessions.list", json!({})).await.unwrap();
    assert_eq!(list["payload"]["sessions"][0]["queueMode"], "", "{list}");
    gateway.stop().await.unwrap();
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn principal_b_gets_404_for_a_session_over_chat_completions() {
    // Arrange
    let sandbox = Sandbox::start().await.unwrap();
    let gateway = gateway(&sandbox, json!({})).await;
    alice_with_a_session(&gateway).await;
    let url = format!("http://{}/v1/chat/completions", gateway.addr);
    let body = json!({"model": "agentloop", "messages": [{"role": "user", "content": "injected"}]});
    let http = reqwest::Client::new();

    // Act: once by `user`, once by `X-Session-Key`.
    let mut by_user = body.clone();
    by_user["user"] = json!(KEY);
    let user = http
        .post(&url)
        .bearer_auth(BOB)
        .json(&by_user)
        .send()
        .await
        .unwrap();
    let header = http
        .post(&url)
        .bearer_auth(BOB)
        .header("x-session-key", KEY)
        .json(&body)
        .send()
        .await
        .unwrap();

    // Assert
    assert_eq!(user.status().as_u16(), 404);
    assert_eq!(header.status().as_u16(), 404);
    assert_eq!(runs_of(&sandbox, KEY).await.unwrap(), 1);
    gateway.stop().await.unwrap();
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_read_only_token_cannot_send_reset_or_abort() {
    // Arrange
    let sandbox = Sandbox::start().await.unwrap();
    let gateway = gateway(&sandbox, json!({})).await;
    let mut carol = Client::connected_at(gateway.addr, Some(READER))
        .await
        .unwrap();

    // Act
    let sent = carol
        .call("agent", json!({"message": "hi", "sessionKey": "carol:1"}))
        .await
        .unwrap();
    let chat = carol
        .call(
            "chat.send",
            json!({"message": "hi", "sessionKey": "carol:1"}),
        )
        .await
        .unwrap();
    let reset = carol
        .call("sessions.reset", json!({"key": "carol:1"}))
        .await
        .unwrap();
    let abort = carol
        .call("chat.abort", json!({"sessionKey": "carol:1"}))
        .await
        .unwrap();
    let list = carol.call("sessions.list", json!({})).await.unwrap();

    // Assert
    for answer in [&sent, &chat, &reset, &abort] {
        assert_eq!(code(answer), "FORBIDDEN", "{answer}");
    }
    assert_eq!(list["ok"], true, "{list}");
    assert_eq!(sessions_with_key(&sandbox, "carol:1").await, 0);
    gateway.stop().await.unwrap();
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_read_of_an_unknown_key_creates_no_session() {
    // Arrange: the token-less loopback gateway (an admin).
    let sandbox = Sandbox::start().await.unwrap();
    let mut client = Client::connected(&sandbox, None).await.unwrap();

    // Act
    let history = client
        .call("chat.history", json!({"sessionKey": "ghost"}))
        .await
        .unwrap();
    let reset = client
        .call("sessions.reset", json!({"key": "ghost"}))
        .await
        .unwrap();
    let patch = client
        .call(
            "sessions.patch",
            json!({"key": "ghost", "queueMode": "steer"}),
        )
        .await
        .unwrap();
    let abort = client
        .call("chat.abort", json!({"sessionKey": "ghost"}))
        .await
        .unwrap();

    // Assert
    for answer in [&history, &reset, &patch, &abort] {
        assert_eq!(code(answer), "NOT_FOUND", "{answer}");
    }
    assert_eq!(sessions_with_key(&sandbox, "ghost").await, 0);
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_non_admin_may_switch_only_to_allowlisted_models_and_not_the_thinking_level() {
    // Arrange: an empty allowlist, so non-admins may use the default model only.
    let sandbox = Sandbox::start().await.unwrap();
    let gateway = gateway(&sandbox, json!({})).await;
    let (mut alice, _) = alice_with_a_session(&gateway).await;
    let mut ops = Client::connected_at(gateway.addr, Some(ROOT))
        .await
        .unwrap();

    // Act
    let pricey = alice
        .call(
            "sessions.patch",
            json!({"key": KEY, "model": "openai/pricey"}),
        )
        .await
        .unwrap();
    let thinking = alice
        .call(
            "sessions.patch",
            json!({"key": KEY, "thinkingLevel": "xhigh"}),
        )
        .await
        .unwrap();
    let default = alice
        .call(
            "sessions.patch",
            json!({"key": KEY, "model": "openai/fake-echo"}),
        )
        .await
        .unwrap();
    let by_admin = ops
        .call(
            "sessions.patch",
            json!({"key": KEY, "model": "openai/pricey"}),
        )
        .await
        .unwrap();

    // Assert
    assert_eq!(code(&pricey), "FORBIDDEN", "{pricey}");
    assert_eq!(code(&thinking), "FORBIDDEN", "{thinking}");
    assert_eq!(default["payload"]["model"], "openai/fake-echo", "{default}");
    assert_eq!(by_admin["payload"]["model"], "openai/pricey", "{by_admin}");
    gateway.stop().await.unwrap();
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn principal_b_naming_as_sender_cannot_recall_list_or_forget_as_memories() {
    // Arrange: alice saves a memory through her own session.
    let sandbox = Sandbox::start().await.unwrap();
    let gateway = gateway(&sandbox, json!({})).await;
    let mut alice = Client::connected_at(gateway.addr, Some(ALICE))
        .await
        .unwrap();
    let save = r#"[[tool:memory_save:{"text":"alice's locker code is 4711"}]]"#;
    let id = alice
        .send(
            "agent",
            json!({"message": save, "sessionKey": KEY, "senderId": "alice"}),
        )
        .await
        .unwrap();
    alice.response(&id).await.unwrap();
    let done = alice.response(&id).await.unwrap();
    assert_eq!(done["payload"]["status"], "ok", "{done}");
    let mut bob = Client::connected_at(gateway.addr, Some(BOB)).await.unwrap();

    // Act: bob's client claims alice's sender id and asks about the code, then lists and forgets.
    let question = "what is the locker code?";
    let id = bob
        .send(
            "agent",
            json!({"message": question, "sessionKey": "bob:x", "senderId": "alice"}),
        )
        .await
        .unwrap();
    bob.response(&id).await.unwrap();
    bob.response(&id).await.unwrap();
    let bobs_list = bob.call("memory.list", json!({})).await.unwrap();
    let bobs_forget = bob
        .call("memory.forget", json!({"query": "locker code"}))
        .await
        .unwrap();

    // Assert: nothing of alice's reached bob's model, list or forget; alice still has it.
    let requests = sandbox.fake.requests();
    let bobs_request = requests
        .iter()
        .rev()
        .find(|r| r.body.to_string().contains(question))
        .expect("bob's message reached the model");
    assert!(
        !bobs_request.body.to_string().contains("4711"),
        "alice's memory reached bob's context"
    );
    assert_eq!(bobs_list["payload"]["memories"], json!([]), "{bobs_list}");
    assert_eq!(
        bobs_forget["payload"]["forgotten"],
        json!([]),
        "{bobs_forget}"
    );
    let alices = alice.call("memory.list", json!({})).await.unwrap();
    let texts: Vec<&str> = alices["payload"]["memories"]
        .as_array()
        .unwrap_or_else(|| panic!("{alices}"))
        .iter()
        .filter_map(|m| m["text"].as_str())
        .collect();
    assert_eq!(texts, vec!["alice's locker code is 4711"]);
    let forgot = alice
        .call("memory.forget", json!({"query": "locker"}))
        .await
        .unwrap();
    assert_eq!(
        forgot["payload"]["forgotten"].as_array().map(Vec::len),
        Some(1),
        "{forgot}"
    );
    gateway.stop().await.unwrap();
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn principal_b_sees_none_of_a_s_usage_and_a_sees_its_own() {
    let sandbox = Sandbox::start().await.unwrap();
    let gateway = gateway(&sandbox, json!({})).await;
    let (mut alice, _) = alice_with_a_session(&gateway).await;
    runs_of(&sandbox, KEY).await.unwrap();
    let pool = sandbox.finished_runs(1).await.unwrap();
    let tokens: i64 = sqlx::query_scalar("SELECT sum(input_tokens)::bigint FROM runs")
        .fetch_one(&pool)
        .await
        .unwrap();
    let mut bob = Client::connected_at(gateway.addr, Some(BOB)).await.unwrap();

    let alices = alice.call("sessions.usage", json!({})).await.unwrap();
    let bobs = bob.call("sessions.usage", json!({})).await.unwrap();

    let session = &alices["payload"]["sessions"][0];
    assert_eq!(session["key"], KEY, "{alices}");
    assert_eq!(session["runs"], 1);
    assert_eq!(session["inputTokens"].as_i64(), Some(tokens));
    assert_eq!(alices["payload"]["agents"][0]["agentId"], "main");
    assert_eq!(bobs["payload"]["sessions"], json!([]), "{bobs}");
    assert_eq!(bobs["payload"]["agents"], json!([]), "{bobs}");
    gateway.stop().await.unwrap();
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn only_an_admin_watches_the_inbox_of_every_conversation() {
    // Arrange
    let sandbox = Sandbox::start().await.unwrap();
    let gateway = gateway(&sandbox, json!({})).await;
    let mut bob = Client::connected_at(gateway.addr, Some(BOB)).await.unwrap();
    let mut carol = Client::connected_at(gateway.addr, Some(READER))
        .await
        .unwrap();
    let mut ops = Client::connected_at(gateway.addr, Some(ROOT))
        .await
        .unwrap();

    // Act: bob and carol try to watch everyone's messages; ops does; alice talks.
    let bobs = bob.call("inbox.subscribe", json!({})).await.unwrap();
    let carols = carol.call("inbox.subscribe", json!({})).await.unwrap();
    let ops_answer = ops.call("inbox.subscribe", json!({})).await.unwrap();
    let (_alice, _run) = alice_with_a_session(&gateway).await;

    // Assert
    assert_eq!(code(&bobs), "FORBIDDEN", "{bobs}");
    assert_eq!(code(&carols), "FORBIDDEN", "{carols}");
    assert_eq!(ops_answer["payload"]["subscribed"], true, "{ops_answer}");
    let mut seen = Vec::new();
    while !seen.iter().any(|e: &Value| e["direction"] == "out") {
        let frame = ops.frame().await.unwrap().unwrap();
        if frame["event"] == "inbox" {
            seen.push(frame["payload"].clone());
        }
    }
    assert_eq!(seen[0]["direction"], "in", "{seen:?}");
    assert_eq!(seen[0]["sessionKey"], KEY);
    assert_eq!(seen[0]["text"], "my secret");
    assert_eq!(seen.last().unwrap()["text"], "echo: my secret");
    // Bob's connection got no inbox event.
    let mut bob_events = 0;
    while let Ok(Ok(Ok(frame))) =
        tokio::time::timeout(Duration::from_millis(300), bob.frame()).await
    {
        bob_events += usize::from(frame["event"] == "inbox");
    }
    assert_eq!(bob_events, 0);
    gateway.stop().await.unwrap();
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn nobody_takes_another_principals_main_session_by_using_its_key_first() {
    // Arrange
    let sandbox = Sandbox::start().await.unwrap();
    let gateway = gateway(&sandbox, json!({})).await;
    let mut bob = Client::open_at(gateway.addr).await.unwrap();
    let hello = bob
        .call("connect", json!({"auth": {"token": BOB}}))
        .await
        .unwrap();

    // Act: bob plants messages on the main keys before their owners use them.
    let mut planted = Vec::new();
    for key in [
        "agent:main:main",
        "agent:main:main:alice",
        "agent:main:main:ops",
    ] {
        let id = bob
            .send("agent", json!({"message": "planted", "sessionKey": key}))
            .await
            .unwrap();
        planted.push((key, bob.response(&id).await.unwrap()));
    }
    // The admin writes without naming a session.
    let mut ops = Client::connected_at(gateway.addr, Some(ROOT))
        .await
        .unwrap();
    let id = ops
        .send("agent", json!({"message": "the admin's secret"}))
        .await
        .unwrap();
    let accepted = ops.response(&id).await.unwrap();
    let done = ops.response(&id).await.unwrap();
    let peek = bob
        .call("chat.history", json!({"sessionKey": "agent:main:main:ops"}))
        .await
        .unwrap();

    // Assert: each main key is its owner's; the admin's message went to the admin's own.
    assert_eq!(
        hello["payload"]["snapshot"]["sessionDefaults"]["mainSessionKey"], "agent:main:main:bob",
        "{hello}"
    );
    for (key, answer) in &planted {
        assert_eq!(code(answer), "NOT_FOUND", "{key}: {answer}");
    }
    assert_eq!(sessions_with_key(&sandbox, "agent:main:main").await, 0);
    assert_eq!(
        sessions_with_key(&sandbox, "agent:main:main:alice").await,
        0
    );
    let own = ops
        .call("chat.history", json!({"sessionKey": "agent:main:main:ops"}))
        .await
        .unwrap();
    assert!(!own.to_string().contains("planted"), "{own}");
    assert_eq!(
        accepted["payload"]["sessionKey"], "agent:main:main:ops",
        "{accepted}"
    );
    assert_eq!(done["payload"]["status"], "ok", "{done}");
    assert_eq!(code(&peek), "NOT_FOUND", "{peek}");
    assert!(!peek.to_string().contains("the admin's secret"), "{peek}");
    gateway.stop().await.unwrap();
    sandbox.shutdown().await.unwrap();
}
