//! The rule that keeps a key's messages (a session's) in their order in a work-queue stream,
//! whichever replica or connection each was handed to.
//!
//! The stream has one consumer, and its first deliveries go out in stream order. A replica
//! that sees consecutive stream sequences knows every message since the last one it saw is in
//! its hands, in its keys' lanes. A gap means messages went elsewhere: to another replica, or
//! into a connection that died on the way (JetStream hands those out again only after
//! `bus.ack_wait_ms`, while later messages of the same key flow on the new connection). The
//! messages in a gap are read from the stream to learn their keys, and a later message of such
//! a key waits until the earlier one is gone from the stream (settled, by anyone) or has come
//! here.
//!
//! Nothing here does I/O: `in_turn.rs` reads the stream and waits.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::time::{Duration, Instant};

/// Most messages known to be elsewhere; past it they are forgotten (and their keys' later
/// messages go without waiting for them), so a flood of other replicas' messages cannot grow
/// this without bound.
const MAX_AWAY: usize = 100_000;

/// Where a message still in the stream is, as this replica knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// In this replica's lane for its key: it goes before anything queued behind it.
    Lane,
    /// Here, out of the lane, waiting for an earlier message of its key.
    Waiting,
    /// Not here (another replica has it, it was lost with a connection, or it was handed
    /// back), known since the instant.
    Away(Instant),
}

/// What to do with a message that arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// Into its key's lane: nothing earlier of the key is anywhere but ahead of it
    /// there.
    Lane,
    /// Out of the lane until [`StreamOrder::turn`] says so.
    Wait,
    /// Another copy of a message this replica is handling (a redelivery): the copy in hand is
    /// acked, this one is left alone.
    Duplicate,
}

/// What this replica knows of the messages still in the stream, per key.
#[derive(Debug)]
pub(crate) struct StreamOrder {
    /// The stream sequence an unbroken run of first deliveries continues with.
    next: Option<u64>,
    /// Per key: its messages known to be still in the stream, by sequence.
    keys: HashMap<String, BTreeMap<u64, Place>>,
    /// How many entries are [`Place::Away`].
    away: usize,
    /// How long a message elsewhere is waited for: by then it is settled or JetStream gave it
    /// up (`bus.ack_wait_ms` × `bus.max_deliver`).
    max_wait: Duration,
}

impl StreamOrder {
    /// An order that waits for a message elsewhere at most `max_wait`.
    pub(crate) fn new(max_wait: Duration) -> Self {
        Self {
            next: None,
            keys: HashMap::new(),
            away: 0,
            max_wait,
        }
    }

    /// Records a delivery at `seq` (`first`: its first delivery) and returns the sequences
    /// skipped since the previous first delivery, whose messages went elsewhere and are to be
    /// read ([`StreamOrder::away`]). After a start that is everything before `seq`.
    pub(crate) fn gap(&mut self, seq: u64, first: bool) -> Option<Range<u64>> {
        if !first {
            return None;
        }
        let from = self.next.unwrap_or(1);
        self.next = Some(from.max(seq + 1));
        (seq > from).then_some(from..seq)
    }

    /// Records that the message at `seq` of `key` is in the stream but not here.
    pub(crate) fn away(&mut self, key: &str, seq: u64, now: Instant) {
        if self.away >= MAX_AWAY {
            tracing::warn!(
                forgotten = self.away,
                "too many messages elsewhere to keep their keys' order; forgetting them"
            );
            self.forget_away(|_| true);
        }
        let messages = self.keys.entry(key.to_owned()).or_default();
        if let std::collections::btree_map::Entry::Vacant(entry) = messages.entry(seq) {
            entry.insert(Place::Away(now));
            self.away += 1;
        }
    }

    /// The message at `seq` of `key` arrived here: where it goes.
    pub(crate) fn arrived(&mut self, key: &str, seq: u64) -> Arrival {
        let messages = self.keys.entry(key.to_owned()).or_default();
        let was = messages.get(&seq).copied();
        if matches!(was, Some(Place::Lane | Place::Waiting)) {
            return Arrival::Duplicate;
        }
        if matches!(was, Some(Place::Away(_))) {
            self.away -= 1;
        }
        let clear = messages
            .range(..seq)
            .all(|(_, place)| *place == Place::Lane);
        let (place, arrival) = if clear {
            (Place::Lane, Arrival::Lane)
        } else {
            (Place::Waiting, Arrival::Wait)
        };
        messages.insert(seq, place);
        arrival
    }

    /// Whether the waiting message at `seq` of `key` may go: nothing earlier of its key is
    /// left. Otherwise, for the key's earliest waiting message only, the earliest earlier
    /// message elsewhere, to look up whether it is gone from the stream (one look-up per key,
    /// however many wait behind it). A message elsewhere longer than the longest wait no longer
    /// counts.
    pub(crate) fn turn(&mut self, key: &str, seq: u64, now: Instant) -> Result<(), Option<u64>> {
        let Some(messages) = self.keys.get_mut(key) else {
            return Ok(());
        };
        let max_wait = self.max_wait;
        let before = messages.len();
        messages.retain(|s, place| {
            *s >= seq || !matches!(place, Place::Away(at) if now.duration_since(*at) >= max_wait)
        });
        self.away -= before - messages.len();
        let mut earlier = messages.range(..seq).peekable();
        if earlier.peek().is_none() {
            return Ok(());
        }
        let mut first_away = None;
        for (s, place) in earlier {
            match place {
                Place::Waiting => return Err(None),
                Place::Away(_) if first_away.is_none() => first_away = Some(*s),
                _ => {}
            }
        }
        Err(first_away)
    }

