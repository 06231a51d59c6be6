//! The recovery chain of a failed model call, step by step, against the fake model server.

use std::time::Duration;

use futures::StreamExt as _;
use serde_json::{Value, json};
use sqlx::Row as _;

use agentloop_fake_model::{Failure, ScriptedReply};
use agentloop_model::AuthProfile;
use agentloop_proto::v1::SystemEvent;

use crate::harness::{Sandbox, SandboxOptions, collect_run_events, next_reply};

const WAIT: Duration = Duration::from_secs(20);

fn profiles(config: &mut agentloop_agent_runner::RunnerConfig) {
    config.models.profiles = vec![
        AuthProfile {
            name: "primary".into(),
            provider: "openai".into(),
            api_key: Some("key-a".into()),
            base_url: None,
        },
        AuthProfile {
            name: "secondary".into(),
            provider: "openai".into(),
            api_key: Some("key-b".into()),
            base_url: None,
        },
    ];
    // Long enough that the cooldown outlives the test.
    config.models.cooldown_base_ms = 120_000;
}

async fn ask(sandbox: &Sandbox, key: &str, text: &str) -> Value {
    let reply = sandbox
        .client
        .request(
            sandbox.subject("ask"),
            json!({"sessionKey": key, "text": text}).to_string().into(),
        )
        .await
        .unwrap();
    serde_json::from_slice(&reply.payload).unwrap()
}

async fn last_run(sandbox: &Sandbox, n: i64) -> sqlx::postgres::PgRow {
    let pool = sandbox.finished_runs(n).await.unwrap();
    sqlx::query(
        "SELECT status, model, provider, profile, error FROM runs ORDER BY started_at DESC LIMIT 1",
    )
    .fetch_one(&pool)
    .await
    .unwrap()
}

