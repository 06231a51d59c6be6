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
        .search_memories(
            &of_session(a2, "alice"),
            "What tea do I drink?",
            None,
            5,
            0.0,
        )
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
        .search_memories(&of_session(b, "bob"), "What tea do I drink?", None, 5, 0.0)
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
        .search_memories(&of_session(mallory, "x"), "vault code", None, 5, 0.0)
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
            .search_memories(&scope, "jazz", None, 5, 0.0)
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
            .search_memories(&other, "units", None, 5, 0.0)
            .await
            .unwrap()
            .0
            .is_empty()
    );
    assert_eq!(
        store
            .search_memories(&main, "units", None, 5, 0.0)
            .await
            .unwrap()
            .0
            .len(),
        1
    );
    let (_, none_for_other) = store
        .search_memories(&other, "units", None, 5, 0.0)
        .await
        .unwrap();
    assert!(
        none_for_other,
        "the other agent holds no memories of the user"
    );
    let (found, none) = store
        .search_memories(&main, "weather", None, 5, 0.0)
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

fn vector(model: &str, values: &[f32]) -> Embedding {
    Embedding::new(model, values.to_vec()).unwrap()
}

#[sqlx::test(migrations = "./migrations")]
async fn hybrid_search_finds_by_vector_only_the_users_own_and_only_of_the_same_model(pool: PgPool) {
    let store = Store::new(pool);
    let a = session(&store, "a", None).await;
    let b = session(&store, "b", None).await;
    let (alice, bob) = (of_session(a, "alice"), of_session(b, "bob"));
    let near = [1.0, 0.1, 0.0];
    store
        .save_or_replace_memory(
            &alice,
            None,
            "Born in Rotterdam",
            "tool",
            Some(&vector("m1", &near)),
        )
        .await
        .unwrap();
    store
        .save_or_replace_memory(
            &alice,
            None,
            "Likes cycling",
            "tool",
            Some(&vector("m1", &[0.0, 0.0, 1.0])),
        )
        .await
        .unwrap();
    store
        .save_or_replace_memory(
            &alice,
            None,
            "Has a cat",
            "tool",
            Some(&vector("m2", &near)),
        )
        .await
        .unwrap();
    store
        .save_or_replace_memory(
            &bob,
            None,
            "Bob was born in Utrecht",
            "tool",
            Some(&vector("m1", &near)),
        )
        .await
        .unwrap();

    // The question shares no word with the fact; only the vector finds it.
    let query = vector("m1", &[1.0, 0.0, 0.0]);
    let (found, none) = store
        .search_memories(&alice, "Am I a Rotterdammer?", Some(&query), 5, 0.3)
        .await
        .unwrap();
    let texts: Vec<&str> = found.iter().map(|m| m.text.as_str()).collect();
    assert_eq!(
        texts,
        ["Born in Rotterdam"],
        "m2's vector and Bob's memory stay out"
    );
    assert!(found[0].score > 0.6 && found[0].score <= hybrid::VECTOR_WEIGHT + 1e-6);
    assert!(!none);
    let text_only = store
        .search_memories(&alice, "Am I a Rotterdammer?", None, 5, 0.0)
        .await
        .unwrap()
        .0;
    assert!(
        text_only.is_empty(),
        "full text alone finds nothing: {text_only:?}"
    );

    // A word match without a near vector still counts, with the text's share.
    let away = vector("m1", &[0.0, -1.0, 0.0]);
    let (by_word, _) = store
        .search_memories(&alice, "cycling", Some(&away), 5, 0.001)
        .await
        .unwrap();
    let texts: Vec<&str> = by_word.iter().map(|m| m.text.as_str()).collect();
    assert_eq!(texts, ["Likes cycling"]);
    assert!(by_word[0].score > 0.0 && by_word[0].score <= 1.0 - hybrid::VECTOR_WEIGHT + 1e-6);
}

#[sqlx::test(migrations = "./migrations")]
async fn replacing_a_memory_drops_the_old_texts_vector(pool: PgPool) {
    let store = Store::new(pool);
    let a = session(&store, "a", None).await;
    let alice = of_session(a, "alice");
    let query = vector("m1", &[1.0, 0.0]);
    let saved = store
        .save_or_replace_memory(&alice, None, "Lives in Delft", "learned", Some(&query))
        .await
        .unwrap();
    store
        .save_or_replace_memory(&alice, Some(saved.id), "Lives in Leiden", "learned", None)
        .await
        .unwrap();
    let found = store
        .search_memories(&alice, "whereabouts", Some(&query), 5, 0.1)
        .await
        .unwrap()
        .0;
    assert!(
        found.is_empty(),
        "the new text is not found by the old vector: {found:?}"
    );
    // Saving the same text again with a vector gives it one.
    store
        .save_or_replace_memory(&alice, None, "Lives in Leiden", "learned", Some(&query))
        .await
        .unwrap();
    let found = store
        .search_memories(&alice, "whereabouts", Some(&query), 5, 0.1)
        .await
        .unwrap()
        .0;
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].id, saved.id);
}

