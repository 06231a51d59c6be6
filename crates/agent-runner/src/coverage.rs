//! When a replica may enqueue a command without reading RUNS first: it saw every command the
//! stream delivered since the session's previous one, and that previous one is in the inbox.
//!
//! RUNS has one consumer, and its first deliveries go out in stream order. If this replica's
//! first deliveries carry consecutive stream sequences, no other replica got a command in
//! between. So when a session's previous command (`prev`) arrived here within such an
//! unbroken run and was enqueued, nothing of the session can be outside the inbox ahead of
//! the new one: commands before `prev` were checked when `prev` was, and every command after
//! it came here, into the session's intake lane ahead of the new one. With one replica that is
//! every command but a session's first after a start, so the read of RUNS that keeps the order
//! is paid only where several replicas share the stream.

use std::collections::HashMap;

/// Most sessions remembered; past it the record starts over (and the next command of each
/// session is read for once).
const CAPACITY: usize = 100_000;

/// What this replica saw of RUNS' first deliveries, and which sessions' latest arrivals are
/// enqueued.
#[derive(Debug, Default)]
pub(crate) struct Coverage {
    /// The stream sequence an unbroken run continues with.
    next: Option<u64>,
    /// The first stream sequence of the current unbroken run.
    run_start: u64,
    /// Per session subject: the stream sequence of the command that arrived last.
    last_arrived: HashMap<String, u64>,
    /// Per session subject: the stream sequence of the command enqueued last.
    enqueued: HashMap<String, u64>,
}

impl Coverage {
    /// Records the arrival of the command at `seq` on `subject` (`first`: its first
    /// delivery). Returns the session's previous command when every delivery since it came
    /// here; the new command skips the read if that one is enqueued by its turn
    /// ([`Coverage::covers`]).
    pub(crate) fn arrived(&mut self, subject: &str, seq: u64, first: bool) -> Option<u64> {
        let contiguous = first && self.next == Some(seq);
        if first {
            if !contiguous || self.last_arrived.len() >= CAPACITY {
                self.restart(seq);
            }
            self.next = Some(seq + 1);
        }
        let prev = record(&mut self.last_arrived, subject, seq);
        prev.filter(|p| contiguous && *p >= self.run_start && *p < seq)
    }

    /// Records that the command at `seq` on `subject` is in the inbox.
    pub(crate) fn enqueued(&mut self, subject: &str, seq: u64) {
        if self.last_arrived.contains_key(subject) {
            record(&mut self.enqueued, subject, seq);
        }
    }

    /// Whether `prev` (from [`Coverage::arrived`]) is the session's command enqueued last: then
    /// the one that arrived after it may go without a read.
    pub(crate) fn covers(&self, subject: &str, prev: u64) -> bool {
        self.enqueued.get(subject) == Some(&prev)
    }

    /// A gap in the sequences (another replica took a command, or this one just started):
    /// nothing before `seq` is known any more.
    fn restart(&mut self, seq: u64) {
        self.run_start = seq;
        self.last_arrived.clear();
        self.enqueued.clear();
    }
}

/// Sets `subject`'s sequence and returns the one it replaced, copying the subject only for a
/// session not yet in `map` (this runs for every command).
fn record(map: &mut HashMap<String, u64>, subject: &str, seq: u64) -> Option<u64> {
    match map.get_mut(subject) {
        Some(held) => Some(std::mem::replace(held, seq)),
        None => {
            map.insert(subject.to_owned(), seq);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "p.run.a";
    const B: &str = "p.run.b";

    #[test]
    fn a_sessions_command_after_an_enqueued_one_with_no_gap_between_skips_the_read() {
        let mut seen = Coverage::default();
        assert_eq!(seen.arrived(A, 1, true), None, "a session's first is read");
        seen.enqueued(A, 1);
        assert_eq!(seen.arrived(B, 2, true), None);
        assert_eq!(seen.arrived(A, 3, true), Some(1));
        assert!(seen.covers(A, 1));
    }

    #[test]
    fn a_gap_in_the_sequences_means_another_replica_took_one_so_the_next_is_read() {
        let mut seen = Coverage::default();
        seen.arrived(A, 1, true);
        seen.enqueued(A, 1);
        // Sequence 2 went to another replica: it may be this session's.
        assert_eq!(seen.arrived(A, 3, true), None);
        seen.enqueued(A, 3);
        assert_eq!(seen.arrived(A, 4, true), Some(3));
    }

    #[test]
    fn a_previous_command_not_yet_enqueued_does_not_cover_the_next() {
        let mut seen = Coverage::default();
        seen.arrived(A, 1, true);
        seen.enqueued(A, 1);
        assert_eq!(seen.arrived(A, 2, true), Some(1));
        // 2 failed to enqueue (or waits for its turn): 3 must be read.
        assert_eq!(seen.arrived(A, 3, true), Some(2));
        assert!(!seen.covers(A, 2));
    }

    #[test]
    fn a_redelivery_is_read_and_does_not_break_the_run() {
        let mut seen = Coverage::default();
        seen.arrived(A, 5, true);
        seen.enqueued(A, 5);
        assert_eq!(
            seen.arrived(B, 2, false),
            None,
            "a redelivery is never covered"
        );
        assert_eq!(seen.arrived(A, 6, true), Some(5));
        // The redelivered command is the session's latest arrival and comes from before the
        // run: the session's next command is read.
        assert_eq!(seen.arrived(B, 7, true), None);
    }

    #[test]
    fn a_command_from_before_the_run_does_not_cover_one_after_it() {
        let mut seen = Coverage::default();
        seen.arrived(A, 1, true);
        seen.arrived(B, 3, true);
        seen.enqueued(A, 1);
        // The run restarted at 3: whatever came before is forgotten.
        assert_eq!(seen.arrived(A, 4, true), None);
    }
}
