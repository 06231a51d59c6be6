//! `agentloop pairing`, `agentloop approvals` and `agentloop audit` against a real memory
//! service and Postgres: an operator pairs a sender by its code, and the audit shows it.

use std::process::Command;

use tokio_util::sync::CancellationToken;

fn agentloop(memory_url: &str, args: &[&str]) -> (bool, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_agentloop"))
        .args(args)
        .env("AGENTLOOP_MEMORY__URL", memory_url)
        .env("AGENTLOOP_OPERATOR", "alice")
        .env_remove("AGENTLOOP_CONFIG")
        .output()
        .expect("run agentloop");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

#[tokio::test]
async fn an_operator_pairs_a_sender_by_its_code_and_the_audit_shows_who() {
    // Arrange: memory on a fresh database, a stranger's pending code
    let db = agentloop_testkit::TestDatabase::create().await.unwrap();
    let mut config = agentloop_memory::MemoryConfig::default();
    config.memory.listen = "127.0.0.1:0".to_owned();
    config.memory.database_url = db.url().to_owned();
    let health = agentloop_lifecycle::Health::new();
    let memory = agentloop_memory::Memory::bind(config, health.clone())
        .await
        .unwrap();
    let url = format!("http://{}", memory.local_addr());
    let stop = CancellationToken::new();
    let serving = tokio::spawn(memory.serve(stop.clone()));
    let pool = sqlx::PgPool::connect(db.url()).await.unwrap();
    agentloop_testkit::wait_until("memory migrated", std::time::Duration::from_secs(20), || {
        let pool = pool.clone();
        async move {
            sqlx::query("SELECT * FROM agentloop_check_sender('telegram', '4242', true, 'K7M2QX9D', 3, 3600000)")
                .execute(&pool)
                .await
                .ok()
        }
    })
    .await
    .unwrap();
    // The migration is in before memory marks its store ready; a command sent between the two
    // is told "memory is starting".
    agentloop_testkit::wait_until("memory ready", std::time::Duration::from_secs(20), || {
        let health = health.clone();
        async move { health.readiness().0.then_some(()) }
    })
    .await
    .unwrap();

    // Act
    let listed = tokio::task::spawn_blocking({
        let url = url.clone();
        move || agentloop(&url, &["pairing", "list"])
    })
    .await
    .unwrap();
    let approved = tokio::task::spawn_blocking({
        let url = url.clone();
        move || agentloop(&url, &["pairing", "approve", "k7m2qx9d"])
    })
    .await
    .unwrap();
    let guessed = tokio::task::spawn_blocking({
        let url = url.clone();
        move || agentloop(&url, &["pairing", "approve", "ZZZZ2345"])
    })
    .await
    .unwrap();
    let audit = tokio::task::spawn_blocking({
        let url = url.clone();
        move || agentloop(&url, &["audit", "--source", "pairing"])
    })
    .await
    .unwrap();
    let bad_decision = tokio::task::spawn_blocking({
        let url = url.clone();
        move || agentloop(&url, &["approvals", "resolve", "x", "maybe"])
    })
    .await
    .unwrap();

    // Assert
    assert!(listed.0, "{}", listed.1);
    assert!(
        listed.1.contains("K7M2QX9D\ttelegram\t4242"),
        "{}",
        listed.1
    );
    assert!(approved.0, "{}", approved.1);
    assert!(
        approved.1.contains("paired 4242 on telegram"),
        "{}",
        approved.1
    );
    assert!(!guessed.0, "a guessed code was accepted: {}", guessed.1);
    assert!(guessed.1.contains("no live pairing code"), "{}", guessed.1);
    assert!(audit.0, "{}", audit.1);
    assert!(
        audit.1.contains("pairing\tapproved") && audit.1.contains("by cli:alice"),
        "{}",
        audit.1
    );
    assert!(audit.1.contains("pairing\trequested"), "{}", audit.1);
    assert!(!bad_decision.0);
    assert!(
        bad_decision.1.contains("allow-once allow-always deny"),
        "{}",
        bad_decision.1
    );
    stop.cancel();
    let _ = serving.await;
}
