//! The store layer on a fresh, migrated database per test.

use std::time::Duration;

use agentloop_memory::{
    Caller, HistoryAsk, InboxKind, MemoryError, NewEntry, RunOutcome, RunStatus, Store,
};
use sqlx::{Connection, PgPool};
use uuid::Uuid;

use crate::wait_until;

const LONG_TTL: Duration = Duration::from_secs(60);

fn entry(key: &str, content: &str) -> NewEntry {
    NewEntry {
        key: key.to_owned(),
        role: "user".to_owned(),
        content: content.to_owned(),
        ..NewEntry::default()
    }
}

fn outcome(run_id: Uuid, inbox_seq: i64, tokens: i64) -> RunOutcome {
    RunOutcome {
        run_id,
        inbox_seq,
        status: RunStatus::Completed,
        error: None,
        model: Some("fake/model".to_owned()),
        input_tokens: tokens,
        output_tokens: tokens * 2,
        provider: Some("fake".to_owned()),
        profile: None,
        prompt_report: Some(format!(r#"{{"run": "{run_id}", "parts": []}}"#)),
    }
}

/// The prompt report stored with a run, as text.
async fn stored_report(pool: &PgPool, run_id: Uuid) -> Option<String> {
    sqlx::query_scalar("SELECT prompt_report->>'run' FROM runs WHERE id = $1")
        .bind(run_id)
        .fetch_one(pool)
        .await
        .expect("the run exists")
}

/// Returns a session held by `owner` with its epoch.
async fn held_session(store: &Store, key: &str, owner: &str) -> (Uuid, i64) {
    let session = store
        .resolve_session(key, "main", None)
        .await
        .expect("resolve succeeds");
    let claim = store
        .claim_session(session.id, owner, LONG_TTL)
        .await
        .expect("claim succeeds");
    assert!(claim.claimed);
    (session.id, claim.epoch)
}

#[sqlx::test(migrations = "./migrations")]
async fn resolve_creates_a_session_once_then_returns_the_same_id(pool: PgPool) {
    let store = Store::new(pool);

    let first = store
        .resolve_session("cli:alice", "main", Some("cli"))
        .await
        .unwrap();
    let again = store
        .resolve_session("cli:alice", "other", Some("ws"))
        .await
        .unwrap();

    assert!(first.created);
    assert!(!again.created);
    assert_eq!(first.id, again.id);
    assert_eq!(again.agent_id, "main", "first sight decides the agent");
    assert_eq!(again.channel.as_deref(), Some("cli"));
    assert_eq!(first.id.get_version_num(), 7);
}

#[sqlx::test(migrations = "./migrations")]
async fn concurrent_first_sights_agree_on_one_session(pool: PgPool) {
    let store = Store::new(pool);

    let resolves = (0..8).map(|_| {
        let store = store.clone();
        async move { store.resolve_session("race", "main", None).await.unwrap() }
    });
    let sessions = futures_join_all(resolves).await;

    assert_eq!(sessions.iter().filter(|s| s.created).count(), 1);
    assert!(sessions.iter().all(|s| s.id == sessions[0].id));
}

async fn futures_join_all<F: Future + Send + 'static>(
    futures: impl Iterator<Item = F>,
) -> Vec<F::Output>
where
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut outputs = Vec::with_capacity(handles.len());
    for handle in handles {
        outputs.push(handle.await.expect("the task does not panic"));
    }
    outputs
}

#[sqlx::test(migrations = "./migrations")]
async fn a_retried_append_is_absorbed(pool: PgPool) {
    let store = Store::new(pool);
    let (session_id, epoch) = held_session(&store, "s", "runner-a").await;
    let run_id = Uuid::now_v7();
    let batch = vec![
        NewEntry {
            run_id: Some(run_id),
            ..entry("m1", "hello")
        },
        NewEntry {
            role: "assistant".to_owned(),
            tool_call_id: Some("call-1".to_owned()),
            tool_name: Some("exec".to_owned()),
            data: Some("{\"x\":1}".to_owned()),
            ..entry("m2", "hi")
        },
    ];

    let first = store
        .append_entries(session_id, epoch, &batch)
        .await
        .unwrap();
    let retry = store
        .append_entries(session_id, epoch, &batch)
        .await
        .unwrap();
    let extended = store
        .append_entries(session_id, epoch, &[entry("m2", "dup"), entry("m3", "new")])
        .await
        .unwrap();

    assert_eq!((first, retry, extended), (2, 0, 1));
    let history = store.get_history(session_id, 10).await.unwrap();
    let keys: Vec<_> = history.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(keys, ["m1", "m2", "m3"]);
    assert_eq!(history[0].run_id, Some(run_id));
    assert_eq!(history[1].tool_name.as_deref(), Some("exec"));
    assert_eq!(history[1].content, "hi", "the retry did not overwrite");
}

#[sqlx::test(migrations = "./migrations")]
async fn a_value_postgres_cannot_store_is_an_invalid_argument_not_an_outage(pool: PgPool) {
    let store = Store::new(pool);
    let (session_id, epoch) = held_session(&store, "s", "runner-a").await;
    // Text columns cannot hold a NUL byte; the same write would fail the same way every time.
    let refused = store
        .append_entries(session_id, epoch, &[entry("m1", "a\u{0}b")])
        .await;
    assert!(
        matches!(refused, Err(MemoryError::InvalidArgument(_))),
        "{refused:?}"
    );
    let refused = store.resolve_session("bad\u{0}key", "main", None).await;
    assert!(
        matches!(refused, Err(MemoryError::InvalidArgument(_))),
        "{refused:?}"
    );
    assert_eq!(
        tonic::Status::from(MemoryError::InvalidArgument(String::new())).code(),
        tonic::Code::InvalidArgument
    );
}

#[sqlx::test(migrations = "./migrations")]
async fn flush_confirms_only_inbox_rows_that_exist_with_their_key(pool: PgPool) {
    let store = Store::new(pool);
    let session = store.resolve_session("s", "main", None).await.unwrap();
    let one = store
        .enqueue(session.id, "k1", InboxKind::User, b"one")
        .await
        .unwrap();
    let two = store
        .enqueue(session.id, "k2", InboxKind::User, b"two")
        .await
        .unwrap();

    let mut durable = store
        .flush(&[
            (one.seq, "k1".to_owned()),
            (two.seq, "k2".to_owned()),
            // A seq a crash handed to another input: the key tells them apart.
            (two.seq, "lost".to_owned()),
            (two.seq + 1000, "k3".to_owned()),
        ])
        .await
        .unwrap();
    durable.sort_unstable();
    let nothing = store.flush(&[]).await.unwrap();

    assert_eq!(
        durable,
        vec![(one.seq, "k1".to_owned()), (two.seq, "k2".to_owned())]
    );
    assert!(nothing.is_empty());
}

