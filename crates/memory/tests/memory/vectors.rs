//! Hybrid memory search over the real gRPC API, written as the attack: a caller sends vectors
//! that cannot be compared, or asks with another model's vector or for another user.

use agentloop_proto::v1 as pb;
use sqlx::PgPool;
use tonic::Code;

use crate::grpc::{Running, url_of};

fn scope(user: &str) -> Option<pb::MemoryScope> {
    Some(pb::MemoryScope {
        agent_id: "main".to_owned(),
        user_key: user.to_owned(),
        ..Default::default()
    })
}

fn embedding(model: &str, values: Vec<f32>) -> Option<pb::Embedding> {
    Some(pb::Embedding {
        model: model.to_owned(),
        values,
    })
}

#[sqlx::test(migrations = "./migrations")]
async fn vectors_that_cannot_be_compared_are_refused_and_store_nothing(pool: PgPool) {
    let server = Running::start(url_of(&pool)).await;
    server.wait_ready().await;
    let mut client = server.client.clone();
    let bad = [
        embedding("m", vec![f32::NAN, 1.0]),
        embedding("m", vec![f32::INFINITY]),
        embedding("m", vec![0.0, 0.0]),
        embedding("m", Vec::new()),
        embedding("", vec![1.0]),
        embedding("m", vec![1.0; 4097]),
    ];
    for (i, vector) in bad.into_iter().enumerate() {
        let saved = client
            .save_memory(pb::SaveMemoryRequest {
                scope: scope("mallory"),
                text: format!("poisoned {i}"),
                embedding: vector.clone(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(saved.code(), Code::InvalidArgument, "save {i}: {saved:?}");
        let searched = client
            .search_memories(pb::SearchMemoriesRequest {
                scope: scope("mallory"),
                query: "anything".to_owned(),
                query_embedding: vector,
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(
            searched.code(),
            Code::InvalidArgument,
            "search {i}: {searched:?}"
        );
    }
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM memories")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(stored, 0);
    server.stop().await;
}

#[sqlx::test(migrations = "./migrations")]
async fn a_vector_finds_only_the_callers_memories_of_the_same_model_and_length(pool: PgPool) {
    let server = Running::start(url_of(&pool)).await;
    server.wait_ready().await;
    let mut client = server.client.clone();
    for (user, text, model, values) in [
        (
            "alice",
            "Alice's locker code is 1234",
            "m",
            vec![1.0, 0.0, 0.0],
        ),
        (
            "alice",
            "Alice's bike is green",
            "other",
            vec![1.0, 0.0, 0.0],
        ),
        ("alice", "Alice naps at noon", "m", vec![1.0, 0.0]),
        ("bob", "Bob's locker code is 9876", "m", vec![1.0, 0.0, 0.0]),
    ] {
        client
            .save_memory(pb::SaveMemoryRequest {
                scope: scope(user),
                text: text.to_owned(),
                embedding: embedding(model, values),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let found = client
        .search_memories(pb::SearchMemoriesRequest {
            scope: scope("alice"),
            query: "zzz".to_owned(),
            limit: 10,
            min_score: 0.1,
            query_embedding: embedding("m", vec![1.0, 0.0, 0.0]),
        })
        .await
        .unwrap()
        .into_inner();
    let texts: Vec<&str> = found.memories.iter().map(|m| m.text.as_str()).collect();
    assert_eq!(
        texts,
        ["Alice's locker code is 1234"],
        "another model's vector, another length and another user's memory stay out"
    );
    assert!(found.hybrid);
    server.stop().await;
}
