//! Load for the fault tests on a NATS cluster: sessions publishing tagged follow-ups, each
//! until acknowledged; replies kept by a capture stream of the test's own on
//! `agentloop.deliver.>`; and the verdict: the history checker over what was accepted and
//! replied, and the tables. Each fault test is: start a [`Load`], fault, [`verify`].
#![allow(dead_code)] // each test binary that includes this uses some of it

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use async_nats::jetstream;
use futures::StreamExt as _;
use serde_json::{Value, json};

use agentloop_testkit::wait_until;

use super::history::{History, Reply, check_tables};

/// The capture stream's name.
pub const CAPTURE: &str = "TEST_CAPTURE";

/// Creates the capture stream with `replicas` copies of every reply.
pub async fn create_capture(js: &jetstream::Context, replicas: usize) {
    js.create_stream(jetstream::stream::Config {
        name: CAPTURE.into(),
        subjects: vec!["agentloop.deliver.>".into()],
        storage: jetstream::stream::StorageType::File,
        num_replicas: replicas,
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    })
    .await
    .unwrap();
}

/// A client of the cluster the way the services are: every seed, and a dead connection
/// noticed in seconds (a partitioned node sends no reset).
pub async fn connect(urls: &str) -> jetstream::Context {
    let client = async_nats::ConnectOptions::new()
        .ping_interval(Duration::from_secs(1))
        .connection_timeout(Duration::from_secs(1))
        .connect(urls.split(',').collect::<Vec<_>>())
        .await
        .unwrap();
    jetstream::new(client)
}

/// The services' settings on a cluster: every seed in `nats_urls`, R3 streams, memory serving
/// on `memory` (`host:port`), the fake model at `model_url`, a 5 s ack wait.
pub fn cluster_env(
    nats_urls: &str,
    database_url: &str,
    memory: &str,
    model_url: &str,
) -> Vec<(String, String)> {
    vec![
        ("NATS_URL".into(), nats_urls.into()),
        ("AGENTLOOP_BUS__REPLICAS".into(), "3".into()),
        ("DATABASE_URL".into(), database_url.into()),
        ("AGENTLOOP_MEMORY__LISTEN".into(), memory.into()),
        ("AGENTLOOP_MEMORY__URL".into(), format!("http://{memory}")),
        ("OPENAI_BASE_URL".into(), model_url.into()),
        ("AGENTLOOP_MODEL".into(), "openai/fake".into()),
        ("AGENTLOOP_BUS__ACK_WAIT_MS".into(), "5000".into()),
    ]
}

/// Sessions sending their follow-ups in order, each once the one before was acknowledged.
pub struct Load {
    accepted: Arc<Mutex<BTreeMap<String, Vec<String>>>>,
    acks: Arc<tokio::sync::Semaphore>,
    senders: tokio::task::JoinSet<()>,
    /// How many messages the load sends in all.
    pub total: usize,
}

