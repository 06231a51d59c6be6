//! `chat.history`, a page at a time: at most [`MAX_LIMIT`] entries and about [`PAGE_BYTES`] of
//! text per answer, newest first across pages; `before` (an entry's `seq`) asks for the page
//! older than it, and `nextBefore` in each answer is that cursor.
//!
//! Memory's `GetHistory` returns only the newest `limit` entries, so an older page is read by
//! asking for more of the newest until enough older ones come back. That reads every entry
//! after the cursor again; a `before_seq` in `GetHistoryRequest` would make it one read.

use serde::Deserialize;
use serde_json::{Value, json};

use agentloop_proto::v1::{Entry, GetHistoryRequest};

use crate::RequestError;
use crate::params::{no_nul, parse};
use crate::principal::Principal;
use crate::sessions::session_id;
use crate::state::AppState;

/// The most entries one answer holds; a larger `limit` is cut to it.
pub(crate) const MAX_LIMIT: u32 = 1000;
/// Entries per answer when the client names no `limit`.
const DEFAULT_LIMIT: u32 = 200;
/// Content bytes per answer past which older entries are left for the next page (one entry
/// always comes, whatever its size).
const PAGE_BYTES: usize = 1024 * 1024;
/// The most entries read from memory for one page.
const MAX_FETCH: u32 = 100_000;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct HistoryParams {
    #[serde(default, alias = "session_key", alias = "key")]
    session_key: String,
    #[serde(default)]
    limit: Option<u32>,
    /// Only entries older than this `seq`.
    #[serde(default)]
    before: Option<i64>,
}

/// `chat.history`: a page of the session's transcript, oldest first; a session `who` does not
/// see (or none) is not found, and nothing is created.
pub(crate) async fn chat_history(
    state: &AppState,
    who: &Principal,
    params: Value,
) -> Result<Value, RequestError> {
    let p: HistoryParams = parse("chat.history", params)?;
    no_nul("sessionKey", &p.session_key)?;
    let limit = p
        .limit
        .filter(|l| *l > 0)
        .unwrap_or(DEFAULT_LIMIT)
        .min(MAX_LIMIT);
    let session_id = session_id(state, who, &p.session_key).await?;
    let (entries, more) = older_entries(state, &session_id, limit, p.before).await?;
    let (entries, more) = cut_to_budget(entries, more);
    let next_before = if more {
        entries.first().map(|e| json!(e.seq)).unwrap_or(Value::Null)
    } else {
        Value::Null
    };
    let messages: Vec<Value> = entries.into_iter().map(row).collect();
    Ok(
        json!({"sessionKey": p.session_key, "sessionId": session_id, "messages": messages,
              "hasMore": more, "nextBefore": next_before}),
    )
}

/// A transcript entry as a history row: agentloop's fields (`content` as text, `ts`), and
/// OpenClaw's (`timestamp`, and a user entry's `idempotencyKey` as `<key>:user`, by which a
/// client recognises the message it sent).
fn row(entry: Entry) -> Value {
    let ts = entry.created_at.as_ref().map(crate::status::timestamp_ms);
    let mut row = json!({"seq": entry.seq, "role": entry.role, "content": entry.content,
        "runId": entry.run_id, "toolName": entry.tool_name, "toolCallId": entry.tool_call_id,
        "ts": ts, "timestamp": ts});
    if entry.role == "user"
        && let Ok(data) = serde_json::from_str::<Value>(&entry.data)
        && let Some(key) = data.get("idempotencyKey").and_then(Value::as_str)
    {
        row["idempotencyKey"] = json!(format!("{key}:user"));
    }
    row
}

/// Returns the newest `limit` entries older than `before` (all when `None`), oldest first, and
/// whether older ones remain.
async fn older_entries(
    state: &AppState,
    session_id: &str,
    limit: u32,
    before: Option<i64>,
) -> Result<(Vec<Entry>, bool), RequestError> {
    let limit_len = usize::try_from(limit).unwrap_or(usize::MAX);
    // One more than asked tells whether there is more.
    let mut want = if before.is_some() {
        limit.saturating_add(1).saturating_mul(2)
    } else {
        limit.saturating_add(1)
    }
    .min(MAX_FETCH);
    loop {
        let fetched = state
            .sessions
            .clone()
            .get_history(GetHistoryRequest {
                session_id: session_id.to_owned(),
                limit: want,
            })
            .await?
            .into_inner()
            .entries;
        let reached_start = fetched.len() < usize::try_from(want).unwrap_or(usize::MAX);
        let mut older: Vec<Entry> = match before {
            Some(before) => fetched.into_iter().filter(|e| e.seq < before).collect(),
            None => fetched,
        };
        if older.len() > limit_len || reached_start || want >= MAX_FETCH {
            let more = older.len() > limit_len || !reached_start;
            let skip = older.len().saturating_sub(limit_len);
            older.drain(..skip);
            return Ok((older, more));
        }
        want = want.saturating_mul(2).min(MAX_FETCH);
    }
}

/// Keeps the newest entries that fit [`PAGE_BYTES`] (at least one); says whether any older
/// ones remain.
fn cut_to_budget(mut entries: Vec<Entry>, more: bool) -> (Vec<Entry>, bool) {
    let mut bytes = 0usize;
    let mut keep = 0usize;
    for entry in entries.iter().rev() {
        bytes = bytes.saturating_add(entry.content.len() + entry.data.len());
        if keep > 0 && bytes > PAGE_BYTES {
            break;
        }
        keep += 1;
    }
    let cut = entries.len() - keep;
    entries.drain(..cut);
    (entries, more || cut > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(seq: i64, size: usize) -> Entry {
        Entry {
            seq,
            content: "x".repeat(size),
            ..Default::default()
        }
    }

    #[test]
    fn a_page_keeps_the_newest_entries_within_its_byte_budget() {
        let entries = vec![
            entry(1, PAGE_BYTES / 2),
            entry(2, PAGE_BYTES / 2),
            entry(3, 10),
        ];
        let (kept, more) = cut_to_budget(entries, false);
        assert_eq!(kept.iter().map(|e| e.seq).collect::<Vec<_>>(), [2, 3]);
        assert!(more);
        let (kept, more) = cut_to_budget(vec![entry(9, PAGE_BYTES * 3)], false);
        assert_eq!(kept.len(), 1);
        assert!(!more);
    }
}
