//! What every routing task shares: the bus, memory's client, the configuration, counters and
//! the caches of resolved sessions and paired senders.

use std::sync::Mutex;

use agentloop_bus::{Bus, DeadLetters};
use agentloop_lifecycle::Counter;
use agentloop_proto::v1::{Session, session_service_client::SessionServiceClient};
use agentloop_scanner::Scanner;
use agentloop_telemetry::TracedChannel;

use crate::RouterConfig;

/// The router's shared state.
pub(crate) struct Ctx {
    pub(crate) bus: Bus,
    pub(crate) sessions: SessionServiceClient<TracedChannel>,
    pub(crate) config: RouterConfig,
    pub(crate) routed: Counter,
    pub(crate) retried: Counter,
    pub(crate) dead_letters: DeadLetters,
    /// Acks of routed messages, sent in batches.
    pub(crate) acks: agentloop_bus::Acks,
    /// Sessions resolved lately.
    pub(crate) cache: Mutex<std::collections::HashMap<String, (std::time::Instant, Session)>>,
    /// The injection scanner (`None`: `scanner.enabled = false`).
    pub(crate) scanner: Option<Scanner>,
    /// The guard's decisions here, by source and decision.
    pub(crate) security: agentloop_lifecycle::CounterFamily,
    /// A session's messages in their INBOUND order, whichever connection or replica got each.
    pub(crate) in_turn: std::sync::Arc<agentloop_bus::InTurn>,
    /// Direct-message senders memory said are paired, and when.
    pub(crate) paired: Mutex<std::collections::HashMap<String, std::time::Instant>>,
}
