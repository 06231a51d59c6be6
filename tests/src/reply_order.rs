//! A session's replies reach its channel in their OUTBOUND order (`delivery.keep_order`), also
//! when earlier ones were pulled by a replica whose connection then died (JetStream hands
//! those out again only after the ack wait) or are being delivered, late, by another replica.

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::PullConsumer};
use futures::StreamExt as _;
use serde_json::json;

use agentloop_bus::{Bus, BusConfig, StreamKind};
use agentloop_testkit::NatsServer;

const WAIT: Duration = Duration::from_secs(20);
const SESSION_S: &str = "0b6c3f5e-0000-4000-8000-00000000000s";
const SESSION_T: &str = "0b6c3f5e-0000-4000-8000-00000000000t";

/// Stores a final reply of `session` in OUTBOUND, as the runner does.
async fn store_reply(js: &jetstream::Context, prefix: &str, session: &str, text: &str) {
    let reply = json!({
        "channel": "cli",
        "sessionId": session,
        "sessionKey": format!("cli:{session}"),
        "text": text,
        "final": true,
        "runId": format!("run-{text}"),
    });
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Content-Type", "application/json");
    js.publish_with_headers(
        format!("{prefix}.outbound.cli"),
        headers,
        reply.to_string().into(),
    )
    .await
    .unwrap()
    .await
    .unwrap();
}

async fn next_text(replies: &mut async_nats::Subscriber) -> (String, String, Instant) {
    let msg = tokio::time::timeout(WAIT, replies.next())
        .await
        .expect("a reply in time")
        .expect("the subscription is open");
    let reply: serde_json::Value = serde_json::from_slice(&msg.payload).unwrap();
    (
        reply["sessionId"].as_str().unwrap().to_owned(),
        reply["text"].as_str().unwrap().to_owned(),
        Instant::now(),
    )
}

#[tokio::test]
async fn replies_held_by_a_dead_connection_or_another_replica_still_go_out_before_later_ones() {
    // Arrange: OUTBOUND and delivery's consumer, with a short ack wait
    agentloop_telemetry::init_for_tests();
    let nats = NatsServer::start().unwrap();
    let prefix = format!("ro{}", &agentloop_bus::nuid()[20..]);
    let bus = BusConfig {
        url: nats.url().to_owned(),
        prefix: prefix.clone(),
        ack_wait_ms: 2_000,
        ..Default::default()
    };
    let setup = Bus::connect(&bus, "test").await.unwrap();
    let consumer: PullConsumer = setup
        .durable_consumer(StreamKind::Outbound, "delivery")
        .await
        .unwrap();
    let js = setup.jetstream().clone();
    let client = async_nats::connect(nats.url()).await.unwrap();
    let mut replies = client
        .subscribe(format!("{prefix}.deliver.cli.>"))
        .await
        .unwrap();
    agentloop_testkit::round_trip(&client).await.unwrap();

    // Two replies of session s and one of t, pulled by a replica (this connection) that never
    // acks s's: its connection dies with them. t's it delivers, late.
    store_reply(&js, &prefix, SESSION_S, "s0").await;
    store_reply(&js, &prefix, SESSION_S, "s1").await;
    store_reply(&js, &prefix, SESSION_T, "t0").await;
    let mut pulled = consumer.fetch().max_messages(3).messages().await.unwrap();
    let mut held = Vec::new();
    while held.len() < 3 {
        held.push(pulled.next().await.unwrap().unwrap());
    }
    store_reply(&js, &prefix, SESSION_S, "s2").await;
    store_reply(&js, &prefix, SESSION_S, "s3").await;
    store_reply(&js, &prefix, SESSION_T, "t1").await;

    // Act: delivery starts with the later replies first in line
    let config = agentloop_delivery::DeliveryConfig {
        bus: bus.clone(),
        ..Default::default()
    };
    let delivery = agentloop_testkit::spawn("delivery", move |token| async move {
        agentloop_delivery::run(config, token)
            .await
            .map_err(|e| format!("{e:?}"))
    });
    tokio::time::sleep(Duration::from_millis(800)).await;
    let t0 = held.pop().unwrap();
    t0.ack().await.unwrap();
    let t0_acked = Instant::now();
    drop(held);

    // Assert: each session's replies in the order stored; t's later one only once the other
    // replica had delivered t0
    let mut got: Vec<(String, String, Instant)> = Vec::new();
    while got.len() < 5 {
        got.push(next_text(&mut replies).await);
    }
    let of = |session: &str| -> Vec<&str> {
        got.iter()
            .filter(|(s, _, _)| s == session)
            .map(|(_, text, _)| text.as_str())
            .collect()
    };
    assert_eq!(of(SESSION_S), ["s0", "s1", "s2", "s3"]);
    assert_eq!(of(SESSION_T), ["t1"]);
    let (_, _, t1_at) = got.iter().find(|(_, text, _)| text == "t1").unwrap();
    assert!(*t1_at >= t0_acked, "t1 went out before t0 was delivered");
    // Nothing more: t0 was the other replica's to deliver.
    assert!(
        tokio::time::timeout(Duration::from_secs(3), replies.next())
            .await
            .is_err()
    );
    delivery.shutdown().await.unwrap();
}