fn auth_header(request: &agentloop_fake_model::RecordedRequest) -> String {
    request
        .header("authorization")
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn each_step_of_the_recovery_chain_happens_in_order() {
    let sandbox = Sandbox::start_with(SandboxOptions {
        runner: Some(Box::new(|config| {
            profiles(config);
            config.models.thinking = "high".into();
            config.models.fallbacks =
                vec!["openai/tiny-model".into(), "openai/backup-model".into()];
            config
                .models
                .context_windows
                .insert("openai/tiny-model".into(), 50);
        })),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut events = sandbox.subscribe("events.*.*").await;

    // 1. Context overflow: the history is compacted into a summary and the call retried.
    assert_eq!(
        ask(&sandbox, "chain", "my cat is called Tom").await["text"],
        "echo: my cat is called Tom"
    );
    collect_run_events(&mut events, WAIT).await.unwrap();
    sandbox
        .fake
        .push_script(ScriptedReply::error(Failure::Overflow));
    sandbox
        .fake
        .push_script(ScriptedReply::text("the user has a cat called Tom"));
    sandbox
        .fake
        .push_script(ScriptedReply::text("Tom, I remember"));
    assert_eq!(
        ask(&sandbox, "chain", "what is my cat called?").await["text"],
        "Tom, I remember"
    );
    let run = collect_run_events(&mut events, WAIT).await.unwrap();
    let compaction: Vec<&str> = run
        .iter()
        .filter(|e| e.stream == "compaction")
        .map(|e| e.phase.as_str())
        .collect();
    assert_eq!(compaction, vec!["start", "end"]);
    let retried = sandbox.fake.requests().last().unwrap().body["messages"].clone();
    let contents: Vec<String> = retried
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] != "system")
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(
        contents,
        vec![
            "[Summary of the earlier conversation]\nthe user has a cat called Tom".to_owned(),
            "what is my cat called?".to_owned()
        ]
    );
    sandbox.fake.reset();

    // 2. Rate limit: the next auth profile answers and the failed one cools down in Postgres.
    sandbox
        .fake
        .state()
        .fail_key("key-a", Some(Failure::RateLimit));
    assert_eq!(ask(&sandbox, "profiles", "hi").await["text"], "echo: hi");
    let keys: Vec<String> = sandbox.fake.requests().iter().map(auth_header).collect();
    assert_eq!(keys, vec!["Bearer key-a", "Bearer key-b"]);
    let run = last_run(&sandbox, 3).await;
    assert_eq!(
        run.get::<Option<String>, _>("profile").as_deref(),
        Some("secondary")
    );
    let pool = sandbox.pool().await.unwrap();
    let cooling: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM auth_profile_cooldowns WHERE profile = 'primary' AND cooldown_until > now()",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(cooling, 1);
    sandbox.fake.reset();

    // The cooling profile is skipped even though it would work again now.
    assert_eq!(
        ask(&sandbox, "profiles", "again").await["text"],
        "echo: again"
    );
    let keys: Vec<String> = sandbox.fake.requests().iter().map(auth_header).collect();
    assert_eq!(keys, vec!["Bearer key-b"]);
    sandbox.fake.reset();

    // 3. Unsupported thinking level: lowered until the model accepts it.
    sandbox.fake.state().set_max_thinking(Some("low"));
    assert_eq!(
        ask(&sandbox, "thinking", "think").await["text"],
        "echo: think"
    );
    let levels: Vec<Value> = sandbox
        .fake
        .requests()
        .iter()
        .map(|r| r.body["reasoning_effort"].clone())
        .collect();
    assert_eq!(levels, vec![json!("high"), json!("medium"), json!("low")]);
    sandbox.fake.reset();

    // 4. Anything else: the next model of the fallback chain; a model whose window is too
    //    small is skipped without being called.
    sandbox
        .fake
        .state()
        .fail_model("fake-echo", Some(Failure::Server));
    assert_eq!(
        ask(&sandbox, "fallback", "still there?").await["text"],
        "echo: still there?"
    );
    let models: Vec<Value> = sandbox
        .fake
        .requests()
        .iter()
        .map(|r| r.body["model"].clone())
        .collect();
    assert_eq!(models, vec![json!("fake-echo"), json!("backup-model")]);
    let run = last_run(&sandbox, 6).await;
    assert_eq!(
        run.get::<Option<String>, _>("model").as_deref(),
        Some("openai/backup-model")
    );
    assert_eq!(
        run.get::<Option<String>, _>("provider").as_deref(),
        Some("openai")
    );

    // 5. When every model fails: a clear error reply and a lifecycle error.
    sandbox
        .fake
        .state()
        .fail_model("backup-model", Some(Failure::Server));
    let answer = ask(&sandbox, "doomed", "anyone?").await;
    let error = answer["error"].as_str().unwrap();
    assert!(error.contains("every model failed"), "{error}");
    assert!(
        error.contains("tiny-model") && error.contains("too small"),
        "{error}"
    );
    let mut last: Option<SystemEvent> = None;
    while let Ok(Some(msg)) = tokio::time::timeout(Duration::from_millis(500), events.next()).await
    {
        let (event, _) = agentloop_bus::decode::<SystemEvent>(&msg).unwrap();
        last = Some(event);
    }
    let last = last.unwrap();
    assert_eq!(
        (last.stream.as_str(), last.phase.as_str()),
        ("lifecycle", "error")
    );
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_profile_cooling_down_on_one_runner_is_skipped_by_another() {
    let mut sandbox = Sandbox::start_with(SandboxOptions {
        runners: 2,
        runner: Some(Box::new(profiles)),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut replies = sandbox.subscribe("deliver.>").await;
    sandbox.fake.state().fail_key("key-a", Some(Failure::Auth));
    sandbox
        .publish_json("cli", json!({"sessionKey": "one", "text": "first"}))
        .await
        .unwrap();
    assert_eq!(
        next_reply(&mut replies, WAIT).await.unwrap().text,
        "echo: first"
    );
    let pool = sandbox.finished_runs(1).await.unwrap();
    let first_owner: String = sqlx::query_scalar("SELECT owner FROM runs")
        .fetch_one(&pool)
        .await
        .unwrap();
    sandbox.fake.reset();

    // Only the other replica is left to answer.
    sandbox.stop_runner(&first_owner).await.unwrap();
    sandbox
        .publish_json("cli", json!({"sessionKey": "two", "text": "second"}))
        .await
        .unwrap();

    assert_eq!(
        next_reply(&mut replies, WAIT).await.unwrap().text,
        "echo: second"
    );
    let pool = sandbox.finished_runs(2).await.unwrap();
    let owners: Vec<String> = sqlx::query("SELECT owner FROM runs ORDER BY started_at")
        .fetch_all(&pool)
        .await
        .unwrap()
        .iter()
        .map(|r| r.get("owner"))
        .collect();
    assert_ne!(owners[0], owners[1]);
    let keys: Vec<String> = sandbox.fake.requests().iter().map(auth_header).collect();
    assert_eq!(
        keys,
        vec!["Bearer key-b"],
        "the second replica skipped the cooling profile"
    );
    sandbox.shutdown().await.unwrap();
}