impl Load {
    /// Starts `sessions` × `per_session` messages tagged `t-sSS-mMM`; `directives` (the fake
    /// model's, e.g. `[[delay_ms:200]]`) follow each tag.
    pub fn start(
        js: &jetstream::Context,
        prefix: &str,
        sessions: usize,
        per_session: usize,
        directives: &str,
    ) -> Self {
        let accepted: Arc<Mutex<BTreeMap<String, Vec<String>>>> = Arc::default();
        let acks = Arc::new(tokio::sync::Semaphore::new(0));
        let mut senders = tokio::task::JoinSet::new();
        for s in 0..sessions {
            let (js, accepted, acks) = (js.clone(), accepted.clone(), acks.clone());
            let session = format!("{prefix}:s{s:02}");
            let directives = directives.to_owned();
            senders.spawn(async move {
                for m in 0..per_session {
                    let tag = format!("t-s{s:02}-m{m:02}");
                    publish_until_acked(&js, &session, &tag, &directives, Some("followup")).await;
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
        Self {
            accepted,
            acks,
            senders,
            total: sessions * per_session,
        }
    }

    /// Waits until `n` messages were acknowledged.
    pub async fn acked(&self, n: usize) {
        let _ = self.acks.acquire_many(n as u32).await.unwrap();
        self.acks.add_permits(n);
    }

    /// Waits until every message was acknowledged; returns them by session in order.
    pub async fn finish(mut self) -> BTreeMap<String, Vec<String>> {
        while let Some(done) = self.senders.join_next().await {
            done.unwrap();
        }
        self.accepted.lock().unwrap().clone()
    }
}

/// Publishes until JetStream acknowledges; a retry carries the same message id, so a message
/// whose acknowledgement was lost is stored once. `queue_mode` `None` leaves the channel's.
pub async fn publish_until_acked(
    js: &jetstream::Context,
    session: &str,
    tag: &str,
    directives: &str,
    queue_mode: Option<&str>,
) {
    let text = format!("{tag} {directives}");
    let mut body = json!({"sessionKey": session, "text": text.trim(), "idempotencyKey": tag});
    if let Some(mode) = queue_mode {
        body["queueMode"] = mode.into();
    }
    let body = body.to_string();
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

/// The inputs (tags) of the runs `owner` has in flight.
pub async fn in_flight_of(pool: &sqlx::PgPool, owner: &str) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT idempotency_key FROM runs WHERE finished_at IS NULL AND owner = $1 \
         AND idempotency_key IS NOT NULL",
    )
    .bind(owner)
    .fetch_all(pool)
    .await
    .unwrap_or_default()
}

/// Waits until the capture stream holds `n` replies.
pub async fn replies_stored(js: &jetstream::Context, n: u64, within: Duration) -> bool {
    wait_until("replies stored", within, || {
        let js = js.clone();
        async move {
            let mut stream = js.get_stream(CAPTURE).await.ok()?;
            (stream.info().await.ok()?.state.messages >= n).then_some(())
        }
    })
    .await
    .is_ok()
}

/// Log words that tell which hop reordered a session's messages.
const ORDER_WORDS: [&str; 8] = [
    "went elsewhere",
    "earlier one",
    "does not answer",
    "never reached",
    "never settled",
    "redeliver",
    "handed back",
    "keep_order",
];

/// The outcome of a fault test, checked: prints the figures (`--no-capture` shows them) and
/// panics with `logs` when a guarantee broke, a session's replies out of order included.
/// Returns the history for figures of the caller's.
pub async fn verify(
    js: &jetstream::Context,
    pool: &sqlx::PgPool,
    accepted: BTreeMap<String, Vec<String>>,
    fault_at: SystemTime,
    what: &str,
    logs: impl Fn() -> String,
) -> History {
    let total: usize = accepted.values().map(Vec::len).sum();
    let stored = replies_stored(js, total as u64, Duration::from_secs(90)).await;
    // A late duplicate would show up in the moments after the last reply.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let history = History {
        accepted,
        replies: read_capture(js, if stored { total as u64 } else { 0 }).await,
    };
    let findings = history.check();
    let reordered = findings.out_of_order.len();
    // Which replies came out of order, and when the capture stored each of them.
    for (session, answered, order) in findings.out_of_order.iter().take(4) {
        let stored: Vec<String> = order
            .iter()
            .filter_map(|tag| history.replies.iter().find(|r| &r.tag == tag))
            .map(|r| {
                let since = r.at.duration_since(fault_at).unwrap_or_default();
                format!("{}@{:.2}s", r.tag, since.as_secs_f64())
            })
            .collect();
        println!("{session}: sent {answered:?}, stored {stored:?} (after the fault)");
    }
    let first_after = history
        .replies
        .iter()
        .find(|r| r.at > fault_at)
        .and_then(|r| r.at.duration_since(fault_at).ok());
    println!(
        "{what}: {} replies for {total} accepted; lost {}, duplicated {}, out of order {}; \
         longest pause {:?}; first reply {:?} after the fault",
        history.replies.len(),
        findings.lost.len(),
        findings.duplicated.len(),
        reordered,
        findings.longest_pause,
        first_after,
    );
    if !findings.ok() || reordered > 0 {
        let order: Vec<(String, String)> = sqlx::query_as(
            "SELECT s.key, string_agg(split_part(t.content, ' ', 1), ' ' ORDER BY t.seq) \
             FROM transcript_entries t JOIN sessions s ON s.id = t.session_id \
             WHERE t.role = 'user' GROUP BY s.key ORDER BY s.key",
        )
        .fetch_all(pool)
        .await
        .unwrap_or_default();
        println!("user entries of each session, in transcript order: {order:?}");
        // What the services said about order and redelivery, to tell which hop reordered.
        let said = logs();
        let telling = said.lines().filter(|line| {
            ORDER_WORDS
                .iter()
                .any(|word| line.to_lowercase().contains(word))
        });
        for line in telling.take(60) {
            println!("  {line}");
        }
    }
    assert!(
        stored && findings.ok(),
        "guarantees broken ({what}): {findings:?}\n{}",
        logs()
    );
    let all_tags: Vec<String> = history.accepted.values().flatten().cloned().collect();
    let broken = check_tables(pool, &all_tags).await;
    assert!(broken.is_empty(), "tables ({what}): {broken:?}");
    history
}

/// Reads every reply the capture stream stored, in stream order, at least `stored` of them (a
/// new reader's count of what it has to read can lag behind what the stream holds, down to
/// nothing). A reader whose pulls stall (its consumer placed on a node that is slow or between
/// leaders) is replaced by a new one starting after the last reply read.
pub async fn read_capture(js: &jetstream::Context, stored: u64) -> Vec<Reply> {
    let mut replies = Vec::new();
    let mut next_seq = 1;
    let mut total = None;
    for attempt in 0..10 {
        let Some((consumer, pending)) = capture_reader(js, next_seq).await else {
            continue;
        };
        let total = *total.get_or_insert((replies.len() as u64 + pending).max(stored));
        let Ok(mut messages) = consumer.messages().await else {
            continue;
        };
        while (replies.len() as u64) < total {
            match tokio::time::timeout(Duration::from_secs(10), messages.next()).await {
                Ok(Some(Ok(msg))) => {
                    let info = msg.info().unwrap();
                    next_seq = info.stream_sequence + 1;
                    let at: SystemTime = info.published.into();
                    replies.push(Reply {
                        tag: reply_tag(&msg.payload),
                        at,
                    });
                }
                // "No responders" between leaders: the pull is sent again by itself.
                Ok(Some(Err(err))) => {
                    eprintln!("pulling the capture stream again after: {err}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Ok(None) | Err(_) => {
                    eprintln!("capture reader {attempt} stalled; a new one from {next_seq}");
                    break;
                }
            }
        }
        if (replies.len() as u64) >= total {
            return replies;
        }
    }
    panic!(
        "the capture stream never handed out what it holds: {} read",
        replies.len()
    );
}

/// A reader of the capture stream from `start` and how many replies it has to read.
async fn capture_reader(
    js: &jetstream::Context,
    start: u64,
) -> Option<(jetstream::consumer::PullConsumer, u64)> {
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
                        deliver_policy: jetstream::consumer::DeliverPolicy::ByStartSequence {
                            start_sequence: start,
                        },
                        ..Default::default()
                    })
                    .await
                    .ok()
            }
        },
    )
    .await
    .ok()?;
    let pending = consumer.cached_info().num_pending;
    Some((consumer, pending))
}

/// The tag a delivered reply answers: the fake model echoes it (`echo: <tag>`).
pub fn reply_tag(payload: &[u8]) -> String {
    let body: Value = serde_json::from_slice(payload).unwrap();
    let text = body["text"].as_str().unwrap_or_default();
    text.strip_prefix("echo: ")
        .unwrap_or(text)
        .trim()
        .to_owned()
}

/// The last `lines` lines of `text`.
pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
