//! Keeps a key's messages in their stream order ([`crate::order`]): reads the messages in a gap
//! of the consumer's deliveries, and holds a later message of their keys until each is
//! settled, here or elsewhere. The router keeps a session's inbound messages so, delivery its
//! replies.

use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, message::StreamMessage};
use futures::StreamExt as _;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use agentloop_lifecycle::Counter;

use crate::order::{Arrival, StreamOrder};
use crate::{Bus, BusError, StreamKind};

/// Most messages read for one gap: a gap is the messages other replicas (or a dead connection)
/// hold, at most their unacked ones.
const MAX_GAP_READS: usize = 10_000;
/// Largest gap read one sequence at a time; a larger one is scanned.
const ONE_BY_ONE: u64 = 256;
/// Reads of one gap in flight at once.
const READS_AT_ONCE: usize = 32;
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
    order: Arc<Mutex<StreamOrder>>,
    /// Told whenever a message is settled, for the messages waiting behind it.
    settled: Notify,
    /// Reads of the stream for messages that went elsewhere.
    reads: Counter,
    max_wait: Duration,
    progress_every: Duration,
    swept_at: Mutex<Instant>,
}

impl Bus {
    /// The order of the messages of the stream of `kind`, kept when the service's `setting`
    /// (`keep`) says so, keyed by `key_of`, its reads counted in `reads`. Off, with a warning,
    /// when this connection may not read the stream ([`Bus::readable_stream`]).
    ///
    /// # Errors
    /// [`BusError::Admin`] when the stream cannot be opened.
    pub async fn in_turn(
        &self,
        kind: StreamKind,
        (setting, keep): (&str, bool),
        reads: Counter,
        key_of: KeyOf,
    ) -> Result<InTurn, BusError> {
        let config = &self.config;
        let stream = self.readable_stream(kind, keep, setting).await?;
        let ack_wait = Duration::from_millis(config.ack_wait_ms);
        let max_wait = ack_wait * u32::try_from(config.max_deliver).unwrap_or(u32::MAX).max(2);
        Ok(InTurn {
            stream,
            all: self.subjects.stream_subjects(kind),
            key_of,
            order: Arc::new(Mutex::new(StreamOrder::new(max_wait))),
            settled: Notify::new(),
            reads,
            max_wait,
            progress_every: config.progress_every(),
            swept_at: Mutex::new(Instant::now()),
        })
    }
}

impl InTurn {
    /// Notes the delivery of `msg` (in the order the consumer delivers): its stream sequence,
    /// and the sequences skipped since the previous one, whose messages went elsewhere and are
    /// to be read ([`InTurn::read_gap`]). `None` when the order is not kept.
    pub(crate) fn note(&self, msg: &jetstream::Message) -> Option<(u64, Option<Range<u64>>)> {
        let (Some(stream), Ok(info)) = (&self.stream, msg.info()) else {
            return None;
        };
        let seq = info.stream_sequence;
        let gap = lock(&self.order).gap(seq);
        self.sweep(stream);
        Some((seq, gap))
    }

    /// Where the message at `seq` of `key` goes, once every gap noted before it is read.
    pub(crate) fn place(&self, key: &str, seq: u64) -> Arrival {
        lock(&self.order).arrived(key, seq)
    }

    /// Reads the messages in `gap` still in the stream and records their keys: one by one,
    /// several at once, for a gap of the usual size (what other replicas took since this one's
    /// last delivery); by a scan that skips settled ones for a larger gap (after a start). The
    /// messages already delivered to this replica wait meanwhile, so after a third of the ack
    /// wait (an election answers nothing for seconds) the reading goes on in the background and
    /// this returns: every later message then waits out of its lane, with progress acks, until
    /// the gap is read or the longest wait has passed, since any of them may be of a key whose
    /// earlier message is in the gap.
    pub(crate) async fn read_gap(self: Arc<Self>, gap: Range<u64>) {
        if self.stream.is_none() {
            return;
        }
        let mut reading = Box::pin(self.clone().read_all(gap.clone()));
        if tokio::time::timeout(self.progress_every, &mut reading)
            .await
            .is_ok()
        {
            return;
        }
        lock(&self.order).unread(gap.clone(), std::time::Instant::now());
        tracing::warn!(
            from = gap.start,
            until = gap.end,
            "cannot read in time the messages that went elsewhere (the stream does not answer); \
             later messages wait until they are read"
        );
        tokio::spawn(async move {
            let started = Instant::now();
            if tokio::time::timeout(self.max_wait, reading).await.is_ok() {
                tracing::info!(
                    from = gap.start,
                    until = gap.end,
                    read_ms = started.elapsed().as_millis() as u64,
                    "read the messages that went elsewhere at last; later messages go on"
                );
            } else {
                tracing::warn!(
                    from = gap.start,
                    until = gap.end,
                    "never read the messages that went elsewhere; later messages are no longer \
                     held for them"
                );
            }
            lock(&self.order).read(&gap);
            self.settled.notify_waiters();
        });
    }

