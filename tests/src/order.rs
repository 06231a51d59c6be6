//! A session's run commands keep their order into the inbox (`runner.keep_order`), and a lone
//! runner pays the stream read that keeps it only for a session's first command.

use std::time::Duration;

use serde_json::json;

use crate::harness::{Sandbox, SandboxOptions, next_reply};

const WAIT: Duration = Duration::from_secs(20);

/// `agentloop_runner_order_reads_total` from the runner's `/metrics`.
async fn order_reads(admin: &str) -> f64 {
    let text = reqwest::get(format!("http://{admin}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("agentloop_runner_order_reads_total "))
        .unwrap_or_else(|| panic!("no order reads counter in:\n{text}"))
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn a_lone_runner_reads_the_stream_once_per_session_and_keeps_follow_ups_in_order() {
    // Arrange: one runner with its admin endpoint on a known port
    let admin = format!("127.0.0.1:{}", agentloop_testkit::free_port().unwrap());
    let admin_listen = admin.clone();
    let sandbox = Sandbox::start_with(SandboxOptions {
        runner: Some(Box::new(move |config| {
            config.runner.admin_listen = admin_listen;
        })),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut replies = sandbox.subscribe("deliver.>").await;

    // Act: one session in turn, then another's burst of follow-ups published at once
    for i in 0..4 {
        sandbox
            .say("order:turns", &format!("turn {i}"))
            .await
            .unwrap();
        let reply = next_reply(&mut replies, WAIT).await.unwrap();
        assert_eq!(reply.text, format!("echo: turn {i}"));
    }
    for i in 0..6 {
        sandbox
            .publish_json(
                "cli",
                json!({"sessionKey": "order:burst", "text": format!("burst {i}"),
                       "queueMode": "followup"}),
            )
            .await
            .unwrap();
    }
    let mut burst = Vec::new();
    while burst.len() < 6 {
        burst.push(next_reply(&mut replies, WAIT).await.unwrap().text);
    }

    // Assert: answered in the order sent, and RUNS read for each session's first command only
    let sent: Vec<String> = (0..6).map(|i| format!("echo: burst {i}")).collect();
    assert_eq!(burst, sent);
    assert_eq!(order_reads(&admin).await, 2.0);
    sandbox.shutdown().await.unwrap();
}