#[sqlx::test(migrations = "./migrations")]
async fn a_repeated_idempotency_key_is_absorbed(pool: PgPool) {
    let store = Store::new(pool);
    let session = store.resolve_session("s", "main", None).await.unwrap();

    let first = store
        .enqueue(session.id, "k1", InboxKind::User, b"one")
        .await
        .unwrap();
    let repeat = store
        .enqueue(session.id, "k1", InboxKind::User, b"one again")
        .await
        .unwrap();
    let other = store
        .enqueue(session.id, "k2", InboxKind::Steer, b"two")
        .await
        .unwrap();
    let unknown = store
        .enqueue(Uuid::now_v7(), "k1", InboxKind::User, b"x")
        .await;

    assert!(first.inserted);
    assert!(!repeat.inserted);
    assert_eq!(repeat.seq, first.seq);
    assert!(other.inserted && other.seq > first.seq);
    assert!(
        matches!(unknown, Err(MemoryError::SessionNotFound(_))),
        "{unknown:?}"
    );
}

#[sqlx::test(migrations = "./migrations")]
async fn an_expired_lease_moves_to_a_new_owner_and_fences_the_old_epoch(pool: PgPool) {
    let store = Store::new(pool);
    let session = store.resolve_session("s", "main", None).await.unwrap();
    store
        .enqueue(session.id, "k1", InboxKind::User, b"one")
        .await
        .unwrap();
    let a = store
        .claim_session(session.id, "runner-a", Duration::from_millis(200))
        .await
        .unwrap();
    let taken = store
        .take_next(session.id, a.epoch, "runner-a")
        .await
        .unwrap()
        .unwrap();

    let while_held = store
        .claim_session(session.id, "runner-b", LONG_TTL)
        .await
        .unwrap();
    let reclaim_by_holder = store
        .claim_session(session.id, "runner-a", LONG_TTL)
        .await
        .unwrap();
    let b = wait_until("the lease to expire", Duration::from_secs(5), || async {
        let claim = store
            .claim_session(session.id, "runner-b", LONG_TTL)
            .await
            .unwrap();
        claim.claimed.then_some(claim)
    })
    .await;

    assert!(a.claimed);
    assert!(!while_held.claimed);
    assert_eq!(while_held.owner.as_deref(), Some("runner-a"));
    assert_eq!(while_held.epoch, a.epoch);
    assert!(
        !reclaim_by_holder.claimed,
        "claiming is for taking over, not renewing"
    );
    assert!(b.epoch > a.epoch, "a new claim moves the epoch on");
    assert_eq!(b.owner.as_deref(), Some("runner-b"));

    let append = store
        .append_entries(session.id, a.epoch, &[entry("m1", "late")])
        .await;
    let finish = store
        .finish_run(
            session.id,
            a.epoch,
            &outcome(taken.run.id, taken.item.seq, 1),
        )
        .await;
    let take = store.take_next(session.id, a.epoch, "runner-a").await;
    let renew = store
        .renew_lease(session.id, a.epoch, LONG_TTL)
        .await
        .unwrap();
    let release = store.release_session(session.id, a.epoch).await.unwrap();
    assert!(
        matches!(append, Err(MemoryError::LeaseLost { .. })),
        "{append:?}"
    );
    assert!(
        matches!(finish, Err(MemoryError::LeaseLost { .. })),
        "{finish:?}"
    );
    assert!(
        matches!(take, Err(MemoryError::LeaseLost { .. })),
        "{take:?}"
    );
    assert!(!renew);
    assert!(!release);
    assert!(store.get_history(session.id, 10).await.unwrap().is_empty());
    assert!(
        store
            .renew_lease(session.id, b.epoch, LONG_TTL)
            .await
            .unwrap()
    );
}

