//! Publishing: to a stream (waiting until it stored the message, through a leader election),
//! fire-and-forget for events, and dead letters.

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::context::PublishError;
use async_nats::jetstream::message::PublishMessage as Publish;
use bytes::Bytes;
use serde::Serialize;

use agentloop_lifecycle::{Backoff, retry};
use agentloop_proto::{Encoding, header_safe_msg_id, v1::SystemEvent};

use crate::{
    Bus, BusError, HEADER_ERROR, HEADER_ORIGINAL_SUBJECT, HEADER_SERVICE, HEADER_TRUNCATED,
    error_chain, nuid,
};

/// What a stream did with a published message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stored {
    /// Stored as a new message.
    New,
    /// Not stored again: the stream holds a message with the same id.
    Duplicate,
}

/// Sending a message again that no stream confirmed, within `publish_retry_ms`.
const PUBLISH_BACKOFF: Backoff = Backoff::new(50, 500, u32::MAX);

impl Bus {
    /// Publishes `msg` to a stream subject and waits until the stream stored it, retrying while
    /// the stream has no leader or the answer is lost, for `publish_retry_ms`.
    ///
    /// # Errors
    /// [`BusError::Publish`] when the stream refuses it or does not store it in time: the
    /// caller must then keep its own input unacknowledged, so it comes again.
    pub async fn publish_durable<T: prost::Message + Serialize>(
        &self,
        subject: String,
        msg: &T,
        msg_id: Option<&str>,
    ) -> Result<(), BusError> {
        let mut publish = Publish::build()
            .payload(Bytes::from(msg.encode_to_vec()))
            .headers(wire_headers(Encoding::Proto));
        if let Some(id) = msg_id {
            publish = publish.message_id(header_safe_msg_id(id));
        }
        self.send_confirmed(&subject, publish)
            .await
            .map(drop)
            .map_err(|e| publish_error(&subject, &e))
    }

    /// [`Bus::publish_durable`] that also says whether the stream stored the message or
    /// already held one with the same `msg_id` (within its duplicate window). A retry after a
    /// lost confirmation reads as a duplicate too, so `Duplicate` means "not known to be the
    /// first copy", never "certainly another sender's".
    ///
    /// # Errors
    /// As [`Bus::publish_durable`].
    pub async fn publish_durable_checked<T: prost::Message + Serialize>(
        &self,
        subject: String,
        msg: &T,
        msg_id: &str,
    ) -> Result<Stored, BusError> {
        let publish = Publish::build()
            .payload(Bytes::from(msg.encode_to_vec()))
            .headers(wire_headers(Encoding::Proto))
            .message_id(header_safe_msg_id(msg_id));
        self.send_confirmed(&subject, publish)
            .await
            .map_err(|e| publish_error(&subject, &e))
    }

    /// Publishes `msg` without waiting for an acknowledgement (events, control, replies).
    ///
    /// # Errors
    /// [`BusError::Publish`] when the client cannot queue it.
    pub async fn publish_fast<T: prost::Message + Serialize>(
        &self,
        subject: String,
        msg: &T,
        encoding: Encoding,
    ) -> Result<(), BusError> {
        let payload = Bytes::from(agentloop_proto::encode(msg, encoding));
        self.client
            .publish_with_headers(subject.clone(), wire_headers(encoding), payload)
            .await
            .map_err(|e| BusError::Publish {
                subject,
                source: e.to_string().into(),
            })
    }

    /// Publishes `msg` on a subject a stream captures (in `encoding`) and waits until the stream
    /// stored it; see [`Bus::publish_durable`] for the retries.
    ///
    /// # Errors
    /// [`BusError::Publish`] when no stream stored it before `publish_retry_ms` passed.
    pub async fn publish_confirmed<T: prost::Message + Serialize>(
        &self,
        subject: String,
        msg: &T,
        encoding: Encoding,
        msg_id: Option<&str>,
    ) -> Result<(), BusError> {
        let mut publish = Publish::build()
            .payload(Bytes::from(agentloop_proto::encode(msg, encoding)))
            .headers(wire_headers(encoding));
        // A retry after a lost confirmation carries the same id, so the stream keeps one copy.
        if let Some(id) = msg_id {
            publish = publish.message_id(header_safe_msg_id(id));
        }
        self.send_confirmed(&subject, publish)
            .await
            .map(drop)
            .map_err(|e| publish_error(&subject, &e))
    }

    /// Returns the stream that captures `subject`, `None` when the server says none does.
    ///
    /// # Errors
    /// [`BusError::Publish`] when the server cannot say (a lost answer, no meta leader): the
    /// caller must not take that for "no stream".
    pub async fn capturing_stream(&self, subject: &str) -> Result<Option<String>, BusError> {
        use async_nats::jetstream::context::GetStreamByNameErrorKind;
        match self.js.stream_by_subject(subject).await {
            Ok(name) => Ok(Some(name)),
            Err(e) if e.kind() == GetStreamByNameErrorKind::NotFound => Ok(None),
            Err(e) => Err(publish_error(subject, &e)),
        }
    }

