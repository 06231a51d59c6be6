//! Sessions a caller is known to see, so a message to one of them can be published while its
//! dispatch is recorded rather than after.
//!
//! Safe to remember without expiry because what it remembers never changes: a session is never
//! deleted and its owner is set once, when it is created (`resolve_owned_session.sql`), so a
//! caller that saw a session once sees it for good.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use agentloop_proto::v1::Caller;

/// Entries kept at most; the map starts over when it is full (a miss costs one lookup).
const CAPACITY: usize = 65_536;

/// Who is asking, as far as seeing a session goes: an admin sees every session.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Viewer {
    Admin,
    Principal(String),
    Nobody,
}

impl Viewer {
    fn of(caller: &Caller) -> Self {
        if caller.admin {
            Self::Admin
        } else if caller.principal.is_empty() {
            Self::Nobody
        } else {
            Self::Principal(caller.principal.clone())
        }
    }
}

/// Session ids by (session key, viewer). Shared by every request handler of a gateway: a mutex
/// held for one map operation, never across an await.
#[derive(Debug, Default)]
pub(crate) struct KnownSessions {
    ids: Mutex<HashMap<(String, Viewer), String>>,
}

impl KnownSessions {
    /// The id of the session `key` when `caller` has been seen to see it.
    pub(crate) fn get(&self, key: &str, caller: &Caller) -> Option<String> {
        let ids = self.ids.lock().unwrap_or_else(PoisonError::into_inner);
        ids.get(&(key.to_owned(), Viewer::of(caller))).cloned()
    }

    /// Remembers that `caller` sees the session `key` with id `session_id`.
    pub(crate) fn remember(&self, key: &str, caller: &Caller, session_id: &str) {
        let viewer = Viewer::of(caller);
        if viewer == Viewer::Nobody || session_id.is_empty() {
            // A caller without principal is refused every session it did not create; there is
            // nothing to remember that would hold for the next one.
            return;
        }
        let mut ids = self.ids.lock().unwrap_or_else(PoisonError::into_inner);
        if ids.len() >= CAPACITY {
            ids.clear();
        }
        ids.insert((key.to_owned(), viewer), session_id.to_owned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn principal(name: &str) -> Caller {
        Caller {
            principal: name.into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_session_is_known_only_to_the_caller_that_saw_it() {
        let known = KnownSessions::default();
        known.remember("k", &principal("alice"), "s1");
        assert_eq!(known.get("k", &principal("alice")).as_deref(), Some("s1"));
        assert_eq!(known.get("k", &principal("bob")), None);
        let admin = Caller {
            admin: true,
            ..Default::default()
        };
        assert_eq!(known.get("k", &admin), None);
        known.remember("k", &admin, "s1");
        assert_eq!(known.get("k", &admin).as_deref(), Some("s1"));
    }

    #[test]
    fn a_caller_without_principal_is_never_remembered() {
        let known = KnownSessions::default();
        known.remember("k", &Caller::default(), "s1");
        assert_eq!(known.get("k", &Caller::default()), None);
    }
}
