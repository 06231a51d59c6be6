//! A session's run commands enter its inbox in the order the router stored them in RUNS,
//! whichever replica pulled each. Replicas pull a session's commands independently, and one
//! that is slower to enqueue (a slow link, a connection that died with the delivery, which
//! JetStream hands out again only after `bus.ack_wait_ms`) would otherwise let a later command
//! run first. RUNS keeps a command until it is acked, and it is acked only once its inbox row
//! is on disk; so before a command is enqueued, the session's first command still in RUNS
//! (`<prefix>.run.<session>`, asked of the stream leader) must be this one or one this replica
//! has already enqueued. Otherwise the command waits for its turn, at most
//! [`CommandOrder::max_wait`]: past that the earlier command is taken as gone for good, and a
//! session that never moves is worse than one answered out of order.
//!
//! The read is skipped where this replica saw every command since the session's previous one
//! ([`crate::coverage`]): with one replica, all but a session's first command after a start.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use async_nats::jetstream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use agentloop_lifecycle::Counter;

use crate::coverage::Coverage;

/// What this replica knows about the RUNS order, and how to ask the stream for the rest.
pub(crate) struct CommandOrder {
    /// The RUNS stream; `None` when `runner.keep_order` is off.
    runs: Option<jetstream::stream::Stream<()>>,
    /// What this replica enqueued and saw, under one lock: intake, the acknowledger and the
    /// consume loop each take it once per command.
    known: Mutex<Known>,
    /// `agentloop_runner_order_reads_total`.
    reads: Counter,
    max_wait: Duration,
    progress_every: Duration,
}

#[derive(Debug, Default)]
struct Known {
    /// Per session subject: the highest RUNS sequence this replica enqueued and how many of
    /// its enqueued commands still wait for their ack. Everything up to that sequence is in
    /// the inbox; the entry goes once nothing of the session is unacked.
    unacked: HashMap<String, Unacked>,
    /// The deliveries this replica saw in stream order, for reads it may skip.
    coverage: Coverage,
}

#[derive(Debug, Clone, Copy)]
struct Unacked {
    highest: u64,
    count: usize,
}

/// Whether a command may be enqueued now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Turn {
    /// Nothing earlier of its session is still outside the inbox.
    Now,
    /// Command `earlier` of its session is still in RUNS and not in the inbox.
    After(u64),
    /// The stream did not answer (an election, a missing permission).
    Unknown,
}

/// The rule: `first` is the session's first command still in RUNS past what this replica
/// enqueued; the command at `own` goes now unless that one comes before it.
pub(crate) fn turn(own: u64, first: Option<u64>) -> Turn {
    match first {
        Some(earlier) if earlier < own => Turn::After(earlier),
        _ => Turn::Now,
    }
}

impl CommandOrder {
    /// Asks `runs` (the RUNS stream; `None`: order not kept) for the order. A command waits
    /// for an earlier one at most as long as JetStream keeps handing that one out
    /// (`ack_wait` × `max_deliver`): by then it is in an inbox or a dead letter.
    pub(crate) fn new(
        runs: Option<jetstream::stream::Stream<()>>,
        ack_wait: Duration,
        max_deliver: u32,
        reads: Counter,
    ) -> Self {
        Self {
            runs,
            known: Mutex::default(),
            reads,
            max_wait: ack_wait * max_deliver.max(2),
            progress_every: ack_wait / 3,
        }
    }

    /// Records `msg`'s arrival, in the order the consumer delivers: the session's previous
    /// command when the read may be skipped once that one is enqueued (see [`Coverage`]).
    pub(crate) fn arrived(&self, msg: &jetstream::Message) -> Option<u64> {
        let (Some(_), Ok(info)) = (&self.runs, msg.info()) else {
            return None;
        };
        lock(&self.known).coverage.arrived(
            msg.subject.as_str(),
            info.stream_sequence,
            info.delivered == 1,
        )
    }

    /// Whether `msg` may be enqueued now. `prev` is what [`CommandOrder::arrived`] said: when
    /// that command is the session's last enqueued here, no read is needed.
    pub(crate) async fn turn(&self, msg: &jetstream::Message, prev: Option<u64>) -> Turn {
        if prev.is_some_and(|prev| {
            lock(&self.known)
                .coverage
                .covers(msg.subject.as_str(), prev)
        }) {
            return Turn::Now;
        }
        self.check(msg).await
    }

