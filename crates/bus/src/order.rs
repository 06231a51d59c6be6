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
    /// Gaps whose messages could not be read yet (the stream did not answer: an election), by
    /// start, with their end and since when: their keys are unknown, so every later message
    /// waits until they are read.
    unread: BTreeMap<u64, (u64, Instant)>,
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
            unread: BTreeMap::new(),
            max_wait,
        }
    }

    /// Records a delivery at `seq` and returns the sequences before it this replica has not
    /// seen, whose messages went elsewhere and are to be read ([`StreamOrder::away`]). After a
    /// start that is everything before `seq`. A redelivery counts as much as a first delivery:
    /// first deliveries go out in stream order, so a redelivered message past what this
    /// replica saw means every message before it was handed out somewhere, to another replica
    /// or into a connection that died (after a partition, the redeliveries come before any new
    /// message does).
    pub(crate) fn gap(&mut self, seq: u64) -> Option<Range<u64>> {
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
            .all(|(_, place)| *place == Place::Lane)
            && !unread_before(&self.unread, seq);
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
        let max_wait = self.max_wait;
        self.unread
            .retain(|_, (_, since)| now.duration_since(*since) < max_wait);
        if unread_before(&self.unread, seq) {
            // Read off the consume loop ([`StreamOrder::read`] ends it); nothing to look up.
            return Err(None);
        }
        let Some(messages) = self.keys.get_mut(key) else {
            return Ok(());
        };
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

    /// The message at `seq` of `key`, queued in its key's lane, is next there: whether it may
    /// go. Not when an earlier message of its key left the lane meanwhile (handed back after
    /// its delivery kept failing) or is known elsewhere: then it waits out of the lane, as
    /// [`Arrival::Wait`], for the earlier one may come back into that lane behind it.
    pub(crate) fn still_first(&mut self, key: &str, seq: u64) -> bool {
        let Some(messages) = self.keys.get_mut(key) else {
            return true;
        };
        let first = messages
            .range(..seq)
            .all(|(_, place)| *place == Place::Lane);
        if !first && let Some(place) = messages.get_mut(&seq) {
            *place = Place::Waiting;
        }
        first
    }

    /// The messages of `gap` could not be read in time: until [`StreamOrder::read`] says they
    /// are, or the longest wait passed, every message after it waits.
    pub(crate) fn unread(&mut self, gap: Range<u64>, now: Instant) {
        self.unread.insert(gap.start, (gap.end, now));
    }

    /// The messages of `gap` were read (each one still in the stream recorded with
    /// [`StreamOrder::away`]), or reading them was given up.
    pub(crate) fn read(&mut self, gap: &Range<u64>) {
        self.unread.remove(&gap.start);
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

/// Whether a gap not read yet lies before `seq`: a message of any key may be in it.
fn unread_before(unread: &BTreeMap<u64, (u64, Instant)>, seq: u64) -> bool {
    unread.range(..seq).next().is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAIT: Duration = Duration::from_secs(300);

    #[test]
    fn consecutive_deliveries_leave_no_gap_and_a_start_reads_what_came_before() {
        let mut order = StreamOrder::new(WAIT);
        assert_eq!(order.gap(5), Some(1..5), "after a start");
        assert_eq!(order.gap(6), None);
        assert_eq!(order.gap(3), None, "a redelivery of a message seen here");
        assert_eq!(order.gap(9), Some(7..9));
        assert_eq!(order.gap(10), None);
    }

    #[test]
    fn a_redelivery_past_what_was_seen_waits_for_the_earlier_messages_it_skipped() {
        let now = Instant::now();
        let mut order = StreamOrder::new(WAIT);
        assert_eq!(order.gap(3), Some(1..3));
        // The connection died after 3; 4 and 7 (of "s") were handed into it. On the new
        // connection 7 comes again before anything new: 4..7 is unseen here.
        assert_eq!(order.gap(7), Some(4..7));
        order.away("s", 4, now);
        assert_eq!(order.arrived("s", 7), Arrival::Wait);
        assert_eq!(order.turn("s", 7, now), Err(Some(4)));
        // 4 comes again: it goes first, then 7.
        assert_eq!(order.gap(4), None);
        assert_eq!(order.arrived("s", 4), Arrival::Lane);
        order.done("s", 4);
        assert_eq!(order.turn("s", 7, now), Ok(()));
        assert_eq!(order.gap(8), None, "the run goes on after the redelivery");
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

    #[test]
    fn a_message_queued_in_the_lane_behind_one_handed_back_leaves_the_lane_and_waits() {
        let now = Instant::now();
        let mut order = StreamOrder::new(WAIT);
        // 2 came while 1 was being delivered: queued behind it in the lane.
        assert_eq!(order.arrived("s", 1), Arrival::Lane);
        assert_eq!(order.arrived("s", 2), Arrival::Lane);
        assert_eq!(order.arrived("t", 3), Arrival::Lane);
        order.handed_back("s", 1, now);
        assert!(
            !order.still_first("s", 2),
            "1 goes back to the stream first"
        );
        assert_eq!(order.turn("s", 2, now), Err(Some(1)));
        assert!(order.still_first("t", 3), "another key is not held");
        // 1 comes again: into the lane, and 2 follows once it is settled.
        assert_eq!(order.arrived("s", 1), Arrival::Lane);
        assert_eq!(order.turn("s", 2, now), Err(None));
        order.done("s", 1);
        assert_eq!(order.turn("s", 2, now), Ok(()));
    }

    #[test]
    fn a_gap_not_read_in_time_holds_every_later_message_until_it_is_read() {
        let now = Instant::now();
        let mut order = StreamOrder::new(WAIT);
        assert_eq!(order.arrived("s", 1), Arrival::Lane);
        order.unread(4..6, now);
        assert_eq!(order.arrived("s", 2), Arrival::Lane, "before the gap");
        assert_eq!(order.arrived("t", 6), Arrival::Wait, "any key may be in it");
        assert_eq!(order.turn("t", 6, now), Err(None));
        // Read at last: 5 is of key t and still in the stream; 4 was settled.
        order.away("t", 5, now);
        order.read(&(4..6));
        assert_eq!(order.turn("t", 6, now), Err(Some(5)));
        assert_eq!(order.arrived("u", 7), Arrival::Lane);
        order.done("u", 7);
        // A gap never read stops holding anything after the longest wait.
        order.unread(8..9, now);
        assert_eq!(order.arrived("u", 9), Arrival::Wait);
        assert_eq!(order.turn("u", 9, now), Err(None));
        assert_eq!(order.turn("u", 9, now + WAIT), Ok(()));
    }
}
