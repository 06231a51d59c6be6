//! The per-session inbox cap, written as the attack: a client floods one session while its
//! run is busy. Past `memory.inbox_max_pending` each message is refused with a QUEUE_FULL
//! error reply and dead-lettered, nothing accepted is lost, and the session answers again
//! once its inbox drains.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::Context as _;
use futures::StreamExt as _;
use serde_json::{Value, json};

use crate::harness::{Sandbox, SandboxOptions, next_reply};

const WAIT: Duration = Duration::from_secs(20);
const CAP: u64 = 3;

/// Waits for the next dead letter and returns its reason.
async fn next_dead_letter_reason(sub: &mut async_nats::Subscriber) -> anyhow::Result<String> {
    let msg = tokio::time::timeout(WAIT, sub.next())
        .await
        .context("timed out waiting for a dead letter")?
        .context("dead letter subscription closed")?;
    Ok(msg
        .headers
        .as_ref()
        .and_then(|h| h.get(agentloop_bus::HEADER_ERROR))
        .map(|v| v.as_str().to_owned())
        .unwrap_or_default())
}

#[tokio::test]
async fn a_flooded_session_refuses_past_the_cap_with_an_error_and_answers_again_once_drained() {
    let sandbox = Sandbox::start_with(SandboxOptions {
        memory: Some(Box::new(|config| config.memory.inbox_max_pending = CAP)),
        ..SandboxOptions::default()
    })
    .await
    .unwrap();
    let mut dead = sandbox.subscribe("dlq.>").await;
    let mut replies = sandbox.subscribe("deliver.>").await;
    let pool = sandbox.pool().await.unwrap();
    let say = |text: &str| {
        sandbox.publish_json(
            "cli",
            json!({"sessionKey": "flood", "text": text, "queueMode": "followup"}),
        )
    };

    // A slow first run holds the session, so what follows waits in its inbox.
    say("first [[delay_ms:3500]]").await.unwrap();
    agentloop_testkit::wait_until("the first run to start", WAIT, || {
        let pool = pool.clone();
        async move {
            let running: i64 =
                sqlx::query_scalar("SELECT count(*) FROM runs WHERE status = 'running'")
                    .fetch_one(&pool)
                    .await
                    .ok()?;
            (running == 1).then_some(())
        }
    })
    .await
    .unwrap();
    for i in 1..=5 {
        say(&format!("m{i}")).await.unwrap();
    }

    // The running input and m1, m2 fill the cap of 3: m3, m4 and m5 are refused.
    let mut reasons = Vec::new();
    for _ in 0..3 {
        reasons.push(next_dead_letter_reason(&mut dead).await.unwrap());
    }
    for reason in &reasons {
        assert!(reason.starts_with("QUEUE_FULL:"), "reason: {reason}");
        assert!(reason.contains(&format!(" {CAP} ")), "reason: {reason}");
    }
    // A gateway client asking while the inbox is full is answered with the error, not silence.
    let reply = tokio::time::timeout(
        WAIT,
        sandbox.client.request(
            sandbox.subject("ask"),
            json!({"sessionKey": "flood", "text": "asked", "queueMode": "followup"})
                .to_string()
                .into(),
        ),
    )
    .await
    .expect("ask is answered")
    .unwrap();
    let answer: Value = serde_json::from_slice(&reply.payload).unwrap();
    let error = answer["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("queue_full") && error.contains(&format!("{CAP} messages waiting")),
        "answer: {answer}"
    );
    assert!(
        next_dead_letter_reason(&mut dead)
            .await
            .unwrap()
            .starts_with("QUEUE_FULL:")
    );

    // Every message gets exactly one reply: the three accepted their answer, the four refused
    // the error.
    let mut answered = BTreeSet::new();
    let mut refused = 0;
    for _ in 0..7 {
        let reply = next_reply(&mut replies, WAIT).await.unwrap();
        assert_eq!(reply.session_key, "flood");
        if reply.error.is_empty() {
            answered.insert(reply.text);
        } else {
            assert!(reply.error.starts_with("queue_full: "), "{reply:?}");
            assert!(reply.error.contains(&format!("{CAP} messages waiting")));
            refused += 1;
        }
    }
    assert_eq!(refused, 4);
    assert_eq!(
        answered,
        BTreeSet::from(["echo: first", "echo: m1", "echo: m2"].map(str::to_owned))
    );

    // Drained: the same session takes new input again.
    say("later").await.unwrap();
    let reply = next_reply(&mut replies, WAIT).await.unwrap();
    assert_eq!(reply.text, "echo: later");
    assert!(reply.error.is_empty());

    // Nothing accepted was lost, nothing refused was stored.
    sandbox.finished_runs(4).await.unwrap();
    let (rows, consumed): (i64, i64) =
        sqlx::query_as("SELECT count(*), count(consumed_at) FROM session_inbox")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((rows, consumed), (4, 4), "first, m1, m2 and later, all run");
    let completed: i64 = sqlx::query_scalar("SELECT count(*) FROM runs WHERE status = 'completed'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(completed, 4);
    sandbox.shutdown().await.unwrap();
}
