//! The streams' bounds, tried as a flood would: a full work stream refuses what comes next and
//! keeps every message it accepted.

use agentloop_bus::{Bus, BusConfig, StreamKind, stream_name};
use agentloop_proto::v1::InboundMessage;
use agentloop_testkit::NatsServer;

#[tokio::test]
async fn a_full_work_stream_refuses_the_next_publish_and_drops_nothing_it_accepted() {
    // Arrange: an inbound stream bounded to 16 KiB.
    let nats = NatsServer::start().unwrap();
    let config = BusConfig {
        url: nats.url().to_owned(),
        prefix: "flood".to_owned(),
        work_max_bytes: 16 * 1024,
        publish_retry_ms: 500,
        ..BusConfig::default()
    };
    let bus = Bus::connect(&config, "test").await.unwrap();
    let message = InboundMessage {
        session_key: "flood:a".to_owned(),
        text: "x".repeat(1000),
        ..Default::default()
    };

    // Act: publish until the stream says no.
    let mut accepted = 0_u64;
    let refusal = loop {
        match bus
            .publish_durable(bus.subjects().inbound("cli"), &message, None)
            .await
        {
            Ok(()) => accepted += 1,
            Err(err) => break agentloop_bus::error_chain(&err),
        }
        assert!(accepted < 1000, "a 16 KiB stream took a megabyte");
    };

    // Assert: a clear refusal, and every accepted message still there from the first on.
    assert!(refusal.contains("maximum bytes"), "{refusal}");
    let mut stream = bus
        .jetstream()
        .get_stream(stream_name("flood", StreamKind::Inbound))
        .await
        .unwrap();
    let state = stream.info().await.unwrap().state.clone();
    assert!(accepted > 0);
    assert_eq!(state.messages, accepted, "nothing accepted was dropped");
    assert_eq!(
        state.first_sequence, 1,
        "the oldest accepted message is kept"
    );
}
