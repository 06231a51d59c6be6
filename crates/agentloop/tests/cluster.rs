//! Failover on a NATS cluster: three nats-server nodes (JetStream, `sync_interval: always`),
//! `agentloop all` pointed at all three seeds with three-replica streams, replies kept by a
//! three-replica capture stream on `agentloop.deliver.>`. Under load, the node leading one
//! stream is killed with SIGKILL; the history checker then verifies that every acknowledged
//! message was answered exactly once, in each session's acceptance order, with no overlapping
//! runs and each input once in the transcript. The pause in replies is printed (run with
//! `--no-capture` to see it): figures belong in the benchmark notes, not in assertions.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a failed fixture should panic the test

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use async_nats::jetstream;
use futures::StreamExt as _;
use serde_json::{Value, json};

use agentloop_fake_model::{FakeModel, FakeModelConfig};
use agentloop_testkit::{NatsCluster, ServiceProcess, TestDatabase, free_port, wait_until};
use support::history::{History, Reply, check_tables};

const BIN: &str = env!("CARGO_BIN_EXE_agentloop");
const SESSIONS: usize = 20;
const PER_SESSION: usize = 10;
/// Acknowledged messages before the leader is killed.
const KILL_AFTER: usize = 60;
const CAPTURE: &str = "TEST_CAPTURE";
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

// Nothing is lost or duplicated in any run; but in 1 run of 8 here a few sessions had one
// follow-up answered after the later ones: a pull response lost with a dying connection is
// redelivered only after `bus.ack_wait_ms`, and the session's next messages, delivered over
// the new connection, overtake it. Out of the default run until ordering survives that (issue
// 28); `cargo nextest run --run-ignored all -E 'test(rolling)'` runs it.
#[ignore = "follow-up order breaks in about 1 run of 8: a lost pull response is redelivered after the next messages"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_of_every_nats_node_loses_no_acknowledged_message() {
    under_load(Fault::RollingRestart).await;
}

/// What happens to the cluster while the load runs.
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
    let client = async_nats::connect(cluster.urls().split(',').collect::<Vec<_>>())
        .await
        .unwrap();
    let js = jetstream::new(client);
    js.create_stream(jetstream::stream::Config {
        name: CAPTURE.into(),
        subjects: vec!["agentloop.deliver.>".into()],
        storage: jetstream::stream::StorageType::File,
        num_replicas: 3,
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    })
    .await
    .unwrap();
    let memory_port = free_port().unwrap();
    let env: Vec<(String, String)> = vec![
        ("NATS_URL".into(), cluster.urls()),
        ("AGENTLOOP_BUS__REPLICAS".into(), "3".into()),
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
        ("AGENTLOOP_BUS__ACK_WAIT_MS".into(), "5000".into()),
    ];
    let mut stack = ServiceProcess::spawn(BIN.as_ref(), "all", "all", &env).unwrap();
    stack
        .wait_ready(Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| {
            panic!("{e}\n{}\n{}", stack.logs(), cluster.logs());
        });

    // Act: every session publishes its messages in order, each once acknowledged; the node
    // leading the victim stream dies after KILL_AFTER acknowledgements.
    let accepted: Arc<Mutex<BTreeMap<String, Vec<String>>>> = Arc::default();
    let acks = Arc::new(tokio::sync::Semaphore::new(0));
    let mut senders = tokio::task::JoinSet::new();
    for s in 0..SESSIONS {
        let (js, accepted, acks) = (js.clone(), accepted.clone(), acks.clone());
        senders.spawn(async move {
            let session = format!("cluster:s{s:02}");
            for m in 0..PER_SESSION {
                let tag = format!("t-s{s:02}-m{m:02}");
                publish_until_acked(&js, &session, &tag).await;
                accepted
                    .lock()
                    .unwrap()
                    .entry(session.clone())
                    .or_default()
                    .push(tag);
                acks.add_permits(1);
            }
        });
    }
    let _ = acks.acquire_many(KILL_AFTER as u32).await.unwrap();
    // Replies are flowing when the node dies, so the pause they take is measured.
    wait_until("replies to flow", Duration::from_secs(60), || {
        let js = js.clone();
        async move {
            let mut stream = js.get_stream(CAPTURE).await.ok()?;
            (stream.info().await.ok()?.state.messages >= 20).then_some(())
        }
    })
    .await
    .unwrap();
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
    while let Some(done) = senders.join_next().await {
        done.unwrap();
    }
    let total = SESSIONS * PER_SESSION;
    let stored = wait_until(
        "a reply to every acknowledged message",
        Duration::from_secs(90),
        || {
            let js = js.clone();
            async move {
                let mut stream = js.get_stream(CAPTURE).await.ok()?;
                let n = stream.info().await.ok()?.state.messages;
                (n >= total as u64).then_some(n)
            }
        },
    )
    .await;
    // A late duplicate would show up in the moments after the last reply.
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Assert: the history holds every guarantee.
    let accepted = accepted.lock().unwrap().clone();
    let history = History {
        accepted,
        replies: read_capture(&js).await,
    };
    let findings = history.check();
    let first_after_kill = history
        .replies
        .iter()
        .find(|r| r.at > killed_at)
        .and_then(|r| r.at.duration_since(killed_at).ok());
    println!(
        "{what}: {} replies for {total} accepted; lost {}, \
         duplicated {}, out of order {}; longest pause {:?}; first reply {:?} after the fault; \
         cluster whole again {elected:?} after it",
        history.replies.len(),
        findings.lost.len(),
        findings.duplicated.len(),
        findings.out_of_order.len(),
        findings.longest_pause,
        first_after_kill,
    );
    if !findings.ok() {
        let pool = db.pool().await.unwrap();
        let order: Vec<(String, String)> = sqlx::query_as(
            "SELECT s.key, string_agg(split_part(t.content, ' ', 1), ' ' ORDER BY t.seq) \
             FROM transcript_entries t JOIN sessions s ON s.id = t.session_id \
             WHERE t.role = 'user' GROUP BY s.key ORDER BY s.key",
        )
        .fetch_all(&pool)
        .await
        .unwrap_or_default();
        println!("user entries of each session, in transcript order: {order:?}");
    }
    assert!(
        stored.is_ok() && findings.ok(),
        "guarantees broken ({what}): {findings:?}\n\
         stack log:\n{}\ncluster:\n{}",
        tail(&stack.logs(), 80),
        cluster.logs()
    );
    let all_tags: Vec<String> = history.accepted.values().flatten().cloned().collect();
    let pool = db.pool().await.unwrap();
    let broken = check_tables(&pool, &all_tags).await;
    assert!(broken.is_empty(), "tables: {broken:?}");
    let _ = stack.terminate();
    let _ = stack.wait_exit(Duration::from_secs(20)).await;
}

