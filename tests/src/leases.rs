//! A runner renews every lease it holds at once, and keeps them past their TTL.

use std::time::Duration;

use crate::harness::{Sandbox, SandboxOptions, next_reply};

const WAIT: Duration = Duration::from_secs(20);

/// Sessions whose lease is held now, and how many different expiry instants they have.
async fn held_leases(pool: &sqlx::PgPool) -> (i64, i64) {
    sqlx::query_as(
        "SELECT count(*), count(DISTINCT lease_expires_at) FROM sessions \
         WHERE lease_owner IS NOT NULL AND lease_expires_at > now()",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_runner_renews_all_its_leases_in_one_statement_and_keeps_them_past_their_ttl() {
    // Arrange: a lease far shorter than the model's answers, renewed every 300 ms; the runs end
    // well only if their leases are renewed meanwhile.
    let sandbox = Sandbox::start_with(SandboxOptions {
        runners: 1,
        runner: Some(Box::new(|config| config.runner.lease_ttl_ms = 900)),
        ..Default::default()
    })
    .await
    .unwrap();
    let pool = sandbox.pool().await.unwrap();
    let mut replies = sandbox.subscribe("deliver.>").await;

    // Act: five sessions claimed at different moments, each run waiting 3 s for its model.
    for i in 0..5 {
        sandbox
            .say(
                &format!("lease:{i}"),
                &format!("[[delay_ms:3000]] hold {i}"),
            )
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(70)).await;
    }
    agentloop_testkit::wait_until("five leases held", WAIT, || {
        let pool = pool.clone();
        async move { (held_leases(&pool).await.0 == 5).then_some(()) }
    })
    .await
    .unwrap();
    // At least one renewal after the last claim.
    tokio::time::sleep(Duration::from_millis(450)).await;
    let (held, expiries) = held_leases(&pool).await;

    // Assert: one statement set every lease's expiry (one `now()`); a task per session would
    // have renewed each at its own moment.
    assert_eq!((held, expiries), (5, 1), "five leases, renewed together");
    let mut answered = Vec::new();
    for _ in 0..5 {
        answered.push(next_reply(&mut replies, WAIT).await.unwrap().text);
    }
    answered.sort();
    let expected: Vec<String> = (0..5).map(|i| format!("echo: hold {i}")).collect();
    assert_eq!(answered, expected, "each run kept its lease to the end");
    let lost: i64 = sqlx::query_scalar("SELECT count(*) FROM runs WHERE attempts > 1")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(lost, 0, "no run was taken over and repeated");
    sandbox.shutdown().await.unwrap();
}
