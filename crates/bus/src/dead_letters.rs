//! What a service does with a stream message it cannot process: keeps it as a dead letter with
//! the reason and acknowledges it, so it is neither lost nor handed out again; when even the
//! dead letter cannot be stored, hands the message back instead, so it comes again later.

use std::time::Duration;

use async_nats::jetstream::{self, AckKind};

use agentloop_lifecycle::{Backoff, CounterFamily, Health};

use crate::publish::Letter;
use crate::{Bus, BusError, Stored, error_chain};

/// How long a message whose dead letter could not be stored waits before it comes back.
const DEAD_LETTER_RETRY: Duration = Duration::from_secs(1);
/// Waits before the next delivery of a message whose handling failed in a way that may pass:
/// half a second after the first delivery, doubling up to 8 s.
const REDELIVERY: Backoff = Backoff::new(500, 8_000, u32::MAX);

impl Bus {
    /// Keeps a received message (its subject, headers and payload) as a dead letter with
    /// `reason`; see [`Bus::dead_letter`].
    ///
    /// # Errors
    /// [`BusError::Publish`] when the dead letter cannot be stored.
    pub async fn dead_letter_message(
        &self,
        service: &str,
        msg: &async_nats::Message,
        reason: &str,
    ) -> Result<(), BusError> {
        self.dead_letter(
            service,
            msg.subject.as_str(),
            msg.headers.as_ref(),
            msg.payload.clone(),
            reason,
        )
        .await
    }

    /// Keeps a message that every replica of `service` receives (a core NATS subject without a
    /// queue group, such as `control.*`) as one dead letter: the letter's id is the digest of
    /// the message's subject and payload, so the stream's duplicate window absorbs the copies
    /// the other replicas send. Returns whether this call stored it (the others find it there).
    ///
    /// # Errors
    /// [`BusError::Publish`] when the dead letter cannot be stored.
    pub async fn dead_letter_shared(
        &self,
        service: &str,
        msg: &async_nats::Message,
        reason: &str,
    ) -> Result<bool, BusError> {
        let id = agentloop_proto::shared_dead_letter_msg_id(msg.subject.as_str(), &msg.payload);
        let letter = Letter {
            service,
            original_subject: msg.subject.as_str(),
            original_headers: msg.headers.as_ref(),
            reason,
        };
        let stored = self
            .keep_letter(&letter, msg.payload.clone(), Some(&id))
            .await?;
        Ok(stored == Stored::New)
    }
}

/// Why a message became a dead letter, as a class an operator can alert on; the reason text
/// kept with the dead letter says the rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadReason {
    /// The message cannot be read or breaks the contract (bad encoding, missing fields).
    Invalid,
    /// The message was read but refused for good (a policy, a permanent downstream error).
    Refused,
    /// A failure that could have passed lasted through every delivery (`bus.max_deliver`).
    Exhausted,
    /// The session's queue was full.
    QueueFull,
}

impl DeadReason {
    /// The label value in `agentloop_dead_letters_total{reason=...}`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Invalid => "invalid",
            Self::Refused => "refused",
            Self::Exhausted => "exhausted",
            Self::QueueFull => "queue_full",
        }
    }
}

/// A service's dead letters: each one stored with its reason, acknowledged, and counted in
/// `agentloop_dead_letters_total{service,reason}`. Cheap to clone.
#[derive(Clone)]
pub struct DeadLetters {
    bus: Bus,
    service: &'static str,
    stored: CounterFamily,
}

impl DeadLetters {
    /// Returns the dead letters of `service`, counted in `health`.
    pub fn new(bus: Bus, service: &'static str, health: &Health) -> Self {
        let stored = health.counter_family(
            "agentloop_dead_letters_total",
            "Messages kept as dead letters, by the service that gave up on them and the reason class (invalid, refused, exhausted, queue_full).",
        );
        Self {
            bus,
            service,
            stored,
        }
    }

    /// Dead-letters `msg` with `reason` (of class `class`) and acknowledges it. When the dead
    /// letter cannot be stored, the message is handed back (redelivered after a second) rather
    /// than dropped.
    pub async fn reject(&self, msg: &jetstream::Message, class: DeadReason, reason: &str) {
        match self
            .bus
            .dead_letter_message(self.service, &msg.message, reason)
            .await
        {
            Ok(()) => {
                self.stored
                    .get_or_create(&vec![
                        ("service", self.service.to_owned()),
                        ("reason", class.as_str().to_owned()),
                    ])
                    .inc();
                tracing::warn!(reason, class = class.as_str(), subject = %msg.subject, "dropped to dlq");
                let _ = msg.ack().await;
            }
            Err(err) => {
                // Without a stored dead letter the message must come back, not vanish.
                tracing::error!(error = %error_chain(&err), "failed to dead-letter, will retry");
                let _ = msg.ack_with(AckKind::Nak(Some(DEAD_LETTER_RETRY))).await;
            }
        }
    }

    /// Hands `msg` back after a failure that may pass, for a later delivery that waits longer
    /// each time; a message on its last delivery (`bus.max_deliver`) is dead-lettered instead,
    /// with `reason`.
    pub async fn retry_later(&self, msg: &jetstream::Message, reason: &str) {
        let delivered = msg.info().map(|info| info.delivered).unwrap_or(1);
        match redelivery_delay(delivered, self.bus.config().max_deliver) {
            Some(delay) => {
                tracing::warn!(
                    reason,
                    delivered,
                    retry_in_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                    "handed back for redelivery"
                );
                let _ = msg.ack_with(AckKind::Nak(Some(delay))).await;
            }
            None => {
                let reason = format!("gave up after {delivered} deliveries: {reason}");
                self.reject(msg, DeadReason::Exhausted, &reason).await;
            }
        }
    }
}

/// The wait before the next delivery of a message delivered `delivered` times, or `None` when
/// that was its last (a `max_deliver` below 1 means no limit, as in JetStream).
fn redelivery_delay(delivered: i64, max_deliver: i64) -> Option<Duration> {
    if max_deliver > 0 && delivered >= max_deliver {
        return None;
    }
    let retry = u32::try_from(delivered.max(1) - 1).unwrap_or(u32::MAX - 1);
    REDELIVERY.delay(retry)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redeliveries_wait_longer_each_time_until_the_last_delivery() {
        let waits: Vec<Option<u64>> = (1..=7)
            .map(|delivered| redelivery_delay(delivered, 7).map(|d| d.as_millis() as u64))
            .collect();
        assert_eq!(
            waits,
            vec![
                Some(500),
                Some(1_000),
                Some(2_000),
                Some(4_000),
                Some(8_000),
                Some(8_000),
                None
            ]
        );
    }

    #[test]
    fn without_a_delivery_limit_a_message_is_never_given_up() {
        assert_eq!(redelivery_delay(1_000, -1), Some(Duration::from_secs(8)));
        assert_eq!(redelivery_delay(0, 0), Some(Duration::from_millis(500)));
    }
}
