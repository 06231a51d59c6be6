//! Tests of the bus against a real nats-server (one per test, from the testkit): what a
//! service's startup does with a server that refuses it, and what becomes of the messages a
//! service cannot process.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a failed fixture should panic the test

mod dead_letters;
mod startup;

use agentloop_bus::BusConfig;
use agentloop_testkit::NatsServer;

/// A bus configuration of its own on `nats` (a prefix no other test uses), waiting at most
/// half a second for a stream to store something.
fn config(nats: &NatsServer) -> BusConfig {
    BusConfig {
        url: nats.url().to_owned(),
        prefix: format!("t{}", agentloop_bus::nuid()),
        publish_retry_ms: 500,
        ..BusConfig::default()
    }
}
