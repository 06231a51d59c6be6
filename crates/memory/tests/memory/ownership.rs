//! Session ownership in the store: one rule for every gateway call, a principal sees only its
//! own sessions and an admin sees all.

use std::time::Duration;

use agentloop_memory::{Caller, DispatchLookup, MemoryError, SessionInfo, SessionPatch, Store};
use sqlx::PgPool;
use uuid::Uuid;

fn principal(name: &str) -> Caller {
    Caller {
        principal: Some(name.to_owned()),
        admin: false,
    }
}

#[sqlx::test(migrations = "./migrations")]
async fn a_principal_sees_only_its_own_sessions_and_an_admin_sees_all(pool: PgPool) {
    let store = Store::new(pool);
    let (alice, bob) = (principal("alice"), principal("bob"));
    let owned = store
        .resolve_owned_session("a:1", "main", Some("webchat"), &alice)
        .await
        .unwrap();
    store
        .resolve_session("cli:1", "main", Some("cli"))
        .await
        .unwrap();
    let handle = Uuid::now_v7();
    store
        .begin_dispatch("a:1", "k", handle, owned.id, Duration::from_secs(60))
        .await
        .unwrap();
    let keys = |list: Vec<SessionInfo>| {
        let mut keys: Vec<String> = list.into_iter().map(|s| s.key).collect();
        keys.sort();
        keys
    };
    let not_found =
        |result: Result<_, MemoryError>| matches!(result, Err(MemoryError::SessionNotFound(_)));

    let again = store
        .resolve_owned_session("a:1", "main", None, &alice)
        .await
        .unwrap();
    assert_eq!((again.id, again.created), (owned.id, false));
    let stolen = store.resolve_owned_session("a:1", "main", None, &bob).await;
    assert!(not_found(stolen.map(|s| s.id)));
    let unowned = store
        .resolve_owned_session("cli:1", "main", None, &bob)
        .await;
    assert!(not_found(unowned.map(|s| s.id)));
    for (caller, want) in [
        (&alice, vec!["a:1"]),
        (&bob, vec![]),
        (&Caller::default(), vec!["cli:1"]),
        (&Caller::admin(), vec!["a:1", "cli:1"]),
    ] {
        let list = store.list_sessions(10, None, None, caller).await.unwrap();
        assert_eq!(keys(list), want, "{caller:?}");
    }
    let by_key = store.list_sessions(10, None, Some("a:1"), &bob).await;
    assert!(by_key.unwrap().is_empty(), "a lookup by key is ruled too");
    assert!(not_found(
        store.reset_session("a:1", &bob).await.map(|s| s.id)
    ));
    let patch = SessionPatch {
        queue_mode: Some("steer".into()),
        ..Default::default()
    };
    assert!(not_found(
        store.patch_session("a:1", &patch, &bob).await.map(|s| s.id)
    ));
    let patched = store.patch_session("a:1", &patch, &alice).await.unwrap();
    assert_eq!(patched.owner.as_deref(), Some("alice"));
    let run = DispatchLookup::Run(handle);
    assert!(store.get_dispatch(&run, &bob).await.unwrap().is_none());
    assert!(store.get_dispatch(&run, &alice).await.unwrap().is_some());
    assert!(
        store
            .reset_session("ghost", &Caller::admin())
            .await
            .is_err()
    );
    let admin = Caller::admin();
    let ghosts = store.list_sessions(10, None, Some("ghost"), &admin).await;
    assert!(ghosts.unwrap().is_empty());
}
