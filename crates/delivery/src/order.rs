//! The rule that keeps a session's replies in the order the runner stored them in OUTBOUND.
//!
//! OUTBOUND has one consumer, and its first deliveries go out in stream order. A replica that
//! sees consecutive stream sequences knows every reply since the last one it saw is in its
//! hands, in its sessions' lanes. A gap means replies went elsewhere: to another replica, or
//! into a connection that died on the way (JetStream hands those out again only after
//! `bus.ack_wait_ms`, while later replies of the same session flow on the new connection).
//! The replies in a gap are read from the stream to learn their sessions, and a later reply
//! of such a session waits until the earlier one is gone from the stream (delivered, by
//! anyone) or has come here.
//!
//! Nothing here does I/O: `in_turn.rs` reads the stream and waits.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::time::{Duration, Instant};

/// Most replies known to be elsewhere; past it they are forgotten (and their sessions' later
/// replies go without waiting for them), so a flood of other replicas' replies cannot grow
/// this without bound.
const MAX_AWAY: usize = 100_000;

/// Where a reply still in OUTBOUND is, as this replica knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// In this replica's lane for its session: it goes before anything queued behind it.
    Lane,
    /// Here, out of the lane, waiting for an earlier reply of its session.
    Waiting,
    /// Not here (another replica has it, it was lost with a connection, or it was handed
    /// back), known since the instant.
    Away(Instant),
}

/// What to do with a reply that arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arrival {
    /// Into its session's lane: nothing earlier of the session is anywhere but ahead of it
    /// there.
    Lane,
    /// Out of the lane until [`ReplyOrder::turn`] says so.
    Wait,
    /// Another copy of a reply this replica is handling (a redelivery): the copy in hand is
    /// acked, this one is left alone.
    Duplicate,
}

/// What this replica knows of the replies still in OUTBOUND, per session.
#[derive(Debug)]
pub(crate) struct ReplyOrder {
    /// The stream sequence an unbroken run of first deliveries continues with.
    next: Option<u64>,
    /// Per session: its replies known to be still in the stream, by sequence.
    sessions: HashMap<String, BTreeMap<u64, Place>>,
    /// How many entries are [`Place::Away`].
    away: usize,
    /// How long a reply elsewhere is waited for: by then JetStream has delivered it or given
    /// it up (`bus.ack_wait_ms` × `bus.max_deliver`).
    max_wait: Duration,
}

impl ReplyOrder {
    /// An order that waits for a reply elsewhere at most `max_wait`.
    pub(crate) fn new(max_wait: Duration) -> Self {
        Self {
            next: None,
            sessions: HashMap::new(),
            away: 0,
            max_wait,
        }
    }

    /// Records a delivery at `seq` (`first`: its first delivery) and returns the sequences
    /// skipped since the previous first delivery, whose replies went elsewhere and are to be
    /// read ([`ReplyOrder::away`]). After a start that is everything before `seq`.
    pub(crate) fn gap(&mut self, seq: u64, first: bool) -> Option<Range<u64>> {
        if !first {
            return None;
        }
        let from = self.next.unwrap_or(1);
        self.next = Some(from.max(seq + 1));
        (seq > from).then_some(from..seq)
    }

    /// Records that the reply at `seq` of `session` is in the stream but not here.
    pub(crate) fn away(&mut self, session: &str, seq: u64, now: Instant) {
        if self.away >= MAX_AWAY {
            tracing::warn!(
                forgotten = self.away,
                "too many replies elsewhere to keep their sessions' order; forgetting them"
            );
            self.forget_away(|_| true);
        }
        let replies = self.sessions.entry(session.to_owned()).or_default();
        if let std::collections::btree_map::Entry::Vacant(entry) = replies.entry(seq) {
            entry.insert(Place::Away(now));
            self.away += 1;
        }
    }

    /// The reply at `seq` of `session` arrived here: where it goes.
    pub(crate) fn arrived(&mut self, session: &str, seq: u64) -> Arrival {
        let replies = self.sessions.entry(session.to_owned()).or_default();
        let was = replies.get(&seq).copied();
        if matches!(was, Some(Place::Lane | Place::Waiting)) {
            return Arrival::Duplicate;
        }
        if matches!(was, Some(Place::Away(_))) {
            self.away -= 1;
        }
        let clear = replies.range(..seq).all(|(_, place)| *place == Place::Lane);
        let (place, arrival) = if clear {
            (Place::Lane, Arrival::Lane)
        } else {
            (Place::Waiting, Arrival::Wait)
        };
        replies.insert(seq, place);
        arrival
    }

    /// Whether the waiting reply at `seq` of `session` may go: nothing earlier of its session
    /// is left. Otherwise the earlier replies that are elsewhere, to look up whether they are
    /// gone from the stream. A reply elsewhere longer than the longest wait no longer counts.
    pub(crate) fn turn(&mut self, session: &str, seq: u64, now: Instant) -> Result<(), Vec<u64>> {
        let Some(replies) = self.sessions.get_mut(session) else {
            return Ok(());
        };
        let max_wait = self.max_wait;
        let before = replies.len();
        replies.retain(|s, place| {
            *s >= seq || !matches!(place, Place::Away(at) if now.duration_since(*at) >= max_wait)
        });
        self.away -= before - replies.len();
        let mut earlier = replies.range(..seq).peekable();
        if earlier.peek().is_none() {
            return Ok(());
        }
        Err(earlier
            .filter(|(_, place)| matches!(place, Place::Away(_)))
            .map(|(s, _)| *s)
            .collect())
    }