    /// Whether `msg` (a RunCommand from RUNS) may be enqueued now: one read of the stream.
    async fn check(&self, msg: &jetstream::Message) -> Turn {
        let (Some(runs), Ok(info)) = (self.runs.as_ref(), msg.info()) else {
            return Turn::Now;
        };
        let subject = msg.subject.as_str();
        let after = self.highest_enqueued(subject).map_or(0, |s| s + 1);
        self.reads.inc();
        let first = runs
            .raw_message_builder()
            .next_by_subject(subject)
            .sequence(after)
            .send()
            .await;
        let first = match first {
            Ok(first) => Some(first.sequence),
            Err(err)
                if matches!(
                    err.kind(),
                    jetstream::stream::RawMessageErrorKind::NoMessageFound
                ) =>
            {
                None
            }
            Err(err) => {
                tracing::debug!(error = %err, "cannot read the session's first run command");
                return Turn::Unknown;
            }
        };
        turn(info.stream_sequence, first)
    }

    /// Once `msg`'s turn was found not yet come, checks it again until it comes, keeping it
    /// from being handed to another replica meanwhile; past the longest wait it goes anyway.
    /// `false` when `stop` came first: the command is left unacknowledged, for redelivery.
    pub(crate) async fn wait_turn(
        &self,
        msg: &jetstream::Message,
        stop: &CancellationToken,
    ) -> bool {
        let started = Instant::now();
        let mut progress_at = started + self.progress_every;
        let mut pause = Duration::from_millis(2);
        let mut unanswered_since: Option<Instant> = None;
        loop {
            // The caller has just found the command's turn not yet come.
            tokio::select! {
                () = stop.cancelled() => return false,
                () = tokio::time::sleep(pause) => {}
            }
            pause = (pause * 2).min(Duration::from_millis(100));
            let earlier = match self.check(msg).await {
                Turn::Now => return true,
                Turn::After(earlier) => {
                    unanswered_since = None;
                    earlier
                }
                Turn::Unknown => {
                    // The stream is electing a leader (its node was lost or cut off): the
                    // earlier command may still be in it, so the wait goes on, up to the
                    // longest. Going on after one ack wait let a later command overtake one
                    // still held by a cut-off runner. The permission to read is checked at
                    // start (`Bus::readable_stream`).
                    let since = *unanswered_since.get_or_insert(Instant::now());
                    if since.elapsed() >= self.progress_every * 3 {
                        tracing::warn!(
                            silent_ms = since.elapsed().as_millis() as u64,
                            "the runs stream does not answer (a leader election?); the run command keeps waiting for its turn"
                        );
                        unanswered_since = Some(Instant::now());
                    }
                    0
                }
            };
            if started.elapsed() >= self.max_wait {
                tracing::warn!(
                    earlier,
                    waited_ms = self.max_wait.as_millis() as u64,
                    "an earlier run command of the session never reached the inbox; going on without it"
                );
                return true;
            }
            if Instant::now() >= progress_at {
                // Still being worked on: JetStream must not hand it to another replica.
                let _ = msg.ack_with(jetstream::AckKind::Progress).await;
                progress_at = Instant::now() + self.progress_every;
            }
        }
    }

    /// Records that `msg`'s command is in the inbox, its ack to follow.
    pub(crate) fn enqueued(&self, msg: &jetstream::Message) {
        let (Some(_), Ok(info)) = (&self.runs, msg.info()) else {
            return;
        };
        let mut known = lock(&self.known);
        let subject = msg.subject.as_str();
        let seq = info.stream_sequence;
        match known.unacked.get_mut(subject) {
            Some(entry) => {
                entry.highest = entry.highest.max(seq);
                entry.count += 1;
            }
            None => {
                let first = Unacked {
                    highest: seq,
                    count: 1,
                };
                known.unacked.insert(subject.to_owned(), first);
            }
        }
        known.coverage.enqueued(subject, seq);
    }

    /// Records that `msg`'s command was acked or left for redelivery.
    pub(crate) fn settled(&self, msg: &jetstream::Message) {
        if self.runs.is_none() {
            return;
        }
        let unacked = &mut lock(&self.known).unacked;
        if let Some(entry) = unacked.get_mut(msg.subject.as_str()) {
            entry.count = entry.count.saturating_sub(1);
            if entry.count == 0 {
                unacked.remove(msg.subject.as_str());
            }
        }
    }

    fn highest_enqueued(&self, subject: &str) -> Option<u64> {
        lock(&self.known).unacked.get(subject).map(|e| e.highest)
    }
}

/// Locks `mutex`, also after a panic elsewhere: each holder leaves the map consistent. (Not
/// `replica::lock`: the replica holds this module's type, and modules import no cycle.)
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_waits_only_for_an_earlier_one_outside_the_inbox() {
        assert_eq!(turn(10, None), Turn::Now);
        assert_eq!(turn(10, Some(10)), Turn::Now);
        assert_eq!(turn(10, Some(12)), Turn::Now);
        assert_eq!(turn(10, Some(7)), Turn::After(7));
    }
}
