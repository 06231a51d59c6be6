//! The transcript windows this replica saw last, so a session's next run asks memory only for
//! the entries after them instead of the whole window. Bounded by a total number of entries;
//! the least recently used sessions are dropped first.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use agentloop_proto::v1::Entry;

/// A transcript entry as the runner holds it. Its text is shared with every conversation built
/// from it: copying each history text into each run's conversation was 4–6 % of the runner's
/// CPU at long histories.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct HistoryEntry {
    pub(crate) seq: i64,
    pub(crate) key: String,
    pub(crate) role: Role,
    pub(crate) content: Arc<str>,
    pub(crate) run_id: String,
    pub(crate) tool_call_id: String,
    pub(crate) data: String,
}

impl From<Entry> for HistoryEntry {
    fn from(entry: Entry) -> Self {
        Self {
            seq: entry.seq,
            key: entry.key,
            role: Role::parse(&entry.role),
            content: entry.content.into(),
            run_id: entry.run_id,
            tool_call_id: entry.tool_call_id,
            data: entry.data,
        }
    }
}

/// An entry's role, held inline: every run looks at the role of every entry of its window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Role {
    User,
    Assistant,
    Tool,
    Summary,
    /// Any other role (`system`), which the conversation leaves out.
    #[default]
    Other,
}

impl Role {
    /// The role a transcript entry names.
    pub(crate) fn parse(role: &str) -> Self {
        match role {
            "user" => Self::User,
            "assistant" => Self::Assistant,
            "tool" => Self::Tool,
            "summary" => Self::Summary,
            _ => Self::Other,
        }
    }
}

/// A session's window, oldest first.
pub(crate) type Window = Arc<Vec<HistoryEntry>>;

/// Transcript windows by session id.
pub(crate) struct HistoryCache {
    max_entries: usize,
    window: usize,
    total: usize,
    tick: u64,
    sessions: HashMap<String, (u64, Window)>,
    by_use: BTreeMap<u64, String>,
}

impl HistoryCache {
    /// Keeps at most `max_entries` entries in all; windows hold the newest `window` entries.
    pub(crate) fn new(max_entries: usize, window: u32) -> Self {
        Self {
            max_entries,
            window: window as usize,
            total: 0,
            tick: 0,
            sessions: HashMap::new(),
            by_use: BTreeMap::new(),
        }
    }

    /// The seq of the newest entry held for the session, 0 when none is.
    pub(crate) fn after_seq(&self, session_id: &str) -> i64 {
        self.sessions
            .get(session_id)
            .and_then(|(_, entries)| entries.last())
            .map_or(0, |entry| entry.seq)
    }

    /// Combines what memory sent (`delta`: only the entries after `after_seq`) with the copy
    /// held, keeps the result and returns it. `None` when the copy changed since `after_seq` was
    /// read, so the delta does not fit it: the caller must fetch the whole window.
    pub(crate) fn merge(
        &mut self,
        session_id: &str,
        after_seq: i64,
        fetched: Vec<HistoryEntry>,
        delta: bool,
    ) -> Option<Window> {
        let held = self.remove(session_id);
        let mut entries = if delta {
            // Usually the last run is over and this is the only reference: no copy.
            let mut held = Arc::try_unwrap(held?).unwrap_or_else(|shared| (*shared).clone());
            if held.last().map_or(0, |entry| entry.seq) != after_seq {
                return None;
            }
            held.extend(fetched);
            held
        } else {
            fetched
        };
        if entries.len() > self.window {
            entries.drain(..entries.len() - self.window);
        }
        let entries = Arc::new(entries);
        self.keep(session_id, entries.clone());
        Some(entries)
    }

    fn keep(&mut self, session_id: &str, entries: Window) {
        if self.max_entries == 0 || entries.len() > self.max_entries {
            return;
        }
        self.tick += 1;
        self.total += entries.len();
        self.by_use.insert(self.tick, session_id.to_owned());
        self.sessions
            .insert(session_id.to_owned(), (self.tick, entries));
        while self.total > self.max_entries {
            let Some((_, oldest)) = self.by_use.pop_first() else {
                break;
            };
            if let Some((_, dropped)) = self.sessions.remove(&oldest) {
                self.total -= dropped.len();
            }
        }
    }

    fn remove(&mut self, session_id: &str) -> Option<Window> {
        let (tick, entries) = self.sessions.remove(session_id)?;
        self.by_use.remove(&tick);
        self.total -= entries.len();
        Some(entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(seqs: std::ops::RangeInclusive<i64>) -> Vec<HistoryEntry> {
        seqs.map(|seq| HistoryEntry {
            seq,
            content: format!("e{seq}").into(),
            ..Default::default()
        })
        .collect()
    }

    fn seqs(entries: &[HistoryEntry]) -> Vec<i64> {
        entries.iter().map(|e| e.seq).collect()
    }

    #[test]
    fn a_delta_extends_the_held_window_and_keeps_the_newest_entries() {
        let mut cache = HistoryCache::new(100, 4);
        assert_eq!(cache.after_seq("s"), 0);
        let full = cache.merge("s", 0, entries(1..=3), false).unwrap();
        assert_eq!(seqs(&full), vec![1, 2, 3]);
        assert_eq!(cache.after_seq("s"), 3);

        let merged = cache.merge("s", 3, entries(4..=5), true).unwrap();

        assert_eq!(seqs(&merged), vec![2, 3, 4, 5]);
        assert_eq!(cache.after_seq("s"), 5);
    }

    #[test]
    fn a_delta_that_does_not_fit_the_held_copy_asks_for_the_whole_window() {
        let mut cache = HistoryCache::new(100, 10);
        cache.merge("s", 0, entries(1..=3), false).unwrap();

        assert!(cache.merge("s", 2, entries(4..=4), true).is_none());
        assert!(cache.merge("t", 7, entries(8..=8), true).is_none());
        assert_eq!(
            cache.after_seq("s"),
            0,
            "a copy that did not fit is dropped"
        );
    }

    #[test]
    fn the_least_recently_used_sessions_go_first_when_over_budget() {
        let mut cache = HistoryCache::new(5, 10);
        cache.merge("a", 0, entries(1..=2), false).unwrap();
        cache.merge("b", 0, entries(3..=4), false).unwrap();
        cache.merge("a", 2, entries(5..=5), true).unwrap();

        cache.merge("c", 0, entries(6..=7), false).unwrap();

        assert_eq!(cache.after_seq("b"), 0, "b was used least recently");
        assert_eq!(cache.after_seq("a"), 5);
        assert_eq!(cache.after_seq("c"), 7);
    }

    #[test]
    fn a_zero_budget_keeps_nothing() {
        let mut cache = HistoryCache::new(0, 10);
        let full = cache.merge("s", 0, entries(1..=2), false).unwrap();
        assert_eq!(full.len(), 2);
        assert_eq!(cache.after_seq("s"), 0);
    }
}
