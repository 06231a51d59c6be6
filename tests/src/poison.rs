//! Poison input and leaking provider errors, each written as the attack: a NUL byte in a
//! message or a session key, a model answer Postgres cannot store, an API key in a provider's
//! error text.

use std::time::Duration;

use anyhow::Context as _;
use futures::StreamExt as _;
use serde_json::{Value, json};
use sqlx::Row as _;

use agentloop_fake_model::{Failure, ScriptedReply};
use agentloop_model::AuthProfile;
use agentloop_proto::v1::OutboundMessage;

use crate::harness::{Sandbox, SandboxOptions, collect_run_events, next_reply};

const WAIT: Duration = Duration::from_secs(20);

/// Waits for the next dead letter and returns its subject and reason.
async fn next_dead_letter(sub: &mut async_nats::Subscriber) -> anyhow::Result<(String, String)> {
    let msg = tokio::time::timeout(WAIT, sub.next())
        .await
        .context("timed out waiting for a dead letter")?
        .context("dead letter subscription closed")?;
    let reason = msg
        .headers
        .as_ref()
        .and_then(|h| h.get(agentloop_bus::HEADER_ERROR))
        .map(|v| v.as_str().to_owned())
        .unwrap_or_default();
    Ok((msg.subject.to_string(), reason))
}

async fn ask(sandbox: &Sandbox, key: &str, text: &str) -> anyhow::Result<Value> {
    let reply = tokio::time::timeout(
        WAIT,
        sandbox.client.request(
            sandbox.subject("ask"),
            json!({"sessionKey": key, "text": text}).to_string().into(),
        ),
    )
    .await
    .context("no answer to ask")??;
    Ok(serde_json::from_slice(&reply.payload)?)
}

