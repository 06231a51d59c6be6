//! Keeps a key's messages in their stream order ([`crate::order`]): reads the messages in a gap
//! of the consumer's deliveries, and holds a later message of their keys until each is
//! settled, here or elsewhere. The router keeps a session's inbound messages so, delivery its
//! replies.

use std::ops::Range;
use std::sync::Mutex;
use std::time::Duration;

use async_nats::jetstream::{self, message::StreamMessage};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use agentloop_lifecycle::Counter;

use crate::order::{Arrival, StreamOrder};
use crate::{Bus, BusError, StreamKind};

/// Most messages read for one gap: a gap is the messages other replicas (or a dead connection)
/// hold, at most their unacked ones.
const MAX_GAP_READS: usize = 10_000;
/// How often the messages known to be elsewhere are checked against the stream's start.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// The key a message read from the stream is ordered under (`None`: it cannot be read and
/// is dead-lettered when it comes).
pub type KeyOf = Box<dyn Fn(&StreamMessage) -> Option<String> + Send + Sync>;

/// A key's messages in their stream order, or nothing when the service's `keep_order` is off.
pub struct InTurn {
    /// The stream; `None`: order not kept.
    stream: Option<jetstream::stream::Stream<()>>,
    /// Every subject of the stream.
    all: String,
    key_of: KeyOf,
    order: Mutex<StreamOrder>,
    /// Told whenever a message is settled, for the messages waiting behind it.
    settled: Notify,
    /// Reads of the stream for messages that went elsewhere.
    reads: Counter,
    max_wait: Duration,
    progress_every: Duration,
    swept_at: Mutex<Instant>,
}

impl Bus {
    /// The order of the messages of the stream of `kind` (`keep`: kept at all), keyed by
    /// `key_of`, its reads counted in `reads`. Off, with a warning, when this connection may
    /// not read the stream: every message after a gap would wait for an answer that never
    /// comes.
    ///
    /// # Errors
    /// [`BusError::Admin`] when the stream cannot be opened.
    pub async fn in_turn(
        &self,
        kind: StreamKind,
        keep: bool,
        reads: Counter,
        key_of: KeyOf,
    ) -> Result<InTurn, BusError> {
        let config = &self.config;
        let subjects = self.subjects.stream_subjects(kind);
        let stream = if keep {
            let name = crate::stream_name(&config.prefix, kind);
            let stream = self.js.get_stream_no_info(&name).await;
            let stream = stream.map_err(|err| BusError::Admin {
                what: format!("open the stream {name}"),
                source: Box::new(err),
            })?;
            let patience = Duration::from_millis(config.ack_wait_ms.saturating_mul(2));
            let probe = subjects.replace('>', "_order_probe");
            if crate::stream_readable(&stream, &probe, patience).await {
                Some(stream)
            } else {
                tracing::warn!(
                    stream = %name,
                    "keep_order is off: this connection cannot read the stream (does its NATS \
                     user have $JS.API.STREAM.MSG.GET on it?); a session's messages pulled \
                     through a lost connection or by another replica may go after later ones"
                );
                None
            }
        } else {
            None
        };
        let ack_wait = Duration::from_millis(config.ack_wait_ms);
        let max_wait = ack_wait * u32::try_from(config.max_deliver).unwrap_or(u32::MAX).max(2);
        Ok(InTurn {
            stream,
            all: subjects,
            key_of,
            order: Mutex::new(StreamOrder::new(max_wait)),
            settled: Notify::new(),
            reads,
            max_wait,
            progress_every: ack_wait / 3,
            swept_at: Mutex::new(Instant::now()),
        })
    }
}

impl InTurn {
    /// Records `msg`'s arrival (in the order the consumer delivers), reading the stream for
    /// the messages of any gap before it, and says where it goes.
    pub async fn arrived(&self, msg: &jetstream::Message, key: &str) -> Arrival {
        let (Some(stream), Ok(info)) = (&self.stream, msg.info()) else {
            return Arrival::Lane;
        };
        let seq = info.stream_sequence;
        let gap = lock(&self.order).gap(seq, info.delivered == 1);
        if let Some(gap) = gap {
            self.read_gap(stream, gap).await;
        }
        self.sweep(stream).await;
        lock(&self.order).arrived(key, seq)
    }

