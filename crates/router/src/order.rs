//! A session's inbound messages routed in their INBOUND order (`router.keep_order`), whichever
//! router replica or connection got each: `agentloop_bus::InTurn`, keyed by the session key
//! as validated.

use async_nats::jetstream;

use agentloop_bus::{Bus, InTurn, StreamKind};
use agentloop_lifecycle::Health;
use agentloop_proto::v1::InboundMessage;

use crate::{RouterConfig, RouterError};

/// The order of `router.keep_order`, keyed by session key as validated.
pub(crate) async fn in_turn(
    config: &RouterConfig,
    bus: &Bus,
    health: &Health,
) -> Result<InTurn, RouterError> {
    let reads = health.counter(
        "agentloop_router_order_reads_total",
        "Reads of INBOUND for messages that went elsewhere (router.keep_order).",
    );
    let subjects = bus.subjects().clone();
    let key_of = Box::new(move |stored: &jetstream::message::StreamMessage| {
        let (mut inbound, _) = agentloop_bus::decode_stored::<InboundMessage>(stored).ok()?;
        let channel = subjects.channel_of(&stored.subject);
        agentloop_proto::validate_inbound(&mut inbound, channel).ok()?;
        Some(inbound.session_key)
    });
    Ok(bus
        .in_turn(
            StreamKind::Inbound,
            ("router.keep_order", config.router.keep_order),
            reads,
            key_of,
        )
        .await?)
}
