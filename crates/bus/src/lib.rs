//! The NATS bus of agentloop: subject names under a configurable prefix, JetStream stream setup
//! (idempotent, checked against the server), the protobuf/JSON codec on the wire with
//! `traceparent` headers, and dead-lettering of anything that cannot be processed.

mod acks;
mod config;
mod consume;
mod error;
mod in_order;
mod subjects;

pub use acks::Acks;
pub use config::{BusConfig, redact_url};
pub use consume::Deliveries;
pub use error::BusError;
pub use in_order::InOrder;
pub use subjects::{StreamKind, Subjects, stream_name};

use std::time::Duration;

use async_nats::jetstream::{self, consumer::PullConsumer, message::PublishMessage as Publish};
use async_nats::{HeaderMap, Message};
use bytes::Bytes;
use serde::{Serialize, de::DeserializeOwned};
use tokio_util::sync::CancellationToken;

use agentloop_proto::{DecodeError, Encoding, v1::SystemEvent};

/// Header naming why a message was dead-lettered.
pub const HEADER_ERROR: &str = "Agentloop-Error";
/// Header naming the subject a dead-lettered message arrived on.
pub const HEADER_ORIGINAL_SUBJECT: &str = "Agentloop-Original-Subject";
/// Header naming the service that dead-lettered a message.
pub const HEADER_SERVICE: &str = "Agentloop-Service";
/// The oldest nats-server this code runs against (older ones drop stream settings silently).
pub const MIN_SERVER_VERSION: (u64, u64) = (2, 11);

/// A connection to NATS and JetStream with agentloop's subjects. Cheap to clone.
#[derive(Clone)]
pub struct Bus {
    client: async_nats::Client,
    /// Counts (re)connections: consumers reopen their pull streams when it moves, since a
    /// restarted server has forgotten their outstanding pull requests.
    connections: tokio::sync::watch::Receiver<u64>,
    js: jetstream::Context,
    subjects: Subjects,
    config: BusConfig,
}

impl Bus {
    /// Connects once, checks the server version and ensures the streams exist.
    ///
    /// # Errors
    /// [`BusError`] when the server is unreachable, too old, or refuses the stream settings.
    pub async fn connect(config: &BusConfig, service: &str) -> Result<Self, BusError> {
        let seeds = config.server_addrs()?;
        let (connected_tx, connections) = tokio::sync::watch::channel(0_u64);
        let client = config
            .connect_options()
            .await?
            .event_callback(move |event| {
                let connected_tx = connected_tx.clone();
                async move {
                    match event {
                        async_nats::Event::Connected => {
                            connected_tx.send_modify(|n| *n += 1);
                            tracing::info!("nats connected");
                        }
                        async_nats::Event::Disconnected => tracing::warn!("nats disconnected"),
                        other => tracing::info!(event = %other, "nats event"),
                    }
                }
            })
            .name(format!("agentloop-{service}"))
            .connection_timeout(Duration::from_millis(config.connect_timeout_ms))
            .connect(seeds)
            .await
            .map_err(|source| BusError::Connect {
                url: config.display_urls(),
                source,
            })?;
        let version = client.server_info().version;
        if !version_at_least(&version, MIN_SERVER_VERSION) {
            return Err(BusError::ServerTooOld {
                url: config.display_urls(),
                version,
            });
        }
        let mut js = jetstream::new(client.clone());
        js.set_timeout(Duration::from_millis(config.request_timeout_ms));
        let bus = Self {
            client,
            connections,
            js,
            subjects: Subjects::new(&config.prefix),
            config: config.clone(),
        };
        bus.ensure_streams().await?;
        Ok(bus)
    }