    /// Reads the messages in `gap` still in the stream and records their keys. A stream that
    /// does not answer (an election) is asked again for up to one progress interval; past that
    /// the rest of the gap is not waited for.
    async fn read_gap(&self, stream: &jetstream::stream::Stream<()>, gap: Range<u64>) {
        let mut from = gap.start;
        let mut pause = Duration::from_millis(10);
        let give_up_at = Instant::now() + self.progress_every;
        for _ in 0..MAX_GAP_READS {
            self.reads.inc();
            let read = stream
                .raw_message_builder()
                .next_by_subject(self.all.clone())
                .sequence(from)
                .send()
                .await;
            match read {
                Ok(message) if message.sequence < gap.end => {
                    if let Some(key) = (self.key_of)(&message) {
                        lock(&self.order).away(&key, message.sequence, std::time::Instant::now());
                    }
                    from = message.sequence + 1;
                }
                Ok(_) => return,
                Err(err)
                    if matches!(
                        err.kind(),
                        jetstream::stream::RawMessageErrorKind::NoMessageFound
                    ) =>
                {
                    return;
                }
                Err(err) if Instant::now() >= give_up_at => {
                    tracing::warn!(error = %err, from, until = gap.end, "cannot read the messages that went elsewhere; their sessions' later messages are not held for them");
                    return;
                }
                Err(_) => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
            }
        }
        tracing::warn!(
            until = gap.end,
            "more messages elsewhere than are read for one gap"
        );
    }

    /// Now and then, while messages are known to be elsewhere, forgets those gone from the
    /// stream's start (settled by another replica, long ago).
    async fn sweep(&self, stream: &jetstream::stream::Stream<()>) {
        {
            let mut swept_at = lock(&self.swept_at);
            if swept_at.elapsed() < SWEEP_EVERY || !lock(&self.order).any_away() {
                return;
            }
            *swept_at = Instant::now();
        }
        let first = stream
            .get_info()
            .await
            .map(|info| info.state.first_sequence);
        if let Ok(first) = first {
            lock(&self.order).sweep(first, std::time::Instant::now());
        }
    }

    /// Holds `msg` of `key` until every earlier message of its key is settled, looking up
    /// those elsewhere, and keeps it from being handed out again meanwhile; past the longest
    /// wait it goes anyway. `false` when `stop` came first: it is left unacknowledged, for
    /// redelivery.
    pub async fn wait_turn(
        &self,
        msg: &jetstream::Message,
        key: &str,
        stop: &CancellationToken,
    ) -> bool {
        let (Some(stream), Ok(info)) = (&self.stream, msg.info()) else {
            return true;
        };
        let seq = info.stream_sequence;
        let started = Instant::now();
        let mut progress_at = started + self.progress_every;
        let mut look_at = started;
        let mut pause = Duration::from_millis(2);
        loop {
            let settled = self.settled.notified();
            let away = match lock(&self.order).turn(key, seq, std::time::Instant::now()) {
                Ok(()) => return true,
                Err(away) => away,
            };
            if Instant::now() >= look_at {
                for earlier in away {
                    self.reads.inc();
                    let gone = matches!(
                        stream.get_raw_message(earlier).await,
                        Err(err) if matches!(err.kind(), jetstream::stream::RawMessageErrorKind::NoMessageFound)
                    );
                    if gone {
                        self.settle(key, earlier);
                    }
                }
                look_at = Instant::now() + pause;
                pause = (pause * 2).min(Duration::from_millis(100));
                continue;
            }
            if started.elapsed() >= self.max_wait {
                tracing::warn!(
                    waited_ms = self.max_wait.as_millis() as u64,
                    "an earlier message of the session was never settled; going on without it"
                );
                return true;
            }
            if Instant::now() >= progress_at {
                // Still being worked on: JetStream must not hand it to another replica.
                let _ = msg.ack_with(jetstream::AckKind::Progress).await;
                progress_at = Instant::now() + self.progress_every;
            }
            tokio::select! {
                () = stop.cancelled() => return false,
                () = settled => {}
                () = tokio::time::sleep_until(look_at) => {}
            }
        }
    }

    /// `msg` of `key` is settled (acked or dead-lettered): later ones may go.
    pub fn settled(&self, msg: &jetstream::Message, key: &str) {
        if let (Some(_), Ok(info)) = (&self.stream, msg.info()) {
            self.settle(key, info.stream_sequence);
        }
    }

    /// `msg` of `key` went back to the stream: later ones wait for it.
    pub fn handed_back(&self, msg: &jetstream::Message, key: &str) {
        if let (Some(_), Ok(info)) = (&self.stream, msg.info()) {
            lock(&self.order).handed_back(key, info.stream_sequence, std::time::Instant::now());
        }
    }

    fn settle(&self, key: &str, seq: u64) {
        lock(&self.order).done(key, seq);
        self.settled.notify_waiters();
    }
}

/// Locks `mutex`, also after a panic elsewhere: each holder leaves it consistent.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