    /// The reply at `seq` of `session` is settled: delivered or dead-lettered here, or found
    /// gone from the stream.
    pub(crate) fn done(&mut self, session: &str, seq: u64) {
        let Some(replies) = self.sessions.get_mut(session) else {
            return;
        };
        if let Some(Place::Away(_)) = replies.remove(&seq) {
            self.away -= 1;
        }
        if replies.is_empty() {
            self.sessions.remove(session);
        }
    }

    /// The reply at `seq` of `session` went back to the stream (its delivery kept failing):
    /// the session's later replies wait until it comes again.
    pub(crate) fn handed_back(&mut self, session: &str, seq: u64, now: Instant) {
        self.done(session, seq);
        self.away(session, seq, now);
    }

    /// Forgets the replies elsewhere that are older than the stream's first message (gone
    /// from it) or than the longest wait.
    pub(crate) fn sweep(&mut self, first_in_stream: u64, now: Instant) {
        let max_wait = self.max_wait;
        self.forget_away(|(seq, at)| seq < first_in_stream || now.duration_since(at) >= max_wait);
    }

    /// Whether any reply is known to be elsewhere (a sweep has something to do).
    pub(crate) fn any_away(&self) -> bool {
        self.away > 0
    }

    fn forget_away(&mut self, forget: impl Fn((u64, Instant)) -> bool) {
        let mut forgotten = 0;
        self.sessions.retain(|_, replies| {
            replies.retain(|seq, place| match place {
                Place::Away(at) if forget((*seq, *at)) => {
                    forgotten += 1;
                    false
                }
                _ => true,
            });
            !replies.is_empty()
        });
        self.away -= forgotten;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAIT: Duration = Duration::from_secs(300);

    #[test]
    fn consecutive_first_deliveries_leave_no_gap_and_a_start_reads_what_came_before() {
        let mut order = ReplyOrder::new(WAIT);
        assert_eq!(order.gap(5, true), Some(1..5), "after a start");
        assert_eq!(order.gap(6, true), None);
        assert_eq!(order.gap(3, false), None, "a redelivery is no gap");
        assert_eq!(order.gap(9, true), Some(7..9));
        assert_eq!(order.gap(10, true), None);
    }

    #[test]
    fn a_reply_after_one_lost_with_a_connection_waits_until_that_one_is_delivered() {
        let now = Instant::now();
        let mut order = ReplyOrder::new(WAIT);
        // 4 and 5 were pulled through a connection that died; 6 came on the new one.
        order.away("s", 4, now);
        order.away("t", 5, now);
        assert_eq!(order.arrived("s", 6), Arrival::Wait);
        assert_eq!(order.turn("s", 6, now), Err(vec![4]));
        assert_eq!(order.arrived("t", 7), Arrival::Wait);
        // 4 comes again, here: first in its session, into the lane.
        assert_eq!(order.arrived("s", 4), Arrival::Lane);
        assert_eq!(order.turn("s", 6, now), Err(vec![]), "4 is in the lane");
        order.done("s", 4);
        assert_eq!(order.turn("s", 6, now), Ok(()));
        // 5 was delivered by another replica: found gone from the stream.
        order.done("t", 5);
        assert_eq!(order.turn("t", 7, now), Ok(()));
        assert!(!order.any_away());
    }

    #[test]
    fn replies_behind_one_in_the_lane_follow_it_there_and_behind_a_waiting_one_wait() {
        let now = Instant::now();
        let mut order = ReplyOrder::new(WAIT);
        assert_eq!(order.arrived("s", 1), Arrival::Lane);
        assert_eq!(order.arrived("s", 2), Arrival::Lane);
        order.away("s", 3, now);
        assert_eq!(order.arrived("s", 4), Arrival::Wait);
        assert_eq!(order.arrived("s", 5), Arrival::Wait, "behind a waiting one");
        order.done("s", 1);
        order.done("s", 2);
        order.done("s", 3);
        assert_eq!(order.turn("s", 5, now), Err(vec![]), "4 goes first");
        assert_eq!(order.turn("s", 4, now), Ok(()));
        order.done("s", 4);
        assert_eq!(order.turn("s", 5, now), Ok(()));
    }

    #[test]
    fn a_second_copy_of_a_reply_in_hand_is_a_duplicate() {
        let mut order = ReplyOrder::new(WAIT);
        assert_eq!(order.arrived("s", 1), Arrival::Lane);
        assert_eq!(order.arrived("s", 1), Arrival::Duplicate);
        order.done("s", 1);
        assert_eq!(order.arrived("s", 1), Arrival::Lane, "settled: a new copy");
    }

    #[test]
    fn a_reply_handed_back_holds_the_sessions_later_ones() {
        let now = Instant::now();
        let mut order = ReplyOrder::new(WAIT);
        assert_eq!(order.arrived("s", 1), Arrival::Lane);
        order.handed_back("s", 1, now);
        assert_eq!(order.arrived("s", 2), Arrival::Wait);
        assert_eq!(order.turn("s", 2, now), Err(vec![1]));
    }

    #[test]
    fn a_reply_elsewhere_past_the_longest_wait_or_the_streams_start_is_forgotten() {
        let now = Instant::now();
        let mut order = ReplyOrder::new(WAIT);
        order.away("s", 1, now);
        order.away("t", 2, now);
        order.away("u", 9, now);
        assert_eq!(order.arrived("s", 3), Arrival::Wait);
        assert_eq!(order.turn("s", 3, now + WAIT), Ok(()));
        order.sweep(5, now);
        assert_eq!(order.arrived("t", 6), Arrival::Lane, "2 left the stream");
        assert!(order.any_away(), "9 is still there");
        order.sweep(5, now + WAIT);
        assert!(!order.any_away());
    }
}
