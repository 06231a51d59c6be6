//! `replyEarly`: a request/reply caller that takes the first answer gets it from the runner as
//! soon as the reply is built, without waiting for the outbound stream and delivery. These run
//! without a delivery service, so every answer seen here is the runner's.

use std::time::Duration;

use futures::StreamExt as _;
use serde_json::json;

use crate::harness::{Sandbox, SandboxOptions, next_reply};

const WAIT: Duration = Duration::from_secs(20);

async fn without_delivery() -> Sandbox {
    Sandbox::start_with(SandboxOptions {
        no_delivery: true,
        ..Default::default()
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn a_caller_that_asks_for_an_early_answer_gets_it_from_the_runner() {
    let sandbox = without_delivery().await;
    let mut replies = sandbox.client.subscribe("_INBOX.early.1").await.unwrap();
    sandbox
        .publish_json(
            "cli",
            json!({"sessionKey": "cli:early", "text": "hello", "replySubject": "_INBOX.early.1",
                   "replyEncoding": "json", "replyEarly": true}),
        )
        .await
        .unwrap();
    let answer = next_reply(&mut replies, WAIT).await.unwrap();
    assert_eq!(answer.text, "echo: hello");
    assert!(answer.r#final);
    assert!(answer.error.is_empty());
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn without_asking_the_caller_is_answered_by_delivery_only() {
    let sandbox = without_delivery().await;
    let mut replies = sandbox.client.subscribe("_INBOX.late.1").await.unwrap();
    sandbox
        .publish_json(
            "cli",
            json!({"sessionKey": "cli:late", "text": "hello", "replySubject": "_INBOX.late.1",
                   "replyEncoding": "json"}),
        )
        .await
        .unwrap();
    // The runner publishes its reply before it marks the run finished: once the run is
    // finished, an answer of the runner's would have been sent already.
    sandbox.finished_runs(1).await.unwrap();
    sandbox.client.flush().await.unwrap();
    let early = tokio::time::timeout(Duration::from_millis(500), replies.next()).await;
    assert!(
        early.is_err(),
        "the runner answered a caller that did not ask for it: {early:?}"
    );
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_early_answer_is_never_sent_to_a_subject_outside_the_reply_space() {
    let sandbox = without_delivery().await;
    let inbound = sandbox.subject("inbound.cli");
    let mut seen = sandbox.client.subscribe(inbound.clone()).await.unwrap();
    // A hostile NATS client aims the early answer at the inbound subject, so it would come
    // back in as a new message and loop.
    sandbox
        .publish_json(
            "cli",
            json!({"sessionKey": "cli:loop", "text": "hi", "replySubject": inbound,
                   "replyEarly": true}),
        )
        .await
        .unwrap();
    sandbox.finished_runs(1).await.unwrap();
    sandbox.client.flush().await.unwrap();
    // Our own message, then nothing.
    next_reply_raw(&mut seen).await;
    let more = tokio::time::timeout(Duration::from_millis(500), seen.next()).await;
    assert!(
        more.is_err(),
        "something was published on the inbound subject: {more:?}"
    );
    let pool = sandbox.pool().await.unwrap();
    let runs: i64 = sqlx::query_scalar("SELECT count(*) FROM runs")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(runs, 1, "the message ran once and fed nothing back in");
    sandbox.shutdown().await.unwrap();
}

async fn next_reply_raw(sub: &mut async_nats::Subscriber) -> async_nats::Message {
    tokio::time::timeout(WAIT, sub.next())
        .await
        .expect("our own message was not seen")
        .unwrap()
}
