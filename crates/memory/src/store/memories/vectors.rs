//! The memories of recently searched users with their vectors, kept by the memory service
//! between searches. Reading a user's every vector from Postgres took most of a hybrid search
//! (5.6 ms p50 for 710 memories); with the entry kept, a search reads only the text matches and
//! the version of the user's memories. An entry is used only while that version (a counter every
//! write of the user's memories moves on, `memory_versions`) is the one Postgres reports, so a
//! save, replace or forget on any replica is seen by the next search.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use super::Memory;

/// The default budget: about 50 users of 700 memories with 384-dimension vectors.
pub const DEFAULT_BUDGET_BYTES: usize = 64 << 20;

/// Whose memories, searched with which model's vectors.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    pub(crate) user_key: String,
    pub(crate) agent_id: String,
    pub(crate) model: String,
}

/// A user's memories, each with its vector of the key's model (`None`: none of that model).
#[derive(Debug)]
pub(crate) struct Entry {
    /// `memory_versions.version` when they were read.
    pub(crate) version: i64,
    pub(crate) memories: Vec<(Memory, Option<Vec<f32>>)>,
    bytes: usize,
}

impl Entry {
    /// An entry of `memories` at `version`.
    pub(crate) fn new(version: i64, memories: Vec<(Memory, Option<Vec<f32>>)>) -> Self {
        let bytes = memories
            .iter()
            .map(|(m, v)| {
                std::mem::size_of::<(Memory, Option<Vec<f32>>)>()
                    + m.text.len()
                    + m.user_key.len()
                    + m.agent_id.len()
                    + m.source.len()
                    + v.as_ref().map_or(0, |v| v.len() * 4)
            })
            .sum();
        Self {
            version,
            memories,
            bytes,
        }
    }
}

/// The entries, least recently used dropped first once over the budget.
#[derive(Debug)]
pub(crate) struct VectorCache {
    budget: usize,
    inner: Mutex<Inner>,
}

#[derive(Default, Debug)]
struct Inner {
    entries: HashMap<Key, (Arc<Entry>, u64)>,
    bytes: usize,
    clock: u64,
}

impl VectorCache {
    /// A cache holding at most `budget` bytes (0: nothing is kept).
    pub(crate) fn new(budget: usize) -> Self {
        Self {
            budget,
            inner: Mutex::default(),
        }
    }

    /// The entry of `key` if it is at `version`.
    pub(crate) fn get(&self, key: &Key, version: i64) -> Option<Arc<Entry>> {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.clock += 1;
        let now = inner.clock;
        let (entry, used) = inner.entries.get_mut(key)?;
        if entry.version != version {
            return None;
        }
        *used = now;
        Some(entry.clone())
    }

    /// Keeps `entry` for `key`, dropping the least recently used entries past the budget.
    pub(crate) fn put(&self, key: Key, entry: Arc<Entry>) {
        if entry.bytes > self.budget {
            return;
        }
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.clock += 1;
        let now = inner.clock;
        inner.bytes += entry.bytes;
        if let Some((old, _)) = inner.entries.insert(key, (entry, now)) {
            inner.bytes -= old.bytes;
        }
        while inner.bytes > self.budget {
            let Some(oldest) = inner
                .entries
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some((gone, _)) = inner.entries.remove(&oldest) {
                inner.bytes -= gone.bytes;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use chrono::Utc;
    use uuid::Uuid;

    use super::*;

    fn key(user: &str) -> Key {
        Key {
            user_key: user.into(),
            agent_id: "main".into(),
            model: "m".into(),
        }
    }

    fn entry(version: i64, dims: usize) -> Arc<Entry> {
        let now = Utc::now();
        let memory = Memory {
            id: Uuid::now_v7(),
            agent_id: "main".into(),
            user_key: "u".into(),
            text: "t".into(),
            source: "tool".into(),
            created_at: now,
            updated_at: now,
            score: 0.0,
        };
        Arc::new(Entry::new(version, vec![(memory, Some(vec![0.5; dims]))]))
    }

    #[test]
    fn an_entry_serves_only_its_own_version() {
        let cache = VectorCache::new(1 << 20);
        cache.put(key("a"), entry(1, 4));
        assert!(cache.get(&key("a"), 1).is_some());
        assert!(
            cache.get(&key("a"), 2).is_none(),
            "a changed user is read again"
        );
        assert!(cache.get(&key("b"), 1).is_none());
    }

    #[test]
    fn the_least_recently_used_entry_goes_first_once_over_budget() {
        let one = entry(1, 1000).bytes;
        let cache = VectorCache::new(one * 2 + one / 2);
        cache.put(key("a"), entry(1, 1000));
        cache.put(key("b"), entry(1, 1000));
        assert!(cache.get(&key("a"), 1).is_some(), "a is now the newer use");
        cache.put(key("c"), entry(1, 1000));
        assert!(
            cache.get(&key("b"), 1).is_none(),
            "b was used least recently"
        );
        assert!(cache.get(&key("a"), 1).is_some());
        assert!(cache.get(&key("c"), 1).is_some());
        let none = VectorCache::new(0);
        none.put(key("a"), entry(1, 1));
        assert!(
            none.get(&key("a"), 1).is_none(),
            "a zero budget keeps nothing"
        );
    }
}