    /// Reads every message of `gap` still in the stream, recording each one's key.
    async fn read_all(self: Arc<Self>, gap: Range<u64>) {
        let this: &Self = &self;
        let Some(stream) = &this.stream else {
            return;
        };
        if gap.end - gap.start <= ONE_BY_ONE {
            futures::stream::iter(gap)
                .map(|seq| this.read_at(stream, seq))
                .buffer_unordered(READS_AT_ONCE)
                .for_each(|found| async move {
                    if let Some(message) = found {
                        this.record_away(&message);
                    }
                })
                .await;
        } else {
            this.scan(stream, gap).await;
        }
    }

    /// Reads the message at `seq`, `None` once it is settled.
    async fn read_at(
        &self,
        stream: &jetstream::stream::Stream<()>,
        seq: u64,
    ) -> Option<StreamMessage> {
        let found = self.until_answered(|| stream.get_raw_message(seq)).await;
        if found.is_none() {
            tracing::debug!(seq, "not in the stream: settled");
        }
        found
    }

    /// Reads the messages of `gap` in order, each read skipping the settled ones before it.
    async fn scan(&self, stream: &jetstream::stream::Stream<()>, gap: Range<u64>) {
        let mut from = gap.start;
        for _ in 0..MAX_GAP_READS {
            let next = self.until_answered(|| {
                stream
                    .raw_message_builder()
                    .next_by_subject(self.all.clone())
                    .sequence(from)
                    .send()
            });
            match next.await {
                Some(message) if message.sequence < gap.end => {
                    self.record_away(&message);
                    from = message.sequence + 1;
                }
                _ => return,
            }
        }
        tracing::warn!(
            until = gap.end,
            "more messages elsewhere than are read for one gap"
        );
    }

    /// Asks `read` until the stream answers, `None` when it has no such message. An election
    /// goes unanswered for seconds; the caller's deadline bounds the asking.
    async fn until_answered<F, Fut>(&self, mut read: F) -> Option<StreamMessage>
    where
        F: FnMut() -> Fut,
        Fut:
            std::future::Future<Output = Result<StreamMessage, jetstream::stream::RawMessageError>>,
    {
        let mut pause = Duration::from_millis(10);
        loop {
            self.reads.inc();
            match read().await {
                Ok(message) => return Some(message),
                Err(err) if not_found(&err) => return None,
                Err(_) => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
            }
        }
    }

    fn record_away(&self, message: &StreamMessage) {
        if let Some(key) = (self.key_of)(message) {
            tracing::debug!(key = %key, seq = message.sequence, "elsewhere");
            lock(&self.order).away(&key, message.sequence, std::time::Instant::now());
        } else {
            tracing::debug!(seq = message.sequence, "elsewhere, key unknown");
        }
    }

    /// Now and then, while messages are known to be elsewhere, forgets those gone from the
    /// stream's start (settled by another replica, long ago). Off the consume loop: the
    /// messages delivered to this replica must not wait on it.
    fn sweep(&self, stream: &jetstream::stream::Stream<()>) {
        {
            let mut swept_at = lock(&self.swept_at);
            if swept_at.elapsed() < SWEEP_EVERY || !lock(&self.order).any_away() {
                return;
            }
            *swept_at = Instant::now();
        }
        let (stream, order) = (stream.clone(), self.order.clone());
        tokio::spawn(async move {
            if let Ok(info) = stream.get_info().await {
                lock(&order).sweep(info.state.first_sequence, std::time::Instant::now());
            }
        });
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
            let look_up = match lock(&self.order).turn(key, seq, std::time::Instant::now()) {
                Ok(()) => return true,
                Err(look_up) => look_up,
            };
            if Instant::now() >= look_at {
                if let Some(earlier) = look_up {
                    self.reads.inc();
                    let gone = matches!(stream.get_raw_message(earlier).await, Err(err) if not_found(&err));
                    tracing::debug!(key = %key, seq, earlier, gone, "looked up an earlier message");
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

    /// Whether `msg` of `key`, next in its key's lane, may go now. `false` when an earlier
    /// message of its key left the lane meanwhile (handed back after its delivery kept
    /// failing): it is then to wait out of the lane ([`InTurn::wait_turn`]), for the earlier
    /// one comes back into that lane behind it.
    pub fn still_first(&self, msg: &jetstream::Message, key: &str) -> bool {
        match (&self.stream, msg.info()) {
            (Some(_), Ok(info)) => lock(&self.order).still_first(key, info.stream_sequence),
            _ => true,
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
            tracing::debug!(key = %key, seq = info.stream_sequence, "handed back");
            lock(&self.order).handed_back(key, info.stream_sequence, std::time::Instant::now());
        }
    }

    fn settle(&self, key: &str, seq: u64) {
        tracing::debug!(key = %key, seq, "settled");
        lock(&self.order).done(key, seq);
        self.settled.notify_waiters();
    }
}

/// Whether the stream said it has no such message (settled, or never stored).
fn not_found(err: &jetstream::stream::RawMessageError) -> bool {
    matches!(
        err.kind(),
        jetstream::stream::RawMessageErrorKind::NoMessageFound
    )
}

/// Locks `mutex`, also after a panic elsewhere: each holder leaves it consistent.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
