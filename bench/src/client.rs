//! The load client: publishes InboundMessages (protobuf or JSON) through JetStream, watches replies on
//! `<prefix>.deliver.>` (and, when tracing, run events and run commands), checks each reply's
//! text and counts duplicates. It also notes when each final reply first appears on
//! `<prefix>.outbound.>`, the subject `DESIGN.md` gives replies and the one a NATS CLI user
//! reads, before delivery's bus adapter forwards it (`replies.rs` matches what it watches).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use async_nats::{HeaderMap, jetstream};
use bytes::Bytes;
use futures::StreamExt as _;
use prost::Message as _;
use tokio::sync::oneshot;

use agentloop_proto::Encoding;
use agentloop_proto::v1::{InboundMessage, OutboundMessage, RunCommand};

use crate::replies::{Inflight, State, on_event, on_outbound, on_reply};

/// How long one message may take before it counts as lost.
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// Microseconds since the Unix epoch.
pub fn wall_us() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_micros() as f64)
}

pub(crate) fn ts_us(seconds: i64, nanos: i32) -> f64 {
    seconds as f64 * 1e6 + f64::from(nanos) / 1e3
}

/// Timestamps of one run, for the per-hop profile (µs since the epoch).
#[derive(Debug, Clone, Default)]
pub struct Trace {
    /// Bench: just before publishing.
    pub sent: f64,
    /// Bench: the router's RunCommand seen on `<prefix>.run.>`.
    pub run_command_seen: Option<f64>,
    /// Runner: lifecycle start event.
    pub start_ev: Option<f64>,
    /// Runner: first assistant delta.
    pub first_delta_ev: Option<f64>,
    /// Runner: last assistant delta.
    pub last_delta_ev: Option<f64>,
    /// Runner: lifecycle end event.
    pub end_ev: Option<f64>,
    /// Runner: `OutboundMessage.ts`.
    pub outbound_ts: Option<f64>,
    /// Bench: the reply seen on `<prefix>.deliver.>`.
    pub delivered: f64,
}

/// The outcome of one message.
#[derive(Debug)]
pub struct Done {
    /// Publish to final reply.
    pub total: Duration,
    /// Publish to the first assistant delta, when events were watched.
    pub first_delta: Option<Duration>,
    /// Publish to the final reply seen on `<prefix>.outbound.>` (bus messages only).
    pub outbound: Option<Duration>,
    /// Whether the reply's text was the expected echo.
    pub text_ok: bool,
}

/// Counters of one phase.
#[derive(Debug, Default, Clone, Copy)]
pub struct Tally {
    /// Replies seen more than once.
    pub duplicates: u64,
    /// Replies that matched no message in flight (wrong text, unknown session).
    pub unexpected: u64,
    /// Messages answered on `<prefix>.outbound.>` whose delivered copy never came.
    pub undelivered: u64,
}

/// The bench's NATS side.
#[derive(Clone)]
pub struct LoadClient {
    nc: async_nats::Client,
    js: jetstream::Context,
    prefix: String,
    /// The encoding of the InboundMessages it publishes (and asks with).
    inbound: Encoding,
    /// Fake-model directives appended to every message (`[[delay_ms:N]]`); the model strips
    /// them, so the expected echo is unchanged.
    directive: String,
    state: Arc<State>,
}

