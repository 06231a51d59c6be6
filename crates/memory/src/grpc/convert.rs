//! Between the wire and the store: request fields checked and parsed, store rows turned into
//! messages.

use std::time::Duration;

use agentloop_proto::v1 as pb;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::MemoryError;
use crate::store::{self, NewEntry, non_empty};

/// Refuses an empty `value` of the required field `field`.
pub(super) fn require(field: &str, value: &str) -> Result<(), MemoryError> {
    if value.is_empty() {
        return Err(MemoryError::InvalidArgument(format!("{field} is required")));
    }
    Ok(())
}

/// Parses the required uuid field `field`.
pub(super) fn parse_id(field: &str, value: &str) -> Result<Uuid, MemoryError> {
    require(field, value)?;
    Uuid::parse_str(value)
        .map_err(|_| MemoryError::InvalidArgument(format!("{field} {value:?} is not a uuid")))
}

/// Parses a lease TTL, which must be positive.
pub(super) fn parse_ttl(ttl_ms: u32) -> Result<Duration, MemoryError> {
    if ttl_ms == 0 {
        // A zero TTL would hand out a lease that is expired before the caller sees it.
        return Err(MemoryError::InvalidArgument(
            "ttl_ms must be positive".to_owned(),
        ));
    }
    Ok(Duration::from_millis(u64::from(ttl_ms)))
}

/// Most transcript entries the history of `TakeNext` and of a claiming `Enqueue` holds, unless
/// `memory.history_limit` is set higher: a caller's count goes to SQL, and `u32::MAX` would have
/// one call on the shared run lane read and send a session's whole transcript.
pub(super) const MAX_HISTORY_ENTRIES: u32 = 1000;

/// Most transcript entries one `GetHistory` returns. The gateway's `chat.history` pages back
/// through a long transcript by asking for ever more of the newest entries, up to this many
/// (`MAX_FETCH` in the gateway's `history.rs`); it is off the run path.
pub(super) const MAX_HISTORY_READ: u32 = 100_000;

/// Most session ids one `ListClaimable` returns: far more than one sweep of a runner can claim.
pub(super) const MAX_CLAIMABLE_SESSIONS: u32 = 1000;

/// The count a call uses: what the caller asked, `when_zero` when it asked 0, never more than
/// `cap`.
pub(super) fn bounded_limit(asked: u32, when_zero: u32, cap: u32) -> u32 {
    let limit = if asked == 0 { when_zero } else { asked };
    limit.min(cap)
}

/// Parses a token count into the column's type.
pub(super) fn parse_tokens(field: &str, tokens: u64) -> Result<i64, MemoryError> {
    i64::try_from(tokens)
        .map_err(|_| MemoryError::InvalidArgument(format!("{field} {tokens} is out of range")))
}

/// Transcript entries to append, from the wire; each needs a key.
pub(super) fn new_entries(entries: Vec<pb::Entry>) -> Result<Vec<NewEntry>, MemoryError> {
    let mut out = Vec::with_capacity(entries.len());
    for entry in entries {
        if entry.key.is_empty() {
            return Err(MemoryError::InvalidArgument(
                "every entry needs a key".to_owned(),
            ));
        }
        let run_id = match entry.run_id.as_str() {
            "" => None,
            run_id => Some(parse_id("entry run_id", run_id)?),
        };
        out.push(NewEntry {
            tool_call_id: non_empty(&entry.tool_call_id),
            tool_name: non_empty(&entry.tool_name),
            data: non_empty(&entry.data),
            key: entry.key,
            role: entry.role,
            content: entry.content,
            run_id,
        });
    }
    Ok(out)
}

/// A stored transcript entry on the wire.
pub(super) fn entry_message(entry: store::Entry) -> pb::Entry {
    pb::Entry {
        seq: entry.seq,
        key: entry.key,
        role: entry.role,
        content: entry.content,
        run_id: entry.run_id.map(|id| id.to_string()).unwrap_or_default(),
        tool_call_id: entry.tool_call_id.unwrap_or_default(),
        tool_name: entry.tool_name.unwrap_or_default(),
        data: entry.data.unwrap_or_default(),
        created_at: Some(timestamp(entry.created_at)),
    }
}

/// An inbox item on the wire.
pub(super) fn inbox_item(item: store::InboxItem) -> pb::InboxItem {
    pb::InboxItem {
        seq: item.seq,
        idempotency_key: item.idempotency_key,
        kind: item.kind,
        payload: item.payload,
    }
}

/// A taken input with its run and history (`(is a delta, entries)`) on the wire.
pub(super) fn take_response(
    taken: store::Taken,
    (history_is_delta, history): (bool, Vec<store::Entry>),
) -> pb::TakeNextResponse {
    pb::TakeNextResponse {
        item: Some(inbox_item(taken.item)),
        run: Some(run_message(taken.run)),
        history: history.into_iter().map(entry_message).collect(),
        history_is_delta,
    }
}

fn run_message(run: store::Run) -> pb::Run {
    pb::Run {
        id: run.id.to_string(),
        session_id: run.session_id.to_string(),
        inbox_seq: run.inbox_seq,
        status: run.status,
        attempts: run.attempts,
        started_at: Some(timestamp(run.started_at)),
        finished_at: run.finished_at.map(timestamp),
    }
}

/// A point in time on the wire.
pub(super) fn timestamp(at: DateTime<Utc>) -> pbjson_types::Timestamp {
    pbjson_types::Timestamp {
        seconds: at.timestamp(),
        nanos: i32::try_from(at.timestamp_subsec_nanos()).unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_ids_and_ttls_are_invalid_arguments() {
        assert!(matches!(
            parse_id("session_id", ""),
            Err(MemoryError::InvalidArgument(_))
        ));
        assert!(matches!(
            parse_id("session_id", "nope"),
            Err(MemoryError::InvalidArgument(_))
        ));
        assert!(parse_id("session_id", &Uuid::now_v7().to_string()).is_ok());
        assert!(matches!(parse_ttl(0), Err(MemoryError::InvalidArgument(_))));
        assert!(matches!(
            parse_tokens("input_tokens", u64::MAX),
            Err(MemoryError::InvalidArgument(_))
        ));
    }

    #[test]
    fn a_callers_count_is_its_own_or_the_default_and_never_past_the_cap() {
        assert_eq!(bounded_limit(0, 200, 1000), 200, "0 asks for the default");
        assert_eq!(
            bounded_limit(0, 0, 1000),
            0,
            "a default of 0 stays 0: no history"
        );
        assert_eq!(bounded_limit(50, 200, 1000), 50);
        assert_eq!(bounded_limit(1000, 200, 1000), 1000);
        assert_eq!(bounded_limit(1001, 200, 1000), 1000);
        assert_eq!(
            bounded_limit(u32::MAX, 200, MAX_HISTORY_READ),
            MAX_HISTORY_READ
        );
        assert_eq!(
            bounded_limit(u32::MAX, 0, MAX_HISTORY_ENTRIES),
            MAX_HISTORY_ENTRIES
        );
        assert_eq!(
            bounded_limit(u32::MAX, 100, MAX_CLAIMABLE_SESSIONS),
            MAX_CLAIMABLE_SESSIONS
        );
    }
}
