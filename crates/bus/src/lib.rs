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
pub use config::BusConfig;
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
            .connect(config.url.as_str())
            .await
            .map_err(|source| BusError::Connect {
                url: config::redact_url(&config.url),
                source,
            })?;
        let version = client.server_info().version;
        if !version_at_least(&version, MIN_SERVER_VERSION) {
            return Err(BusError::ServerTooOld {
                url: config::redact_url(&config.url),
                version,
            });
        }
        let js = jetstream::new(client.clone());
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
    /// [`BusError::ServerTooOld`] at once: retrying cannot fix it.
    pub async fn connect_retrying(
        config: &BusConfig,
        service: &str,
        shutdown: &CancellationToken,
    ) -> Result<Option<Self>, BusError> {
        let mut delay = Duration::from_millis(200);
        loop {
            match Self::connect(config, service).await {
                Ok(bus) => return Ok(Some(bus)),
                Err(err @ BusError::ServerTooOld { .. }) => return Err(err),
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

    /// Creates or updates the five streams; safe to call from every replica at once.
    ///
    /// # Errors
    /// [`BusError::Stream`] when the server refuses a stream.
    pub async fn ensure_streams(&self) -> Result<(), BusError> {
        for kind in StreamKind::ALL {
            let config = self.stream_config(kind);
            let name = config.name.clone();
            self.js
                .create_or_update_stream(config)
                .await
                .map_err(|source| BusError::Stream {
                    name,
                    source: Box::new(source),
                })?;
        }
        Ok(())
    }

    fn stream_config(&self, kind: StreamKind) -> jetstream::stream::Config {
        use jetstream::stream::{RetentionPolicy, StorageType};
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
            // Bounded so a burst of streamed deltas cannot exhaust the server's memory.
            max_bytes: if kind == StreamKind::Events {
                c.events_max_bytes
            } else {
                -1
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

    /// Publishes `msg` to a stream subject and waits for the server's acknowledgement.
    ///
    /// # Errors
    /// [`BusError::Publish`] when the server does not store it.
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

    /// Publishes `msg` and waits until the server confirms it: stored by a stream that captures
    /// the subject, or (no stream does) handed to its subscribers. Unlike [`Bus::publish_fast`]
    /// and a flush, the confirmation comes after a capturing stream stored the message.
    ///
    /// # Errors
    /// [`BusError::Publish`] when the server does not confirm it.
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
        // A retry after a lost confirmation carries the same id, so a capturing stream keeps
        // one copy.
        if let Some(id) = msg_id {
            publish = publish.message_id(id);
        }
        match self.send_confirmed(&subject, publish).await {
            Ok(()) => Ok(()),
            // No stream captures the subject: the server took it and passed it on as a
            // plain message, which is all a plain subscriber can get.
            Err(e)
                if e.kind() == async_nats::jetstream::context::PublishErrorKind::StreamNotFound =>
            {
                Ok(())
            }
            Err(e) => Err(publish_error(&subject, &e)),
        }
    }

    /// Publishes through JetStream and waits for the server's answer.
    async fn send_confirmed(
        &self,
        subject: &str,
        publish: Publish,
    ) -> Result<(), async_nats::jetstream::context::PublishError> {
        self.js
            .send_publish(subject.to_owned(), publish)
            .await?
            .await?;
        Ok(())
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
