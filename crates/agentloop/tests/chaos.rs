//! Chaos: every service as its own `agentloop <service>` process against a private NATS
//! server, Postgres and the fake model server; runners killed with SIGKILL or stopped with
//! SIGTERM, NATS and Postgres restarted under load. Each message carries a unique tag that the
//! fake model echoes, so "answered exactly once" is checked per message, and the runs and
//! transcript tables are checked for overlapping runs and duplicated or orphaned entries.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a failed fixture should panic the test

mod support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use futures::StreamExt as _;
use serde_json::{Value, json};

use agentloop_fake_model::{FakeModel, FakeModelConfig, ScriptedReply};
use agentloop_testkit::{
    NatsServer, PrivatePostgres, ServiceProcess, TestDatabase, free_port, wait_until,
};
use agentloop_tool_server::{RemoteTool, ToolServer};
use support::load::{self, in_flight_of};

const BIN: &str = env!("CARGO_BIN_EXE_agentloop");
const READY: Duration = Duration::from_secs(30);

/// The services of one stack, each its own process, and how to reach what they share.
struct Stack {
    env: Vec<(String, String)>,
    memory: ServiceProcess,
    router: ServiceProcess,
    delivery: ServiceProcess,
    runners: Vec<ServiceProcess>,
    others: Vec<ServiceProcess>,
}

impl Stack {
    async fn start(
        nats_url: &str,
        database_url: &str,
        fake: &FakeModel,
        runners: usize,
        extra: &[(&str, &str)],
    ) -> Self {
        let memory_port = free_port().unwrap();
        let mut env: Vec<(String, String)> = vec![
            ("NATS_URL".into(), nats_url.into()),
            ("DATABASE_URL".into(), database_url.into()),
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
            ("AGENTLOOP_BUS__ACK_WAIT_MS".into(), "2000".into()),
            ("AGENTLOOP_RUNNER__LEASE_TTL_MS".into(), "1200".into()),
            ("AGENTLOOP_RUNNER__SWEEP_INTERVAL_MS".into(), "200".into()),
            ("AGENTLOOP_RUNNER__DRAIN_TIMEOUT_MS".into(), "5000".into()),
        ];
        for (key, value) in extra {
            env.retain(|(k, _)| k != key);
            env.push(((*key).to_owned(), (*value).to_owned()));
        }
        let mut memory = ServiceProcess::spawn(BIN.as_ref(), "memory", "memory", &env).unwrap();
        memory.wait_ready(READY).await.unwrap();
        let router = ServiceProcess::spawn(BIN.as_ref(), "router", "router", &env).unwrap();
        let delivery = ServiceProcess::spawn(BIN.as_ref(), "delivery", "delivery", &env).unwrap();
        let mut stack = Self {
            env,
            memory,
            router,
            delivery,
            runners: Vec::new(),
            others: Vec::new(),
        };
        for i in 0..runners {
            stack.add_runner(&format!("runner-{i}"));
        }
        stack.router.wait_ready(READY).await.unwrap();
        stack.delivery.wait_ready(READY).await.unwrap();
        for runner in &mut stack.runners {
            runner.wait_ready(READY).await.unwrap();
        }
        stack
    }

    /// Starts one more runner whose lease owner id is `name`, without waiting for it.
    fn add_runner(&mut self, name: &str) -> usize {
        let mut env = self.env.clone();
        env.push(("AGENTLOOP_RUNNER__OWNER_ID".into(), name.into()));
        self.runners
            .push(ServiceProcess::spawn(BIN.as_ref(), "runner", name, &env).unwrap());
        self.runners.len() - 1
    }

    fn runner(&mut self, name: &str) -> &mut ServiceProcess {
        self.runners.iter_mut().find(|r| r.name() == name).unwrap()
    }