#[sqlx::test(migrations = "./migrations")]
async fn renewing_many_leases_extends_those_their_epoch_still_holds_and_only_those(pool: PgPool) {
    let store = Store::new(pool);
    let (held, held_epoch) = held_session(&store, "renew:held", "runner-a").await;
    let (other, other_epoch) = held_session(&store, "renew:other", "runner-a").await;
    let (released, released_epoch) = held_session(&store, "renew:released", "runner-a").await;
    assert!(
        store
            .release_session(released, released_epoch)
            .await
            .unwrap()
    );
    let (handed_back, handed_back_epoch) =
        held_session(&store, "renew:handed-back", "runner-a").await;
    // A hand-back lets the lease run out at once (1 ms).
    assert!(
        store
            .renew_lease(handed_back, handed_back_epoch, Duration::from_millis(1))
            .await
            .unwrap()
    );
    tokio::time::sleep(Duration::from_millis(5)).await;
    let expiry = |id: Uuid| {
        let pool = store.pool().clone();
        async move {
            sqlx::query_scalar::<_, Option<chrono::DateTime<chrono::Utc>>>(
                "SELECT lease_expires_at FROM sessions WHERE id = $1",
            )
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    let other_before = expiry(other).await;

    let renewed = store
        .renew_leases(
            &[
                (held, held_epoch),
                // A stale epoch, a released lease, one run out and a session that does not
                // exist.
                (other, other_epoch - 1),
                (released, released_epoch),
                (handed_back, handed_back_epoch),
                (Uuid::now_v7(), 1),
            ],
            Duration::from_secs(600),
        )
        .await
        .unwrap();

    assert_eq!(renewed, vec![held]);
    let held_after = expiry(held).await.expect("a held lease has an expiry");
    assert!(
        held_after > chrono::Utc::now() + chrono::Duration::seconds(300),
        "extended by the ttl asked for: {held_after}"
    );
    assert_eq!(
        expiry(other).await,
        other_before,
        "a stale epoch renews nothing"
    );
    assert!(store.renew_leases(&[], LONG_TTL).await.unwrap().is_empty());
}

#[sqlx::test(migrations = "./migrations")]
async fn take_next_returns_the_oldest_input_and_counts_a_retake(pool: PgPool) {
    let store = Store::new(pool);
    let (session_id, epoch) = held_session(&store, "s", "runner-a").await;
    let empty = store
        .take_next(session_id, epoch, "runner-a")
        .await
        .unwrap();
    let first = store
        .enqueue(session_id, "k1", InboxKind::User, b"one")
        .await
        .unwrap();
    let second = store
        .enqueue(session_id, "k2", InboxKind::Followup, b"two")
        .await
        .unwrap();

    let taken = store
        .take_next(session_id, epoch, "runner-a")
        .await
        .unwrap()
        .unwrap();
    // runner-a dies; runner-b takes over after the lease is handed back by force.
    sqlx::query("UPDATE sessions SET lease_expires_at = now() - interval '1 second'")
        .execute(store.pool())
        .await
        .unwrap();
    let b = store
        .claim_session(session_id, "runner-b", LONG_TTL)
        .await
        .unwrap();
    let retaken = store
        .take_next(session_id, b.epoch, "runner-b")
        .await
        .unwrap()
        .unwrap();
    let finished = store
        .finish_run(
            session_id,
            b.epoch,
            &outcome(retaken.run.id, retaken.item.seq, 1),
        )
        .await
        .unwrap();
    let next = store
        .take_next(session_id, b.epoch, "runner-b")
        .await
        .unwrap()
        .unwrap();

    assert!(empty.is_none());
    assert_eq!(taken.item.seq, first.seq);
    assert_eq!(taken.item.payload, b"one");
    assert_eq!(taken.item.idempotency_key, "k1");
    assert_eq!(taken.item.kind, "user");
    assert_eq!(
        (taken.run.attempts, taken.run.status.as_str()),
        (1, "running")
    );
    let derived: Uuid = sqlx::query_scalar("SELECT agentloop_run_id($1, 'k1')")
        .bind(session_id)
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(
        taken.run.id, derived,
        "a run's id comes from its input, so a run repeated after a crash keeps it"
    );
    assert_eq!(
        agentloop_proto::run_id(&session_id.to_string(), "k1"),
        derived.to_string(),
        "clients derive the same id"
    );
    assert_eq!(
        retaken.run.id, taken.run.id,
        "a re-take resumes the same run"
    );
    assert_eq!(retaken.run.attempts, 2);
    assert_eq!(retaken.run.started_at, taken.run.started_at);
    assert!(finished);
    assert_eq!(next.item.seq, second.seq);
    assert_eq!(next.item.kind, "followup");
    assert_ne!(next.run.id, taken.run.id);
}

#[sqlx::test(migrations = "./migrations")]
async fn a_retried_finish_changes_nothing_and_counts_tokens_once(pool: PgPool) {
    let store = Store::new(pool);
    let (session_id, epoch) = held_session(&store, "s", "runner-a").await;
    store
        .enqueue(session_id, "k1", InboxKind::User, b"one")
        .await
        .unwrap();
    let taken = store
        .take_next(session_id, epoch, "runner-a")
        .await
        .unwrap()
        .unwrap();
    let done = outcome(taken.run.id, taken.item.seq, 10);

    let first = store.finish_run(session_id, epoch, &done).await.unwrap();
    let other_report = RunOutcome {
        prompt_report: Some(r#"{"run": "a retry's"}"#.to_owned()),
        ..done.clone()
    };
    let retry = store
        .finish_run(session_id, epoch, &other_report)
        .await
        .unwrap();
    let wrong_run = store
        .finish_run(
            session_id,
            epoch,
            &outcome(Uuid::now_v7(), taken.item.seq, 1),
        )
        .await;

    assert!(first);
    assert!(!retry);
    assert!(
        matches!(wrong_run, Err(MemoryError::RunNotFound { .. })),
        "{wrong_run:?}"
    );
    let (input, output): (i64, i64) =
        sqlx::query_as("SELECT input_tokens, output_tokens FROM sessions WHERE id = $1")
            .bind(session_id)
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!((input, output), (10, 20));
    let (status, consumed_by): (String, Option<Uuid>) = sqlx::query_as(
        "SELECT r.status, i.run_id FROM runs r JOIN session_inbox i ON i.seq = r.inbox_seq WHERE r.id = $1",
    )
    .bind(taken.run.id)
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(status, "completed");
    assert_eq!(consumed_by, Some(taken.run.id));
    assert_eq!(
        stored_report(store.pool(), taken.run.id).await,
        Some(taken.run.id.to_string()),
        "the finishing call's report is kept, a retry's is not"
    );
    assert!(
        store
            .take_next(session_id, epoch, "runner-a")
            .await
            .unwrap()
            .is_none()
    );
}

#[sqlx::test(migrations = "./migrations")]
async fn release_is_refused_while_inputs_are_pending(pool: PgPool) {
    let store = Store::new(pool);
    let (session_id, epoch) = held_session(&store, "s", "runner-a").await;
    store
        .enqueue(session_id, "k1", InboxKind::User, b"one")
        .await
        .unwrap();

    let while_pending = store.release_session(session_id, epoch).await.unwrap();
    let taken = store
        .take_next(session_id, epoch, "runner-a")
        .await
        .unwrap()
        .unwrap();
    store
        .finish_run(session_id, epoch, &outcome(taken.run.id, taken.item.seq, 0))
        .await
        .unwrap();
    let once_drained = store.release_session(session_id, epoch).await.unwrap();
    let next_claim = store
        .claim_session(session_id, "runner-b", LONG_TTL)
        .await
        .unwrap();

    assert!(!while_pending);
    assert!(once_drained);
    assert!(next_claim.claimed, "a released lease is free at once");
    assert!(next_claim.epoch > epoch, "a new claim moves the epoch on");
}

#[sqlx::test(migrations = "./migrations")]
async fn list_claimable_lists_free_or_expired_sessions_with_pending_input(pool: PgPool) {
    let store = Store::new(pool);
    let idle = store.resolve_session("idle", "main", None).await.unwrap();
    let free = store.resolve_session("free", "main", None).await.unwrap();
    let (held, _) = held_session(&store, "held", "runner-a").await;
    let expiring = store
        .resolve_session("expiring", "main", None)
        .await
        .unwrap();
    for session_id in [free.id, held, expiring.id] {
        store
            .enqueue(session_id, "k1", InboxKind::User, b"x")
            .await
            .unwrap();
    }
    store
        .claim_session(expiring.id, "runner-dead", Duration::from_millis(50))
        .await
        .unwrap();

    let claimable = wait_until(
        "the short lease to expire",
        Duration::from_secs(5),
        || async {
            let ids = store.list_claimable(100).await.unwrap();
            (ids.len() == 2).then_some(ids)
        },
    )
    .await;
    let limited = store.list_claimable(1).await.unwrap();

    assert_eq!(claimable, [free.id, expiring.id], "longest waiting first");
    assert!(!claimable.contains(&idle.id));
    assert_eq!(limited, [free.id]);
}

#[sqlx::test(migrations = "./migrations")]
async fn history_returns_the_newest_entries_oldest_first(pool: PgPool) {
    let store = Store::new(pool);
    let (session_id, epoch) = held_session(&store, "s", "runner-a").await;
    let (other_id, other_epoch) = held_session(&store, "other", "runner-a").await;
    let entries: Vec<_> = (1..=5)
        .map(|i| entry(&format!("m{i}"), &format!("{i}")))
        .collect();
    store
        .append_entries(session_id, epoch, &entries)
        .await
        .unwrap();
    store
        .append_entries(other_id, other_epoch, &[entry("m9", "elsewhere")])
        .await
        .unwrap();

    let newest = store.get_history(session_id, 3).await.unwrap();

    let contents: Vec<_> = newest.iter().map(|e| e.content.as_str()).collect();
    assert_eq!(contents, ["3", "4", "5"]);
    assert!(newest.windows(2).all(|w| w[0].seq < w[1].seq));
}

#[sqlx::test(migrations = "./migrations")]
async fn a_history_window_after_a_held_entry_is_a_delta_until_a_reset(pool: PgPool) {
    let store = Store::new(pool);
    let (session_id, epoch) = held_session(&store, "s", "runner-a").await;
    let entries: Vec<_> = (1..=4)
        .map(|i| entry(&format!("m{i}"), &format!("{i}")))
        .collect();
    store
        .append_entries(session_id, epoch, &entries)
        .await
        .unwrap();
    let ask = |after_seq| HistoryAsk {
        limit: 3,
        after_seq,
    };
    let contents = |entries: &[agentloop_memory::Entry]| {
        entries
            .iter()
            .map(|e| e.content.clone())
            .collect::<Vec<_>>()
    };

    let (full_delta, full) = store.history_window(session_id, ask(0)).await.unwrap();
    let (delta, newer) = store
        .history_window(session_id, ask(full[0].seq))
        .await
        .unwrap();
    store.reset_session("s", &Caller::admin()).await.unwrap();
    let (after_reset_delta, after_reset) = store
        .history_window(session_id, ask(full[2].seq))
        .await
        .unwrap();

    assert!(!full_delta);
    assert_eq!(contents(&full), ["2", "3", "4"]);
    assert!(delta, "the held entry exists: only newer ones come");
    assert_eq!(contents(&newer), ["3", "4"]);
    assert!(
        !after_reset_delta,
        "a reset removed the held entry: the whole window comes"
    );
    assert!(after_reset.is_empty());
    let archived: Vec<String> = sqlx::query_scalar(
        "SELECT content FROM transcript_archive WHERE session_id = $1 ORDER BY seq",
    )
    .bind(session_id)
    .fetch_all(store.pool())
    .await
    .unwrap();
    assert_eq!(
        archived,
        ["1", "2", "3", "4"],
        "a reset archives, it does not delete"
    );
}

#[sqlx::test(migrations = "./migrations")]
async fn fenced_writes_to_an_unknown_session_are_not_found(pool: PgPool) {
    let store = Store::new(pool);
    let unknown = Uuid::now_v7();

    let append = store.append_entries(unknown, 1, &[entry("m1", "x")]).await;
    let take = store.take_next(unknown, 1, "runner-a").await;
    let claim = store.claim_session(unknown, "runner-a", LONG_TTL).await;

    assert!(
        matches!(append, Err(MemoryError::SessionNotFound(_))),
        "{append:?}"
    );
    assert!(
        matches!(take, Err(MemoryError::SessionNotFound(_))),
        "{take:?}"
    );
    assert!(
        matches!(claim, Err(MemoryError::SessionNotFound(_))),
        "{claim:?}"
    );
}

/// Starts every call at once and returns their answers in call order.
async fn all<T: Send + 'static>(
    calls: impl IntoIterator<Item = impl std::future::Future<Output = T> + Send + 'static>,
) -> Vec<T> {
    let tasks: Vec<_> = calls.into_iter().map(tokio::spawn).collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.expect("call task"));
    }
    answers
}

