//! The NATS bus of agentloop: subject names under a configurable prefix, JetStream stream setup
//! (idempotent, checked against the server; a server that refuses it for good is an error at
//! once), the protobuf/JSON codec on the wire with `traceparent` headers, and dead-lettering of
//! anything that cannot be processed ([`DeadLetters`]).

mod acks;
mod arrivals;
mod config;
mod consume;
mod dead_letters;
mod depth;
mod dlq;
mod error;
mod in_order;
mod in_turn;
mod order;
mod probe;
mod publish;
mod subjects;

pub use acks::{Acks, holding};
pub use arrivals::{Arrivals, Arrived};
pub use config::{BusConfig, EventsEncoding, redact_url};
pub use consume::Deliveries;
pub use dead_letters::{DeadLetters, DeadReason};
pub use depth::report_depths;
pub use dlq::{DeadLetter, HEADER_RETRY_OF};
pub use error::BusError;
pub use in_order::InOrder;
pub use in_turn::{InTurn, KeyOf};
pub use order::Arrival;
pub use publish::Stored;
pub use subjects::{StreamKind, Subjects, channel_label, stream_name};

use std::time::Duration;

use async_nats::Message;
use async_nats::jetstream::{self, consumer::PullConsumer};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use agentloop_lifecycle::{Backoff, retry};
use agentloop_proto::{DecodeError, Encoding};

/// Header naming why a message was dead-lettered.
pub const HEADER_ERROR: &str = "Agentloop-Error";
/// Header naming the subject a dead-lettered message arrived on.
pub const HEADER_ORIGINAL_SUBJECT: &str = "Agentloop-Original-Subject";
/// Header naming the service that dead-lettered a message.
pub const HEADER_SERVICE: &str = "Agentloop-Service";
/// Header on a dead letter whose original was too large to keep whole: the original's size in
/// bytes (its payload is cut to fit the server's `max_payload`).
pub const HEADER_TRUNCATED: &str = "Agentloop-Truncated";
/// The oldest nats-server this code runs against (older ones drop stream settings silently).
pub const MIN_SERVER_VERSION: (u64, u64) = (2, 11);
/// Waiting for NATS at startup: until it answers or the service is stopped.
const CONNECT_BACKOFF: Backoff = Backoff::new(200, 5_000, u32::MAX);
/// Asking again for a stream a cluster cannot answer for yet, within `publish_retry_ms`.
const STREAM_BACKOFF: Backoff = Backoff::new(250, 250, u32::MAX);

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
            .ping_interval(Duration::from_millis(config.ping_interval_ms.max(100)))
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
        if !client.server_info().jetstream {
            return Err(BusError::JetStreamDisabled {
                url: config.display_urls(),
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
    /// A [permanent](BusError::is_permanent) error at once: retrying cannot fix it, and a
    /// service that waited on it would look alive while it can never work.
    pub async fn connect_retrying(
        config: &BusConfig,
        service: &str,
        shutdown: &CancellationToken,
    ) -> Result<Option<Self>, BusError> {
        let connected = retry_transient("nats connect", CONNECT_BACKOFF, || {
            Self::connect(config, service)
        });
        // A stop while waiting for NATS is not an error: there is nothing to drain yet.
        tokio::select! {
            () = shutdown.cancelled() => Ok(None),
            connected = connected => connected.map(Some),
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
        // A request lost to a node that died, or a cluster still electing its leaders, is
        // asked again rather than failing the whole connection; a refusal is final.
        let patience = STREAM_BACKOFF.within(Duration::from_millis(self.config.publish_retry_ms));
        for kind in StreamKind::ALL {
            retry_transient("stream setup", patience, || self.ensure_stream(kind)).await?;
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

/// Retries `call` under `policy` while its error is not [permanent](BusError::is_permanent).
async fn retry_transient<T, Fut>(
    what: &str,
    policy: Backoff,
    mut call: impl FnMut() -> Fut,
) -> Result<T, BusError>
where
    Fut: std::future::Future<Output = Result<T, BusError>>,
{
    let attempt = || {
        let attempt = call();
        async move { attempt.await.map_err(WithCauses) }
    };
    retry(
        what,
        policy,
        |err: &WithCauses| !err.0.is_permanent(),
        attempt,
    )
    .await
    .map_err(|WithCauses(err)| err)
}

/// A bus error as the retry log shows it: with its causes (a refused connection, a TLS error).
struct WithCauses(BusError);

impl std::fmt::Display for WithCauses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&error_chain(&self.0))
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
    agentloop_proto::decode(content_type(msg), &msg.payload)
}

/// Returns the encoding `msg`'s payload is in: its `Content-Type`, else what its first byte says.
pub fn encoding(msg: &Message) -> Encoding {
    Encoding::detect(content_type(msg), &msg.payload)
}

fn content_type(msg: &Message) -> Option<&str> {
    msg.headers
        .as_ref()
        .and_then(|h| h.get("Content-Type").or_else(|| h.get("content-type")))
        .map(|v| v.as_str())
}

/// Decodes a message read from a stream (not delivered by a consumer) as `T`, honouring its
/// `Content-Type` header.
///
/// # Errors
/// [`DecodeError`] describing what did not fit.
pub fn decode_stored<T>(
    msg: &jetstream::message::StreamMessage,
) -> Result<(T, Encoding), DecodeError>
where
    T: prost::Message + Default + DeserializeOwned,
{
    let content_type = msg
        .headers
        .get("Content-Type")
        .or_else(|| msg.headers.get("content-type"))
        .map(async_nats::HeaderValue::as_str);
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
