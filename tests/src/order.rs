//! A session's run commands keep their order into the inbox (`runner.keep_order`), and a lone
//! runner pays the stream read that keeps it only for a session's first command.

use std::time::Duration;

use serde_json::json;

use crate::harness::secured::{self, SecuredStack};
use crate::harness::{Sandbox, SandboxOptions, metric, next_reply};

const WAIT: Duration = Duration::from_secs(20);

/// `agentloop_runner_order_reads_total` from the runner's `/metrics`.
async fn order_reads(admin: &str) -> f64 {
    metric(admin, "agentloop_runner_order_reads_total").await
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

#[tokio::test]
async fn a_runner_that_may_not_read_the_runs_stream_gives_the_read_up_and_still_answers() {
    // Arrange: the shipped users, the runner's right to read RUNS taken away
    let shipped = std::fs::read_to_string(secured::auth_conf()).unwrap();
    let without = shipped.replace(
        "\"$JS.API.STREAM.MSG.GET.AGENTLOOP_RUNS\"",
        "\"agentloop.order-test.unused\"",
    );
    assert_ne!(shipped, without, "the shipped file grants the read");
    let conf = std::env::temp_dir().join(format!("agentloop-auth-{}.conf", uuid::Uuid::new_v4()));
    std::fs::write(&conf, without).unwrap();
    let admin = format!("127.0.0.1:{}", agentloop_testkit::free_port().unwrap());
    let stack = SecuredStack::start_from(&conf, &admin).await.unwrap();
    let (client, _errors) = secured::connect_as(&stack.nats, "client").await.unwrap();
    // Subscribed on the connection that publishes: the server takes the SUB first.
    let mut replies = client.subscribe("agentloop.deliver.cli.>").await.unwrap();

    // Act: two messages of one session, in turn
    for i in 0..2 {
        let body = json!({"sessionKey": "cli:unread", "text": format!("ask {i}")});
        client
            .publish("agentloop.inbound.cli", body.to_string().into())
            .await
            .unwrap();
        let reply = next_reply(&mut replies, WAIT).await.unwrap();

        // Assert: answered, and the runner gave the read up instead of trying per command
        assert_eq!(reply.text, format!("echo: ask {i}"));
    }
    assert_eq!(order_reads(&admin).await, 0.0);
    stack.shutdown().await.unwrap();
    let _ = std::fs::remove_file(&conf);
}