/// Enqueues `key`; when `refused`, with a claim whose lease is so long that it overflows
/// Postgres' interval, so the statement carrying it fails.
async fn enqueue_or_refused(
    store: &Store,
    id: Uuid,
    key: &str,
    refused: bool,
) -> Result<agentloop_memory::Enqueued, MemoryError> {
    if refused {
        let ttl = Duration::from_millis(i64::MAX as u64);
        store
            .enqueue_claim_take(id, key, InboxKind::User, b"x", "runner-a", ttl, None)
            .await
            .map(|(enqueued, _, _)| enqueued)
    } else {
        store.enqueue(id, key, InboxKind::User, b"x").await
    }
}

/// A store whose run path has one lane, so calls made together queue behind the first one and
/// share a batch.
fn one_lane_store(pool: PgPool) -> (Store, agentloop_memory::BatchCounters) {
    let counters = agentloop_memory::BatchCounters::default();
    let settings = agentloop_memory::BatchSettings {
        lanes: 1,
        max_items: 64,
    };
    (Store::with_batching(pool, settings, &counters), counters)
}

#[sqlx::test(migrations = "./migrations")]
async fn run_path_batches_keep_to_one_backend_whatever_the_shared_pool_holds(pool: PgPool) {
    let (store, _) = one_lane_store(pool.clone());
    let session = store
        .resolve_session("lane-backend", "main", None)
        .await
        .unwrap();
    // Four connections open in the shared pool at once: it hands its idle ones out oldest
    // first, so batches drawn from it would take turns on all four backends.
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(pool.acquire().await.unwrap());
    }
    drop(held);

    for i in 0..8 {
        store
            .enqueue(session.id, &format!("k{i}"), InboxKind::User, b"x")
            .await
            .unwrap();
        store.get_history(session.id, 10).await.unwrap();
    }

    let mut watcher = sqlx::PgConnection::connect_with(&pool.connect_options())
        .await
        .unwrap();
    let backends: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
         AND pid <> pg_backend_pid() AND query LIKE '%agentloop_enqueue%'",
    )
    .fetch_one(&mut watcher)
    .await
    .unwrap();
    assert_eq!(
        backends, 1,
        "every enqueue batch ran on the lane's one backend"
    );
}

#[sqlx::test(migrations = "./migrations")]
async fn enqueues_and_run_ends_of_many_sessions_share_batches_and_each_gets_its_own_answer(
    pool: PgPool,
) {
    let (store, counters) = one_lane_store(pool.clone());
    let mut sessions = Vec::new();
    for i in 0..16 {
        let session = store
            .resolve_session(&format!("batch-{i}"), "main", None)
            .await
            .unwrap();
        sessions.push(session.id);
    }
    let before = (counters.batches.get(), counters.items.get());

    // Each session enqueues, claims and takes its input; the calls go in descending session
    // order, so the batch (in lock order, ascending) must map its rows back to their callers.
    let mut calling: Vec<(usize, Uuid)> = sessions.iter().copied().enumerate().collect();
    calling.sort_by_key(|&(_, id)| std::cmp::Reverse(id));
    let enqueues = calling.iter().map(|&(i, id)| {
        let store = store.clone();
        async move {
            store
                .enqueue_claim_take(
                    id,
                    &format!("key-{i}"),
                    InboxKind::User,
                    format!("payload-{i}").as_bytes(),
                    "runner-a",
                    LONG_TTL,
                    Some(HistoryAsk {
                        limit: 10,
                        after_seq: 0,
                    }),
                )
                .await
        }
    });
    let answers = all(enqueues).await;
    let mut answers: Vec<_> = calling.iter().map(|&(i, _)| i).zip(answers).collect();
    answers.sort_by_key(|(i, _)| *i);
    let mut taken = Vec::new();
    for (i, answer) in answers {
        let (enqueued, claim, took) = answer.unwrap();
        assert!(enqueued.inserted, "session {i}");
        assert!(claim.claimed, "session {i}: its lease was free");
        let (took, _history) = took.expect("asked to take");
        let took = took.expect("its own input was pending");
        assert_eq!(took.item.idempotency_key, format!("key-{i}"), "session {i}");
        assert_eq!(took.item.payload, format!("payload-{i}").into_bytes());
        assert_eq!(took.item.seq, enqueued.seq);
        taken.push((sessions[i], claim.epoch, took));
    }
    // A second input for session 0 arrives while its run is on.
    let second = store
        .enqueue(sessions[0], "key-0-second", InboxKind::User, b"second")
        .await
        .unwrap();
    assert!(second.inserted);

    // All runs end together; every one but session 0's gives its lease back.
    let finishes = taken.iter().enumerate().map(|(i, (id, epoch, took))| {
        let (store, id, epoch) = (store.clone(), *id, *epoch);
        let run = outcome(took.run.id, took.item.seq, 1);
        let entries = vec![
            entry(&format!("u-{i}"), &format!("question {i}")),
            entry(&format!("a-{i}"), &format!("answer {i}")),
        ];
        async move {
            store
                .finish_run_and_release(id, epoch, run, entries, true)
                .await
        }
    });
    let finished = all(finishes).await;
    for (i, finished) in finished.into_iter().enumerate() {
        let finished = finished.unwrap();
        assert!(finished.finished, "session {i}");
        assert_eq!(
            finished.released,
            i != 0,
            "session {i}: released unless input is pending"
        );
    }
    let after = (counters.batches.get(), counters.items.get());
    let (batches, calls) = (after.0 - before.0, after.1 - before.1);
    assert_eq!(calls, 33, "16 enqueues, a second one and 16 run ends");
    assert!(
        batches < calls,
        "calls made together shared batches ({calls} calls in {batches} batches)"
    );
    assert_eq!(
        counters.fallbacks.get(),
        0,
        "every batch ran as one statement"
    );
    for (i, &id) in sessions.iter().enumerate() {
        let history = store.get_history(id, 10).await.unwrap();
        let contents: Vec<&str> = history.iter().map(|e| e.content.as_str()).collect();
        assert_eq!(
            contents,
            [format!("question {i}"), format!("answer {i}")],
            "session {i}"
        );
    }
    for (id, _, took) in &taken {
        assert_eq!(
            stored_report(&pool, took.run.id).await,
            Some(took.run.id.to_string()),
            "session {id}: each run of a batch keeps its own prompt report"
        );
    }
}

