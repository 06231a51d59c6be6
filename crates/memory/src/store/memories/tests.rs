use sqlx::PgPool;

use super::*;

async fn session(store: &Store, key: &str, owner: Option<&str>) -> Uuid {
    let id = Uuid::now_v7();
    sqlx::query("INSERT INTO sessions (id, key, owner) VALUES ($1, $2, $3)")
        .bind(id)
        .bind(key)
        .bind(owner)
        .execute(store.shared.pool())
        .await
        .unwrap();
    id
}

fn of_session(session: Uuid, sender: &str) -> MemoryScope {
    MemoryScope {
        agent_id: "main".into(),
        session_id: Some(session),
        sender_id: sender.into(),
        channel: "cli".into(),
        ..Default::default()
    }
}

#[sqlx::test(migrations = "./migrations")]
async fn a_memory_is_found_by_a_paraphrase_and_only_by_its_user(pool: PgPool) {
    let store = Store::new(pool);
    let a1 = session(&store, "a-first", None).await;
    let a2 = session(&store, "a-second", None).await;
    let b = session(&store, "b", None).await;
    let saved = store
        .save_memory(
            &of_session(a1, "alice"),
            "Alice drinks green tea every morning",
            "tool",
        )
        .await
        .unwrap();
    assert_eq!(saved.user_key, "sender:cli:alice");

    let found = store
        .search_memories(&of_session(a2, "alice"), "What tea do I drink?", 5, 0.0)
        .await
        .unwrap()
        .0;
    assert_eq!(
        found.len(),
        1,
        "the same sender in another session finds it"
    );
    assert!(found[0].score > 0.0);
    let other = store
        .search_memories(&of_session(b, "bob"), "What tea do I drink?", 5, 0.0)
        .await
        .unwrap()
        .0;
    assert!(other.is_empty(), "another user finds nothing: {other:?}");
}

#[sqlx::test(migrations = "./migrations")]
async fn a_gateway_principal_wins_over_the_sender_id_a_client_names(pool: PgPool) {
    let store = Store::new(pool);
    let alice = session(&store, "web:a", Some("alice")).await;
    let mallory = session(&store, "web:m", Some("mallory")).await;
    store
        .save_memory(&of_session(alice, "x"), "The vault code is 4711", "tool")
        .await
        .unwrap();
    // Mallory's client says it is Alice's sender.
    let stolen = store
        .search_memories(&of_session(mallory, "x"), "vault code", 5, 0.0)
        .await
        .unwrap()
        .0;
    assert!(stolen.is_empty(), "{stolen:?}");
    let by_principal = MemoryScope {
        agent_id: "main".into(),
        principal: "alice".into(),
        ..Default::default()
    };
    let (user, listed) = store.list_memories(&by_principal, 10).await.unwrap();
    assert_eq!(user, "principal:alice");
    assert_eq!(listed.len(), 1);
}

#[sqlx::test(migrations = "./migrations")]
async fn saving_the_same_text_twice_keeps_one_and_forget_removes_it(pool: PgPool) {
    let store = Store::new(pool);
    let s = session(&store, "k", None).await;
    let scope = of_session(s, "");
    let first = store
        .save_memory(&scope, "likes jazz", "tool")
        .await
        .unwrap();
    let again = store
        .save_memory(&scope, " likes jazz ", "tool")
        .await
        .unwrap();
    assert_eq!(first.id, again.id);
    assert_eq!(
        first.user_key, "session:k",
        "no sender: the session is the user"
    );

    let forgotten = store
        .forget_memories(&scope, None, "jazz music", 0.0)
        .await
        .unwrap();
    assert_eq!(forgotten, vec![first.id]);
    assert!(
        store
            .search_memories(&scope, "jazz", 5, 0.0)
            .await
            .unwrap()
            .0
            .is_empty()
    );
    assert!(matches!(
        store.forget_memories(&scope, None, " ", 0.0).await,
        Err(MemoryError::InvalidArgument(_))
    ));
    assert!(matches!(
        store.save_memory(&scope, "  ", "tool").await,
        Err(MemoryError::InvalidArgument(_))
    ));
}

#[sqlx::test(migrations = "./migrations")]
async fn memories_are_kept_per_agent(pool: PgPool) {
    let store = Store::new(pool);
    let s = session(&store, "k", None).await;
    let main = of_session(s, "u");
    let other = MemoryScope {
        agent_id: "coder".into(),
        ..main.clone()
    };
    store
        .save_memory(&main, "prefers metric units", "tool")
        .await
        .unwrap();
    assert!(
        store
            .search_memories(&other, "units", 5, 0.0)
            .await
            .unwrap()
            .0
            .is_empty()
    );
    assert_eq!(
        store
            .search_memories(&main, "units", 5, 0.0)
            .await
            .unwrap()
            .0
            .len(),
        1
    );
    let (_, none_for_other) = store
        .search_memories(&other, "units", 5, 0.0)
        .await
        .unwrap();
    assert!(
        none_for_other,
        "the other agent holds no memories of the user"
    );
    let (found, none) = store
        .search_memories(&main, "weather", 5, 0.0)
        .await
        .unwrap();
    assert!(found.is_empty());
    assert!(!none, "no match is not the same as nothing stored");
}

#[sqlx::test(migrations = "./migrations")]
async fn a_skills_snapshot_holds_until_a_reset_retires_it(pool: PgPool) {
    let store = Store::new(pool);
    let s = session(&store, "k", None).await;
    assert_eq!(store.skill_snapshot(s).await.unwrap(), None);
    let first = store.save_skill_snapshot(s, "d1", "[]").await.unwrap();
    assert_eq!((first.version, first.digest.as_str()), (1, "d1"));
    let kept = store.save_skill_snapshot(s, "d2", "[1]").await.unwrap();
    assert_eq!(kept, first, "a current snapshot is kept");

    let caller = super::super::Caller {
        principal: None,
        admin: true,
    };
    store.reset_session("k", &caller).await.unwrap();
    assert_eq!(store.skill_snapshot(s).await.unwrap(), None);
    let second = store.save_skill_snapshot(s, "d2", "[1]").await.unwrap();
    assert_eq!((second.version, second.digest.as_str()), (2, "d2"));
}
