//! A message a service cannot process is kept as a dead letter with the reason and leaves its
//! stream; when the dead letter cannot be stored, the message stays and comes back.

use std::time::Duration;

use futures::StreamExt as _;

use agentloop_bus::{Bus, BusConfig, DeadLetters, HEADER_ERROR, StreamKind, stream_name};
use agentloop_lifecycle::Health;
use agentloop_proto::v1::InboundMessage;
use agentloop_testkit::NatsServer;

const COUNTER: &str = "agentloop_test_dead_letters_total";

/// Publishes one inbound message and returns it as the consumer `test` delivers it.
async fn one_delivered(bus: &Bus) -> async_nats::jetstream::Message {
    let message = InboundMessage {
        session_key: "cli:dead".to_owned(),
        text: "unprocessable".to_owned(),
        ..Default::default()
    };
    bus.publish_durable(bus.subjects().inbound("cli"), &message, None)
        .await
        .unwrap();
    let mut deliveries = bus.deliveries(StreamKind::Inbound, "test").await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), deliveries.next())
        .await
        .expect("the message is delivered")
}

/// Waits until the inbound stream holds no message: an acknowledged one leaves a work queue.
async fn inbound_emptied(bus: &Bus) {
    let name = stream_name(&bus.config().prefix, StreamKind::Inbound);
    agentloop_testkit::wait_until(
        "the inbound stream to empty",
        Duration::from_secs(5),
        || {
            let (js, name) = (bus.jetstream().clone(), name.clone());
            async move {
                let stream = js.get_stream(name).await.ok()?;
                (stream.cached_info().state.messages == 0).then_some(())
            }
        },
    )
    .await
    .unwrap();
}

fn counted(health: &Health) -> String {
    let metrics = health.render_metrics();
    metrics
        .lines()
        .find(|line| line.starts_with(&format!("{COUNTER} ")))
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn a_rejected_message_is_kept_with_its_reason_leaves_its_stream_and_is_counted() {
    // Arrange
    let nats = NatsServer::start().unwrap();
    let bus = Bus::connect(&crate::config(&nats), "test").await.unwrap();
    let health = Health::new();
    let dead_letters = DeadLetters::new(bus.clone(), "test", &health);
    let mut dlq = bus
        .client()
        .subscribe(format!("{}.dlq.>", bus.config().prefix))
        .await
        .unwrap();
    let msg = one_delivered(&bus).await;

    // Act
    dead_letters.reject(&msg, "cannot be processed").await;

    // Assert: the dead letter carries the reason, the original is acknowledged and gone.
    let kept = tokio::time::timeout(Duration::from_secs(5), dlq.next())
        .await
        .unwrap()
        .unwrap();
    let reason = kept.headers.as_ref().and_then(|h| h.get(HEADER_ERROR));
    assert_eq!(reason.map(|v| v.as_str()), Some("cannot be processed"));
    assert_eq!(kept.payload, msg.payload);
    inbound_emptied(&bus).await;
    assert_eq!(counted(&health), format!("{COUNTER} 1"));
}

#[tokio::test]
async fn a_message_whose_dead_letter_cannot_be_stored_comes_back_uncounted() {
    // Arrange: no stream stores dead letters any more.
    let nats = NatsServer::start().unwrap();
    let bus = Bus::connect(&crate::config(&nats), "test").await.unwrap();
    let health = Health::new();
    let dead_letters = DeadLetters::new(bus.clone(), "test", &health);
    let msg = one_delivered(&bus).await;
    bus.jetstream()
        .delete_stream(stream_name(&bus.config().prefix, StreamKind::Dlq))
        .await
        .unwrap();

    // Act
    dead_letters.reject(&msg, "cannot be processed").await;

    // Assert: handed back, so the consumer delivers it again.
    let mut deliveries = bus.deliveries(StreamKind::Inbound, "test").await.unwrap();
    let again = tokio::time::timeout(Duration::from_secs(10), deliveries.next())
        .await
        .expect("the message comes back");
    assert_eq!(again.payload, msg.payload);
    assert_eq!(again.info().unwrap().delivered, 2);
    assert_eq!(counted(&health), format!("{COUNTER} 0"));
}

#[tokio::test]
async fn a_message_that_failed_on_its_last_delivery_is_dead_lettered_with_the_failure() {
    // Arrange: a consumer that delivers each message once.
    let nats = NatsServer::start().unwrap();
    let config = BusConfig {
        max_deliver: 1,
        ..crate::config(&nats)
    };
    let bus = Bus::connect(&config, "test").await.unwrap();
    let health = Health::new();
    let dead_letters = DeadLetters::new(bus.clone(), "test", &health);
    let mut dlq = bus
        .client()
        .subscribe(format!("{}.dlq.>", bus.config().prefix))
        .await
        .unwrap();
    let msg = one_delivered(&bus).await;

    // Act
    dead_letters.retry_later(&msg, "memory unavailable").await;

    // Assert
    let kept = tokio::time::timeout(Duration::from_secs(5), dlq.next())
        .await
        .unwrap()
        .unwrap();
    let reason = kept.headers.as_ref().and_then(|h| h.get(HEADER_ERROR));
    assert_eq!(
        reason.map(|v| v.as_str()),
        Some("gave up after 1 deliveries: memory unavailable")
    );
    inbound_emptied(&bus).await;
    assert_eq!(counted(&health), format!("{COUNTER} 1"));
}
