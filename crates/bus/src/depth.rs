//! How much waits in the streams: each stream's stored messages and each consumer's backlog,
//! read from the server every few seconds into gauges. The dead-letter stream's depth is what
//! an operator watches, and the runs consumer's backlog is what scales runners.

use std::time::Duration;

use futures::StreamExt as _;
use tokio_util::sync::CancellationToken;

use agentloop_lifecycle::{GaugeFamily, Health};

use crate::{Bus, StreamKind, error_chain, stream_name};

/// The gauges one reading sets.
struct Gauges {
    messages: GaugeFamily,
    pending: GaugeFamily,
    ack_pending: GaugeFamily,
}

impl Gauges {
    fn new(health: &Health) -> Self {
        Self {
            messages: health.gauge_family(
                "agentloop_stream_messages",
                "Messages stored in each agentloop stream (the DLQ stream's is the dead letters waiting for an operator).",
            ),
            pending: health.gauge_family(
                "agentloop_consumer_pending",
                "Messages of a stream not yet handed to its consumer, by stream and consumer (the runs consumer's is the runners' backlog).",
            ),
            ack_pending: health.gauge_family(
                "agentloop_consumer_ack_pending",
                "Messages handed to a consumer and not yet acknowledged, by stream and consumer.",
            ),
        }
    }
}

/// Reads every stream's depth and its consumers' backlogs every `every` until `shutdown`.
/// A failed reading is logged and leaves the last values; the next one tries again.
pub async fn report_depths(bus: Bus, health: Health, every: Duration, shutdown: CancellationToken) {
    let gauges = Gauges::new(&health);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        for kind in StreamKind::ALL {
            if let Err(err) = read_stream(&bus, kind, &gauges).await {
                tracing::debug!(stream = ?kind, error = %err, "stream depth not read");
            }
        }
    }
}

async fn read_stream(bus: &Bus, kind: StreamKind, gauges: &Gauges) -> Result<(), String> {
    let name = stream_name(&bus.config().prefix, kind);
    let mut stream = bus
        .jetstream()
        .get_stream(&name)
        .await
        .map_err(|e| error_chain(&e))?;
    let info = stream.info().await.map_err(|e| error_chain(&e))?;
    gauges
        .messages
        .get_or_create(&vec![("stream", name.clone())])
        .set(i64::try_from(info.state.messages).unwrap_or(i64::MAX));
    let mut consumers = stream.consumers();
    while let Some(consumer) = consumers.next().await {
        let consumer = consumer.map_err(|e| error_chain(&e))?;
        let labels = vec![
            ("stream", name.clone()),
            ("consumer", consumer.name.clone()),
        ];
        gauges
            .pending
            .get_or_create(&labels)
            .set(i64::try_from(consumer.num_pending).unwrap_or(i64::MAX));
        gauges
            .ack_pending
            .get_or_create(&labels)
            .set(i64::try_from(consumer.num_ack_pending).unwrap_or(i64::MAX));
    }
    Ok(())
}
