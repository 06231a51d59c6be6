//! A server that refuses a service for good ends its startup with the reason at once; one that
//! is only unreachable is waited for, until the service is stopped.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use agentloop_bus::{Bus, BusConfig, BusError};
use agentloop_testkit::NatsServer;

#[tokio::test]
async fn streams_the_server_refuses_for_good_end_the_startup_at_once_with_the_reason() {
    // Arrange: three replicas asked of a single server, which never has them.
    let nats = NatsServer::start().unwrap();
    let config = BusConfig {
        replicas: 3,
        publish_retry_ms: 60_000,
        ..crate::config(&nats)
    };

    // Act: a startup that would wait a minute for a stream that is only slow, and for ever
    // for a server that does not answer.
    let connected = tokio::time::timeout(
        Duration::from_secs(20),
        Bus::connect_retrying(&config, "test", &CancellationToken::new()),
    )
    .await
    .expect("a refusal ends the startup, it is not retried");

    // Assert
    let err = connected.err().expect("a refused stream is an error");
    assert!(err.is_permanent(), "{err:?}");
    assert!(matches!(err, BusError::Stream { .. }), "{err:?}");
    let text = agentloop_bus::error_chain(&err);
    assert!(
        text.contains("replicas"),
        "the server's reason is kept: {text}"
    );
}

#[tokio::test]
async fn an_unreachable_server_is_waited_for_until_the_service_is_stopped() {
    // Arrange: a port nothing listens on.
    let port = agentloop_testkit::free_port().unwrap();
    let config = BusConfig {
        url: format!("nats://127.0.0.1:{port}"),
        ..BusConfig::default()
    };
    let shutdown = CancellationToken::new();

    // Act: still waiting after a while, then stopped.
    let waiting = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { Bus::connect_retrying(&config, "test", &shutdown).await }
    });
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        !waiting.is_finished(),
        "an unreachable server is not an error"
    );
    shutdown.cancel();
    let stopped = tokio::time::timeout(Duration::from_secs(5), waiting).await;

    // Assert: a stop, not an error, and at once.
    let connected = stopped.expect("stops within 5 s").unwrap();
    assert!(matches!(connected, Ok(None)), "{:?}", connected.err());
}