    /// SIGTERMs every process still running and asserts each exits 0 within `within`.
    async fn stop_all(mut self, within: Duration) {
        let mut all: Vec<ServiceProcess> = self.runners.drain(..).collect();
        all.append(&mut self.others);
        all.push(self.router);
        all.push(self.delivery);
        all.push(self.memory);
        for process in &all {
            let _ = process.terminate();
        }
        for process in &mut all {
            let status = process.wait_exit(within).await.unwrap();
            assert!(
                status.success(),
                "{} exited with {status}:\n{}",
                process.name(),
                process.logs()
            );
        }
    }
}

/// Replies seen on `agentloop.deliver.>`, kept in a stream of the test's own so none is missed
/// while a client reconnects, counted by the tag they echo.
#[derive(Clone, Default)]
struct Replies {
    by_tag: Arc<Mutex<HashMap<String, usize>>>,
    /// When each tag's first reply was captured.
    first_at: Arc<Mutex<HashMap<String, Instant>>>,
    total: Arc<AtomicUsize>,
}

impl Replies {
    async fn capture(js: &jetstream::Context) -> (Self, tokio::task::JoinHandle<()>) {
        let stream = js
            .create_stream(jetstream::stream::Config {
                name: "TEST_CAPTURE".into(),
                subjects: vec!["agentloop.deliver.>".into()],
                storage: jetstream::stream::StorageType::File,
                ..Default::default()
            })
            .await
            .unwrap();
        let consumer = stream
            .create_consumer(jetstream::consumer::pull::Config {
                durable_name: Some("test".into()),
                // Acked, so a reply in flight to this capture when the broker dies comes again.
                ack_policy: jetstream::consumer::AckPolicy::Explicit,
                ack_wait: Duration::from_secs(1),
                ..Default::default()
            })
            .await
            .unwrap();
        let replies = Self::default();
        let sink = replies.clone();
        let task = tokio::spawn(async move {
            let mut seen = HashSet::new();
            // Re-opened when the server restarts under it, the way the services must too.
            loop {
                let Ok(mut messages) = consumer
                    .stream()
                    .heartbeat(Duration::from_millis(500))
                    .expires(Duration::from_secs(2))
                    .messages()
                    .await
                else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                while let Some(next) = messages.next().await {
                    let Ok(msg) = next else { break };
                    // After a broker restart the capture consumer itself may hand out a stored
                    // reply again; only distinct stored messages are distinct deliveries.
                    let Ok(info) = msg.info() else { continue };
                    let fresh = seen.insert(info.stream_sequence);
                    let _ = msg.ack().await;
                    if !fresh {
                        continue;
                    }
                    let tag = load::reply_tag(&msg.payload);
                    sink.first_at
                        .lock()
                        .unwrap()
                        .entry(tag.clone())
                        .or_insert_with(Instant::now);
                    *sink.by_tag.lock().unwrap().entry(tag).or_default() += 1;
                    sink.total.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        (replies, task)
    }

    fn count(&self, tag: &str) -> usize {
        self.by_tag.lock().unwrap().get(tag).copied().unwrap_or(0)
    }

    /// Asserts that each of `sessions` × `messages` conversation turns (as [`converse`] tags
    /// them) was answered exactly once, and nothing else was.
    fn assert_each_once(&self, sessions: usize, messages: usize) {
        for s in 0..sessions {
            for m in 0..messages {
                let tag = format!("m-s{s:02}-{m}");
                assert_eq!(self.count(&tag), 1, "replies to {tag}");
            }
        }
        assert_eq!(self.total(), sessions * messages);
    }

    /// Failover: from `fault` to the first reply to any of `moved` (the runs the faulted
    /// runner had in flight, which another runner must take over). `None` when none came.
    fn failover(&self, moved: &[String], fault: Instant) -> Option<Duration> {
        let first_at = self.first_at.lock().unwrap();
        moved
            .iter()
            .filter_map(|tag| first_at.get(tag))
            .map(|at| at.saturating_duration_since(fault))
            .min()
    }

    fn total(&self) -> usize {
        self.total.load(Ordering::SeqCst)
    }
}

/// Publishes a message until JetStream acknowledges it (the message is then accepted).
async fn send(js: &jetstream::Context, session: &str, tag: &str, directives: &str) {
    load::publish_until_acked(js, session, tag, directives, None).await;
}

/// A runs-table row as the invariant checks read it.
type RunRow = (String, String, f64, Option<f64>, String, i32, String);
/// A transcript row as the invariant checks read it.
type EntryRow = (String, String, String, Option<String>, Option<String>);

/// Runs `sessions` conversations of `messages` turns each; every turn waits for its reply.
fn converse(
    js: &jetstream::Context,
    replies: &Replies,
    sessions: usize,
    messages: usize,
    directives: &'static str,
) -> tokio::task::JoinSet<()> {
    let mut set = tokio::task::JoinSet::new();
    for s in 0..sessions {
        let js = js.clone();
        let replies = replies.clone();
        set.spawn(async move {
            let session = format!("chaos:s{s:02}");
            for m in 0..messages {
                let tag = format!("m-s{s:02}-{m}");
                send(&js, &session, &tag, directives).await;
                wait_until(
                    &format!("a reply to {tag}"),
                    Duration::from_secs(40),
                    || {
                        let seen = replies.count(&tag);
                        async move { (seen > 0).then_some(()) }
                    },
                )
                .await
                .unwrap();
            }
        });
    }
    set
}

async fn join_all_ok(mut set: tokio::task::JoinSet<()>) {
    while let Some(done) = set.join_next().await {
        done.unwrap();
    }
}

/// Waits until no work is left anywhere: every inbox row consumed, every run finished, the
/// outbound and run consumers with nothing pending, so late duplicates would have shown up.
async fn wait_quiet(js: &jetstream::Context, db: &sqlx::PgPool) {
    wait_until("the stack to go quiet", Duration::from_secs(30), || async {
        let (pending, running): (i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM session_inbox WHERE consumed_at IS NULL), \
                    (SELECT count(*) FROM runs WHERE finished_at IS NULL)",
        )
        .fetch_one(db)
        .await
        .ok()?;
        if pending + running > 0 {
            return None;
        }
        for (stream, consumer) in [
            ("AGENTLOOP_OUTBOUND", "delivery"),
            ("AGENTLOOP_RUNS", "runner"),
        ] {
            let mut consumer: jetstream::consumer::PullConsumer = js
                .get_stream(stream)
                .await
                .ok()?
                .get_consumer(consumer)
                .await
                .ok()?;
            let info = consumer.info().await.ok()?;
            if info.num_pending > 0 || info.num_ack_pending > 0 {
                return None;
            }
        }
        Some(())
    })
    .await
    .unwrap();
}

/// Asserts the tables' invariants: runs of one session never overlap, every run finished
/// completed, and each run's transcript has one user entry, one final answer and exactly one
/// result per tool call.
async fn assert_tables(db: &sqlx::PgPool, expected_runs: usize) -> Vec<(String, i32)> {
    let runs: Vec<RunRow> = sqlx::query_as(
        "SELECT id::text, session_id::text, extract(epoch FROM started_at)::float8, \
                extract(epoch FROM finished_at)::float8, status, attempts, coalesce(owner, '') \
         FROM runs ORDER BY session_id, started_at",
    )
    .fetch_all(db)
    .await
    .unwrap();
    if runs.len() != expected_runs {
        // Which inputs have no run, and what the inbox says about them.
        let orphans: Vec<(String, String, i64, bool)> = sqlx::query_as(
            "SELECT s.key, i.idempotency_key, i.seq, i.consumed_at IS NOT NULL \
             FROM session_inbox i JOIN sessions s ON s.id = i.session_id \
             WHERE NOT EXISTS (SELECT 1 FROM runs r WHERE r.inbox_seq = i.seq) \
             ORDER BY i.seq",
        )
        .fetch_all(db)
        .await
        .unwrap_or_default();
        let inbox: i64 = sqlx::query_scalar("SELECT count(*) FROM session_inbox")
            .fetch_one(db)
            .await
            .unwrap_or(-1);
        panic!(
            "one run per accepted message: {} runs, {expected_runs} expected; {inbox} inbox rows; \
             inputs without a run (session, key, seq, consumed): {orphans:?}",
            runs.len()
        );
    }
    let mut last_end: HashMap<&str, f64> = HashMap::new();
    for (id, session, started, finished, status, _, _) in &runs {
        assert_eq!(status, "completed", "run {id}");
        let finished = finished.expect("every run finished");
        if let Some(previous) = last_end.get(session.as_str()) {
            assert!(
                previous <= started,
                "session {session}: run {id} started before the previous one finished"
            );
        }
        last_end.insert(session, finished);
    }
    let entries: Vec<EntryRow> = sqlx::query_as(
        "SELECT coalesce(run_id::text, ''), entry_key, role, tool_call_id, data \
         FROM transcript_entries",
    )
    .fetch_all(db)
    .await
    .unwrap();
    let mut by_run: BTreeMap<&str, Vec<&EntryRow>> = BTreeMap::new();
    for entry in &entries {
        by_run.entry(entry.0.as_str()).or_default().push(entry);
    }
    let run_ids: HashSet<&str> = runs.iter().map(|r| r.0.as_str()).collect();
    for (run_id, entries) in &by_run {
        assert!(run_ids.contains(run_id), "entries of unknown run {run_id}");
        let users = entries.iter().filter(|e| e.2 == "user").count();
        assert_eq!(users, 1, "run {run_id}: user entries {entries:?}");
        let mut calls: Vec<String> = Vec::new();
        let mut finals = 0;
        for (_, _, role, _, data) in entries.iter().copied() {
            if role != "assistant" {
                continue;
            }
            let tool_calls = data
                .as_deref()
                .filter(|d| !d.is_empty())
                .and_then(|d| serde_json::from_str::<Value>(d).ok())
                .and_then(|d| d["toolCalls"].as_array().cloned())
                .unwrap_or_default();
            if tool_calls.is_empty() {
                finals += 1;
            }
            calls.extend(
                tool_calls
                    .iter()
                    .map(|c| c["id"].as_str().unwrap_or_default().to_owned()),
            );
        }
        assert_eq!(finals, 1, "run {run_id}: final answers {entries:?}");
        let results: Vec<&str> = entries
            .iter()
            .filter(|e| e.2 == "tool")
            .map(|e| e.3.as_deref().unwrap_or_default())
            .collect();
        for call in &calls {
            let n = results.iter().filter(|r| **r == call.as_str()).count();
            assert_eq!(n, 1, "run {run_id}: call {call} has {n} results");
        }
        assert_eq!(
            results.len(),
            calls.len(),
            "run {run_id}: orphaned tool results"
        );
    }
    assert_eq!(by_run.len(), expected_runs, "every run has a transcript");
    runs.into_iter().map(|r| (r.6, r.5)).collect()
}

async fn running_owned_by(db: &sqlx::PgPool, owner: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM runs WHERE finished_at IS NULL AND owner = $1")
        .bind(owner)
        .fetch_one(db)
        .await
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_one_of_three_runners_mid_run_answers_every_message_exactly_once() {
    // Arrange: three runners, 50 sessions of three slow turns each, runner-0 mid-run.
    let MidRun {
        _nats,
        _db,
        _fake,
        js,
        replies,
        capture,
        mut stack,
        pool,
        conversations,
        moved,
    } = MidRun::start(50, 30).await;

    // Act: kill -9 the runner while it has runs in flight, and start a fresh replica.
    stack.runner("runner-0").kill();
    let killed_at = Instant::now();
    let late = stack.add_runner("runner-late");
    stack.runners[late].wait_ready(READY).await.unwrap();
    join_all_ok(conversations).await;

    // Assert
    wait_quiet(&js, &pool).await;
    replies.assert_each_once(50, 3);
    // A figure for the notes, not an assertion: `--no-capture` prints it.
    println!(
        "failover after kill -9 of a runner (lease 1.2 s, sweep 200 ms): {:?}",
        replies.failover(&moved, killed_at)
    );
    let runs = assert_tables(&pool, 150).await;
    assert!(
        runs.iter().any(|(_, attempts)| *attempts > 1),
        "some run was resumed after the kill"
    );
    let late_runs = runs
        .iter()
        .filter(|(owner, _)| owner == "runner-late")
        .count();
    assert!(late_runs > 0, "the late replica took no work: {runs:?}");
    capture.abort();
    stack.runners.retain(|r| r.name() != "runner-0");
    stack.stop_all(Duration::from_secs(10)).await;
}

/// What a runner-fault test starts from: three runners (lease 1.2 s) answering `sessions`
/// conversations of three slow turns each, once runner-0 has runs in flight and `replied`
/// replies have come; `moved` are the inputs of runner-0's runs at that moment.
struct MidRun {
    _nats: NatsServer,
    _db: TestDatabase,
    _fake: FakeModel,
    js: jetstream::Context,
    replies: Replies,
    capture: tokio::task::JoinHandle<()>,
    stack: Stack,
    pool: sqlx::PgPool,
    conversations: tokio::task::JoinSet<()>,
    moved: Vec<String>,
}

impl MidRun {
    async fn start(sessions: usize, replied: usize) -> Self {
        let nats = NatsServer::start().unwrap();
        let db = TestDatabase::create().await.unwrap();
        let fake = FakeModel::start(FakeModelConfig::default()).await.unwrap();
        let client = async_nats::connect(nats.url()).await.unwrap();
        let js = jetstream::new(client);
        let (replies, capture) = Replies::capture(&js).await;
        let stack = Stack::start(nats.url(), db.url(), &fake, 3, &[]).await;
        let pool = db.pool().await.unwrap();
        let conversations = converse(&js, &replies, sessions, 3, "[[delay_ms:300]]");
        wait_until("runner-0 to be mid-run", Duration::from_secs(30), || {
            let pool = pool.clone();
            let total = replies.total();
            async move {
                (total >= replied && running_owned_by(&pool, "runner-0").await > 0).then_some(())
            }
        })
        .await
        .unwrap();
        let moved = in_flight_of(&pool, "runner-0").await;
        Self {
            _nats: nats,
            _db: db,
            _fake: fake,
            js,
            replies,
            capture,
            stack,
            pool,
            conversations,
            moved,
        }
    }
}

/// Sends SIGSTOP or SIGCONT to a process.
fn signal(process: &ServiceProcess, sig: &str) {
    let status = std::process::Command::new("kill")
        .args([sig, &process.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {sig} {}", process.pid());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_paused_past_its_lease_loses_its_sessions_and_its_late_writes_are_refused() {
    // Arrange: three runners (lease 1.2 s), 30 sessions of three slow turns each, runner-0
    // mid-run.
    let MidRun {
        _nats,
        _db,
        _fake,
        js,
        replies,
        capture,
        mut stack,
        pool,
        conversations,
        moved,
    } = MidRun::start(30, 20).await;

    // Act: SIGSTOP the runner for three lease lengths (a GC pause, a throttled container, a
    // VM migration), then let it go on: it wakes up holding runs whose sessions other runners
    // have taken over meanwhile.
    signal(stack.runner("runner-0"), "-STOP");
    let paused_at = Instant::now();
    let before = replies.total();
    wait_until(
        "other runners to answer meanwhile",
        Duration::from_secs(30),
        || {
            let total = replies.total();
            async move { (total > before + 5).then_some(()) }
        },
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(3_600).saturating_sub(paused_at.elapsed())).await;
    signal(stack.runner("runner-0"), "-CONT");
    join_all_ok(conversations).await;

    // Assert: every message answered once, no two runs of a session overlapping, the paused
    // runner's runs resumed elsewhere.
    wait_quiet(&js, &pool).await;
    // A late duplicate from the woken runner would arrive in the moments after.
    tokio::time::sleep(Duration::from_secs(2)).await;
    replies.assert_each_once(30, 3);
    println!(
        "failover after SIGSTOP of a runner (lease 1.2 s, sweep 200 ms): {:?}",
        replies.failover(&moved, paused_at)
    );
    let runs = assert_tables(&pool, 90).await;
    assert!(
        runs.iter().any(|(_, attempts)| *attempts > 1),
        "a run of the paused runner was resumed by another: {runs:?}"
    );
    capture.abort();
    stack.stop_all(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_that_finished_before_the_crash_is_not_executed_again() {
    // Arrange: two runners, a remote tool counting its executions per tag, and a model that
    // calls it, then takes long over the next turn.
    let nats = NatsServer::start().unwrap();
    let db = TestDatabase::create().await.unwrap();
    let fake = FakeModel::start(FakeModelConfig::default()).await.unwrap();
    let client = async_nats::connect(nats.url()).await.unwrap();
    let js = jetstream::new(client);
    let (replies, capture) = Replies::capture(&js).await;
    let executions: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let counted = executions.clone();
    let tools = ToolServer::connect(nats.url(), "agentloop")
        .await
        .unwrap()
        .tool(RemoteTool {
            name: "charge".into(),
            description: "Charges a card once per order.".into(),
            parameters: json!({"type": "object", "properties": {"order": {"type": "string"}}}),
            parallel_safe: false,
            timeout_ms: Some(5_000),
            handler: Arc::new(move |arguments: Value| {
                let counted = counted.clone();
                Box::pin(async move {
                    let order = arguments["order"].as_str().unwrap_or_default().to_owned();
                    *counted.lock().unwrap().entry(order.clone()).or_default() += 1;
                    Ok(format!("charged {order}"))
                })
            }),
        });
    let tools_stop = tokio_util::sync::CancellationToken::new();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let tool_task = tokio::spawn(tools.serve(tools_stop.clone(), move || {
        let _ = ready_tx.send(());
    }));
    ready_rx.await.unwrap();
    let mut stack = Stack::start(nats.url(), db.url(), &fake, 2, &[]).await;
    let pool = db.pool().await.unwrap();
    fake.push_script(ScriptedReply::tool_call("charge", json!({"order": "o-1"})));
    fake.push_script(ScriptedReply::text("echo: paid").with_delay(Duration::from_secs(20)));

    // Act: once the slow turn is asked for, the tool result is persisted; kill its runner.
    send(&js, "chaos:tool", "pay", "").await;
    wait_until(
        "the slow second model turn",
        Duration::from_secs(20),
        || {
            let n = fake.requests().len();
            async move { (n >= 2).then_some(()) }
        },
    )
    .await
    .unwrap();
    let owner: String = sqlx::query_scalar("SELECT owner FROM runs WHERE finished_at IS NULL")
        .fetch_one(&pool)
        .await
        .unwrap();
    stack.runner(&owner).kill();

    // Assert
    wait_until("the final reply", Duration::from_secs(20), || {
        let total = replies.total();
        async move { (total >= 1).then_some(()) }
    })
    .await
    .unwrap();
    wait_quiet(&js, &pool).await;
    assert_eq!(executions.lock().unwrap().get("o-1").copied(), Some(1));
    assert_eq!(replies.total(), 1);
    let runs = assert_tables(&pool, 1).await;
    assert_eq!(runs[0].1, 2, "the run was resumed by the other runner");
    assert_ne!(runs[0].0, owner);
    capture.abort();
    tools_stop.cancel();
    tool_task.await.unwrap().unwrap();
    stack.runners.retain(|r| r.name() != owner);
    stack.stop_all(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarting_nats_mid_load_answers_every_accepted_message_once() {
    // Arrange: a broker configured to survive a crash (every stored message synced), since
    // replies are counted from a stream on the same broker.
    let nats = NatsServer::start_durable().unwrap();
    let db = TestDatabase::create().await.unwrap();
    let fake = FakeModel::start(FakeModelConfig::default()).await.unwrap();
    let client = async_nats::connect(nats.url()).await.unwrap();
    let js = jetstream::new(client);
    let (replies, capture) = Replies::capture(&js).await;
    let stack = Stack::start(nats.url(), db.url(), &fake, 2, &[]).await;
    let pool = db.pool().await.unwrap();
    let conversations = converse(&js, &replies, 20, 3, "[[delay_ms:200]]");

    // Act: the broker dies with work in every stage, and comes back with its store.
    wait_until("some replies", Duration::from_secs(30), || {
        let total = replies.total();
        async move { (total >= 15).then_some(()) }
    })
    .await
    .unwrap();
    let (port, dir) = nats.kill_keep_store();
    // An outage long enough for publishes and acks to fail, short enough for a fast test.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _nats = NatsServer::start_on(Some(port), Some(dir)).unwrap();
    join_all_ok(conversations).await;

    // Assert
    wait_quiet(&js, &pool).await;
    replies.assert_each_once(20, 3);
    assert_tables(&pool, 60).await;
    capture.abort();
    stack.stop_all(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarting_postgres_mid_load_loses_nothing_and_memory_recovers_by_itself() {
    // Arrange: a Postgres of this test alone, since it is the one restarted.
    let mut pg = tokio::task::block_in_place(PrivatePostgres::start).unwrap();
    let database_url = pg.url("agentloop");
    let nats = NatsServer::start().unwrap();
    let fake = FakeModel::start(FakeModelConfig::default()).await.unwrap();
    let client = async_nats::connect(nats.url()).await.unwrap();
    let js = jetstream::new(client);
    let (replies, capture) = Replies::capture(&js).await;
    let stack = Stack::start(nats.url(), &database_url, &fake, 2, &[]).await;
    let conversations = converse(&js, &replies, 20, 3, "[[delay_ms:200]]");

    // Act
    wait_until("some replies", Duration::from_secs(30), || {
        let total = replies.total();
        async move { (total >= 15).then_some(()) }
    })
    .await
    .unwrap();
    tokio::task::block_in_place(|| pg.stop()).unwrap();
    wait_until(
        "memory to report not ready",
        Duration::from_secs(10),
        || async { (!stack.memory.is_ready().await).then_some(()) },
    )
    .await
    .unwrap();
    tokio::task::block_in_place(|| pg.start_again()).unwrap();
    wait_until(
        "memory to be ready again",
        Duration::from_secs(20),
        || async { stack.memory.is_ready().await.then_some(()) },
    )
    .await
    .unwrap();
    join_all_ok(conversations).await;

    // Assert
    let pool = sqlx::PgPool::connect(&database_url).await.unwrap();
    wait_quiet(&js, &pool).await;
    replies.assert_each_once(20, 3);
    assert_tables(&pool, 60).await;
    pool.close().await;
    capture.abort();
    stack.stop_all(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_the_run_in_flight_finish_and_hands_queued_input_to_another_runner() {
    // Arrange: a lease TTL far longer than the test, so only a hand-back moves the session.
    let nats = NatsServer::start().unwrap();
    let db = TestDatabase::create().await.unwrap();
    let fake = FakeModel::start(FakeModelConfig::default()).await.unwrap();
    let client = async_nats::connect(nats.url()).await.unwrap();
    let js = jetstream::new(client);
    let (replies, capture) = Replies::capture(&js).await;
    let extra = [
        ("AGENTLOOP_RUNNER__LEASE_TTL_MS", "30000"),
        ("AGENTLOOP_RUNNER__DRAIN_TIMEOUT_MS", "5000"),
    ];
    let mut stack = Stack::start(nats.url(), db.url(), &fake, 2, &extra).await;
    let mut gateway =
        ServiceProcess::spawn(BIN.as_ref(), "gateway", "gateway", &stack.env).unwrap();
    gateway.wait_ready(READY).await.unwrap();
    stack.others.push(gateway);
    let pool = db.pool().await.unwrap();
    send(&js, "chaos:drain", "first", "[[delay_ms:1500]]").await;
    let owner: String = wait_until("the first run", Duration::from_secs(20), || async {
        sqlx::query_scalar::<_, String>("SELECT owner FROM runs WHERE finished_at IS NULL")
            .fetch_optional(&pool)
            .await
            .ok()
            .flatten()
    })
    .await
    .unwrap();
    send(&js, "chaos:drain", "second", "").await;
    wait_until(
        "the second input queued",
        Duration::from_secs(20),
        || async {
            let n: i64 =
                sqlx::query_scalar("SELECT count(*) FROM session_inbox WHERE consumed_at IS NULL")
                    .fetch_one(&pool)
                    .await
                    .ok()?;
            (n == 2).then_some(())
        },
    )
    .await
    .unwrap();

    // Act
    let signalled = Instant::now();
    stack.runner(&owner).terminate().unwrap();
    let status = stack
        .runner(&owner)
        .wait_exit(Duration::from_secs(6))
        .await
        .unwrap();

    // Assert: it finished its run within the drain time, and the other runner answered the
    // queued input long before the lease could have expired.
    assert!(status.success(), "{}", stack.runner(&owner).logs());
    assert!(signalled.elapsed() < Duration::from_secs(5));
    wait_until("both replies", Duration::from_secs(10), || {
        let total = replies.total();
        async move { (total >= 2).then_some(()) }
    })
    .await
    .unwrap();
    wait_quiet(&js, &pool).await;
    assert_eq!(replies.count("first"), 1);
    assert_eq!(replies.count("second"), 1);
    let runs = assert_tables(&pool, 2).await;
    assert_eq!(
        runs[0],
        (owner.clone(), 1),
        "the first run finished where it started"
    );
    assert_ne!(
        runs[1].0, owner,
        "the queued input moved to the other runner"
    );
    capture.abort();
    stack.runners.retain(|r| r.name() != owner);
    stack.stop_all(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_longer_than_the_drain_time_moves_to_another_runner_and_is_answered_once() {
    // Arrange
    let nats = NatsServer::start().unwrap();
    let db = TestDatabase::create().await.unwrap();
    let fake = FakeModel::start(FakeModelConfig::default()).await.unwrap();
    let client = async_nats::connect(nats.url()).await.unwrap();
    let js = jetstream::new(client);
    let (replies, capture) = Replies::capture(&js).await;
    let extra = [
        ("AGENTLOOP_RUNNER__LEASE_TTL_MS", "30000"),
        ("AGENTLOOP_RUNNER__DRAIN_TIMEOUT_MS", "500"),
    ];
    let mut stack = Stack::start(nats.url(), db.url(), &fake, 2, &extra).await;
    let pool = db.pool().await.unwrap();
    send(&js, "chaos:long", "long", "[[delay_ms:2500]]").await;
    let owner: String = wait_until("the run", Duration::from_secs(20), || async {
        sqlx::query_scalar::<_, String>("SELECT owner FROM runs WHERE finished_at IS NULL")
            .fetch_optional(&pool)
            .await
            .ok()
            .flatten()
    })
    .await
    .unwrap();

    // Act
    let signalled = Instant::now();
    stack.runner(&owner).terminate().unwrap();
    let status = stack
        .runner(&owner)
        .wait_exit(Duration::from_secs(3))
        .await
        .unwrap();

    // Assert: out within the drain time (plus process teardown), and the run resumed elsewhere.
    assert!(status.success(), "{}", stack.runner(&owner).logs());
    assert!(signalled.elapsed() < Duration::from_millis(2000));
    wait_until("the reply", Duration::from_secs(15), || {
        let total = replies.total();
        async move { (total >= 1).then_some(()) }
    })
    .await
    .unwrap();
    wait_quiet(&js, &pool).await;
    assert_eq!(
        replies.count("long"),
        1,
        "answered once, with the model's answer"
    );
    let runs = assert_tables(&pool, 1).await;
    assert_ne!(runs[0].0, owner);
    assert_eq!(runs[0].1, 2);
    capture.abort();
    stack.runners.retain(|r| r.name() != owner);
    stack.stop_all(Duration::from_secs(10)).await;
}
