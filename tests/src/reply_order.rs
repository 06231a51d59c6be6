//! A session's replies reach its channel in their OUTBOUND order (`delivery.keep_order`), and
//! its inbound messages become run commands in their INBOUND order (`router.keep_order`), also
//! when earlier ones were pulled by a replica whose connection then died (JetStream hands
//! those out again only after the ack wait) or are being handled, late, by another replica.

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::PullConsumer};
use futures::StreamExt as _;
use serde_json::json;

use agentloop_bus::{Bus, BusConfig, StreamKind};
use agentloop_proto::v1::RunCommand;
use agentloop_testkit::{NatsServer, TestDatabase};

use crate::harness::metric;

const WAIT: Duration = Duration::from_secs(20);
const SESSION_S: &str = "0b6c3f5e-0000-4000-8000-00000000000s";
const SESSION_T: &str = "0b6c3f5e-0000-4000-8000-00000000000t";

/// A stream and a service's durable consumer on a server of the test's own, with a short ack
/// wait.
struct Stream {
    nats: NatsServer,
    bus: BusConfig,
    consumer: PullConsumer,
    /// On the connection that pulls and holds messages, as a dying replica.
    js: jetstream::Context,
}

impl Stream {
    async fn open(kind: StreamKind, durable: &str, ack_wait_ms: u64) -> Self {
        agentloop_telemetry::init_for_tests();
        let nats = NatsServer::start().unwrap();
        let bus = BusConfig {
            url: nats.url().to_owned(),
            prefix: format!("o{}", &agentloop_bus::nuid()[20..]),
            ack_wait_ms,
            ..Default::default()
        };
        let setup = Bus::connect(&bus, "test").await.unwrap();
        let consumer = setup.durable_consumer(kind, durable).await.unwrap();
        let js = setup.jetstream().clone();
        Self {
            nats,
            bus,
            consumer,
            js,
        }
    }
}

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

