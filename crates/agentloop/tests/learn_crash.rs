//! Auto-learn survives a runner killed mid-job: the job is leased in Postgres, the runner that
//! claimed it is SIGKILLed while the learn model is still answering, and another runner process
//! takes the job over once the lease runs out. The fact is stored once and the job ends once.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a failed fixture should panic the test

use std::time::Duration;

use agentloop_fake_model::{FakeModel, FakeModelConfig, ScriptedReply};
use agentloop_testkit::{NatsServer, ServiceProcess, TestDatabase, free_port, wait_until};

const BIN: &str = env!("CARGO_BIN_EXE_agentloop");
const READY: Duration = Duration::from_secs(30);
const FACT: &str = "The user keeps a parrot named Kiwi";

fn learn_requests(fake: &FakeModel) -> usize {
    fake.requests()
        .iter()
        .filter(|r| r.body["model"] == "fake-learn")
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_learn_stores_a_fact_once_when_its_runner_is_killed_mid_job() {
    // Arrange: memory and one runner as processes of their own, and a queued job whose learn
    // answer takes far longer than the test waits before the kill.
    let nats = NatsServer::start().unwrap();
    let db = TestDatabase::create().await.unwrap();
    let fake = FakeModel::start(FakeModelConfig::default()).await.unwrap();
    let memory_port = free_port().unwrap();
    let env: Vec<(String, String)> = vec![
        ("NATS_URL".into(), nats.url().into()),
        ("DATABASE_URL".into(), db.url().into()),
        (
            "AGENTLOOP_MEMORY__LISTEN".into(),
            format!("127.0.0.1:{memory_port}"),
        ),
        (
            "AGENTLOOP_MEMORY__URL".into(),
            format!("http://127.0.0.1:{memory_port}"),
        ),
        ("OPENAI_BASE_URL".into(), fake.openai_base_url()),
        ("AGENTLOOP_MODEL".into(), "openai/fake".into()),
        (
            "AGENTLOOP_MEMORY__LEARN_MODEL".into(),
            "openai/fake-learn".into(),
        ),
        ("AGENTLOOP_MEMORY__LEARN_LEASE_MS".into(), "1500".into()),
    ];
    let mut memory = ServiceProcess::spawn(BIN.as_ref(), "memory", "memory", &env).unwrap();
    memory.wait_ready(READY).await.unwrap();
    let pool = db.pool().await.unwrap();
    sqlx::query("INSERT INTO sessions (id, key) VALUES (gen_random_uuid(), 'kiwi-owner')")
        .execute(&pool)
        .await
        .unwrap();
    let answer = serde_json::json!({ "facts": [FACT] }).to_string();
    fake.push_script(ScriptedReply::text(answer.clone()).with_delay(Duration::from_secs(60)));
    fake.push_script(ScriptedReply::text(answer));
    sqlx::query(
        "INSERT INTO learn_jobs (id, run_id, session_id, agent_id, sender_id, channel, exchange) \
         SELECT gen_random_uuid(), gen_random_uuid(), id, 'main', 'kim', 'cli', \
                'User: my parrot Kiwi says hello\nAssistant: Hello, Kiwi!' \
         FROM sessions WHERE key = 'kiwi-owner'",
    )
    .execute(&pool)
    .await
    .unwrap();
    let runner_env = |name: &str| {
        let mut env = env.clone();
        env.push(("AGENTLOOP_RUNNER__OWNER_ID".into(), name.into()));
        env
    };
    let mut first =
        ServiceProcess::spawn(BIN.as_ref(), "runner", "runner-0", &runner_env("runner-0")).unwrap();
    first.wait_ready(READY).await.unwrap();

    // Act: kill -9 the runner while the learn model is answering it, then start another.
    wait_until("runner-0 to ask the learn model", READY, || {
        let asked = learn_requests(&fake);
        async move { (asked >= 1).then_some(()) }
    })
    .await
    .unwrap();
    let owner: Option<String> = sqlx::query_scalar("SELECT lease_owner FROM learn_jobs")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(owner.as_deref(), Some("runner-0"));
    first.kill();
    let mut second =
        ServiceProcess::spawn(BIN.as_ref(), "runner", "runner-1", &runner_env("runner-1")).unwrap();
    second.wait_ready(READY).await.unwrap();

    // Assert: the job ends once, on its second attempt: the second runner's (the first is dead).
    let (status, attempts): (String, i32) =
        wait_until("the job to be done", Duration::from_secs(30), || {
            let pool = pool.clone();
            async move {
                let row: (String, i32) = sqlx::query_as("SELECT status, attempts FROM learn_jobs")
                    .fetch_one(&pool)
                    .await
                    .ok()?;
                (row.0 != "pending").then_some(row)
            }
        })
        .await
        .unwrap();
    assert_eq!(status, "done", "{}", second.logs());
    assert_eq!(
        attempts, 2,
        "taken over once, after the killed runner's attempt"
    );
    let stored: Vec<(String, String)> = sqlx::query_as("SELECT text, source FROM memories")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(stored, vec![(FACT.to_owned(), "learned".to_owned())]);
    assert_eq!(
        learn_requests(&fake),
        2,
        "the learn model was asked once per attempt"
    );

    second.terminate().unwrap();
    assert!(
        second
            .wait_exit(Duration::from_secs(10))
            .await
            .unwrap()
            .success()
    );
    memory.terminate().unwrap();
    assert!(
        memory
            .wait_exit(Duration::from_secs(10))
            .await
            .unwrap()
            .success()
    );
}