#[sqlx::test(migrations = "./migrations")]
async fn a_replica_keeping_a_users_vectors_sees_another_replicas_saves_and_forgets(pool: PgPool) {
    let searching = Store::new(pool.clone());
    let writing = Store::new(pool);
    let a = session(&searching, "a", None).await;
    let alice = of_session(a, "alice");
    let near = vector("m1", &[1.0, 0.0]);
    let far = vector("m1", &[0.0, 1.0]);
    let first = writing
        .save_or_replace_memory(&alice, None, "Rides a blue bicycle", "tool", Some(&near))
        .await
        .unwrap();
    let found = |store: &Store| {
        let (store, alice, near) = (store.clone(), alice.clone(), near.clone());
        async move {
            let (found, _) = store
                .search_memories(&alice, "two wheels", Some(&near), 5, 0.5)
                .await
                .unwrap();
            found.into_iter().map(|m| m.text).collect::<Vec<_>>()
        }
    };
    assert_eq!(found(&searching).await, ["Rides a blue bicycle"]);

    // Another replica adds one: the next search here sees it.
    writing
        .save_or_replace_memory(&alice, None, "Owns a red tandem", "tool", Some(&near))
        .await
        .unwrap();
    let mut now = found(&searching).await;
    now.sort();
    assert_eq!(now, ["Owns a red tandem", "Rides a blue bicycle"]);

    // ...replaces one with a text of another meaning (the count stays the same)...
    writing
        .save_or_replace_memory(
            &alice,
            Some(first.id),
            "Swims on Mondays",
            "tool",
            Some(&far),
        )
        .await
        .unwrap();
    assert_eq!(found(&searching).await, ["Owns a red tandem"]);

    // ...and forgets one.
    writing
        .forget_memories(&alice, None, "tandem", 0.0)
        .await
        .unwrap();
    assert!(found(&searching).await.is_empty());
}

#[sqlx::test(migrations = "./migrations")]
async fn a_backfilled_vector_lands_only_on_a_memory_still_holding_its_text(pool: PgPool) {
    let store = Store::new(pool);
    let a = session(&store, "a", None).await;
    let alice = of_session(a, "alice");
    let saved = store
        .save_memory(&alice, "Plays chess on Fridays", "tool")
        .await
        .unwrap();
    let to_embed = store.memories_to_embed("m1", None, 10).await.unwrap();
    assert_eq!(to_embed.len(), 1);
    let vector = vector("m1", &[1.0, 0.0]);
    assert!(
        !store
            .set_memory_embedding(saved.id, "Plays go on Fridays", &vector)
            .await
            .unwrap(),
        "the text changed since it was listed"
    );
    assert!(
        store
            .set_memory_embedding(saved.id, "Plays chess on Fridays", &vector)
            .await
            .unwrap()
    );
    assert!(
        store
            .memories_to_embed("m1", None, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        store.memories_to_embed("m2", None, 10).await.unwrap().len(),
        1
    );
}

#[sqlx::test(migrations = "./migrations")]
async fn hybrid_search_scores_only_the_users_newest_memories(pool: PgPool) {
    // One more memory than a hybrid search reads: the newest and the oldest lie on the query's
    // vector, every other one away from it; each is a second older than the one before.
    let store = Store::new(pool);
    let user = MemoryScope {
        agent_id: "main".into(),
        user_key: "user:hoarder".into(),
        ..Default::default()
    };
    let query = vector("m1", &[1.0, 0.0, 0.0]);
    sqlx::query(
        "INSERT INTO memories (id, agent_id, user_key, text, embedding, embedding_model, \
                               created_at, updated_at) \
         SELECT gen_random_uuid(), 'main', 'user:hoarder', 'fact ' || i, \
                CASE WHEN i IN (1, $1) THEN $2 ELSE $3 END, 'm1', \
                now() - i * interval '1 second', now() - i * interval '1 second' \
         FROM generate_series(1, $1) AS i",
    )
    .bind(MAX_VECTOR_CANDIDATES + 1)
    .bind(query.to_bytes())
    .bind(vector("m1", &[0.0, 1.0, 0.0]).to_bytes())
    .execute(store.shared.pool())
    .await
    .unwrap();

    let (found, _) = store
        .search_memories(&user, "zzz", Some(&query), 5, 0.5)
        .await
        .unwrap();

    let texts: Vec<&str> = found.iter().map(|m| m.text.as_str()).collect();
    assert_eq!(
        texts,
        ["fact 1"],
        "the oldest memory is past the newest {MAX_VECTOR_CANDIDATES} and is not read"
    );
}