/// What delivery hands the `cli` channel, subscribed before anything is delivered.
async fn delivered(nats: &NatsServer, prefix: &str) -> async_nats::Subscriber {
    let client = async_nats::connect(nats.url()).await.unwrap();
    let replies = client
        .subscribe(format!("{prefix}.deliver.cli.>"))
        .await
        .unwrap();
    agentloop_testkit::round_trip(&client).await.unwrap();
    replies
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
    let Stream {
        nats,
        bus,
        consumer,
        js,
    } = Stream::open(StreamKind::Outbound, "delivery", 2_000).await;
    let prefix = bus.prefix.clone();
    let mut replies = delivered(&nats, &prefix).await;

    // Two replies of session s and one of t, pulled by a replica (this connection) that never
    // acks s's: its connection dies with them. t's it delivers, late.
    store_reply(&js, &prefix, SESSION_S, "s0").await;
    store_reply(&js, &prefix, SESSION_S, "s1").await;
    store_reply(&js, &prefix, SESSION_T, "t0").await;
    let mut held = pull_and_hold(&consumer, 3).await;
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

#[tokio::test]
async fn a_reply_handed_back_goes_out_before_the_later_ones_queued_behind_it() {
    // Arrange: a stream keeps the cli channel's deliveries but refuses s0's for now (too
    // large), so delivery hands s0 back while s1 waits behind it in the session's lane
    let Stream {
        nats: _nats,
        bus,
        js,
        ..
    } = Stream::open(StreamKind::Outbound, "delivery", 2_000).await;
    let prefix = bus.prefix.clone();
    let mut capture = jetstream::stream::Config {
        name: format!("CAPTURE_{prefix}"),
        subjects: vec![format!("{prefix}.deliver.cli.>")],
        max_message_size: 1_000,
        ..Default::default()
    };
    js.create_stream(capture.clone()).await.unwrap();
    store_reply(
        &js,
        &prefix,
        SESSION_S,
        &format!("s0 {}", "x".repeat(2_000)),
    )
    .await;
    store_reply(&js, &prefix, SESSION_S, "s1").await;

    // Act: delivery tries s0 in place briefly, hands it back, and s0 may pass later
    let (delivery, admin) = start_delivery(BusConfig {
        publish_retry_ms: 300,
        ..bus.clone()
    })
    .await;
    agentloop_testkit::wait_until("s0 handed back", WAIT, || {
        let admin = admin.clone();
        async move {
            let text = reqwest::get(format!("http://{admin}/metrics"))
                .await
                .ok()?
                .text()
                .await
                .ok()?;
            text.contains("outcome=\"handed_back\"").then_some(())
        }
    })
    .await
    .unwrap();
    // Time for s1 to overtake, were it still in the lane.
    tokio::time::sleep(Duration::from_millis(500)).await;
    capture.max_message_size = -1;
    js.update_stream(&capture).await.unwrap();

    // Assert: the channel got s0 first, then s1
    let stream = js.get_stream(&capture.name).await.unwrap();
    agentloop_testkit::wait_until("both replies delivered", WAIT, || {
        let stream = stream.clone();
        async move { (stream.get_info().await.ok()?.state.messages == 2).then_some(()) }
    })
    .await
    .unwrap();
    let mut texts = Vec::new();
    for seq in 1..=2 {
        let stored = stream.get_raw_message(seq).await.unwrap();
        let reply: serde_json::Value = serde_json::from_slice(&stored.payload).unwrap();
        let text = reply["text"].as_str().unwrap();
        texts.push(text.split(' ').next().unwrap().to_owned());
    }
    assert_eq!(texts, ["s0", "s1"]);
    delivery.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_later_reply_handed_out_again_first_still_waits_for_the_earlier_one() {
    // Arrange: a replica pulls both replies of session s and its connection dies with them.
    // The later one is handed out again first: the earlier one was sent back with a delay
    // (after a partition the redeliveries come in the order their ack waits ran out, and no
    // new reply reveals the gap)
    let Stream {
        nats,
        bus,
        consumer,
        js,
    } = Stream::open(StreamKind::Outbound, "delivery", 1_000).await;
    let prefix = bus.prefix.clone();
    let mut replies = delivered(&nats, &prefix).await;
    store_reply(&js, &prefix, SESSION_S, "s0").await;
    store_reply(&js, &prefix, SESSION_S, "s1").await;
    let mut held = pull_and_hold(&consumer, 2).await;
    let s0 = held.remove(0);
    s0.ack_with(jetstream::AckKind::Nak(Some(Duration::from_secs(3))))
        .await
        .unwrap();
    drop(held);
    // s1's ack wait runs out; s0's delay does not yet.
    tokio::time::sleep(Duration::from_millis(1_300)).await;

    // Act: delivery starts, and the first reply it is handed is s1 again
    let (delivery, _admin) = start_delivery(bus.clone()).await;

    // Assert: s0 first, then s1
    let first = next_text(&mut replies).await;
    let second = next_text(&mut replies).await;
    assert_eq!(
        [first.1.as_str(), second.1.as_str()],
        ["s0", "s1"],
        "the redelivered later reply went ahead of the earlier one"
    );
    delivery.shutdown().await.unwrap();
}

/// Pulls `n` messages of `consumer` and holds them unacked, as a replica whose connection then
/// died would.
async fn pull_and_hold(consumer: &PullConsumer, n: usize) -> Vec<jetstream::Message> {
    let mut pulled = consumer.fetch().max_messages(n).messages().await.unwrap();
    let mut held = Vec::new();
    while held.len() < n {
        held.push(pulled.next().await.unwrap().unwrap());
    }
    held
}

#[tokio::test]
async fn inbound_messages_held_by_a_dead_connection_still_become_run_commands_before_later_ones() {
    // Arrange: INBOUND and the router's consumer, with a short ack wait
    let Stream {
        nats: _nats,
        bus,
        consumer,
        js,
    } = Stream::open(StreamKind::Inbound, "router", 2_000).await;
    let prefix = bus.prefix.clone();
    let db = TestDatabase::create().await.unwrap();
    let say = |text: &str| {
        let (js, subject) = (js.clone(), format!("{prefix}.inbound.cli"));
        let body = json!({"sessionKey": "cli:in-order", "text": text}).to_string();
        async move {
            js.publish(subject, body.into())
                .await
                .unwrap()
                .await
                .unwrap();
        }
    };
    // The first two pulled by a router whose connection dies with them.
    say("m0").await;
    say("m1").await;
    let held = pull_and_hold(&consumer, 2).await;
    say("m2").await;
    say("m3").await;

    // Act: memory and the router start, the later messages first in line
    let mut memory_config = agentloop_memory::MemoryConfig::default();
    memory_config.memory.listen = "127.0.0.1:0".to_owned();
    memory_config.memory.database_url = db.url().to_owned();
    let memory = agentloop_memory::Memory::bind(memory_config, agentloop_lifecycle::Health::new())
        .await
        .unwrap();
    let mut router = agentloop_router::RouterConfig {
        bus: bus.clone(),
        ..Default::default()
    };
    router.memory.url = format!("http://{}", memory.local_addr());
    router.models.default_model = "openai/fake-echo".to_owned();
    let memory = agentloop_testkit::spawn("memory", move |token| async move {
        memory.serve(token).await.map_err(|e| format!("{e:?}"))
    });
    let router = agentloop_testkit::spawn("router", move |token| async move {
        agentloop_router::run(router, token)
            .await
            .map_err(|e| format!("{e:?}"))
    });
    drop(held);

    // Assert: RUNS holds the session's commands in the order sent
    let runs = js
        .get_stream(agentloop_bus::stream_name(&prefix, StreamKind::Runs))
        .await
        .unwrap();
    agentloop_testkit::wait_until("four run commands", WAIT, || {
        let runs = runs.clone();
        async move { (runs.get_info().await.ok()?.state.messages == 4).then_some(()) }
    })
    .await
    .unwrap();
    let first = runs.get_info().await.unwrap().state.first_sequence;
    let mut texts = Vec::new();
    for seq in first..first + 4 {
        let stored = runs.get_raw_message(seq).await.unwrap();
        let (command, _) = agentloop_bus::decode_stored::<RunCommand>(&stored).unwrap();
        texts.push(command.text);
    }
    assert_eq!(texts, ["m0", "m1", "m2", "m3"]);
    router.shutdown().await.unwrap();
    memory.shutdown().await.unwrap();
}

/// Stores replies `rounds` of every one of `sessions` sessions, round by round, as a burst.
async fn store_rounds(
    js: &jetstream::Context,
    prefix: &str,
    sessions: usize,
    rounds: std::ops::Range<usize>,
) {
    let mut acks = Vec::new();
    for i in rounds {
        for s in 0..sessions {
            let reply = json!({
                "channel": "cli",
                "sessionId": format!("session-{s:02}"),
                "text": format!("{i}"),
                "final": true,
                "runId": format!("run-{s}-{i}"),
            });
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("Content-Type", "application/json");
            let subject = format!("{prefix}.outbound.cli");
            let body = reply.to_string().into();
            acks.push(
                js.publish_with_headers(subject, headers, body)
                    .await
                    .unwrap(),
            );
        }
    }
    for ack in acks {
        ack.await.unwrap();
    }
}

/// Starts a delivery replica on `bus` with its admin server on a port of its own; returns it
/// once it is consuming, with its admin address.
async fn start_delivery(bus: BusConfig) -> (agentloop_testkit::ServiceHandle<String>, String) {
    let admin = format!("127.0.0.1:{}", agentloop_testkit::free_port().unwrap());
    let mut config = agentloop_delivery::DeliveryConfig {
        bus,
        ..Default::default()
    };
    config.delivery.admin_listen = admin.clone();
    let replica = agentloop_testkit::spawn("delivery", move |token| async move {
        agentloop_delivery::run(config, token)
            .await
            .map_err(|e| format!("{e:?}"))
    });
    agentloop_testkit::wait_until("delivery consuming", WAIT, || {
        let admin = admin.clone();
        async move {
            let ready = reqwest::get(format!("http://{admin}/readyz")).await.ok()?;
            ready.status().is_success().then_some(())
        }
    })
    .await
    .unwrap();
    (replica, admin)
}

#[tokio::test]
async fn two_delivery_replicas_sharing_the_stream_keep_each_sessions_replies_in_order() {
    // Arrange: a delivery replica behind a slow link (100 ms each way)
    const SESSIONS: usize = 30;
    const EACH: usize = 10;
    // An ack wait well past the slow link's round trips, as a deployment would have.
    let Stream { nats, bus, js, .. } = Stream::open(StreamKind::Outbound, "delivery", 10_000).await;
    let prefix = bus.prefix.clone();
    let mut replies = delivered(&nats, &prefix).await;
    let slow_link = agentloop_testkit::DelayProxy::start(
        "127.0.0.1",
        nats.url().trim_start_matches("nats://"),
        agentloop_testkit::Latency {
            base: Duration::from_millis(100),
            jitter: Duration::ZERO,
        },
    )
    .await
    .unwrap();
    let url = format!("nats://{}", slow_link.addr());
    let slow = start_delivery(BusConfig { url, ..bus.clone() }).await;

    // Act: the slow replica takes the first half of every session's replies; a second replica
    // starts and shares the rest with it (JetStream takes turns between their pulls), and
    // could deliver its share long before the slow one's land
    let outbound = js
        .get_stream(agentloop_bus::stream_name(&prefix, StreamKind::Outbound))
        .await
        .unwrap();
    let consumer_has = |what: &'static str, held: fn(&jetstream::consumer::Info) -> bool| {
        let outbound = outbound.clone();
        agentloop_testkit::wait_until(what, WAIT, move || {
            let outbound = outbound.clone();
            async move {
                let info = outbound.consumer_info("delivery").await.ok()?;
                held(&info).then_some(())
            }
        })
    };
    consumer_has("the slow replica's pull at the server", |i| {
        i.num_waiting >= 1
    })
    .await
    .unwrap();
    store_rounds(&js, &prefix, SESSIONS, 0..EACH / 2).await;
    consumer_has("the first half pulled", |i| i.num_ack_pending == 150)
        .await
        .unwrap();
    let fast = start_delivery(bus.clone()).await;
    store_rounds(&js, &prefix, SESSIONS, EACH / 2..EACH).await;

    // Assert: every reply once, each session's in the order stored
    let mut got: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for _ in 0..SESSIONS * EACH {
        let (session, text, _) = next_text(&mut replies).await;
        got.entry(session).or_default().push(text);
    }
    let stored: Vec<String> = (0..EACH).map(|i| i.to_string()).collect();
    for (session, texts) in &got {
        assert_eq!(texts, &stored, "{session}'s replies");
    }
    assert_eq!(got.len(), SESSIONS);
    assert!(
        tokio::time::timeout(Duration::from_secs(2), replies.next())
            .await
            .is_err(),
        "a reply delivered twice"
    );
    // Both replicas had some: the sessions' replies were split between them.
    for (name, admin) in [("slow", &slow.1), ("fast", &fast.1)] {
        let delivered = metric(admin, "agentloop_delivery_delivered_total").await;
        let reads = metric(admin, "agentloop_delivery_order_reads_total").await;
        println!("{name} replica: delivered {delivered}, order reads {reads}");
        assert!(delivered > 0.0, "the {name} replica delivered nothing");
    }
    slow.0.shutdown().await.unwrap();
    fast.0.shutdown().await.unwrap();
}
