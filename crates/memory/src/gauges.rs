//! The memory service's reading of what waits in Postgres, every few seconds, into gauges:
//! live sessions, queued input per kind, stuck sessions, approvals waiting.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use agentloop_lifecycle::{Gauge, GaugeFamily, Health};

use crate::Store;

/// The gauges a reading sets.
pub(crate) struct WaitingGauges {
    active: Gauge,
    pending: GaugeFamily,
    stuck: Gauge,
    approvals: Gauge,
}

impl WaitingGauges {
    pub(crate) fn new(health: &Health) -> Self {
        Self {
            active: health.gauge(
                "agentloop_sessions_active",
                "Sessions whose lease is held now (a run live or starting).",
            ),
            pending: health.gauge_family(
                "agentloop_inbox_pending",
                "Inputs stored and not yet consumed by a finished run, by kind (user, followup, steer, collect, interrupt).",
            ),
            stuck: health.gauge(
                "agentloop_sessions_stuck",
                "Sessions holding their lease with an input waiting longer than memory.stuck_after_ms.",
            ),
            approvals: health.gauge(
                "agentloop_approvals_pending",
                "Tool calls waiting for an operator's decision.",
            ),
        }
    }
}

/// Reads what waits every `every` until `stop`; a failed reading keeps the last values (the
/// database check reports the outage).
pub(crate) async fn report(
    store: Store,
    gauges: WaitingGauges,
    every: Duration,
    stuck_after_ms: u64,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        match store.waiting(stuck_after_ms).await {
            Ok(waiting) => {
                gauges.active.set(waiting.sessions_active);
                gauges.stuck.set(waiting.sessions_stuck);
                gauges.approvals.set(waiting.approvals_pending);
                for (kind, n) in waiting.inbox_pending {
                    gauges.pending.get_or_create(&vec![("kind", kind)]).set(n);
                }
            }
            Err(err) => tracing::debug!(error = %err, "waiting gauges not read"),
        }
    }
}
