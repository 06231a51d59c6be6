//! Messages of a durable pull consumer that outlive a NATS restart: a message stream that ends
//! or keeps failing is reopened, and the consumer recreated when the server lost it.

use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull};
use futures::StreamExt as _;

use crate::{Bus, BusError, StreamKind};

/// How often the server reports an idle pull as alive. A pull request sent to a consumer
/// leader that died is answered by nobody: two missed heartbeats (2 s) are how that is noticed,
/// so this bounds the pause in a failover. The cost is one small message a second per consumer.
const HEARTBEAT: Duration = Duration::from_secs(1);
/// The longest wait between attempts to reopen; short, since a new leader is usually elected
/// within seconds.
const MAX_REOPEN_DELAY: Duration = Duration::from_secs(1);

/// The messages of one durable consumer, shared by a service's replicas.
pub struct Deliveries {
    bus: Bus,
    kind: StreamKind,
    durable: String,
    stream: Option<pull::Stream>,
    connections: tokio::sync::watch::Receiver<u64>,
    /// False once the connection's event source is gone (the client closed).
    watching: bool,
    /// Told whether messages can flow: false from an error until the pull is open again.
    flow: Option<Box<dyn Fn(bool) + Send + Sync>>,
}

impl Bus {
    /// Opens the messages of the durable consumer `durable` on the stream of `kind`.
    ///
    /// # Errors
    /// [`BusError::Consumer`] when the consumer cannot be created or read.
    pub async fn deliveries(
        &self,
        kind: StreamKind,
        durable: &str,
    ) -> Result<Deliveries, BusError> {
        let mut connections = self.connections.clone();
        connections.borrow_and_update();
        let mut deliveries = Deliveries {
            bus: self.clone(),
            kind,
            durable: durable.to_owned(),
            stream: None,
            connections,
            watching: true,
            flow: None,
        };
        deliveries.stream = Some(deliveries.open().await?);
        Ok(deliveries)
    }
}

impl Deliveries {
    /// Reports from now on whether messages can flow (`true` while a pull is open, `false` from
    /// a failure until it is open again), so a service's readiness means its work arrives.
    pub fn report_flow(&mut self, report: impl Fn(bool) + Send + Sync + 'static) {
        report(self.stream.is_some());
        self.flow = Some(Box::new(report));
    }

    fn set_flowing(&self, flowing: bool) {
        if let Some(report) = &self.flow {
            report(flowing);
        }
    }

    async fn open(&self) -> Result<pull::Stream, BusError> {
        let consumer = self.bus.durable_consumer(self.kind, &self.durable).await?;
        consumer
            .stream()
            .max_messages_per_batch(256)
            .heartbeat(HEARTBEAT)
            .expires(Duration::from_secs(30))
            .messages()
            .await
            .map_err(|e| BusError::Consumer {
                name: self.durable.clone(),
                source: e.to_string().into(),
            })
    }

    /// Returns the next message, reopening the stream (with backoff) as often as it takes.
    /// Cancel-safe: drop the future to stop waiting.
    pub async fn next(&mut self) -> jetstream::Message {
        let mut delay = Duration::from_millis(100);
        loop {
            let Some(stream) = self.stream.as_mut() else {
                match self.open().await {
                    Ok(stream) => {
                        tracing::info!(consumer = %self.durable, "consumer stream reopened");
                        self.stream = Some(stream);
                        self.set_flowing(true);
                        delay = Duration::from_millis(100);
                    }
                    Err(err) => {
                        tracing::warn!(consumer = %self.durable, error = %crate::error_chain(&err), retry_in_ms = delay.as_millis() as u64, "cannot reopen the consumer stream");
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(MAX_REOPEN_DELAY);
                    }
                }
                continue;
            };
            let next = tokio::select! {
                next = stream.next() => next,
                changed = self.connections.changed(), if self.watching => {
                    if changed.is_ok() {
                        // The server may have restarted and forgotten this consumer's pull
                        // request: a new stream pulls again at once instead of after expiry.
                        tracing::info!(consumer = %self.durable, "reconnected, reopening the consumer stream");
                        self.stream = None;
                        self.set_flowing(false);
                    } else {
                        self.watching = false;
                    }
                    continue;
                }
            };
            match next {
                Some(Ok(msg)) => return msg,
                // Every error means the pull request in flight is lost (no responders while the
                // consumer has no leader, missed heartbeats after its leader died, the consumer
                // gone): the stream would otherwise wait for the request to expire before
                // pulling again, so a new one pulls at once.
                Some(Err(err)) => {
                    tracing::warn!(consumer = %self.durable, error = %err, "consumer stream error, reopening");
                    self.stream = None;
                    self.set_flowing(false);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                None => {
                    tracing::warn!(consumer = %self.durable, "consumer stream ended, reopening");
                    self.stream = None;
                    self.set_flowing(false);
                }
            }
        }
    }
}