/// Sessions `{prefix}-{i}`, each with its input "first" taken by `runner-a`: (id, epoch, taken).
async fn running_sessions(
    store: &Store,
    prefix: &str,
    n: usize,
) -> Vec<(Uuid, i64, agentloop_memory::Taken)> {
    let mut running = Vec::new();
    for i in 0..n {
        let session = store
            .resolve_session(&format!("{prefix}-{i}"), "main", None)
            .await
            .expect("resolve succeeds");
        let ask = Some(HistoryAsk {
            limit: 10,
            after_seq: 0,
        });
        let (_, claim, took) = store
            .enqueue_claim_take(
                session.id,
                "first",
                InboxKind::User,
                b"1",
                "runner-a",
                LONG_TTL,
                ask,
            )
            .await
            .expect("enqueue succeeds");
        let took = took
            .and_then(|(took, _)| took)
            .expect("its input was taken");
        running.push((session.id, claim.epoch, took));
    }
    running
}

/// Ends each run of `running` (session i writes "question {i}" and asks to give its lease back),
/// every call in a task of its own.
fn spawn_run_ends(
    store: &Store,
    running: &[(Uuid, i64, agentloop_memory::Taken)],
) -> Vec<tokio::task::JoinHandle<Result<agentloop_memory::Finished, MemoryError>>> {
    running
        .iter()
        .enumerate()
        .map(|(i, (id, epoch, took))| {
            let (store, id, epoch) = (store.clone(), *id, *epoch);
            let run = outcome(took.run.id, took.item.seq, 1);
            let entries = vec![entry(&format!("u-{i}"), &format!("question {i}"))];
            tokio::spawn(async move {
                store
                    .finish_run_and_release(id, epoch, run, entries, true)
                    .await
            })
        })
        .collect()
}

/// Holds the one lane of `store` in a batch that waits on a row lock of the returned
/// transaction (the lane is known to wait once Postgres shows the lock wait), so calls made
/// until the transaction ends queue up and go together in the next batch.
async fn hold_the_lane(
    pool: &PgPool,
    store: &Store,
) -> (
    sqlx::Transaction<'static, sqlx::Postgres>,
    tokio::task::JoinHandle<Result<agentloop_memory::Enqueued, MemoryError>>,
) {
    let blocker = store
        .resolve_session("lane-blocker", "main", None)
        .await
        .expect("resolve succeeds")
        .id;
    let mut hold = pool.begin().await.expect("a transaction");
    sqlx::query("SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE")
        .bind(blocker)
        .execute(&mut *hold)
        .await
        .expect("the row is locked");
    let blocked = tokio::spawn({
        let store = store.clone();
        async move { store.enqueue(blocker, "b", InboxKind::User, b"b").await }
    });
    wait_until(
        "the held batch to wait on the lock",
        Duration::from_secs(10),
        || async {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
            )
            .fetch_one(pool)
            .await
            .expect("pg_stat_activity answers");
            (waiting > 0).then_some(())
        },
    )
    .await;
    (hold, blocked)
}

#[sqlx::test(migrations = "./migrations")]
async fn run_ends_and_enqueues_waiting_together_share_one_batch_and_the_run_ends_go_first(
    pool: PgPool,
) {
    let (store, counters) = one_lane_store(pool.clone());
    let running = running_sessions(&store, "mixed", 8).await;
    // Session 0 has a second input pending when its run ends: it keeps its lease.
    store
        .enqueue(running[0].0, "pending", InboxKind::User, b"p")
        .await
        .unwrap();

    let (hold, blocked) = hold_the_lane(&pool, &store).await;
    let before = (counters.batches.get(), counters.items.get());
    let combined_before = counters.combined.get();
    let finishes = spawn_run_ends(&store, &running);
    let enqueues: Vec<_> = running
        .iter()
        .enumerate()
        .map(|(i, (id, _, _))| {
            let (store, id) = (store.clone(), *id);
            tokio::spawn(async move {
                let ask = Some(HistoryAsk {
                    limit: 10,
                    after_seq: 0,
                });
                let key = format!("second-{i}");
                store
                    .enqueue_claim_take(id, &key, InboxKind::User, b"2", "runner-b", LONG_TTL, ask)
                    .await
            })
        })
        .collect();
    // Spawned calls reach the lane's queue at their first poll; give them time to.
    tokio::time::sleep(Duration::from_millis(300)).await;
    hold.commit().await.unwrap();

    assert!(blocked.await.unwrap().unwrap().inserted);
    for (i, finish) in finishes.into_iter().enumerate() {
        let finished = finish.await.unwrap().unwrap();
        assert!(finished.finished, "session {i}");
        assert_eq!(
            finished.released,
            i != 0,
            "session {i}: released unless input is pending"
        );
    }
    for (i, enqueue) in enqueues.into_iter().enumerate() {
        let (enqueued, claim, took) = enqueue.await.unwrap().unwrap();
        assert!(enqueued.inserted, "session {i}");
        if i == 0 {
            assert!(!claim.claimed, "session 0 kept its lease");
            assert_eq!(claim.owner.as_deref(), Some("runner-a"));
            continue;
        }
        assert!(
            claim.claimed,
            "session {i}: the run end before it in the batch gave the lease back"
        );
        assert_eq!(claim.owner.as_deref(), Some("runner-b"));
        let (took, history) = took.expect("asked to take");
        let took = took.expect("its input was pending");
        assert_eq!(took.item.idempotency_key, format!("second-{i}"));
        let contents: Vec<&str> = history.1.iter().map(|e| e.content.as_str()).collect();
        assert_eq!(
            contents,
            [format!("question {i}")],
            "session {i}: the history its own run end wrote"
        );
    }
    let after = (counters.batches.get(), counters.items.get());
    assert_eq!(after.1 - before.1, 16, "8 run ends and 8 enqueues");
    assert_eq!(
        after.0 - before.0,
        1,
        "the calls queued behind the held batch went as one batch"
    );
    assert_eq!(
        counters.combined.get() - combined_before,
        1,
        "one statement carried both kinds"
    );
    assert_eq!(
        counters.fallbacks.get(),
        0,
        "every batch ran as one statement"
    );
    for (_, _, took) in &running {
        assert_eq!(
            stored_report(&pool, took.run.id).await,
            Some(took.run.id.to_string()),
            "a run ended in a batch of both kinds keeps its prompt report"
        );
    }
}

