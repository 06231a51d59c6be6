//! Keeps a session's replies in their OUTBOUND order ([`crate::order`]): reads the replies in
//! a gap of the consumer's deliveries, and holds a later reply of their sessions until each is
//! delivered, here or elsewhere.

use std::ops::Range;
use std::sync::Mutex;
use std::time::Duration;

use async_nats::jetstream;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use agentloop_lifecycle::Counter;
use agentloop_proto::v1::OutboundMessage;

use crate::order::{Arrival, ReplyOrder};

/// Most replies read for one gap: a gap is the replies other replicas (or a dead connection)
/// hold, at most their unacked ones.
const MAX_GAP_READS: usize = 10_000;
/// How often the replies known to be elsewhere are checked against the stream's start.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// A session's replies in their stream order, or nothing when `delivery.keep_order` is off.
pub(crate) struct InTurn {
    /// OUTBOUND; `None`: order not kept.
    stream: Option<jetstream::stream::Stream<()>>,
    /// `<prefix>.outbound.>`: every reply, whatever its channel.
    all: String,
    order: Mutex<ReplyOrder>,
    /// Told whenever a reply is settled, for the replies waiting behind it.
    settled: Notify,
    /// `agentloop_delivery_order_reads_total`.
    reads: Counter,
    max_wait: Duration,
    progress_every: Duration,
    swept_at: Mutex<Instant>,
}

/// The session a reply's order is kept in (its lane key).
pub(crate) fn session_of(outbound: &OutboundMessage) -> &str {
    if outbound.session_id.is_empty() {
        &outbound.session_key
    } else {
        &outbound.session_id
    }
}

impl InTurn {
    /// Keeps the order of the replies in `stream` (`None`: not kept), of subjects under
    /// `prefix`. A reply waits for an earlier one at most as long as JetStream keeps handing
    /// that one out (`ack_wait` × `max_deliver`).
    pub(crate) fn new(
        stream: Option<jetstream::stream::Stream<()>>,
        prefix: &str,
        ack_wait: Duration,
        max_deliver: u32,
        reads: Counter,
    ) -> Self {
        let max_wait = ack_wait * max_deliver.max(2);
        Self {
            stream,
            all: format!("{prefix}.outbound.>"),
            order: Mutex::new(ReplyOrder::new(max_wait)),
            settled: Notify::new(),
            reads,
            max_wait,
            progress_every: ack_wait / 3,
            swept_at: Mutex::new(Instant::now()),
        }
    }

    /// Records `msg`'s arrival (in the order the consumer delivers), reading the stream for
    /// the replies of any gap before it, and says where it goes.
    pub(crate) async fn arrived(&self, msg: &jetstream::Message, session: &str) -> Arrival {
        let (Some(stream), Ok(info)) = (&self.stream, msg.info()) else {
            return Arrival::Lane;
        };
        let seq = info.stream_sequence;
        let gap = lock(&self.order).gap(seq, info.delivered == 1);
        if let Some(gap) = gap {
            self.read_gap(stream, gap).await;
        }
        self.sweep(stream).await;
        lock(&self.order).arrived(session, seq)
    }

    /// Reads the replies in `gap` still in the stream and records their sessions. A stream
    /// that does not answer (an election) is asked again for up to one progress interval;
    /// past that the rest of the gap is not waited for.
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
                Ok(reply) if reply.sequence < gap.end => {
                    let content_type = reply
                        .headers
                        .get("Content-Type")
                        .map(async_nats::HeaderValue::as_str);
                    // One that cannot be decoded is dead-lettered when it comes; no order.
                    if let Ok((outbound, _)) =
                        agentloop_proto::decode::<OutboundMessage>(content_type, &reply.payload)
                    {
                        lock(&self.order).away(
                            session_of(&outbound),
                            reply.sequence,
                            std::time::Instant::now(),
                        );
                    }
                    from = reply.sequence + 1;
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
                    tracing::warn!(error = %err, from, until = gap.end, "cannot read the replies that went elsewhere; their sessions' later replies are not held for them");
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
            "more replies elsewhere than are read for one gap"
        );
    }

    /// Now and then, while replies are known to be elsewhere, forgets those gone from the
    /// stream's start (delivered by another replica, long ago).
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

    /// Holds the reply `msg` of `session` until every earlier one of its session is settled,
    /// looking up those elsewhere, and keeps it from being handed out again meanwhile; past
    /// the longest wait it goes anyway. `false` when `stop` came first: it is left
    /// unacknowledged, for redelivery.
    pub(crate) async fn wait_turn(
        &self,
        msg: &jetstream::Message,
        session: &str,
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
            let away = match lock(&self.order).turn(session, seq, std::time::Instant::now()) {
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
                        self.settle(session, earlier);
                    }
                }
                look_at = Instant::now() + pause;
                pause = (pause * 2).min(Duration::from_millis(100));
                continue;
            }
            if started.elapsed() >= self.max_wait {
                tracing::warn!(
                    waited_ms = self.max_wait.as_millis() as u64,
                    "an earlier reply of the session was never delivered; going on without it"
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

    /// The reply at `msg` of `session` is delivered or dead-lettered: later ones may go.
    pub(crate) fn delivered(&self, msg: &jetstream::Message, session: &str) {
        if let (Some(_), Ok(info)) = (&self.stream, msg.info()) {
            self.settle(session, info.stream_sequence);
        }
    }

    /// The reply at `msg` of `session` went back to the stream: later ones wait for it.
    pub(crate) fn handed_back(&self, msg: &jetstream::Message, session: &str) {
        if let (Some(_), Ok(info)) = (&self.stream, msg.info()) {
            lock(&self.order).handed_back(session, info.stream_sequence, std::time::Instant::now());
        }
    }

    fn settle(&self, session: &str, seq: u64) {
        lock(&self.order).done(session, seq);
        self.settled.notify_waiters();
    }
}

/// Locks `mutex`, also after a panic elsewhere: each holder leaves it consistent.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