/// Publishes until JetStream acknowledges; a retry carries the same message id, so a message
/// whose acknowledgement was lost is stored once.
async fn publish_until_acked(js: &jetstream::Context, session: &str, tag: &str) {
    let body =
        json!({"sessionKey": session, "text": tag, "idempotencyKey": tag, "queueMode": "followup"})
            .to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", tag);
        let acked = match js
            .publish_with_headers("agentloop.inbound.cli", headers, body.clone().into())
            .await
        {
            Ok(ack) => ack.await.is_ok(),
            Err(_) => false,
        };
        if acked {
            return;
        }
        assert!(Instant::now() < deadline, "{tag} never accepted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Reads every reply the capture stream stored, in stream order.
async fn read_capture(js: &jetstream::Context) -> Vec<Reply> {
    // With a node down, the cluster may still be moving leaders: asked again until it answers.
    let consumer: jetstream::consumer::PullConsumer = wait_until(
        "a reader of the capture stream",
        Duration::from_secs(30),
        || {
            let js = js.clone();
            async move {
                js.get_stream(CAPTURE)
                    .await
                    .ok()?
                    .create_consumer(jetstream::consumer::pull::Config {
                        ack_policy: jetstream::consumer::AckPolicy::None,
                        ..Default::default()
                    })
                    .await
                    .ok()
            }
        },
    )
    .await
    .unwrap();
    let pending = consumer.cached_info().num_pending;
    let mut replies = Vec::new();
    let mut messages = consumer.messages().await.unwrap();
    let mut failed_pulls = 0;
    while (replies.len() as u64) < pending {
        let next = tokio::time::timeout(Duration::from_secs(10), messages.next())
            .await
            .expect("the capture stream hands out what it holds")
            .expect("the pull stream ended");
        // A pull that finds the stream between leaders gets "no responders"; the stream
        // pulls again by itself.
        let msg = match next {
            Ok(msg) => msg,
            Err(err) => {
                failed_pulls += 1;
                assert!(
                    failed_pulls < 50,
                    "the capture stream never answered: {err}"
                );
                eprintln!("pulling the capture stream again after: {err}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let at: SystemTime = msg.info().unwrap().published.into();
        let body: Value = serde_json::from_slice(&msg.payload).unwrap();
        let text = body["text"].as_str().unwrap_or_default();
        let tag = text
            .strip_prefix("echo: ")
            .unwrap_or(text)
            .trim()
            .to_owned();
        replies.push(Reply { tag, at });
    }
    replies
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