#[sqlx::test(migrations = "./migrations")]
async fn a_bad_call_in_a_batch_of_both_kinds_fails_alone_and_the_rest_stands(pool: PgPool) {
    let (store, counters) = one_lane_store(pool.clone());
    let running = running_sessions(&store, "mixed-bad-run", 4).await;
    let mut idle = Vec::new();
    for i in 0..4 {
        let session = store
            .resolve_session(&format!("mixed-bad-idle-{i}"), "main", None)
            .await
            .unwrap();
        idle.push(session.id);
    }
    let bad = idle[2];

    let (hold, blocked) = hold_the_lane(&pool, &store).await;
    let finishes = spawn_run_ends(&store, &running);
    let enqueues: Vec<_> = idle
        .iter()
        .enumerate()
        .map(|(i, &id)| {
            let store = store.clone();
            tokio::spawn(async move {
                enqueue_or_refused(&store, id, &format!("x-{i}"), id == bad).await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (fallbacks_before, combined_before) = (counters.fallbacks.get(), counters.combined.get());
    hold.commit().await.unwrap();

    assert!(blocked.await.unwrap().unwrap().inserted);
    for (i, finish) in finishes.into_iter().enumerate() {
        let finished = finish.await.unwrap().unwrap();
        assert!(
            finished.finished && finished.released,
            "run end {i}: {finished:?}"
        );
    }
    for (i, (id, enqueue)) in idle.iter().zip(enqueues).enumerate() {
        let answer = enqueue.await.unwrap();
        if *id == bad {
            assert!(
                // A data exception: refused for good, not retried as an outage.
                matches!(answer, Err(MemoryError::InvalidArgument(_))),
                "the overflowing lease is refused: {answer:?}"
            );
        } else {
            assert!(
                answer.as_ref().is_ok_and(|e| e.inserted),
                "enqueue {i}: {answer:?}"
            );
        }
    }
    assert_eq!(
        counters.fallbacks.get() - fallbacks_before,
        2,
        "the batch of both kinds ran its halves apart, and the enqueue half its calls one by one"
    );
    assert_eq!(
        counters.combined.get(),
        combined_before,
        "the refused statement is not counted as a combined batch"
    );
    let stored: Vec<(Uuid, String)> = sqlx::query_as(
        "SELECT session_id, idempotency_key FROM session_inbox WHERE session_id = ANY ($1) \
         ORDER BY idempotency_key",
    )
    .bind(&idle)
    .fetch_all(&pool)
    .await
    .unwrap();
    let expected: Vec<(Uuid, String)> = idle
        .iter()
        .enumerate()
        .filter(|(_, id)| **id != bad)
        .map(|(i, id)| (*id, format!("x-{i}")))
        .collect();
    assert_eq!(
        stored, expected,
        "every input but the refused one is stored, once"
    );
    for (i, (id, _, _)) in running.iter().enumerate() {
        let history = store.get_history(*id, 10).await.unwrap();
        let contents: Vec<&str> = history.iter().map(|e| e.content.as_str()).collect();
        assert_eq!(
            contents,
            [format!("question {i}")],
            "run end {i} wrote its entry, once"
        );
    }
}

#[sqlx::test(migrations = "./migrations")]
async fn a_call_postgres_rejects_fails_alone_and_the_rest_of_its_batch_stands(pool: PgPool) {
    let (store, counters) = one_lane_store(pool.clone());
    let mut sessions = Vec::new();
    for i in 0..8 {
        let session = store
            .resolve_session(&format!("bad-batch-{i}"), "main", None)
            .await
            .unwrap();
        sessions.push(session.id);
    }
    // The bad call is the last in lock order, so the batch fails after the others ran in it.
    let bad = *sessions.iter().max().unwrap();
    let before = (counters.batches.get(), counters.items.get());
    let enqueues = sessions.iter().enumerate().map(|(i, &id)| {
        let store = store.clone();
        async move { enqueue_or_refused(&store, id, &format!("key-{i}"), id == bad).await }
    });
    let answers = all(enqueues).await;
    let after = (counters.batches.get(), counters.items.get());
    assert!(
        after.0 - before.0 < after.1 - before.1,
        "the calls shared a batch"
    );
    assert_eq!(
        counters.fallbacks.get(),
        1,
        "the failed batch ran its calls one by one"
    );
    for (id, answer) in sessions.iter().zip(&answers) {
        if *id == bad {
            assert!(
                // A data exception: refused for good, not retried as an outage.
                matches!(answer, Err(MemoryError::InvalidArgument(_))),
                "the overflowing lease is refused: {answer:?}"
            );
        } else {
            // Inserted by the second, single run: the failed batch left nothing behind.
            assert!(answer.as_ref().is_ok_and(|e| e.inserted), "{answer:?}");
        }
    }
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM session_inbox")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(stored, 7, "every input but the refused one is stored, once");
}

/// One item of a direct `agentloop_finish_many` call.
struct FinishItem {
    session: Uuid,
    epoch: i64,
    run: Uuid,
    seq: i64,
    tokens: i64,
    release: bool,
    entries: Vec<&'static str>,
}

/// Calls `agentloop_finish_many` with `items` as given and returns (held, found, finished,
/// released) per item, in item order.
async fn finish_many(pool: &PgPool, items: &[FinishItem]) -> Vec<(bool, bool, bool, bool)> {
    let col = |f: &dyn Fn(&FinishItem) -> Option<String>| items.iter().map(f).collect::<Vec<_>>();
    let mut ends = Vec::new();
    let mut end = 0_i32;
    for item in items {
        end += item.entries.len() as i32;
        ends.push(end);
    }
    let keys: Vec<String> = items
        .iter()
        .flat_map(|i| i.entries.iter().map(|k| (*k).to_owned()))
        .collect();
    let runs_of_entries: Vec<Uuid> = items
        .iter()
        .flat_map(|i| i.entries.iter().map(|_| i.run))
        .collect();
    let none = vec![None::<String>; keys.len()];
    let rows: Vec<(i32, bool, bool, bool, bool)> = sqlx::query_as(
        "SELECT idx, held, run_found, finished, released FROM agentloop_finish_many($1, $2, $3, \
         $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20) \
         ORDER BY idx",
    )
    .bind(items.iter().map(|i| i.session).collect::<Vec<_>>())
    .bind(items.iter().map(|i| i.epoch).collect::<Vec<_>>())
    .bind(items.iter().map(|i| i.run).collect::<Vec<_>>())
    .bind(items.iter().map(|i| i.seq).collect::<Vec<_>>())
    .bind(col(&|_| Some("completed".to_owned())))
    .bind(col(&|_| None))
    .bind(col(&|_| Some("fake/model".to_owned())))
    .bind(items.iter().map(|i| i.tokens).collect::<Vec<_>>())
    .bind(items.iter().map(|i| i.tokens * 2).collect::<Vec<_>>())
    .bind(col(&|_| Some("fake".to_owned())))
    .bind(col(&|_| None))
    .bind(items.iter().map(|i| i.release).collect::<Vec<_>>())
    .bind(ends)
    .bind(&keys)
    .bind(keys.iter().map(|_| "user").collect::<Vec<_>>())
    .bind(
        keys.iter()
            .map(|k| format!("content of {k}"))
            .collect::<Vec<_>>(),
    )
    .bind(runs_of_entries)
    .bind(&none)
    .bind(&none)
    .bind(&none)
    .fetch_all(pool)
    .await
    .expect("agentloop_finish_many answers");
    assert_eq!(rows.len(), items.len(), "one row per item");
    rows.into_iter()
        .enumerate()
        .map(|(at, (idx, held, found, finished, released))| {
            assert_eq!(idx as usize, at + 1, "rows come back by item");
            (held, found, finished, released)
        })
        .collect()
}

#[sqlx::test(migrations = "./migrations")]
async fn a_batch_of_run_ends_answers_and_writes_for_each_item_what_it_would_alone(pool: PgPool) {
    let store = Store::new(pool.clone());
    let mut started = Vec::new();
    for i in 0..6 {
        let session = store
            .resolve_session(&format!("finish-many-{i}"), "main", None)
            .await
            .unwrap();
        let (_, claim, took) = store
            .enqueue_claim_take(
                session.id,
                &format!("in-{i}"),
                InboxKind::User,
                b"x",
                "runner-a",
                LONG_TTL,
                Some(HistoryAsk {
                    limit: 0,
                    after_seq: 0,
                }),
            )
            .await
            .unwrap();
        let took = took
            .expect("asked to take")
            .0
            .expect("its input was pending");
        started.push((session.id, claim.epoch, took.run.id, took.item.seq));
    }
    // Session 1 gets a second input while its run is on; session 3's run already ended once
    // (lease kept), so the batch carries a retry of it.
    store
        .enqueue(started[1].0, "in-1-second", InboxKind::User, b"y")
        .await
        .unwrap();
    let (s3, e3, r3, q3) = started[3];
    let first_end = store
        .finish_run_and_release(s3, e3, outcome(r3, q3, 1), Vec::new(), false)
        .await
        .unwrap();
    assert!(first_end.finished && !first_end.released);

    let item = |i: usize, entries: Vec<&'static str>| FinishItem {
        session: started[i].0,
        epoch: started[i].1,
        run: started[i].2,
        seq: started[i].3,
        tokens: 5,
        release: true,
        entries,
    };
    let items = vec![
        item(0, vec!["u-0", "a-0"]),
        item(1, vec!["a-1"]),
        // A stale epoch: fenced off, nothing written.
        FinishItem {
            epoch: started[2].1 - 1,
            ..item(2, vec!["a-2"])
        },
        item(3, Vec::new()),
        // Not this session's run: held, so its entry is kept, but nothing else happens.
        FinishItem {
            run: Uuid::now_v7(),
            ..item(4, vec!["a-4"])
        },
        FinishItem {
            release: false,
            ..item(5, vec!["u-5", "a-5"])
        },
    ];
    let answers = finish_many(&pool, &items).await;
    assert_eq!(
        answers,
        vec![
            (true, true, true, true),
            (true, true, true, false),
            (false, false, false, false),
            (true, true, false, true),
            (true, false, false, false),
            (true, true, true, false),
        ],
        "(held, found, finished, released) per item"
    );

    for (i, &(session, _, run, _)) in started.iter().enumerate() {
        let entries: i64 =
            sqlx::query_scalar("SELECT count(*) FROM transcript_entries WHERE session_id = $1")
                .bind(session)
                .fetch_one(&pool)
                .await
                .unwrap();
        let status: String = sqlx::query_scalar("SELECT status FROM runs WHERE id = $1")
            .bind(run)
            .fetch_one(&pool)
            .await
            .unwrap();
        let pending: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM session_inbox WHERE session_id = $1 AND consumed_at IS NULL",
        )
        .bind(session)
        .fetch_one(&pool)
        .await
        .unwrap();
        let (owner, input_tokens): (Option<String>, i64) =
            sqlx::query_as("SELECT lease_owner, input_tokens FROM sessions WHERE id = $1")
                .bind(session)
                .fetch_one(&pool)
                .await
                .unwrap();
        let expected = match i {
            0 => (2, "completed", 0, None, 5),
            1 => (1, "completed", 1, Some("runner-a"), 5),
            2 => (0, "running", 1, Some("runner-a"), 0),
            // Counted once, by its first end.
            3 => (0, "completed", 0, None, 1),
            4 => (1, "running", 1, Some("runner-a"), 0),
            _ => (2, "completed", 0, Some("runner-a"), 5),
        };
        assert_eq!(
            (
                entries,
                status.as_str(),
                pending,
                owner.as_deref(),
                input_tokens
            ),
            expected,
            "session {i}: entries, run status, pending inputs, lease owner, input tokens"
        );
    }

    // One session twice in a batch: the second item sees the first one's release.
    let twice = vec![item(5, Vec::new()), item(5, Vec::new())];
    assert_eq!(
        finish_many(&pool, &twice).await,
        vec![(true, true, false, true), (false, false, false, false)]
    );
}

/// One item of a direct enqueue-batch call.
struct EnqueueItem {
    session: Uuid,
    key: &'static str,
    kind: &'static str,
    payload: &'static [u8],
    owner: Option<&'static str>,
    take: bool,
    /// The transcript seq the caller's history reaches (0: none).
    after: i64,
}

/// What an enqueue-batch item answered, in the terms the scenario checks.
#[derive(Debug, PartialEq)]
struct EnqueueAnswer {
    found: bool,
    inserted: Option<bool>,
    claimed: Option<bool>,
    owner: Option<String>,
    taken_key: Option<String>,
    taken_payload: Option<Vec<u8>>,
    attempts: Option<i32>,
    history: Option<usize>,
    delta: Option<bool>,
}

async fn enqueue_batch(pool: &PgPool, function: &str, items: &[EnqueueItem]) -> Vec<EnqueueAnswer> {
    use sqlx::Row as _;
    let sql = format!("SELECT * FROM {function}($1, $2, $3, $4, $5, $6, $7, $8) ORDER BY idx");
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(items.iter().map(|i| i.session).collect::<Vec<_>>())
        .bind(items.iter().map(|i| i.key).collect::<Vec<_>>())
        .bind(items.iter().map(|i| i.kind).collect::<Vec<_>>())
        .bind(items.iter().map(|i| i.payload.to_vec()).collect::<Vec<_>>())
        .bind(items.iter().map(|i| i.owner).collect::<Vec<_>>())
        .bind(items.iter().map(|_| 60_000_i64).collect::<Vec<_>>())
        .bind(
            items
                .iter()
                .map(|i| i.take.then_some(10_i64))
                .collect::<Vec<_>>(),
        )
        .bind(items.iter().map(|i| i.after).collect::<Vec<_>>())
        .fetch_all(pool)
        .await
        .expect("the enqueue batch answers");
    assert_eq!(rows.len(), items.len(), "one row per item");
    rows.iter()
        .enumerate()
        .map(|(at, row)| {
            assert_eq!(
                row.get::<i32, _>("idx") as usize,
                at + 1,
                "rows come back by item"
            );
            EnqueueAnswer {
                found: row.get("session_found"),
                inserted: row.get("inserted"),
                claimed: row.get("claimed"),
                owner: row.get("owner"),
                taken_key: row.get("taken_key"),
                taken_payload: row.get("taken_payload"),
                attempts: row.get("run_attempts"),
                history: row
                    .get::<Option<Vec<i64>>, _>("h_seq")
                    .map(|seqs| seqs.len()),
                delta: row.get("h_delta"),
            }
        })
        .collect()
}

/// Builds one scenario under `prefix` and runs it through `function`: every kind of item an
/// enqueue batch can carry, each in its own session.
async fn enqueue_scenario(pool: &PgPool, function: &str, prefix: &str) -> Vec<EnqueueAnswer> {
    let store = Store::new(pool.clone());
    let mut ids = Vec::new();
    for i in 1..=9 {
        let session = store
            .resolve_session(&format!("{prefix}-{i}"), "main", None)
            .await
            .expect("the scenario's setup succeeds");
        ids.push(session.id);
    }
    let take = Some(HistoryAsk {
        limit: 0,
        after_seq: 0,
    });
    // Sessions 2 and 9 have one exchange in their transcripts.
    for at in [1, 8] {
        let (_, claim, took) = store
            .enqueue_claim_take(
                ids[at],
                "old",
                InboxKind::User,
                b"o",
                "runner-a",
                LONG_TTL,
                take,
            )
            .await
            .expect("the scenario's setup succeeds");
        let took = took
            .expect("asked to take")
            .0
            .expect("its input was pending");
        let entries = vec![entry("old-u", "question"), entry("old-a", "answer")];
        let ended = store
            .finish_run_and_release(
                ids[at],
                claim.epoch,
                outcome(took.run.id, took.item.seq, 1),
                entries,
                true,
            )
            .await
            .expect("the scenario's setup succeeds");
        assert!(ended.released);
    }
    // Session 9's caller holds its history up to the question already.
    let question: i64 =
        sqlx::query_scalar("SELECT min(seq) FROM transcript_entries WHERE session_id = $1")
            .bind(ids[8])
            .fetch_one(pool)
            .await
            .expect("the scenario's setup succeeds");
    // Session 3 is held by another runner.
    store
        .claim_session(ids[2], "runner-b", LONG_TTL)
        .await
        .expect("the scenario's setup succeeds");
    // Session 5 already has the batch's key pending; sessions 6 and 7 have an older input.
    for (at, key, payload) in [
        (4, "same", &b"stored first"[..]),
        (5, "older", b"older"),
        (6, "older", b"older"),
    ] {
        store
            .enqueue(ids[at], key, InboxKind::User, payload)
            .await
            .expect("the scenario's setup succeeds");
    }
    // Session 8's run was taken under a lease that has expired since.
    store
        .enqueue_claim_take(
            ids[7],
            "interrupted",
            InboxKind::User,
            b"i",
            "runner-b",
            Duration::from_millis(1),
            take,
        )
        .await
        .expect("the scenario's setup succeeds");
    tokio::time::sleep(Duration::from_millis(20)).await;

    let item = |session: Uuid, key: &'static str| EnqueueItem {
        session,
        key,
        kind: "user",
        payload: b"new",
        owner: Some("runner-a"),
        take: true,
        after: 0,
    };
    let items = vec![
        item(Uuid::now_v7(), "nobody"),
        item(ids[0], "fresh"),
        item(ids[1], "again"),
        item(ids[2], "held"),
        EnqueueItem {
            owner: None,
            ..item(ids[3], "plain")
        },
        item(ids[4], "same"),
        item(ids[5], "newer"),
        EnqueueItem {
            kind: "interrupt",
            ..item(ids[6], "stop")
        },
        EnqueueItem {
            owner: None,
            take: false,
            ..item(ids[7], "after")
        },
        EnqueueItem {
            after: question,
            ..item(ids[8], "again")
        },
    ];
    let mut answers = enqueue_batch(pool, function, &items).await;
    // Session 8 again, now asking to take: the interrupted run resumes.
    answers.extend(enqueue_batch(pool, function, &[item(ids[7], "after")]).await);
    answers
}

#[sqlx::test(migrations = "./migrations")]
async fn a_batch_of_enqueues_answers_each_item_as_the_one_by_one_loop_does(pool: PgPool) {
    let answer = |found, inserted, claimed, owner: Option<&str>| EnqueueAnswer {
        found,
        inserted,
        claimed,
        owner: owner.map(str::to_owned),
        taken_key: None,
        taken_payload: None,
        attempts: None,
        history: None,
        delta: None,
    };
    let took = |key: &str, payload: &[u8], attempts, history, delta| EnqueueAnswer {
        taken_key: Some(key.to_owned()),
        taken_payload: Some(payload.to_vec()),
        attempts: Some(attempts),
        history,
        delta,
        ..answer(true, None, Some(true), Some("runner-a"))
    };
    let expected = vec![
        answer(false, None, None, None),
        EnqueueAnswer {
            inserted: Some(true),
            ..took("fresh", b"new", 1, None, Some(false))
        },
        EnqueueAnswer {
            inserted: Some(true),
            ..took("again", b"new", 1, Some(2), Some(false))
        },
        answer(true, Some(true), Some(false), Some("runner-b")),
        answer(true, Some(true), Some(false), None),
        // The stored input is taken, with its own payload.
        EnqueueAnswer {
            inserted: Some(false),
            ..took("same", b"stored first", 1, None, Some(false))
        },
        EnqueueAnswer {
            inserted: Some(true),
            ..took("older", b"older", 1, None, Some(false))
        },
        EnqueueAnswer {
            inserted: Some(true),
            ..took("stop", b"new", 1, None, Some(false))
        },
        // The expired lease is reported as it stands; nobody asked to claim it.
        answer(true, Some(true), Some(false), Some("runner-b")),
        // Only what the caller lacks: the answer after the question.
        EnqueueAnswer {
            inserted: Some(true),
            ..took("again", b"new", 1, Some(1), Some(true))
        },
        // Its key is stored already; the claim resumes the interrupted run, oldest first.
        EnqueueAnswer {
            inserted: Some(false),
            ..took("interrupted", b"i", 2, None, Some(false))
        },
    ];
    for (function, prefix) in [
        ("agentloop_enqueue_many", "set"),
        ("agentloop_enqueue_each", "loop"),
    ] {
        let answers = enqueue_scenario(&pool, function, prefix).await;
        assert_eq!(
            answers.len(),
            expected.len(),
            "{function}: one answer per item"
        );
        for (i, (got, want)) in answers.iter().zip(&expected).enumerate() {
            assert_eq!(got, want, "{function}, item {i}");
        }
    }
}
