//! What waits in memory, as the gauges read it: live sessions, pending inputs by kind, stuck
//! sessions (a held lease with an input waiting too long).

use std::time::Duration;

use agentloop_memory::{InboxKind, Store};
use sqlx::PgPool;

#[sqlx::test(migrations = "./migrations")]
async fn held_sessions_pending_inputs_and_a_stuck_session_are_counted(pool: PgPool) {
    // Arrange: three sessions. `idle` has an input but no lease; `busy` holds its lease with a
    // fresh input; `stuck` holds its lease with an input enqueued an hour ago.
    let store = Store::new(pool.clone());
    let mut ids = Vec::new();
    for key in ["cli:idle", "cli:busy", "cli:stuck"] {
        let session = store.resolve_session(key, "main", None).await.unwrap();
        ids.push(session.id);
    }
    let (idle, busy, stuck) = (ids[0], ids[1], ids[2]);
    store
        .enqueue(idle, "i1", InboxKind::User, b"x")
        .await
        .unwrap();
    store
        .enqueue(busy, "b1", InboxKind::Followup, b"x")
        .await
        .unwrap();
    store
        .enqueue(busy, "b2", InboxKind::Followup, b"x")
        .await
        .unwrap();
    store
        .enqueue(stuck, "s1", InboxKind::Steer, b"x")
        .await
        .unwrap();
    for id in [busy, stuck] {
        let claim = store
            .claim_session(id, "runner-1", Duration::from_secs(60))
            .await
            .unwrap();
        assert!(claim.claimed);
    }
    sqlx::query(
        "UPDATE session_inbox SET enqueued_at = now() - interval '1 hour' WHERE session_id = $1",
    )
    .bind(stuck)
    .execute(&pool)
    .await
    .unwrap();

    // Act
    let waiting = store.waiting(600_000).await.unwrap();

    // Assert
    assert_eq!(waiting.sessions_active, 2);
    assert_eq!(
        waiting.sessions_stuck, 1,
        "only the held session with an old input"
    );
    let pending = |kind: &str| {
        waiting
            .inbox_pending
            .iter()
            .find(|(k, _)| k == kind)
            .map(|(_, n)| *n)
    };
    assert_eq!(pending("user"), Some(1));
    assert_eq!(pending("followup"), Some(2));
    assert_eq!(pending("steer"), Some(1));
    assert_eq!(
        pending("interrupt"),
        Some(0),
        "every kind is reported, zero too"
    );
    assert_eq!(waiting.approvals_pending, 0);

    // An old input in a session nobody holds is waiting, not stuck; a higher threshold
    // makes nothing stuck.
    assert_eq!(store.waiting(7_200_000).await.unwrap().sessions_stuck, 0);
}
