//! Which answers a dispatch record stores: a completed run's own answer is read from the run's
//! transcript when a request is repeated, and only an answer the transcript does not hold (here
//! one a `message_sending` hook changed) is stored in the record. A keyless request over the
//! OpenAI API gets no record at all: its client cannot come back to it.

use std::time::Duration;

use serde_json::{Value, json};
use sqlx::Row as _;

use agentloop_agent_runner::HookPoint;

use crate::gateway::{Client, runs_of};
use crate::harness::Sandbox;

/// Sends one chat completion for `user` under `key` and returns the answer's content.
async fn complete(sandbox: &Sandbox, user: &str, key: &str, text: &str) -> String {
    complete_keyed(sandbox, user, Some(key), text).await
}

/// Sends one chat completion for `user`, with an `Idempotency-Key` when `key` is given (the
/// official OpenAI clients send none).
async fn complete_keyed(sandbox: &Sandbox, user: &str, key: Option<&str>, text: &str) -> String {
    let url = format!("http://{}/v1/chat/completions", sandbox.gateway_addr);
    let mut request = reqwest::Client::new().post(url);
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    let answer: Value = request
        .json(&json!({"model": "agentloop", "user": user,
                      "messages": [{"role": "user", "content": text}]}))
        .timeout(Duration::from_secs(20))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    answer["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("no answer: {answer}"))
        .to_owned()
}

/// The dispatch record of (`session_key`, `key`): its status and stored text.
async fn record(sandbox: &Sandbox, session_key: &str, key: &str) -> (String, Option<String>) {
    let row = sqlx::query(
        "SELECT status, text FROM dispatches WHERE session_key = $1 AND idempotency_key = $2",
    )
    .bind(session_key)
    .bind(key)
    .fetch_one(&sandbox.pool().await.unwrap())
    .await
    .unwrap();
    (row.get("status"), row.get("text"))
}

#[tokio::test]
async fn a_repeat_of_a_completed_run_is_answered_from_the_run_without_a_stored_copy() {
    // Arrange
    let sandbox = Sandbox::start().await.unwrap();
    Client::connected(&sandbox, None).await.unwrap(); // memory ready

    // Act: the request, then the same key again after its run finished
    let first = complete(&sandbox, "da:plain", "plain-1", "hello once").await;
    sandbox.finished_runs(1).await.unwrap();
    let repeated = complete(&sandbox, "da:plain", "plain-1", "hello once").await;

    // Assert
    assert_eq!(first, "echo: hello once");
    assert_eq!(repeated, first);
    assert_eq!(runs_of(&sandbox, "da:plain").await.unwrap(), 1);
    // The answer lives in the run's transcript only.
    assert_eq!(
        record(&sandbox, "da:plain", "plain-1").await,
        ("accepted".to_owned(), None)
    );
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_keyless_openai_request_to_a_known_session_writes_no_record() {
    // Arrange: the session is known to the gateway after its first message
    let sandbox = Sandbox::start().await.unwrap();
    Client::connected(&sandbox, None).await.unwrap(); // memory ready
    let first = complete_keyed(&sandbox, "da:keyless", None, "one").await;

    // Act
    let second = complete_keyed(&sandbox, "da:keyless", None, "two").await;
    let keyed = complete_keyed(&sandbox, "da:keyless", Some("keyed-3"), "three").await;

    // Assert: every message answered and run; records only where a client could come back
    assert_eq!(
        [first, second, keyed],
        ["echo: one", "echo: two", "echo: three"]
    );
    sandbox.finished_runs(3).await.unwrap();
    assert_eq!(runs_of(&sandbox, "da:keyless").await.unwrap(), 3);
    let keys: Vec<String> = sqlx::query_scalar(
        "SELECT idempotency_key FROM dispatches WHERE session_key = $1 ORDER BY created_at",
    )
    .bind("da:keyless")
    .fetch_all(&sandbox.pool().await.unwrap())
    .await
    .unwrap();
    // The first message resolved the session through its record (the key the gateway chose).
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert_eq!(keys[1], "keyed-3");
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_answer_a_hook_changed_is_stored_and_its_repeat_gets_the_changed_text() {
    // Arrange: a message_sending hook that rewrites every reply
    let sandbox = Sandbox::start_with_hook(
        HookPoint::MessageSending,
        |body| json!({"text": format!("reviewed: {}", body["text"].as_str().unwrap_or_default())}),
    )
    .await
    .unwrap();
    Client::connected(&sandbox, None).await.unwrap(); // memory ready

    // Act: the request, then the same key again at once and after its run finished
    let first = complete(&sandbox, "da:hooked", "hooked-1", "hello hook").await;
    let at_once = complete(&sandbox, "da:hooked", "hooked-1", "hello hook").await;
    sandbox.finished_runs(1).await.unwrap();
    let later = complete(&sandbox, "da:hooked", "hooked-1", "hello hook").await;

    // Assert: the transcript holds "echo: hello hook"; every answer is the changed text
    assert_eq!(first, "reviewed: echo: hello hook");
    assert_eq!(at_once, first);
    assert_eq!(later, first);
    assert_eq!(runs_of(&sandbox, "da:hooked").await.unwrap(), 1);
    assert_eq!(
        record(&sandbox, "da:hooked", "hooked-1").await,
        ("ok".to_owned(), Some(first))
    );
    sandbox.shutdown().await.unwrap();
}