    /// Publishes through JetStream until a stream stores the message. "No responders" (what a
    /// stream without a leader answers during a cluster election, and a missing stream too),
    /// a lost answer and a broken connection are retried with backoff for `publish_retry_ms`;
    /// the message id makes a retry of a stored message a duplicate the stream drops. Whether
    /// a stream should capture the subject is the caller's knowledge, never inferred from a
    /// "no responders": taking that for "nothing to store" lost replies in a failover.
    pub(crate) async fn send_confirmed(
        &self,
        subject: &str,
        publish: Publish,
    ) -> Result<Stored, PublishError> {
        let patience = PUBLISH_BACKOFF.within(Duration::from_millis(self.config.publish_retry_ms));
        let stored = retry(
            subject,
            patience,
            |err: &PublishError| publish_retryable(err.kind()),
            || async {
                let ack = self
                    .js
                    .send_publish(subject.to_owned(), publish.clone())
                    .await?;
                let ack = ack.await?;
                Ok(if ack.duplicate {
                    Stored::Duplicate
                } else {
                    Stored::New
                })
            },
        )
        .await;
        if let Err(err) = &stored
            && publish_retryable(err.kind())
        {
            tracing::error!(subject, error = %err, "gave up publishing: no stream stored the message in time");
        }
        stored
    }

    /// Emits a run event (fire and forget: events are for watching, the transcript is the record).
    pub async fn emit_event(&self, event: &SystemEvent) {
        let subject = self.subjects.events(&event.session_id, &event.run_id);
        let encoding = self.config.events_encoding.encoding();
        if let Err(err) = self.publish_fast(subject, event, encoding).await {
            tracing::warn!(error = %error_chain(&err), run_id = %event.run_id, "failed to emit event");
        }
    }

    /// Emits an inbox event on `<prefix>.inbox.<channel>` (fire and forget, as run events),
    /// unless `bus.inbox_events` is off.
    pub async fn emit_inbox(&self, event: &agentloop_proto::v1::InboxEvent) {
        if !self.config.inbox_events {
            return;
        }
        let subject = self.subjects.inbox(&event.channel);
        let encoding = self.config.events_encoding.encoding();
        if let Err(err) = self.publish_fast(subject, event, encoding).await {
            tracing::warn!(error = %error_chain(&err), channel = %event.channel, "failed to emit an inbox event");
        }
    }

    /// Keeps an unprocessable message on `<prefix>.dlq.<subject>` with the reason in headers and
    /// emits an error event, so nothing is dropped silently.
    ///
    /// # Errors
    /// [`BusError::Publish`] when the dead letter itself cannot be stored.
    pub async fn dead_letter(
        &self,
        service: &str,
        original_subject: &str,
        original_headers: Option<&HeaderMap>,
        payload: Bytes,
        reason: &str,
    ) -> Result<(), BusError> {
        let letter = Letter {
            service,
            original_subject,
            original_headers,
            reason,
        };
        self.keep_letter(&letter, payload, None).await.map(|_| ())
    }

    /// Stores `letter` with `payload` on the dead-letter stream (under message id `id`, when
    /// given) and emits its error event, unless the stream already held a letter of that id.
    pub(crate) async fn keep_letter(
        &self,
        letter: &Letter<'_>,
        payload: Bytes,
        id: Option<&str>,
    ) -> Result<Stored, BusError> {
        let Letter {
            service,
            original_subject,
            original_headers,
            reason,
        } = *letter;
        let max_payload = self.client.server_info().max_payload;
        let mut headers = letter_headers(service, original_subject, original_headers, reason);
        if fitting_payload(max_payload, &headers) == 0 {
            // The original's headers alone fill the limit: the letter keeps only its own.
            headers = letter_headers(service, original_subject, None, reason);
        }
        // An original near the server's limit no longer fits with the reason added, and a dead
        // letter the server refuses would leave the message coming back until its deliveries
        // ran out, kept nowhere: it is kept cut to fit instead, its size in a header.
        let room = fitting_payload(max_payload, &headers);
        let payload = if payload.len() > room {
            headers.insert(HEADER_TRUNCATED, payload.len().to_string().as_str());
            // The size header was not counted in `room`; the slack holds it.
            payload.slice(..room)
        } else {
            payload
        };
        if let Some(id) = id {
            headers.insert("Nats-Msg-Id", id);
        }
        let subject = self.subjects.dlq(original_subject);
        let publish = Publish::build().payload(payload).headers(headers);
        let stored = self
            .send_confirmed(&subject, publish)
            .await
            .map_err(|e| publish_error(&subject, &e))?;
        if stored == Stored::Duplicate {
            return Ok(stored);
        }
        let id = nuid();
        let event = SystemEvent {
            run_id: id.clone(),
            session_id: "dlq".to_owned(),
            seq: 1,
            stream: agentloop_proto::EventStream::Error.as_str().to_owned(),
            phase: "error".to_owned(),
            data: serde_json::json!({
                "error": reason,
                "subject": original_subject,
                "dlq_subject": subject,
                "service": service,
            })
            .to_string(),
            ts: Some(agentloop_proto::now()),
            ..Default::default()
        };
        self.emit_event(&event).await;
        tracing::warn!(
            service,
            subject = original_subject,
            reason,
            "dropped to dlq"
        );
        Ok(stored)
    }
}