#[tokio::test]
async fn a_nul_in_a_message_is_dead_lettered_and_the_session_answers_the_next_one() {
    let sandbox = Sandbox::start().await.unwrap();
    let mut dead = sandbox.subscribe("dlq.>").await;
    let mut replies = sandbox.subscribe("deliver.>").await;

    sandbox.say("poisoned", "hello\u{0}world").await.unwrap();
    let (subject, reason) = next_dead_letter(&mut dead).await.unwrap();
    assert_eq!(
        subject,
        sandbox.subject(&format!("dlq.{}", sandbox.subject("inbound.cli")))
    );
    assert!(reason.contains("NUL"), "reason: {reason}");

    sandbox.say("poisoned", "hello again").await.unwrap();
    let reply = next_reply(&mut replies, WAIT).await.unwrap();
    assert_eq!(reply.text, "echo: hello again");
    assert_eq!(reply.session_key, "poisoned");
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_nul_in_a_session_key_is_an_invalid_request_not_an_outage() {
    let sandbox = Sandbox::start().await.unwrap();
    let answer = ask(&sandbox, "bad\u{0}key", "hello").await.unwrap();
    let error = answer["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("sessionKey") && error.contains("NUL"),
        "answer: {answer}"
    );
    // The same client goes on being answered.
    let answer = ask(&sandbox, "good-key", "hello").await.unwrap();
    assert_eq!(answer["text"], "echo: hello");
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_run_command_with_a_nul_published_past_the_router_is_dead_lettered_by_the_runner() {
    let sandbox = Sandbox::start().await.unwrap();
    let mut dead = sandbox.subscribe("dlq.>").await;
    let session_id = uuid::Uuid::now_v7().to_string();
    let js = async_nats::jetstream::new(sandbox.client.clone());
    let command = json!({"sessionId": session_id, "sessionKey": "direct", "text": "a\u{0}b"});
    js.publish(
        sandbox.subject(&format!("run.{session_id}")),
        command.to_string().into(),
    )
    .await
    .unwrap()
    .await
    .unwrap();
    let (subject, reason) = next_dead_letter(&mut dead).await.unwrap();
    assert_eq!(
        subject,
        sandbox.subject(&format!(
            "dlq.{}",
            sandbox.subject(&format!("run.{session_id}"))
        ))
    );
    assert!(reason.contains("text contains a NUL"), "reason: {reason}");
    sandbox.shutdown().await.unwrap();
}

/// The replies of one session until one carries an error.
async fn error_reply(sub: &mut async_nats::Subscriber) -> anyhow::Result<OutboundMessage> {
    loop {
        let reply = next_reply(sub, WAIT).await?;
        if !reply.error.is_empty() {
            return Ok(reply);
        }
    }
}

#[tokio::test]
async fn an_answer_postgres_cannot_store_ends_the_run_and_frees_the_session() {
    let sandbox = Sandbox::start().await.unwrap();
    let mut dead = sandbox.subscribe("dlq.>").await;
    let mut replies = sandbox.subscribe("deliver.>").await;
    // Validation cannot see this one coming: the model's own answer holds a NUL.
    sandbox
        .fake
        .push_script(ScriptedReply::text("a broken \u{0} answer"));

    sandbox.say("wedged", "first").await.unwrap();
    let failed = error_reply(&mut replies).await.unwrap();
    assert!(
        failed.error.contains("could not be stored"),
        "error: {}",
        failed.error
    );
    let (subject, reason) = next_dead_letter(&mut dead).await.unwrap();
    assert!(
        subject.starts_with(&sandbox.subject(&format!("dlq.{}", sandbox.subject("run.")))),
        "subject: {subject}"
    );
    assert!(reason.contains("could not be stored"), "reason: {reason}");

    sandbox.say("wedged", "second").await.unwrap();
    let reply = next_reply(&mut replies, WAIT).await.unwrap();
    assert_eq!(reply.text, "echo: second");
    let pool = sandbox.finished_runs(2).await.unwrap();
    let statuses: Vec<String> = sqlx::query_scalar("SELECT status FROM runs ORDER BY started_at")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(statuses, vec!["error", "completed"]);
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_api_key_in_a_provider_error_reaches_neither_user_nor_events_nor_postgres() {
    const KEY: &str = "sk-proj-Zq81mK2vX4sLw9Tn5Rb3Hd7Yp0Cf6Gj";
    let sandbox = Sandbox::start_with(SandboxOptions {
        runner: Some(Box::new(|config| {
            config.models.profiles = vec![AuthProfile {
                name: "main".into(),
                provider: "openai".into(),
                api_key: Some(KEY.into()),
                base_url: None,
            }];
        })),
        ..Default::default()
    })
    .await
    .unwrap();
    sandbox.fake.state().fail_key(KEY, Some(Failure::Auth));
    let mut events = sandbox.subscribe("events.*.*").await;

    let answer = ask(&sandbox, "leaky", "hello").await.unwrap();
    let run = collect_run_events(&mut events, WAIT).await.unwrap();
    // The attack is real: the provider puts the key in its error text.
    let body = provider_error_body(&sandbox, KEY).await;
    assert!(body.contains(KEY), "provider error: {body}");

    let shown = answer.to_string();
    assert!(!shown.contains(KEY), "reply: {shown}");
    assert!(shown.contains("auth"), "reply: {shown}");
    for event in &run {
        assert!(!event.data.contains(KEY), "event: {}", event.data);
    }
    let pool = sandbox.finished_runs(1).await.unwrap();
    let row = sqlx::query("SELECT error FROM runs")
        .fetch_one(&pool)
        .await
        .unwrap();
    let error: String = row.get("error");
    assert!(!error.contains(KEY), "runs.error: {error}");
    assert!(error.contains("auth"), "runs.error: {error}");
    let cooldowns: Vec<Option<String>> =
        sqlx::query_scalar("SELECT last_error FROM auth_profile_cooldowns")
            .fetch_all(&pool)
            .await
            .unwrap();
    for stored in cooldowns.into_iter().flatten() {
        assert!(!stored.contains(KEY), "cooldown error: {stored}");
    }
    sandbox.shutdown().await.unwrap();
}

/// The provider's error body for a request made with `key`, as the runner receives it.
async fn provider_error_body(sandbox: &Sandbox, key: &str) -> String {
    reqwest::Client::new()
        .post(format!(
            "{}/chat/completions",
            sandbox.fake.openai_base_url()
        ))
        .bearer_auth(key)
        .json(&json!({"model": "fake-echo", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

#[tokio::test]
async fn an_idempotency_key_with_a_line_break_is_routed_and_answered_once() {
    // Arrange: the key becomes part of a stream message id, which travels as a header.
    let sandbox = Sandbox::start().await.unwrap();
    let mut replies = sandbox.subscribe("deliver.>").await;
    let mut dead = sandbox.subscribe("dlq.>").await;
    let key = "a\r\nNats-Expected-Stream: nowhere";

    // Act: the message twice under that key, then another.
    for _ in 0..2 {
        sandbox
            .publish_json(
                "cli",
                json!({"sessionKey": "crlf", "text": "first", "idempotencyKey": key}),
            )
            .await
            .unwrap();
    }
    let first = next_reply(&mut replies, WAIT).await.unwrap();
    sandbox.say("crlf", "second").await.unwrap();
    let second = next_reply(&mut replies, WAIT).await.unwrap();

    // Assert: answered, once, and nothing dead-lettered.
    assert_eq!(first.text, "echo: first");
    assert_eq!(second.text, "echo: second");
    assert!(
        tokio::time::timeout(Duration::from_millis(300), dead.next())
            .await
            .is_err(),
        "a dead letter appeared"
    );
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_message_too_large_to_dead_letter_whole_is_kept_cut_to_fit_with_its_size() {
    // Arrange: an undecodable payload at the server's limit, so the letter's own headers
    // would push it past.
    let sandbox = Sandbox::start().await.unwrap();
    let mut dead = sandbox.subscribe("dlq.>").await;
    let mut replies = sandbox.subscribe("deliver.>").await;
    let garbage = vec![0xffu8; sandbox.client.server_info().max_payload - 64];

    // Act
    sandbox
        .client
        .publish(sandbox.subject("inbound.cli"), garbage.clone().into())
        .await
        .unwrap();
    let letter = tokio::time::timeout(WAIT, dead.next())
        .await
        .expect("no dead letter")
        .unwrap();
    sandbox.say("after-the-big-one", "hello").await.unwrap();
    let reply = next_reply(&mut replies, WAIT).await.unwrap();

    // Assert: kept, cut, marked with the original size; the next message is answered.
    let truncated = letter
        .headers
        .as_ref()
        .and_then(|h| h.get(agentloop_bus::HEADER_TRUNCATED))
        .map(|v| v.as_str().to_owned());
    assert_eq!(truncated, Some(garbage.len().to_string()));
    assert!(
        letter.payload.len() < garbage.len() && letter.payload.len() > garbage.len() / 2,
        "{} bytes kept",
        letter.payload.len()
    );
    assert!(letter.payload.iter().all(|b| *b == 0xff));
    assert!(!crate::harness::dead_letter_reason(&letter).is_empty());
    assert_eq!(reply.text, "echo: hello");
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_run_command_published_as_json_runs_and_is_answered() {
    // Arrange: a session that exists, and its id.
    let sandbox = Sandbox::start().await.unwrap();
    let mut replies = sandbox.subscribe("deliver.>").await;
    sandbox.say("by-hand", "first").await.unwrap();
    let first = next_reply(&mut replies, WAIT).await.unwrap();
    let js = async_nats::jetstream::new(sandbox.client.clone());

    // Act: a RunCommand typed as JSON (as `agentloop dlq retry --edit` republishes one).
    let command = json!({"sessionId": first.session_id, "sessionKey": "by-hand",
                         "channel": "cli", "text": "typed as JSON",
                         "idempotencyKey": "by-hand-1"});
    js.publish(
        sandbox.subject(&format!("run.{}", first.session_id)),
        command.to_string().into(),
    )
    .await
    .unwrap()
    .await
    .unwrap();
    let reply = next_reply(&mut replies, WAIT).await.unwrap();

    // Assert
    assert_eq!(reply.text, "echo: typed as JSON", "{reply:?}");
    assert!(reply.error.is_empty(), "{reply:?}");
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_control_message_no_runner_can_act_on_is_kept_once_however_many_runners_refuse_it() {
    // Every runner replica hears every control subject. A forged abort (bytes that decode to
    // nothing, an action that does not exist) must be kept, once, and stop nothing.
    let sandbox = Sandbox::start_with(SandboxOptions {
        runners: 3,
        ..Default::default()
    })
    .await
    .unwrap();
    let session = uuid::Uuid::new_v4().to_string();
    let control = sandbox.subject(&format!("control.{session}"));
    sandbox
        .client
        .publish(control.clone(), "\u{0}\u{ff}not a control".into())
        .await
        .unwrap();
    sandbox
        .client
        .publish(control.clone(), r#"{"action":"self-destruct"}"#.into())
        .await
        .unwrap();
    // A subscriber on `dlq.>` would see every replica's copy; the stream is what keeps.
    let js = async_nats::jetstream::new(sandbox.client.clone());
    let dlq = js
        .get_stream(format!("{}_DLQ", sandbox.prefix.to_uppercase()))
        .await
        .unwrap();
    let letter_subject = sandbox.subject(&format!("dlq.{control}"));
    let letters = || async {
        let mut dlq = dlq.clone();
        let last = dlq.info().await.unwrap().state.last_sequence;
        let mut reasons = Vec::new();
        for seq in 1..=last {
            let letter = dlq.get_raw_message(seq).await.unwrap();
            if letter.subject.as_str() == letter_subject {
                let reason = letter.headers.get(agentloop_bus::HEADER_ERROR).unwrap();
                reasons.push(reason.as_str().to_owned());
            }
        }
        reasons
    };
    agentloop_testkit::wait_until("both dead letters kept", WAIT, || async {
        (letters().await.len() >= 2).then_some(())
    })
    .await
    .unwrap();
    // The other replicas' copies had time to arrive; the stream absorbed them.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let reasons = letters().await;
    assert_eq!(reasons.len(), 2, "one letter each: {reasons:?}");
    assert!(
        reasons.iter().any(|r| r.contains("protobuf"))
            && reasons.iter().any(|r| r.contains("self-destruct")),
        "each letter says what is wrong: {reasons:?}"
    );
    // The runners go on running sessions.
    let answer = ask(&sandbox, "after-forged-controls", "still there?")
        .await
        .unwrap();
    assert_eq!(answer["text"], "echo: still there?");
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_oversized_sender_agent_or_channel_is_refused_by_name_and_the_session_goes_on() {
    // Each of these names is stored under a unique index (pairing, per-user memory, sessions);
    // past what an index row holds, every write of it would fail, run after run.
    let sandbox = Sandbox::start().await.unwrap();
    let mut dead = sandbox.subscribe("dlq.>").await;
    let mut replies = sandbox.subscribe("deliver.>").await;
    let long = "s".repeat(4_000);
    for (field, json) in [
        (
            "senderId",
            json!({"sessionKey": "long-names", "text": "hi", "senderId": long}),
        ),
        (
            "agentId",
            json!({"sessionKey": "long-names", "text": "hi", "agentId": long}),
        ),
        (
            "channel",
            json!({"sessionKey": "long-names", "text": "hi", "channel": long}),
        ),
    ] {
        sandbox.publish_json("cli", json).await.unwrap();
        let (_, reason) = next_dead_letter(&mut dead).await.unwrap();
        assert!(
            reason.contains(field) && reason.contains("longer"),
            "{field}: {reason}"
        );
    }
    sandbox.say("long-names", "and now?").await.unwrap();
    let reply = next_reply(&mut replies, WAIT).await.unwrap();
    assert_eq!(reply.text, "echo: and now?");
    sandbox.shutdown().await.unwrap();
}
