//! Which users recently had no memories at all. Most users of an assistant have none yet, and
//! asking memory on every run cost the stack about 30 % more CPU per run (bench/HISTORY.md,
//! 2026-12-05); a scope memory said holds nothing is not asked again for [`FRESH_FOR`]. A user
//! with memories is always asked, whether or not the last message matched any.
//!
//! What this can miss: a memory saved on another runner replica for a user whose session this
//! replica owns, within [`FRESH_FOR`] of an empty recall. A save on this replica forgets every
//! entry at once, so a user's own `memory_save` is recalled by their next run here.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long an empty recall stands.
pub(crate) const FRESH_FOR: Duration = Duration::from_secs(5);

/// Entries kept at most; past it the map starts over (an entry only saves a round trip).
const MAX_ENTRIES: usize = 100_000;

/// Scopes (agent, session, sender, channel) whose recall came back empty, and when.
#[derive(Default)]
pub(crate) struct RecallCache {
    empty: Mutex<HashMap<String, Instant>>,
}

impl RecallCache {
    /// The key of a scope.
    pub(crate) fn key(scope: &agentloop_proto::v1::MemoryScope) -> String {
        let agent = if scope.shared_across_agents {
            ""
        } else {
            scope.agent_id.as_str()
        };
        format!(
            "{agent}\u{0}{}\u{0}{}\u{0}{}",
            scope.session_id, scope.sender_id, scope.channel
        )
    }

    /// Whether `key` was found to hold no memories less than [`FRESH_FOR`] before `now`.
    pub(crate) fn known_empty(&self, key: &str, now: Instant) -> bool {
        let empty = self.empty.lock().unwrap_or_else(PoisonError::into_inner);
        empty
            .get(key)
            .is_some_and(|at| now.saturating_duration_since(*at) < FRESH_FOR)
    }

    /// Records whether `key` holds any memories.
    pub(crate) fn record(&self, key: String, holds_any: bool, now: Instant) {
        let mut empty = self.empty.lock().unwrap_or_else(PoisonError::into_inner);
        if holds_any {
            empty.remove(&key);
            return;
        }
        if empty.len() >= MAX_ENTRIES {
            empty.clear();
        }
        empty.insert(key, now);
    }

    /// Forgets every entry: something was saved.
    pub(crate) fn saved(&self) {
        self.empty
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_recall_stands_for_a_while_and_a_save_ends_it() {
        let cache = RecallCache::default();
        let t0 = Instant::now();
        assert!(!cache.known_empty("a", t0));
        cache.record("a".into(), false, t0);
        assert!(cache.known_empty("a", t0 + Duration::from_secs(1)));
        assert!(
            !cache.known_empty("a", t0 + FRESH_FOR),
            "stale after FRESH_FOR"
        );
        assert!(!cache.known_empty("b", t0));
        cache.saved();
        assert!(!cache.known_empty("a", t0 + Duration::from_secs(1)));
    }

    #[test]
    fn a_user_holding_memories_is_not_cached() {
        let cache = RecallCache::default();
        let t0 = Instant::now();
        cache.record("a".into(), false, t0);
        cache.record("a".into(), true, t0);
        assert!(!cache.known_empty("a", t0));
    }

    #[test]
    fn scopes_differ_by_agent_unless_shared() {
        let scope = |agent: &str, shared| agentloop_proto::v1::MemoryScope {
            agent_id: agent.into(),
            session_id: "s".into(),
            shared_across_agents: shared,
            ..Default::default()
        };
        assert_ne!(
            RecallCache::key(&scope("a", false)),
            RecallCache::key(&scope("b", false))
        );
        assert_eq!(
            RecallCache::key(&scope("a", true)),
            RecallCache::key(&scope("b", true))
        );
    }
}