/// What a dead letter says of its original, beside the payload.
#[derive(Clone, Copy)]
pub(crate) struct Letter<'a> {
    /// The service that gave up on the original.
    pub(crate) service: &'a str,
    /// The subject the original arrived on.
    pub(crate) original_subject: &'a str,
    /// The original's headers, kept on the letter (but its message id).
    pub(crate) original_headers: Option<&'a HeaderMap>,
    /// Why the service gave up.
    pub(crate) reason: &'a str,
}

/// Whether a failed JetStream publish may succeed if sent again: the stream had no leader or
/// the answer was lost. A refusal by the stream (limits, a wrong expected sequence) is final.
fn publish_retryable(kind: async_nats::jetstream::context::PublishErrorKind) -> bool {
    use async_nats::jetstream::context::PublishErrorKind as Kind;
    matches!(
        kind,
        Kind::StreamNotFound | Kind::TimedOut | Kind::BrokenPipe | Kind::MaxAckPending
    )
}

/// The headers of a dead letter: the original's (but its message id: a redelivered original
/// must not be mistaken for a duplicate dead letter), the reason, where it came from and who
/// refused it.
fn letter_headers(
    service: &str,
    original_subject: &str,
    original_headers: Option<&HeaderMap>,
    reason: &str,
) -> HeaderMap {
    let mut headers = HeaderMap::new();
    if let Some(original) = original_headers {
        for (name, values) in original.iter() {
            if name.to_string() == "Nats-Msg-Id" {
                continue;
            }
            for value in values {
                headers.append(name.clone(), value.clone());
            }
        }
    }
    // Header values cannot hold line breaks, and a reason quoting its input is cut short.
    let reason = &reason[..reason.floor_char_boundary(MAX_REASON_LEN)];
    let reason_line = reason.replace(['\r', '\n'], " ");
    headers.insert(HEADER_ERROR, reason_line.as_str());
    headers.insert(HEADER_ORIGINAL_SUBJECT, original_subject);
    headers.insert(HEADER_SERVICE, service);
    headers
}

/// Longest reason a dead letter's header carries, in bytes.
const MAX_REASON_LEN: usize = 2048;

/// Bytes kept free beside the headers counted by [`fitting_payload`] (the protocol's own
/// framing, a header added later).
const HEADER_SLACK: usize = 128;

/// The largest payload that fits in `max_payload` beside `headers`, as the NATS protocol
/// counts them (`NATS/1.0` line, `Name: value` lines, blank line); 0 when the headers alone
/// leave no room.
fn fitting_payload(max_payload: usize, headers: &HeaderMap) -> usize {
    let mut header_bytes = "NATS/1.0\r\n\r\n".len();
    for (name, values) in headers.iter() {
        for value in values {
            let name: &[u8] = name.as_ref();
            header_bytes += name.len() + ": \r\n".len() + value.as_str().len();
        }
    }
    max_payload.saturating_sub(header_bytes + HEADER_SLACK)
}

/// Headers of every payload agentloop publishes: its encoding and the current trace.
fn wire_headers(encoding: Encoding) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert("Content-Type", encoding.content_type());
    agentloop_telemetry::inject_nats(&mut headers);
    headers
}

fn publish_error(subject: &str, err: &dyn std::error::Error) -> BusError {
    BusError::Publish {
        subject: subject.to_owned(),
        source: err.to_string().into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_fits_beside_its_headers_within_the_limit() {
        let mut headers = HeaderMap::new();
        headers.insert(HEADER_ERROR, "x".repeat(100).as_str());
        let room = fitting_payload(1024, &headers);
        // 12 bytes of framing, the header's line, and the slack.
        assert_eq!(
            room,
            1024 - (12 + HEADER_ERROR.len() + 4 + 100) - HEADER_SLACK
        );
        assert_eq!(fitting_payload(100, &headers), 0);
    }

    #[test]
    fn only_a_missing_leader_or_a_lost_answer_is_retried() {
        use async_nats::jetstream::context::PublishErrorKind as Kind;
        assert!(publish_retryable(Kind::StreamNotFound));
        assert!(publish_retryable(Kind::TimedOut));
        assert!(publish_retryable(Kind::BrokenPipe));
        assert!(!publish_retryable(Kind::WrongLastSequence));
        assert!(!publish_retryable(Kind::Other));
    }
}