    /// Connects, retrying with backoff until it succeeds or `shutdown` is cancelled (`None`).
    ///
    /// # Errors
    /// [`BusError::ServerTooOld`] and [`BusError::InvalidUrl`] at once: retrying cannot fix them.
    pub async fn connect_retrying(
        config: &BusConfig,
        service: &str,
        shutdown: &CancellationToken,
    ) -> Result<Option<Self>, BusError> {
        let mut delay = Duration::from_millis(200);
        loop {
            match Self::connect(config, service).await {
                Ok(bus) => return Ok(Some(bus)),
                Err(
                    err @ (BusError::ServerTooOld { .. }
                    | BusError::InvalidUrl { .. }
                    | BusError::Credentials { .. }),
                ) => {
                    return Err(err);
                }
                Err(err) => {
                    tracing::warn!(error = %error_chain(&err), retry_in_ms = delay.as_millis() as u64, "nats not available, retrying");
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => return Ok(None),
                () = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(Duration::from_secs(5));
        }
    }

    /// Returns the subject names of this stack.
    pub fn subjects(&self) -> &Subjects {
        &self.subjects
    }

    /// Returns the underlying NATS client.
    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }

    /// Returns the JetStream context.
    pub fn jetstream(&self) -> &jetstream::Context {
        &self.js
    }

    /// Returns the configuration this bus was built from.
    pub fn config(&self) -> &BusConfig {
        &self.config
    }

    /// Makes sure the five streams exist with this configuration. A stream is read first and
    /// created only when missing, updated only when its settings differ, so replicas starting
    /// together check rather than race (every service updating the same three-replica streams
    /// at once made a cluster start take up to a minute).
    ///
    /// # Errors
    /// [`BusError::Stream`] when the server refuses a stream.
    pub async fn ensure_streams(&self) -> Result<(), BusError> {
        for kind in StreamKind::ALL {
            let deadline =
                tokio::time::Instant::now() + Duration::from_millis(self.config.publish_retry_ms);
            // A request lost to a node that died, or a cluster still electing its leaders, is
            // asked again rather than failing the whole connection.
            loop {
                match self.ensure_stream(kind).await {
                    Ok(()) => break,
                    Err(err) if tokio::time::Instant::now() < deadline => {
                        tracing::warn!(error = %error_chain(&err), "stream not ready yet, checking again");
                        tokio::time::sleep(Duration::from_millis(250)).await;
                    }
                    Err(err) => return Err(err),
                }
            }
        }
        Ok(())
    }

    async fn ensure_stream(&self, kind: StreamKind) -> Result<(), BusError> {
        let wanted = self.stream_config(kind);
        let name = wanted.name.clone();
        let stream_err = |source| BusError::Stream {
            name: name.clone(),
            source: Box::new(source),
        };
        match self.js.get_stream(&name).await {
            // The lookup answered with the stream's current settings.
            Ok(stream) => {
                if !stream_settings_match(&stream.cached_info().config, &wanted) {
                    tracing::info!(stream = %name, "stream settings differ, updating");
                    self.js.update_stream(wanted).await.map_err(stream_err)?;
                }
            }
            Err(_) => {
                self.js
                    .create_or_update_stream(wanted)
                    .await
                    .map_err(stream_err)?;
            }
        }
        Ok(())
    }

    fn stream_config(&self, kind: StreamKind) -> jetstream::stream::Config {
        use jetstream::stream::{DiscardPolicy, RetentionPolicy, StorageType};
        let c = &self.config;
        let (retention, max_age) = match kind {
            StreamKind::Inbound | StreamKind::Runs | StreamKind::Outbound => {
                (RetentionPolicy::WorkQueue, c.work_max_age_secs)
            }
            StreamKind::Events => (RetentionPolicy::Limits, c.events_max_age_secs),
            StreamKind::Dlq => (RetentionPolicy::Limits, c.dlq_max_age_secs),
        };
        jetstream::stream::Config {
            name: stream_name(&c.prefix, kind),
            subjects: vec![self.subjects.stream_subjects(kind)],
            retention,
            // Events are for watching and replay, the transcript is the record: keeping them in
            // memory spares the server a disk write per streamed delta.
            storage: if kind == StreamKind::Events && c.events_in_memory {
                StorageType::Memory
            } else {
                StorageType::File
            },
            max_age: Duration::from_secs(max_age),
            // Every stream is bounded, so a flood cannot fill the server's memory or disk.
            max_bytes: match kind {
                StreamKind::Events => c.events_max_bytes,
                StreamKind::Inbound | StreamKind::Runs | StreamKind::Outbound => c.work_max_bytes,
                StreamKind::Dlq => c.dlq_max_bytes,
            },
            // Accepted work is never thrown away to make room: a full work stream refuses the
            // next publish (the publisher gets an error it can show), while events and dead
            // letters let their oldest go.
            discard: match kind {
                StreamKind::Inbound | StreamKind::Runs | StreamKind::Outbound => DiscardPolicy::New,
                StreamKind::Events | StreamKind::Dlq => DiscardPolicy::Old,
            },
            duplicate_window: Duration::from_secs(c.duplicate_window_secs),
            num_replicas: c.replicas,
            ..Default::default()
        }
    }

    /// Creates (or reuses) the durable pull consumer shared by a service's replicas.
    ///
    /// # Errors
    /// [`BusError::Consumer`] when the server refuses it.
    pub async fn durable_consumer(
        &self,
        kind: StreamKind,
        durable: &str,
    ) -> Result<PullConsumer, BusError> {
        let stream_name = stream_name(&self.config.prefix, kind);
        let config = jetstream::consumer::pull::Config {
            durable_name: Some(durable.to_owned()),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ack_wait: Duration::from_millis(self.config.ack_wait_ms),
            max_deliver: self.config.max_deliver,
            max_ack_pending: self.config.max_ack_pending,
            ..Default::default()
        };
        let map_err = |source: String| BusError::Consumer {
            name: durable.to_owned(),
            source: source.into(),
        };
        let stream = self
            .js
            .get_stream(&stream_name)
            .await
            .map_err(|e| map_err(e.to_string()))?;
        match stream.create_consumer(config.clone()).await {
            Ok(consumer) => Ok(consumer),
            // A durable that exists with older settings is updated in place.
            Err(_) => stream
                .update_consumer(config)
                .await
                .map_err(|e| map_err(e.to_string())),
        }
    }

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
            publish = publish.message_id(id);
        }
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
            publish = publish.message_id(id);
        }
        self.send_confirmed(&subject, publish)
            .await
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
    async fn send_confirmed(
        &self,
        subject: &str,
        publish: Publish,
    ) -> Result<(), async_nats::jetstream::context::PublishError> {
        let deadline =
            tokio::time::Instant::now() + Duration::from_millis(self.config.publish_retry_ms);
        let mut delay = Duration::from_millis(50);
        let mut attempt = 1_u32;
        loop {
            let sent = match self
                .js
                .send_publish(subject.to_owned(), publish.clone())
                .await
            {
                Ok(ack) => ack.await.map(drop),
                Err(e) => Err(e),
            };
            let err = match sent {
                Ok(()) => {
                    if attempt > 1 {
                        tracing::info!(subject, attempt, "stream stored the message after retries");
                    }
                    return Ok(());
                }
                Err(err) => err,
            };
            let now = tokio::time::Instant::now();
            if !publish_retryable(err.kind()) || now + delay > deadline {
                if publish_retryable(err.kind()) {
                    tracing::error!(subject, attempt, error = %err, "gave up publishing: no stream stored the message in time");
                }
                return Err(err);
            }
            tracing::warn!(subject, attempt, error = %err, retry_in_ms = delay.as_millis() as u64, "stream did not store the message, retrying");
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_millis(500));
            attempt += 1;
        }
    }

    /// Emits a run event (fire and forget: events are for watching, the transcript is the record).
    pub async fn emit_event(&self, event: &SystemEvent) {
        let subject = self.subjects.events(&event.session_id, &event.run_id);
        if let Err(err) = self.publish_fast(subject, event, Encoding::Proto).await {
            tracing::warn!(error = %error_chain(&err), run_id = %event.run_id, "failed to emit event");
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
        // A redelivered original must not be mistaken for a duplicate dead letter, so its
        // JetStream message id is not carried over.
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
        // Header values cannot hold line breaks.
        let reason_line = reason.replace(['\r', '\n'], " ");
        headers.insert(HEADER_ERROR, reason_line.as_str());
        headers.insert(HEADER_ORIGINAL_SUBJECT, original_subject);
        headers.insert(HEADER_SERVICE, service);
        let subject = self.subjects.dlq(original_subject);
        let publish = Publish::build().payload(payload).headers(headers);
        self.send_confirmed(&subject, publish)
            .await
            .map_err(|e| publish_error(&subject, &e))?;
        let id = nuid();
        let event = SystemEvent {
            run_id: id.clone(),
            session_id: "dlq".to_owned(),
            seq: 1,
            stream: "error".to_owned(),
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
        Ok(())
    }
}

/// Whether a stream already has the settings agentloop gives it (the server fills in others).
fn stream_settings_match(
    current: &jetstream::stream::Config,
    wanted: &jetstream::stream::Config,
) -> bool {
    current.subjects == wanted.subjects
        && current.retention == wanted.retention
        && current.storage == wanted.storage
        && current.max_age == wanted.max_age
        && current.max_bytes == wanted.max_bytes
        && current.discard == wanted.discard
        && current.duplicate_window == wanted.duplicate_window
        && current.num_replicas == wanted.num_replicas
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

/// Decodes a NATS message as `T`, honouring its `Content-Type` header.
///
/// # Errors
/// [`DecodeError`] describing what did not fit.
pub fn decode<T>(msg: &Message) -> Result<(T, Encoding), DecodeError>
where
    T: prost::Message + Default + DeserializeOwned,
{
    let content_type = msg
        .headers
        .as_ref()
        .and_then(|h| h.get("Content-Type").or_else(|| h.get("content-type")))
        .map(|v| v.as_str());
    agentloop_proto::decode(content_type, &msg.payload)
}

/// Returns a fresh unique, time-ordered id usable as a subject token.
pub fn nuid() -> String {
    uuid::Uuid::now_v7().simple().to_string()
}

/// Formats an error with its chain of causes on one line, for logs and dead-letter headers.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn version_at_least(version: &str, (major, minor): (u64, u64)) -> bool {
    let mut parts = version
        .trim_start_matches('v')
        .split(['.', '-'])
        .map(|p| p.parse::<u64>().unwrap_or(0));
    let got = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    got >= (major, minor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_versions_older_than_2_11_are_refused() {
        assert!(!version_at_least("2.9.10", (2, 11)));
        assert!(version_at_least("2.11.0", (2, 11)));
        assert!(version_at_least("2.15.1", (2, 11)));
        assert!(version_at_least("3.0.0-beta", (2, 11)));
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

    #[test]
    fn error_chain_joins_causes() {
        let err = BusError::Connect {
            url: "nats://x".into(),
            source: async_nats::ConnectError::from(async_nats::ConnectErrorKind::TimedOut),
        };
        let text = error_chain(&err);
        assert!(
            text.starts_with("failed to connect to nats at nats://x: "),
            "{text}"
        );
    }
}
