//! Hybrid memory search end to end: with `memory.embeddings_model` set, the runner embeds every
//! memory it saves and every recall query through the fake model's `/v1/embeddings`, so a fact
//! is recalled by a question that shares no word with it; when embedding fails, memory falls
//! back to full text instead of failing the run.

use agentloop_agent_runner::RunnerConfig;
use agentloop_fake_model::Failure;

use crate::harness::{Sandbox, SandboxOptions};
use crate::knowledge::{ask, system_for};

const EMBEDDINGS: &str = "fake-embed";

fn embeddings_asked_for(sandbox: &Sandbox, text: &str) -> bool {
    sandbox.fake.requests().iter().any(|r| {
        r.path == "/v1/embeddings"
            && r.body["model"] == EMBEDDINGS
            && r.body["input"].to_string().contains(text)
    })
}

#[tokio::test]
async fn hybrid_recall_finds_a_fact_sharing_no_word_with_the_question_and_falls_back_to_full_text()
{
    let options = SandboxOptions {
        runner: Some(Box::new(|config: &mut RunnerConfig| {
            config.memory.embeddings_model = format!("openai/{EMBEDDINGS}");
        })),
        ..Default::default()
    };
    let sandbox = Sandbox::start_with(options).await.unwrap();
    let mut replies = sandbox.subscribe("deliver.>").await;
    let fact = "I was born in Rotterdam";
    let save = format!(r#"[[tool:memory_save:{{"text":"{fact}"}}]]"#);
    let saved = ask(&sandbox, &mut replies, "ann-1", "ann", "", &save).await;
    assert!(saved.contains("\"id\""), "{saved}");
    assert!(
        embeddings_asked_for(&sandbox, fact),
        "the saved fact was embedded"
    );

    // No word in common ("Rotterdammer" does not stem to "Rotterdam"): only the vector finds it.
    let question = "Am I a Rotterdammer?";
    ask(&sandbox, &mut replies, "ann-2", "ann", "", question).await;
    assert!(
        embeddings_asked_for(&sandbox, question),
        "the question was embedded"
    );
    let system = system_for(&sandbox, question);
    assert!(
        system.contains(&format!("- {fact}")),
        "not recalled by its vector: {system}"
    );

    let unrelated = "What should I cook tonight?";
    ask(&sandbox, &mut replies, "ann-2", "ann", "", unrelated).await;
    let system = system_for(&sandbox, unrelated);
    assert!(
        !system.contains("Rotterdam"),
        "an unrelated question recalled it: {system}"
    );

    // Another user's question, however close its vector, never reaches Ann's memory.
    let bobs = "Am I a Rotterdammer, Bob asks?";
    ask(&sandbox, &mut replies, "bob-1", "bob", "", bobs).await;
    let system = system_for(&sandbox, bobs);
    assert!(
        !system.contains("Rotterdam\n") && !system.contains(fact),
        "{system}"
    );

    // The embeddings endpoint fails: saves and recall go on by words alone.
    sandbox
        .fake
        .state()
        .fail_model(EMBEDDINGS, Some(Failure::Server));
    let cello = r#"[[tool:memory_save:{"text":"Ann plays the cello on Sundays"}]]"#;
    let saved = ask(&sandbox, &mut replies, "ann-3", "ann", "", cello).await;
    assert!(
        saved.contains("\"id\""),
        "a save without a vector still stores: {saved}"
    );
    let by_words = "When do I play the cello?";
    let answer = ask(&sandbox, &mut replies, "ann-4", "ann", "", by_words).await;
    assert!(!answer.is_empty());
    let system = system_for(&sandbox, by_words);
    assert!(
        system.contains("- Ann plays the cello on Sundays"),
        "full-text recall did not take over: {system}"
    );
    assert!(
        !system.contains(fact),
        "the fallback is full text, not everything: {system}"
    );
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_backfill_gives_memories_saved_before_the_embeddings_model_their_vectors_once() {
    // Saved while no embeddings model was set: found by words only.
    let sandbox = Sandbox::start().await.unwrap();
    let mut replies = sandbox.subscribe("deliver.>").await;
    for fact in [
        "I was born in Rotterdam",
        "I keep two cats",
        "I cycle to work",
    ] {
        let save = format!(r#"[[tool:memory_save:{{"text":"{fact}"}}]]"#);
        let saved = ask(&sandbox, &mut replies, "cy-1", "cy", "", &save).await;
        assert!(saved.contains("\"id\""), "{saved}");
    }
    let pool = sandbox.pool().await.unwrap();
    let embedded = || async {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM memories WHERE embedding_model = 'openai/fake-embed'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        n
    };
    assert_eq!(embedded().await, 0);

    let mut config = RunnerConfig::default();
    config.memory.url = sandbox.memory_url.clone();
    config.models.openai_base_url = sandbox.fake.openai_base_url();
    let missing = agentloop_agent_runner::backfill_embeddings(&config, 2, |_| {}).await;
    assert!(
        matches!(missing, Err(agentloop_agent_runner::BackfillError::NoModel)),
        "{missing:?}"
    );

    config.memory.embeddings_model = format!("openai/{EMBEDDINGS}");
    let mut pages = Vec::new();
    let done = agentloop_agent_runner::backfill_embeddings(&config, 2, |d| pages.push(d.embedded))
        .await
        .unwrap();
    assert_eq!((done.embedded, done.changed), (3, 0));
    assert_eq!(pages, [2, 3], "two pages of at most two");
    assert_eq!(embedded().await, 3);
    let again = agentloop_agent_runner::backfill_embeddings(&config, 2, |_| {})
        .await
        .unwrap();
    assert_eq!(
        again.embedded, 0,
        "a second run finds nothing left to embed"
    );

    // The embeddings endpoint failing ends the backfill with its error.
    sqlx::query("UPDATE memories SET embedding = NULL, embedding_model = NULL")
        .execute(&pool)
        .await
        .unwrap();
    sandbox
        .fake
        .state()
        .fail_model(EMBEDDINGS, Some(Failure::Server));
    let failed = agentloop_agent_runner::backfill_embeddings(&config, 2, |_| {}).await;
    assert!(
        matches!(
            failed,
            Err(agentloop_agent_runner::BackfillError::Models(_))
        ),
        "{failed:?}"
    );
    sandbox.shutdown().await.unwrap();
}
