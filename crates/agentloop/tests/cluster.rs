//! Failover on a NATS cluster: three nats-server nodes (JetStream, `sync_interval: always`),
//! `agentloop all` pointed at all three seeds with three-replica streams, replies kept by a
//! three-replica capture stream on `agentloop.deliver.>`. Under load, the node leading one
//! stream is killed with SIGKILL; the history checker then verifies that every acknowledged
//! message was answered exactly once, in each session's acceptance order, with no overlapping
//! runs and each input once in the transcript. The pause in replies is printed (run with
//! `--no-capture` to see it): figures belong in the benchmark notes, not in assertions.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a failed fixture should panic the test

mod support;

use std::time::{Duration, SystemTime};

use agentloop_fake_model::{FakeModel, FakeModelConfig};
use agentloop_testkit::{NatsCluster, ServiceProcess, TestDatabase, free_port, wait_until};
use support::load::{self, CAPTURE, Load};

const BIN: &str = env!("CARGO_BIN_EXE_agentloop");
const SESSIONS: usize = 20;
const PER_SESSION: usize = 10;
/// Acknowledged messages before the leader is killed.
const KILL_AFTER: usize = 60;
/// The streams whose leaders must be back before the next node of a rolling restart goes.
const STREAMS: [&str; 4] = [
    "AGENTLOOP_INBOUND",
    "AGENTLOOP_RUNS",
    "AGENTLOOP_OUTBOUND",
    CAPTURE,
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_inbound_leader_loses_no_acknowledged_message() {
    leader_killed_under_load("AGENTLOOP_INBOUND").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_runs_leader_loses_no_acknowledged_message() {
    leader_killed_under_load("AGENTLOOP_RUNS").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_outbound_leader_loses_no_acknowledged_message() {
    leader_killed_under_load("AGENTLOOP_OUTBOUND").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_capture_stream_leader_loses_no_acknowledged_message() {
    leader_killed_under_load(CAPTURE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_seed_urls_are_one_cluster_and_a_bad_one_is_a_clear_error() {
    // A bad seed is refused at once with the reason, instead of being retried for ever.
    let db = TestDatabase::create().await.unwrap();
    let env = vec![
        (
            "NATS_URL".to_owned(),
            "nats://127.0.0.1:4222,nats://127.0.0.1:notaport".to_owned(),
        ),
        ("DATABASE_URL".to_owned(), db.url().to_owned()),
    ];
    let mut router = ServiceProcess::spawn(BIN.as_ref(), "router", "router", &env).unwrap();
    let status = router.wait_exit(Duration::from_secs(20)).await.unwrap();
    assert!(!status.success(), "a bad NATS URL must stop the service");
    assert!(
        router.logs().contains("invalid NATS URL"),
        "the log names the bad URL:\n{}",
        router.logs()
    );
}

// The order of follow-ups is reported, not asserted: in 1 run of 8 here a few sessions had one
// answered after later ones. A delivery lost with a dying connection comes again only after
// `bus.ack_wait_ms`, and the session's next messages, taken by another runner, overtake it
// (docs/scaling.md, "A host cut off, a slow link"; issue 28).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_of_every_nats_node_loses_no_acknowledged_message() {
    under_load(Fault::RollingRestart).await;
}

/// What happens to the cluster while the load runs.
#[derive(Clone, Copy)]
enum Fault<'a> {
    /// SIGKILL of the node leading this stream.
    KillLeader(&'a str),
    /// Each node in turn: SIGKILL, down for two seconds, started again with its store, and the
    /// next one only once every agentloop stream has a leader again.
    RollingRestart,
}

async fn leader_killed_under_load(victim_stream: &str) {
    under_load(Fault::KillLeader(victim_stream)).await;
}

async fn under_load(fault: Fault<'_>) {
    // Arrange: the cluster, the capture stream, the stack on all three seeds.
    let mut cluster = NatsCluster::start(3).await.unwrap();
    let db = TestDatabase::create().await.unwrap();
    let fake = FakeModel::start(FakeModelConfig::default()).await.unwrap();
    let js = load::connect(&cluster.urls()).await;
    load::create_capture(&js, 3).await;
    let memory_port = free_port().unwrap();
    let env = load::cluster_env(
        &cluster.urls(),
        db.url(),
        &format!("127.0.0.1:{memory_port}"),
        &fake.openai_base_url(),
    );
    let mut stack = ServiceProcess::spawn(BIN.as_ref(), "all", "all", &env).unwrap();
    stack
        .wait_ready(Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| {
            panic!("{e}\n{}\n{}", stack.logs(), cluster.logs());
        });

    // Act: every session publishes its messages in order, each once acknowledged; the fault
    // comes after KILL_AFTER acknowledgements, while replies flow, so their pause is measured.
    let load = Load::start(&js, "cluster", SESSIONS, PER_SESSION, "");
    load.acked(KILL_AFTER).await;
    assert!(load::replies_stored(&js, 20, Duration::from_secs(60)).await);
    let killed_at = SystemTime::now();
    let (what, elected) = match fault {
        Fault::KillLeader(victim_stream) => {
            let leader = cluster.stream_leader(victim_stream).await.unwrap();
            cluster.kill(&leader);
            // How long nats-server itself took to elect a new leader: the part of the pause
            // that is not agentloop's.
            let elected = wait_until("a new leader", Duration::from_secs(60), || {
                let (cluster, leader) = (&cluster, &leader);
                async move {
                    let new = cluster.stream_leader(victim_stream).await.ok()?;
                    (new != *leader).then_some(())
                }
            })
            .await
            .map(|()| killed_at.elapsed().unwrap_or_default());
            (
                format!("killed {leader} (leader of {victim_stream})"),
                elected,
            )
        }
        Fault::RollingRestart => {
            for node in cluster.names() {
                cluster.kill(&node);
                tokio::time::sleep(Duration::from_secs(2)).await;
                cluster.restart(&node).unwrap();
                wait_until("every stream led again", Duration::from_secs(60), || {
                    let cluster = &cluster;
                    async move {
                        for stream in STREAMS {
                            cluster.stream_leader(stream).await.ok()?;
                        }
                        Some(())
                    }
                })
                .await
                .unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs()));
            }
            (
                "restarted every node in turn".to_owned(),
                Ok(killed_at.elapsed().unwrap_or_default()),
            )
        }
    };
    let accepted = load.finish().await;

    // Assert: the history holds every guarantee.
    let pool = db.pool().await.unwrap();
    let what = format!("{what}; cluster whole again {elected:?} after it");
    load::verify(&js, &pool, accepted, killed_at, &what, || {
        format!(
            "stack log:\n{}\ncluster:\n{}",
            load::tail(&stack.logs(), 80),
            cluster.logs()
        )
    })
    .await;
    let _ = stack.terminate();
    let _ = stack.wait_exit(Duration::from_secs(20)).await;
}
