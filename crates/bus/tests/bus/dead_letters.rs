//! A message a service cannot process is kept as a dead letter with the reason and leaves its
//! stream; when the dead letter cannot be stored, the message stays and comes back.

use std::time::Duration;

use futures::StreamExt as _;

use agentloop_bus::{
    Bus, BusConfig, DeadLetters, DeadReason, HEADER_ERROR, StreamKind, stream_name,
};
use agentloop_lifecycle::Health;
use agentloop_proto::v1::InboundMessage;
use agentloop_testkit::NatsServer;

const COUNTER: &str = "agentloop_dead_letters_total";

/// A bus with one inbound message delivered to the consumer `test`, the service's dead letters
/// and a watch on the dead-letter subjects.
struct Fixture {
    _nats: NatsServer,
    bus: Bus,
    health: Health,
    dead_letters: DeadLetters,
    dlq: async_nats::Subscriber,
    msg: async_nats::jetstream::Message,
}

impl Fixture {
    /// Delivers each message up to `max_deliver` times.
    async fn start(max_deliver: i64) -> Self {
        let nats = NatsServer::start().unwrap();
        let config = BusConfig {
            max_deliver,
            ..crate::config(&nats)
        };
        let bus = Bus::connect(&config, "test").await.unwrap();
        let health = Health::new();
        let dead_letters = DeadLetters::new(bus.clone(), "test", &health);
        let dlq = bus
            .client()
            .subscribe(format!("{}.dlq.>", config.prefix))
            .await
            .unwrap();
        let message = InboundMessage {
            session_key: "cli:dead".to_owned(),
            text: "unprocessable".to_owned(),
            ..Default::default()
        };
        bus.publish_durable(bus.subjects().inbound("cli"), &message, None)
            .await
            .unwrap();
        let msg = next_delivery(&bus).await;
        Self {
            _nats: nats,
            bus,
            health,
            dead_letters,
            dlq,
            msg,
        }
    }

    /// The reason of the next dead letter, checking that it carries the original payload.
    async fn next_dead_letter_reason(&mut self) -> String {
        let kept = tokio::time::timeout(Duration::from_secs(5), self.dlq.next())
            .await
            .expect("a dead letter within 5 s")
            .unwrap();
        assert_eq!(kept.payload, self.msg.payload);
        let reason = kept.headers.as_ref().and_then(|h| h.get(HEADER_ERROR));
        reason.map(|v| v.as_str().to_owned()).unwrap_or_default()
    }

    /// Waits until the inbound stream holds no message: an acknowledged one leaves a work queue.
    async fn inbound_emptied(&self) {
        let name = stream_name(&self.bus.config().prefix, StreamKind::Inbound);
        let js = self.bus.jetstream();
        agentloop_testkit::wait_until(
            "the inbound stream to empty",
            Duration::from_secs(5),
            || {
                let (js, name) = (js.clone(), name.clone());
                async move {
                    let stream = js.get_stream(name).await.ok()?;
                    (stream.cached_info().state.messages == 0).then_some(())
                }
            },
        )
        .await
        .unwrap();
    }

    /// The dead-letter counter's line in the metrics.
    /// This service's dead letters of `class` counted so far.
    fn counted(&self, class: DeadReason) -> u64 {
        let prefix = format!(
            "{COUNTER}{{service=\"test\",reason=\"{}\"}} ",
            class.as_str()
        );
        let metrics = self.health.render_metrics();
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .map_or(0, |n| n.parse().unwrap())
    }
}

async fn next_delivery(bus: &Bus) -> async_nats::jetstream::Message {
    let mut deliveries = bus.deliveries(StreamKind::Inbound, "test").await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), deliveries.next())
        .await
        .expect("a delivery within 10 s")
}

#[tokio::test]
async fn a_rejected_message_is_kept_with_its_reason_leaves_its_stream_and_is_counted() {
    let mut fixture = Fixture::start(10).await;

    fixture
        .dead_letters
        .reject(&fixture.msg, DeadReason::Invalid, "cannot be processed")
        .await;

    assert_eq!(
        fixture.next_dead_letter_reason().await,
        "cannot be processed"
    );
    fixture.inbound_emptied().await;
    assert_eq!(fixture.counted(DeadReason::Invalid), 1);
}

#[tokio::test]
async fn a_message_whose_dead_letter_cannot_be_stored_comes_back_uncounted() {
    // Arrange: no stream stores dead letters any more.
    let fixture = Fixture::start(10).await;
    let bus = &fixture.bus;
    bus.jetstream()
        .delete_stream(stream_name(&bus.config().prefix, StreamKind::Dlq))
        .await
        .unwrap();

    // Act
    fixture
        .dead_letters
        .reject(&fixture.msg, DeadReason::Invalid, "cannot be processed")
        .await;

    // Assert: handed back, so the consumer delivers it again.
    let again = next_delivery(bus).await;
    assert_eq!(again.payload, fixture.msg.payload);
    assert_eq!(again.info().unwrap().delivered, 2);
    assert_eq!(fixture.counted(DeadReason::Invalid), 0);
}

#[tokio::test]
async fn a_message_that_failed_on_its_last_delivery_is_dead_lettered_with_the_failure() {
    let mut fixture = Fixture::start(1).await;

    fixture
        .dead_letters
        .retry_later(&fixture.msg, "memory unavailable")
        .await;

    assert_eq!(
        fixture.next_dead_letter_reason().await,
        "gave up after 1 deliveries: memory unavailable"
    );
    fixture.inbound_emptied().await;
    assert_eq!(fixture.counted(DeadReason::Exhausted), 1);
}

#[tokio::test]
async fn a_message_that_failed_before_its_last_delivery_comes_back_later() {
    let fixture = Fixture::start(10).await;

    fixture
        .dead_letters
        .retry_later(&fixture.msg, "memory unavailable")
        .await;

    let again = next_delivery(&fixture.bus).await;
    assert_eq!(again.info().unwrap().delivered, 2);
    assert_eq!(fixture.counted(DeadReason::Exhausted), 0);
}