/// Watches that exist only while tracing (events, run commands).
pub struct TraceWatch {
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for TraceWatch {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl LoadClient {
    /// Connects and starts watching `<prefix>.deliver.>` and `<prefix>.outbound.>`; `inbound`:
    /// the encoding of the InboundMessages it will publish.
    ///
    /// # Errors
    /// When NATS cannot be reached.
    pub async fn connect(url: &str, prefix: &str, inbound: Encoding) -> anyhow::Result<Self> {
        let client = Self::connect_unwatched(url, prefix, inbound).await?;
        client.watch_replies().await?;
        Ok(client)
    }

    /// Connects without watching the bus for replies, for phases that only drive the gateway's
    /// HTTP API: their answers come back on the HTTP connection, and a watcher would have
    /// nats-server hand the bench two more copies of every reply (the outbound one and
    /// delivery's), work the system under test pays for and OpenClaw's side of a side by side
    /// does not.
    ///
    /// # Errors
    /// When NATS cannot be reached.
    pub async fn connect_unwatched(
        url: &str,
        prefix: &str,
        inbound: Encoding,
    ) -> anyhow::Result<Self> {
        let nc = async_nats::ConnectOptions::new()
            .name("agentloop-bench")
            .subscription_capacity(1 << 17)
            // A cluster's seeds come comma-separated, as the services take them.
            .connect(url.split(',').map(str::trim).collect::<Vec<_>>())
            .await
            .context("bench failed to connect to nats")?;
        // A burst has every message's ack pending at once: past async-nats's default of 5,000
        // the publish would fail.
        let js = jetstream::context::ContextBuilder::new()
            .max_ack_inflight(1 << 17)
            .build(nc.clone());
        Ok(Self {
            nc,
            js,
            prefix: prefix.to_owned(),
            inbound,
            directive: String::new(),
            state: Arc::new(State::default()),
        })
    }

    /// Watches `<prefix>.deliver.>` and `<prefix>.outbound.>` for the replies of the messages
    /// this client publishes.
    async fn watch_replies(&self) -> anyhow::Result<()> {
        let prefix = &self.prefix;
        let mut replies = self
            .nc
            .subscribe(format!("{prefix}.deliver.>"))
            .await
            .context("failed to subscribe to replies")?;
        let mut outbound = self
            .nc
            .subscribe(format!("{prefix}.outbound.>"))
            .await
            .context("failed to subscribe to the outbound subject")?;
        let state = self.state.clone();
        // One task for both, outbound first: a reply reaches `outbound.>` before delivery
        // forwards it, and a delivered reply must find its outbound time already noted.
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    biased;
                    Some(msg) = outbound.next() => on_outbound(&state, &msg),
                    Some(msg) = replies.next() => on_reply(&state, &msg),
                    else => break,
                }
            }
        });
        self.nc.flush().await.context("flush failed")?;
        Ok(())
    }

    /// Starts recording event and run-command timestamps (and first-delta latency).
    ///
    /// # Errors
    /// When the subscriptions fail.
    pub async fn watch(&self, trace: bool) -> anyhow::Result<TraceWatch> {
        self.state.tracing.store(trace, Ordering::SeqCst);
        let mut events = self
            .nc
            .subscribe(format!("{}.events.>", self.prefix))
            .await?;
        let state = self.state.clone();
        let mut tasks = vec![tokio::spawn(async move {
            while let Some(msg) = events.next().await {
                on_event(&state, &msg);
            }
        })];
        if trace {
            let mut commands = self.nc.subscribe(format!("{}.run.>", self.prefix)).await?;
            let state = self.state.clone();
            tasks.push(tokio::spawn(async move {
                while let Some(msg) = commands.next().await {
                    let seen = wall_us();
                    if let Ok(command) = RunCommand::decode(msg.payload.as_ref())
                        && let Ok(mut map) = state.run_commands.lock()
                    {
                        map.insert(command.idempotency_key, seen);
                    }
                }
            }));
        }
        self.nc.flush().await?;
        Ok(TraceWatch { tasks })
    }

    /// Stops tracing and returns the traces recorded, by tag.
    pub fn take_traces(&self) -> Vec<(String, Trace)> {
        self.state.tracing.store(false, Ordering::SeqCst);
        let traces: Vec<(String, (String, Trace))> = self
            .state
            .traces
            .lock()
            .map(|mut t| t.drain().collect())
            .unwrap_or_default();
        let events = self
            .state
            .events
            .lock()
            .map(|mut e| std::mem::take(&mut *e))
            .unwrap_or_default();
        let commands = self
            .state
            .run_commands
            .lock()
            .map(|mut c| std::mem::take(&mut *c))
            .unwrap_or_default();
        traces
            .into_iter()
            .map(|(tag, (run_id, mut trace))| {
                if let Some(ev) = events.get(&run_id) {
                    trace.start_ev = ev.start;
                    trace.first_delta_ev = ev.first_delta;
                    trace.last_delta_ev = ev.last_delta;
                    trace.end_ev = ev.end;
                }
                trace.run_command_seen = commands.get(&tag).copied();
                (tag, trace)
            })
            .collect()
    }

    /// Returns and resets the phase's counters.
    pub fn take_tally(&self) -> Tally {
        // Sightings on `outbound.>` that no delivered copy claimed (a reply answered over HTTP
        // reaches its gateway, not `deliver.>`) are dropped with the phase.
        if let Ok(mut seen) = self.state.outbound_seen.lock() {
            seen.clear();
        }
        Tally {
            duplicates: self.state.duplicates.swap(0, Ordering::SeqCst),
            unexpected: self.state.unexpected.swap(0, Ordering::SeqCst),
            undelivered: self
                .state
                .answered
                .lock()
                .map(|mut a| std::mem::take(&mut *a).len() as u64)
                .unwrap_or(0),
        }
    }

    /// Sends one message for `session_key` and waits for its reply (bounded by a timeout).
    ///
    /// # Errors
    /// On publish failure or when no reply came in time.
    pub async fn send(&self, session_key: &str, tag: &str) -> anyhow::Result<Done> {
        let (inbound, inflight, rx) = message(session_key, tag, "", &self.directive);
        if let Ok(mut map) = self.state.inflight.lock() {
            map.insert(session_key.to_owned(), inflight);
        }
        let result = async {
            let ack = self.publish(&inbound).await?;
            let (ack, done) =
                tokio::time::timeout(REPLY_TIMEOUT, async { tokio::join!(ack.into_future(), rx) })
                    .await
                    .context("no reply in time")?;
            ack.context("inbound not stored")?;
            done.context("reply watcher gone")
        }
        .await;
        if result.is_err()
            && let Ok(mut map) = self.state.inflight.lock()
        {
            map.remove(session_key);
        }
        result
    }

    /// Publishes one message of a burst without waiting for its reply (a session may have many
    /// in flight, queued in `queue_mode`); the receiver gets the reply, the future the ack.
    ///
    /// # Errors
    /// When the publish itself fails.
    pub async fn publish_burst(
        &self,
        session_key: &str,
        tag: &str,
        queue_mode: &str,
    ) -> anyhow::Result<(
        jetstream::context::PublishAckFuture,
        oneshot::Receiver<Done>,
    )> {
        let (inbound, inflight, rx) = message(session_key, tag, queue_mode, &self.directive);
        if let Ok(mut map) = self.state.burst.lock() {
            map.insert(tag.to_owned(), inflight);
        }
        let ack = self.publish(&inbound).await;
        if ack.is_err()
            && let Ok(mut map) = self.state.burst.lock()
        {
            map.remove(tag);
        }
        Ok((ack?, rx))
    }

    /// Publishes `inbound` on the CLI channel's inbound subject in the client's encoding; the
    /// future resolves on the stream's ack.
    async fn publish(
        &self,
        inbound: &InboundMessage,
    ) -> anyhow::Result<jetstream::context::PublishAckFuture> {
        self.js
            .publish_with_headers(
                format!("{}.inbound.cli", self.prefix),
                self.headers(),
                Bytes::from(agentloop_proto::encode(inbound, self.inbound)),
            )
            .await
            .context("publish failed")
    }

    /// Forgets the burst's messages still waiting for a reply (counted lost by the caller).
    pub fn clear_burst(&self) {
        if let Ok(mut map) = self.state.burst.lock() {
            map.clear();
        }
    }

    /// Sends one message through the gateway's `<prefix>.ask` request/reply and checks the text.
    ///
    /// # Errors
    /// On request failure, timeout or a wrong answer.
    pub async fn ask(&self, session_key: &str, tag: &str) -> anyhow::Result<Duration> {
        let text = format!("bench {tag}");
        let inbound = InboundMessage {
            session_key: session_key.to_owned(),
            channel: "cli".to_owned(),
            text: text.clone(),
            idempotency_key: tag.to_owned(),
            ..Default::default()
        };
        let headers = self.headers();
        let start = Instant::now();
        let reply = tokio::time::timeout(
            REPLY_TIMEOUT,
            self.nc.request_with_headers(
                format!("{}.ask", self.prefix),
                headers,
                Bytes::from(agentloop_proto::encode(&inbound, self.inbound)),
            ),
        )
        .await
        .context("ask timed out")?
        .context("ask failed")?;
        let elapsed = start.elapsed();
        // The gateway answers in the request's encoding.
        let content_type = reply
            .headers
            .as_ref()
            .and_then(|h| h.get("Content-Type"))
            .map(|v| v.as_str());
        let (outbound, _) =
            agentloop_proto::decode::<OutboundMessage>(content_type, reply.payload.as_ref())
                .context("ask reply is not an OutboundMessage")?;
        anyhow::ensure!(
            outbound.text == format!("echo: {text}"),
            "ask answered {:?}",
            outbound.text
        );
        Ok(elapsed)
    }

    /// From now on, answers each bus message's sender as soon as its final reply appears on
    /// `<prefix>.outbound.>` (`on`), or only when delivery's copy arrives (`!on`, the default).
    /// Delivered copies are still counted, so a duplicate or a lost delivery still shows.
    pub fn answer_on_outbound(&self, on: bool) {
        self.state.answer_on_outbound.store(on, Ordering::SeqCst);
    }

    /// Appends fake-model directives to every message it sends from now on.
    pub fn set_directive(&mut self, directive: String) {
        self.directive = directive;
    }

    /// The headers of an InboundMessage in the client's encoding.
    fn headers(&self) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("Content-Type", self.inbound.content_type());
        headers
    }
}

/// The message tagged `tag` for `session_key` (`queue_mode` empty: the session's default) and
/// the record that waits for its reply, timed from now.
fn message(
    session_key: &str,
    tag: &str,
    queue_mode: &str,
    directive: &str,
) -> (InboundMessage, Inflight, oneshot::Receiver<Done>) {
    let text = format!("bench {tag}");
    let (tx, rx) = oneshot::channel();
    let inflight = Inflight {
        tag: tag.to_owned(),
        expected: format!("echo: {text}"),
        sent: Instant::now(),
        sent_wall: wall_us(),
        first_delta: None,
        done: Some(tx),
    };
    let text = if directive.is_empty() {
        text
    } else {
        format!("{text} {directive}")
    };
    let inbound = InboundMessage {
        session_key: session_key.to_owned(),
        channel: "cli".to_owned(),
        sender_id: "bench".to_owned(),
        text,
        idempotency_key: tag.to_owned(),
        queue_mode: queue_mode.to_owned(),
        ..Default::default()
    };
    (inbound, inflight, rx)
}