    /// The message at `seq` of `key` is settled: delivered or dead-lettered here, or found
    /// gone from the stream.
    pub(crate) fn done(&mut self, key: &str, seq: u64) {
        let Some(messages) = self.keys.get_mut(key) else {
            return;
        };
        if let Some(Place::Away(_)) = messages.remove(&seq) {
            self.away -= 1;
        }
        if messages.is_empty() {
            self.keys.remove(key);
        }
    }

    /// The message at `seq` of `key` went back to the stream (its delivery kept failing):
    /// the key's later messages wait until it comes again.
    pub(crate) fn handed_back(&mut self, key: &str, seq: u64, now: Instant) {
        self.done(key, seq);
        self.away(key, seq, now);
    }

    /// Forgets the messages elsewhere that are older than the stream's first message (gone
    /// from it) or than the longest wait.
    pub(crate) fn sweep(&mut self, first_in_stream: u64, now: Instant) {
        let max_wait = self.max_wait;
        self.forget_away(|(seq, at)| seq < first_in_stream || now.duration_since(at) >= max_wait);
    }

    /// Whether any message is known to be elsewhere (a sweep has something to do).
    pub(crate) fn any_away(&self) -> bool {
        self.away > 0
    }

    fn forget_away(&mut self, forget: impl Fn((u64, Instant)) -> bool) {
        let mut forgotten = 0;
        self.keys.retain(|_, messages| {
            messages.retain(|seq, place| match place {
                Place::Away(at) if forget((*seq, *at)) => {
                    forgotten += 1;
                    false
                }
                _ => true,
            });
            !messages.is_empty()
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
        let mut order = StreamOrder::new(WAIT);
        assert_eq!(order.gap(5, true), Some(1..5), "after a start");
        assert_eq!(order.gap(6, true), None);
        assert_eq!(order.gap(3, false), None, "a redelivery is no gap");
        assert_eq!(order.gap(9, true), Some(7..9));
        assert_eq!(order.gap(10, true), None);
    }

    #[test]
    fn a_message_after_one_lost_with_a_connection_waits_until_that_one_is_delivered() {
        let now = Instant::now();
        let mut order = StreamOrder::new(WAIT);
        // 4 and 5 were pulled through a connection that died; 6 came on the new one.
        order.away("s", 4, now);
        order.away("t", 5, now);
        assert_eq!(order.arrived("s", 6), Arrival::Wait);
        assert_eq!(order.turn("s", 6, now), Err(Some(4)));
        assert_eq!(order.arrived("t", 7), Arrival::Wait);
        // 4 comes again, here: its key's first, into the lane.
        assert_eq!(order.arrived("s", 4), Arrival::Lane);
        assert_eq!(order.turn("s", 6, now), Err(None), "4 is in the lane");
        order.done("s", 4);
        assert_eq!(order.turn("s", 6, now), Ok(()));
        // 5 was delivered by another replica: found gone from the stream.
        order.done("t", 5);
        assert_eq!(order.turn("t", 7, now), Ok(()));
        assert!(!order.any_away());
    }

    #[test]
    fn messages_behind_one_in_the_lane_follow_it_there_and_behind_a_waiting_one_wait() {
        let now = Instant::now();
        let mut order = StreamOrder::new(WAIT);
        assert_eq!(order.arrived("s", 1), Arrival::Lane);
        assert_eq!(order.arrived("s", 2), Arrival::Lane);
        order.away("s", 3, now);
        assert_eq!(order.arrived("s", 4), Arrival::Wait);
        assert_eq!(order.arrived("s", 5), Arrival::Wait, "behind a waiting one");
        order.done("s", 1);
        order.done("s", 2);
        order.done("s", 3);
        assert_eq!(order.turn("s", 5, now), Err(None), "4 goes first");
        assert_eq!(order.turn("s", 4, now), Ok(()));
        order.done("s", 4);
        assert_eq!(order.turn("s", 5, now), Ok(()));
    }

    #[test]
    fn only_a_keys_earliest_waiting_message_looks_up_the_earliest_one_elsewhere() {
        let now = Instant::now();
        let mut order = StreamOrder::new(WAIT);
        order.away("s", 1, now);
        order.away("s", 2, now);
        assert_eq!(order.arrived("s", 3), Arrival::Wait);
        assert_eq!(order.arrived("s", 4), Arrival::Wait);
        assert_eq!(order.turn("s", 3, now), Err(Some(1)));
        assert_eq!(order.turn("s", 4, now), Err(None), "3 looks");
        order.done("s", 1);
        assert_eq!(order.turn("s", 3, now), Err(Some(2)));
    }

    #[test]
    fn a_second_copy_of_a_message_in_hand_is_a_duplicate() {
        let mut order = StreamOrder::new(WAIT);
        assert_eq!(order.arrived("s", 1), Arrival::Lane);
        assert_eq!(order.arrived("s", 1), Arrival::Duplicate);
        order.done("s", 1);
        assert_eq!(order.arrived("s", 1), Arrival::Lane, "settled: a new copy");
    }

    #[test]
    fn a_message_handed_back_holds_the_keys_later_ones() {
        let now = Instant::now();
        let mut order = StreamOrder::new(WAIT);
        assert_eq!(order.arrived("s", 1), Arrival::Lane);
        order.handed_back("s", 1, now);
        assert_eq!(order.arrived("s", 2), Arrival::Wait);
        assert_eq!(order.turn("s", 2, now), Err(Some(1)));
    }

    #[test]
    fn a_message_elsewhere_past_the_longest_wait_or_the_streams_start_is_forgotten() {
        let now = Instant::now();
        let mut order = StreamOrder::new(WAIT);
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
