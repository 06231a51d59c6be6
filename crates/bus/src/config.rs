//! `[bus]` settings.

/// How to reach NATS and how the streams are laid out (`[bus]`, `AGENTLOOP_BUS__*`, `NATS_URL`).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(default)]
pub struct BusConfig {
    /// NATS server URL.
    pub url: String,
    /// Subject prefix; two stacks with different prefixes share one server.
    pub prefix: String,
    /// Connection timeout.
    pub connect_timeout_ms: u64,
    /// Stream replicas (1 on a laptop, 3 in a cluster).
    pub replicas: usize,
    /// How long unprocessed work (inbound, runs, outbound) is kept.
    pub work_max_age_secs: u64,
    /// How long run events are kept for replay.
    pub events_max_age_secs: u64,
    /// Keep the EVENTS stream in memory (a server restart forgets events, not transcripts).
    pub events_in_memory: bool,
    /// Most bytes of events kept; the oldest go first.
    pub events_max_bytes: i64,
    /// How long dead letters are kept.
    pub dlq_max_age_secs: u64,
    /// JetStream dedup window for `Nats-Msg-Id`.
    pub duplicate_window_secs: u64,
    /// How long a consumer waits for an ack before redelivering.
    pub ack_wait_ms: u64,
    /// How long the router and delivery gather acks of handled messages before sending them
    /// together (see [`crate::Acks`]); kept well below `ack_wait_ms`.
    pub ack_gather_ms: u64,
    /// Deliveries before a message is given up on.
    pub max_deliver: i64,
    /// Unacknowledged messages a durable consumer hands out at once.
    pub max_ack_pending: i64,
}

impl Default for BusConfig {
    fn default() -> Self {
        Self {
            url: "nats://127.0.0.1:4222".to_owned(),
            prefix: "agentloop".to_owned(),
            connect_timeout_ms: 2_000,
            replicas: 1,
            work_max_age_secs: 7 * 24 * 3600,
            events_max_age_secs: 3600,
            events_in_memory: true,
            events_max_bytes: 256 * 1024 * 1024,
            dlq_max_age_secs: 14 * 24 * 3600,
            duplicate_window_secs: 120,
            ack_wait_ms: 30_000,
            ack_gather_ms: 20,
            max_deliver: 10,
            max_ack_pending: 1024,
        }
    }
}

impl BusConfig {
    /// How long acks are gathered: `ack_gather_ms`, capped at a tenth of `ack_wait_ms` so that a
    /// gathered ack never arrives after the server has given the message to someone else.
    #[must_use]
    pub fn ack_gather(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.ack_gather_ms.min(self.ack_wait_ms / 10))
    }
}
