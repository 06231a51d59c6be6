//! The per-session inbox cap (`memory.inbox_max_pending`, migration 0012): an input past it is
//! refused as queue full, a repeated key is still answered as a duplicate, and a consumed
//! input makes room again. Through the store, and through each enqueue function directly.

use std::time::Duration;

use agentloop_memory::{InboxKind, RunOutcome, RunStatus, Store};
use sqlx::PgPool;
use uuid::Uuid;

const LONG_TTL: Duration = Duration::from_secs(60);

/// The number of pending (unconsumed) inputs of a session.
async fn pending(pool: &PgPool, session: Uuid) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM session_inbox WHERE session_id = $1 AND consumed_at IS NULL",
    )
    .bind(session)
    .fetch_one(pool)
    .await
    .expect("the inbox can be counted")
}

#[sqlx::test(migrations = "./migrations")]
async fn the_cap_refuses_one_input_too_many_until_one_is_consumed(pool: PgPool) {
    let store = Store::new(pool.clone());
    store.set_inbox_max_pending(2).await.unwrap();
    let session = store.resolve_session("s", "main", None).await.unwrap();
    let other = store.resolve_session("t", "main", None).await.unwrap();

    let first = store
        .enqueue(session.id, "k1", InboxKind::User, b"one")
        .await
        .unwrap();
    let second = store
        .enqueue(session.id, "k2", InboxKind::User, b"two")
        .await
        .unwrap();
    let refused = store
        .enqueue(session.id, "k3", InboxKind::User, b"three")
        .await
        .unwrap();
    let repeat = store
        .enqueue(session.id, "k1", InboxKind::User, b"one again")
        .await
        .unwrap();
    let elsewhere = store
        .enqueue(other.id, "k3", InboxKind::User, b"three")
        .await
        .unwrap();

    assert!(first.inserted && second.inserted);
    assert!(!first.queue_full && !second.queue_full);
    assert!(refused.queue_full, "{refused:?}");
    assert!(!refused.inserted);
    assert_eq!(refused.seq, 0);
    // A full inbox still tells a redelivery it is a duplicate, not refused.
    assert!(!repeat.queue_full && !repeat.inserted, "{repeat:?}");
    assert_eq!(repeat.seq, first.seq);
    // The cap is per session.
    assert!(elsewhere.inserted && !elsewhere.queue_full);
    assert_eq!(pending(&pool, session.id).await, 2);

    // One input consumed: room for one more, and no more than that.
    let claim = store
        .claim_session(session.id, "runner-a", LONG_TTL)
        .await
        .unwrap();
    let taken = store
        .take_next(session.id, claim.epoch, "runner-a")
        .await
        .unwrap()
        .expect("an input is pending");
    assert_eq!(taken.item.idempotency_key, "k1");
    let finished = store
        .finish_run(
            session.id,
            claim.epoch,
            &RunOutcome {
                run_id: taken.run.id,
                inbox_seq: taken.item.seq,
                status: RunStatus::Completed,
                error: None,
                model: None,
                input_tokens: 0,
                output_tokens: 0,
                provider: None,
                profile: None,
                prompt_report: None,
            },
        )
        .await
        .unwrap();
    assert!(finished);
    let again = store
        .enqueue(session.id, "k3", InboxKind::User, b"three")
        .await
        .unwrap();
    let over = store
        .enqueue(session.id, "k4", InboxKind::User, b"four")
        .await
        .unwrap();
    assert!(again.inserted && !again.queue_full, "{again:?}");
    assert!(over.queue_full, "{over:?}");

    // 0 lifts the cap.
    store.set_inbox_max_pending(0).await.unwrap();
    let uncapped = store
        .enqueue(session.id, "k4", InboxKind::User, b"four")
        .await
        .unwrap();
    assert!(uncapped.inserted && !uncapped.queue_full);
    assert_eq!(pending(&pool, session.id).await, 3);
}

/// One item's answer from a batch enqueue function: (inserted, seq, claimed, taken key).
type Answer = (Option<bool>, Option<i64>, Option<bool>, Option<String>);

async fn batch(pool: &PgPool, function: &str, items: &[(Uuid, &str, Option<&str>)]) -> Vec<Answer> {
    use sqlx::Row as _;
    let sql = format!("SELECT * FROM {function}($1, $2, $3, $4, $5, $6, $7, $8) ORDER BY idx");
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(items.iter().map(|i| i.0).collect::<Vec<_>>())
        .bind(items.iter().map(|i| i.1).collect::<Vec<_>>())
        .bind(items.iter().map(|_| "user").collect::<Vec<_>>())
        .bind(items.iter().map(|_| b"x".to_vec()).collect::<Vec<_>>())
        .bind(items.iter().map(|i| i.2).collect::<Vec<_>>())
        .bind(items.iter().map(|_| 60_000_i64).collect::<Vec<_>>())
        .bind(
            items
                .iter()
                .map(|i| i.2.map(|_| 10_i64))
                .collect::<Vec<_>>(),
        )
        .bind(items.iter().map(|_| 0_i64).collect::<Vec<_>>())
        .fetch_all(pool)
        .await
        .expect("the enqueue batch answers");
    rows.iter()
        .map(|row| {
            (
                row.get("inserted"),
                row.get("seq"),
                row.get("claimed"),
                row.get("taken_key"),
            )
        })
        .collect()
}

#[sqlx::test(migrations = "./migrations")]
async fn every_enqueue_function_answers_a_refused_input_as_neither_inserted_nor_found(
    pool: PgPool,
) {
    let store = Store::new(pool.clone());
    store.set_inbox_max_pending(1).await.unwrap();
    let a = store.resolve_session("a", "main", None).await.unwrap().id;
    let b = store.resolve_session("b", "main", None).await.unwrap().id;
    for session in [a, b] {
        let first = store
            .enqueue(session, "k1", InboxKind::User, b"one")
            .await
            .unwrap();
        assert!(first.inserted);
    }

    // Set-based (distinct sessions): a refused item with a claim still claims the free lease
    // and takes the input already pending, never the refused one; a repeat finds its row.
    let set_based = batch(
        &pool,
        "agentloop_enqueue_many",
        &[(a, "k2", Some("runner-a")), (b, "k1", None)],
    )
    .await;
    assert_eq!(
        set_based[0],
        (Some(false), None, Some(true), Some("k1".to_owned()))
    );
    assert!(matches!(
        set_based[1],
        (Some(false), Some(_), Some(false), None)
    ));

    // One session twice: the item-by-item variant, the same answers.
    let each = batch(
        &pool,
        "agentloop_enqueue_many",
        &[(b, "k2", None), (b, "k1", None)],
    )
    .await;
    assert_eq!(each[0], (Some(false), None, Some(false), None));
    assert!(matches!(each[1], (Some(false), Some(_), Some(false), None)));

    assert_eq!(pending(&pool, a).await, 1);
    assert_eq!(pending(&pool, b).await, 1);
}
