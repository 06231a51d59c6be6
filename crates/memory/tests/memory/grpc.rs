//! The real gRPC server on port 0, called through the generated client.

use std::time::Duration;

use agentloop_lifecycle::Health;
use agentloop_memory::{Memory, MemoryConfig, MemoryError, MemorySettings};
use agentloop_proto::v1 as pb;
use agentloop_proto::v1::session_service_client::SessionServiceClient;
use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::Code;
use tonic::transport::Channel;

use crate::wait_until;

/// A memory server running in this process.
pub(crate) struct Running {
    addr: String,
    health: Health,
    pub(crate) client: SessionServiceClient<Channel>,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), MemoryError>>,
}

impl Running {
    pub(crate) async fn start(database_url: String) -> Running {
        Self::start_with_secret(database_url, "").await
    }

    async fn start_with_secret(database_url: String, secret: &str) -> Running {
        Self::start_with(MemorySettings {
            database_url,
            secret: secret.to_owned(),
            ..MemorySettings::default()
        })
        .await
    }

    /// Starts memory on a loopback port 0 with `settings` otherwise; `client` speaks plain
    /// HTTP/2 (and only connects at its first call when memory serves TLS).
    pub(crate) async fn start_with(settings: MemorySettings) -> Running {
        let tls = !settings.tls_cert_file.is_empty();
        let config = MemoryConfig {
            memory: MemorySettings {
                listen: "127.0.0.1:0".to_owned(),
                max_connections: 4,
                ..settings
            },
        };
        let health = Health::new();
        let memory = Memory::bind(config, health.clone())
            .await
            .expect("port 0 on loopback binds");
        let addr = memory.local_addr().to_string();
        let url = format!("http://{addr}");
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(memory.serve(shutdown.clone()));
        let client = if tls {
            Channel::from_shared(url).expect("valid").connect_lazy()
        } else {
            Channel::from_shared(url)
                .expect("valid")
                .connect()
                .await
                .expect("the listener is bound, so connecting succeeds")
        };
        let client = SessionServiceClient::new(client);
        Running {
            addr,
            health,
            client,
            shutdown,
            task,
        }
    }

    fn ready(&self) -> bool {
        self.health.readiness().0
    }

    pub(crate) async fn wait_ready(&self) {
        wait_until("memory to be ready", Duration::from_secs(10), || async {
            self.ready().then_some(())
        })
        .await;
    }

    /// Waits for memory to stop on its own and returns how it ended.
    pub(crate) async fn finished(self) -> Result<(), MemoryError> {
        self.task.await.expect("the serve task does not panic")
    }

    /// Cancels, waits for the graceful stop and asserts it succeeded.
    pub(crate) async fn stop(self) {
        self.shutdown.cancel();
        let stopped = tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("memory stops within 10s")
            .expect("the serve task does not panic");
        assert!(stopped.is_ok(), "{stopped:?}");
    }
}

/// Returns a URL for the database behind a `#[sqlx::test]` pool.
pub(crate) fn url_of(pool: &PgPool) -> String {
    let options = pool.connect_options();
    format!(
        "postgres://{}@{}:{}/{}",
        options.get_username(),
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap_or("postgres"),
    )
}

#[sqlx::test(migrations = "./migrations")]
async fn with_a_shared_secret_a_caller_without_it_reads_nothing(pool: PgPool) {
    // Arrange: memory asking for a secret, and a session stored through a caller that has it.
    let server = Running::start_with_secret(url_of(&pool), "s3cret").await;
    server.wait_ready().await;
    let url = format!("http://{}", server.addr);
    let mut trusted = SessionServiceClient::new(
        agentloop_telemetry::traced_channel(&url, "s3cret").expect("valid"),
    );
    let resolve = pb::ResolveSessionRequest {
        session_key: "cli:alice".to_owned(),
        agent_id: String::new(),
        channel: "cli".to_owned(),
    };
    let session = trusted
        .resolve_session(resolve.clone())
        .await
        .expect("the secret is accepted")
        .into_inner();

    // Act: a caller that merely reaches the port, and one with a wrong secret.
    let mut stranger = server.client.clone();
    let anonymous = stranger.resolve_session(resolve.clone()).await;
    let mut guesser = SessionServiceClient::new(
        agentloop_telemetry::traced_channel(&url, "guess").expect("valid"),
    );
    let history = guesser
        .get_history(pb::GetHistoryRequest {
            session_id: session.id.clone(),
            ..Default::default()
        })
        .await;

    // Assert: both refused as unauthenticated.
    assert_eq!(
        anonymous.expect_err("refused").code(),
        Code::Unauthenticated
    );
    assert_eq!(history.expect_err("refused").code(), Code::Unauthenticated);
    server.stop().await;
}

/// A directory of its own under the system's temp dir, removed on drop.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_nanos();
        let dir = std::env::temp_dir().join(format!("{name}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("the temp dir is writable");
        TempDir(dir)
    }

    fn path(&self, file: &str) -> String {
        self.0.join(file).to_string_lossy().into_owned()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[sqlx::test(migrations = "./migrations")]
async fn with_tls_only_a_client_trusting_the_ca_gets_through(pool: PgPool) {
    // Arrange: a CA, a server certificate it signed, a CA nobody signed with, and memory
    // serving TLS with that certificate.
    let dir = TempDir::new("agentloop-memory-tls");
    agentloop_testkit::certs::make_ca(&dir.0, "ca");
    agentloop_testkit::certs::make_ca(&dir.0, "stranger");
    agentloop_testkit::certs::make_server_certificate(&dir.0);
    let server = Running::start_with(MemorySettings {
        database_url: url_of(&pool),
        tls_cert_file: dir.path("server.pem"),
        tls_key_file: dir.path("server.key"),
        ..MemorySettings::default()
    })
    .await;
    server.wait_ready().await;
    let url = format!("https://{}", server.addr);
    let ca = dir.path("ca.pem");
    let stranger_ca = dir.path("stranger.pem");
    let client = |ca_file: &str, domain: &str| {
        SessionServiceClient::new(
            agentloop_telemetry::traced_channel_tls(
                &url,
                "",
                agentloop_telemetry::ChannelTls { ca_file, domain },
            )
            .expect("valid settings"),
        )
    };
    let resolve = pb::ResolveSessionRequest {
        session_key: "cli:alice".to_owned(),
        agent_id: String::new(),
        channel: "cli".to_owned(),
    };
    let call = |mut client: SessionServiceClient<_>| {
        let resolve = resolve.clone();
        async move {
            tokio::time::timeout(Duration::from_secs(10), client.resolve_session(resolve))
                .await
                .expect("a call ends within 10s")
        }
    };

    // Act: clients trusting the CA (checking the IP, and the name `localhost`), a plaintext
    // one, one trusting another CA, and one expecting another name.
    let by_ip = call(client(&ca, "")).await;
    let by_name = call(client(&ca, "localhost")).await;
    let plaintext = call(SessionServiceClient::new(
        agentloop_telemetry::traced_channel(&format!("http://{}", server.addr), "").expect("valid"),
    ))
    .await;
    let untrusting = call(client(&stranger_ca, "")).await;
    let wrong_name = call(client(&ca, "memory.example")).await;

    // Assert: only the clients trusting the CA get an answer, the same session.
    let session = by_ip
        .expect("a client trusting the CA gets through")
        .into_inner();
    assert_eq!(
        by_name.expect("the name matches too").into_inner().id,
        session.id
    );
    for (who, refused) in [
        ("plaintext", plaintext),
        ("untrusting", untrusting),
        ("wrong name", wrong_name),
    ] {
        // Transport failures only: `Unavailable` from a failed handshake, `Unknown` from a
        // connection the server closed mid-request.
        let status = refused.expect_err(who);
        assert!(
            matches!(status.code(), Code::Unavailable | Code::Unknown),
            "{who}: {status:?}"
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn a_half_or_unreadable_tls_setting_stops_memory_at_start() {
    let start = |cert: &str, key: &str| {
        let config = MemoryConfig {
            memory: MemorySettings {
                listen: "127.0.0.1:0".to_owned(),
                tls_cert_file: cert.to_owned(),
                tls_key_file: key.to_owned(),
                ..MemorySettings::default()
            },
        };
        Memory::bind(config, Health::new())
    };

    let half = start("/etc/memory/tls.crt", "")
        .await
        .err()
        .expect("refused");
    let unreadable = start("/nonexistent/tls.crt", "/nonexistent/tls.key")
        .await
        .err()
        .expect("refused");

    assert!(half.to_string().contains("tls_key_file"), "{half}");
    assert!(
        unreadable.to_string().contains("/nonexistent/tls.crt"),
        "{unreadable}"
    );
}

#[sqlx::test(migrations = "./migrations")]
async fn the_grpc_api_carries_a_whole_run(pool: PgPool) {
    let server = Running::start(url_of(&pool)).await;
    server.wait_ready().await;
    let mut client = server.client.clone();

    let session = client
        .resolve_session(pb::ResolveSessionRequest {
            session_key: "cli:alice".to_owned(),
            agent_id: String::new(),
            channel: "cli".to_owned(),
        })
        .await
        .unwrap()
        .into_inner();
    let enqueued = client
        .enqueue(pb::EnqueueRequest {
            session_id: session.id.clone(),
            idempotency_key: "k1".to_owned(),
            kind: "user".to_owned(),
            payload: b"hello".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let claim = client
        .claim_session(pb::ClaimSessionRequest {
            session_id: session.id.clone(),
            owner: "runner-a".to_owned(),
            ttl_ms: 60_000,
        })
        .await
        .unwrap()
        .into_inner();
    let taken = client
        .take_next(pb::TakeNextRequest {
            session_id: session.id.clone(),
            epoch: claim.epoch,
            owner: "runner-a".to_owned(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let run = taken.run.clone().unwrap();
    let appended = client
        .append_entries(pb::AppendEntriesRequest {
            session_id: session.id.clone(),
            epoch: claim.epoch,
            entries: vec![
                pb::Entry {
                    key: "u1".to_owned(),
                    role: "user".to_owned(),
                    content: "hello".to_owned(),
                    run_id: run.id.clone(),
                    ..pb::Entry::default()
                },
                pb::Entry {
                    key: "a1".to_owned(),
                    role: "assistant".to_owned(),
                    content: "hi".to_owned(),
                    ..pb::Entry::default()
                },
            ],
        })
        .await
        .unwrap()
        .into_inner();
    client
        .finish_run(pb::FinishRunRequest {
            session_id: session.id.clone(),
            epoch: claim.epoch,
            run_id: run.id.clone(),
            inbox_seq: run.inbox_seq,
            status: "completed".to_owned(),
            model: "fake/model".to_owned(),
            input_tokens: 3,
            output_tokens: 5,
            ..pb::FinishRunRequest::default()
        })
        .await
        .unwrap();
    let released = client
        .release_session(pb::ReleaseSessionRequest {
            session_id: session.id.clone(),
            epoch: claim.epoch,
        })
        .await
        .unwrap()
        .into_inner();
    let history = client
        .get_history(pb::GetHistoryRequest {
            session_id: session.id.clone(),
            limit: 0,
        })
        .await
        .unwrap()
        .into_inner();

    assert!(session.created);
    assert_eq!(session.agent_id, "main");
    assert_eq!(session.channel, "cli");
    assert!(session.created_at.is_some());
    assert!(enqueued.inserted);
    assert!(claim.claimed);
    assert_eq!(claim.owner, "runner-a");
    let item = taken.item.unwrap();
    assert_eq!((item.seq, item.kind.as_str()), (enqueued.seq, "user"));
    assert_eq!(item.payload, b"hello");
    assert_eq!((run.status.as_str(), run.attempts), ("running", 1));
    assert_eq!(run.session_id, session.id);
    assert!(run.finished_at.is_none());
    assert_eq!(appended.appended, 2);
    assert!(released.released);
    let keys: Vec<_> = history.entries.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(keys, ["u1", "a1"]);
    assert_eq!(history.entries[0].run_id, run.id);
    assert_eq!(history.entries[1].run_id, "");
    server.stop().await;
}

#[sqlx::test(migrations = "./migrations")]
async fn a_dispatch_without_a_session_id_resolves_the_session_by_key_and_a_repeat_gets_the_first_record(
    pool: PgPool,
) {
    let server = Running::start(url_of(&pool)).await;
    server.wait_ready().await;
    let mut client = server.client.clone();
    let begin = |idempotency_key: &str, run_handle: uuid::Uuid| pb::BeginDispatchRequest {
        session_key: "webchat:dora".to_owned(),
        idempotency_key: idempotency_key.to_owned(),
        run_handle: run_handle.to_string(),
        agent_id: "helper".to_owned(),
        channel: "webchat".to_owned(),
        ..Default::default()
    };
    let (first_handle, second_handle) = (uuid::Uuid::now_v7(), uuid::Uuid::now_v7());

    let first = client
        .begin_dispatch(begin("k1", first_handle))
        .await
        .unwrap()
        .into_inner();
    let repeat = client
        .begin_dispatch(begin("k1", second_handle))
        .await
        .unwrap()
        .into_inner();
    let other = client
        .begin_dispatch(begin("k2", second_handle))
        .await
        .unwrap()
        .into_inner();
    let session = client
        .resolve_session(pb::ResolveSessionRequest {
            session_key: "webchat:dora".to_owned(),
            agent_id: String::new(),
            channel: String::new(),
        })
        .await
        .unwrap()
        .into_inner();

    assert!(first.created);
    assert_eq!(first.run_handle, first_handle.to_string());
    assert_eq!(first.status, "accepted");
    assert!(first.expires_at.is_some());
    // The dispatch created the session, with the agent and channel it named.
    assert!(!session.created);
    assert_eq!(first.session_id, session.id);
    assert_eq!(
        (session.agent_id.as_str(), session.channel.as_str()),
        ("helper", "webchat")
    );
    assert!(!repeat.created);
    assert_eq!(repeat.run_handle, first_handle.to_string());
    assert_eq!(repeat.session_id, session.id);
    assert!(other.created);
    assert_eq!(other.session_id, session.id);
    server.stop().await;
}

#[sqlx::test(migrations = "./migrations")]
async fn bad_requests_and_lost_leases_map_onto_status_codes(pool: PgPool) {
    let server = Running::start(url_of(&pool)).await;
    server.wait_ready().await;
    let mut client = server.client.clone();
    let session = client
        .resolve_session(pb::ResolveSessionRequest {
            session_key: "s".to_owned(),
            ..pb::ResolveSessionRequest::default()
        })
        .await
        .unwrap()
        .into_inner();

    let empty_key = client
        .resolve_session(pb::ResolveSessionRequest::default())
        .await
        .unwrap_err();
    let bad_uuid = client
        .get_history(pb::GetHistoryRequest {
            session_id: "not-a-uuid".to_owned(),
            limit: 1,
        })
        .await
        .unwrap_err();
    let bad_kind = client
        .enqueue(pb::EnqueueRequest {
            session_id: session.id.clone(),
            idempotency_key: "k".to_owned(),
            kind: "shout".to_owned(),
            payload: Vec::new(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    let unknown_session = client
        .enqueue(pb::EnqueueRequest {
            session_id: uuid::Uuid::now_v7().to_string(),
            idempotency_key: "k".to_owned(),
            kind: "user".to_owned(),
            payload: Vec::new(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    let never_claimed = client
        .append_entries(pb::AppendEntriesRequest {
            session_id: session.id.clone(),
            epoch: 0,
            entries: vec![pb::Entry {
                key: "m1".to_owned(),
                role: "user".to_owned(),
                ..pb::Entry::default()
            }],
        })
        .await
        .unwrap_err();

    assert_eq!(empty_key.code(), Code::InvalidArgument);
    assert_eq!(bad_uuid.code(), Code::InvalidArgument);
    assert_eq!(bad_kind.code(), Code::InvalidArgument);
    assert_eq!(unknown_session.code(), Code::NotFound);
    assert_eq!(never_claimed.code(), Code::FailedPrecondition);
    assert!(
        never_claimed.message().starts_with("lease lost"),
        "{}",
        never_claimed.message()
    );
    server.stop().await;
}

#[tokio::test]
async fn calls_before_the_database_is_reachable_answer_unavailable() {
    // Nothing listens on port 1: the server keeps retrying and never becomes ready.
    let server = Running::start("postgres://postgres@127.0.0.1:1/agentloop".to_owned()).await;
    let mut client = server.client.clone();

    let status = client
        .resolve_session(pb::ResolveSessionRequest {
            session_key: "s".to_owned(),
            ..pb::ResolveSessionRequest::default()
        })
        .await
        .unwrap_err();

    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(status.message(), "memory is starting: database not ready");
    assert!(!server.ready());
    server.stop().await;
}

#[sqlx::test(migrations = false)]
async fn a_missing_database_is_created_and_migrated_on_start(pool: PgPool) {
    let name = format!("agentloop_created_{}", uuid::Uuid::now_v7().simple());
    let url = url_of(&pool)
        .rsplit_once('/')
        .map(|(base, _)| format!("{base}/{name}"))
        .unwrap();
    let server = Running::start(url).await;

    server.wait_ready().await;
    let mut client = server.client.clone();
    let session = client
        .resolve_session(pb::ResolveSessionRequest {
            session_key: "first".to_owned(),
            ..pb::ResolveSessionRequest::default()
        })
        .await
        .unwrap()
        .into_inner();

    assert!(session.created);
    server.stop().await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE \"{name}\" WITH (FORCE)"
    )))
    .execute(&pool)
    .await
    .unwrap();
}

#[sqlx::test(migrations = "./migrations")]
async fn an_enqueue_past_the_inbox_cap_answers_queue_full_with_the_cap(pool: PgPool) {
    let server = Running::start_with(MemorySettings {
        database_url: url_of(&pool),
        inbox_max_pending: 2,
        ..MemorySettings::default()
    })
    .await;
    server.wait_ready().await;
    let mut client = server.client.clone();
    let session = client
        .resolve_session(pb::ResolveSessionRequest {
            session_key: "cli:flood".to_owned(),
            agent_id: String::new(),
            channel: "cli".to_owned(),
        })
        .await
        .unwrap()
        .into_inner();
    let enqueue = |key: &str, claim_owner: &str| pb::EnqueueRequest {
        session_id: session.id.clone(),
        idempotency_key: key.to_owned(),
        kind: "user".to_owned(),
        payload: key.as_bytes().to_vec(),
        claim_owner: claim_owner.to_owned(),
        claim_ttl_ms: 60_000,
        take_when_claimed: !claim_owner.is_empty(),
        history_limit: 10,
        history_after_seq: 0,
    };

    let mut answers = Vec::new();
    for key in ["k1", "k2", "k3"] {
        answers.push(client.enqueue(enqueue(key, "")).await.unwrap().into_inner());
    }
    let repeat = client
        .enqueue(enqueue("k1", ""))
        .await
        .unwrap()
        .into_inner();
    // Refused, with the lease free: the claim is taken for the inputs already pending.
    let claimed = client
        .enqueue(enqueue("k4", "runner-a"))
        .await
        .unwrap()
        .into_inner();

    assert!(answers[0].inserted && answers[1].inserted);
    assert!(!answers[0].queue_full && !answers[1].queue_full);
    assert_eq!(answers[0].inbox_max_pending, 0);
    assert!(answers[2].queue_full, "{:?}", answers[2]);
    assert!(!answers[2].inserted);
    assert_eq!(answers[2].seq, 0);
    assert_eq!(answers[2].inbox_max_pending, 2);
    assert!(!repeat.queue_full && !repeat.inserted);
    assert_eq!(repeat.seq, answers[0].seq);
    assert!(claimed.queue_full && claimed.claimed, "{claimed:?}");
    let taken = claimed
        .taken
        .and_then(|t| t.item)
        .expect("the oldest input");
    assert_eq!(taken.idempotency_key, "k1");
    server.stop().await;
}

#[sqlx::test(migrations = "./migrations")]
async fn history_and_claimable_counts_past_the_cap_are_cut_to_it(pool: PgPool) {
    // Arrange: a session with more transcript entries than one call may return.
    const CAP: usize = 1000;
    let server = Running::start(url_of(&pool)).await;
    server.wait_ready().await;
    let mut client = server.client.clone();
    let session = client
        .resolve_session(pb::ResolveSessionRequest {
            session_key: "cli:long".to_owned(),
            agent_id: String::new(),
            channel: "cli".to_owned(),
        })
        .await
        .unwrap()
        .into_inner();
    let claim = client
        .claim_session(pb::ClaimSessionRequest {
            session_id: session.id.clone(),
            owner: "runner-a".to_owned(),
            ttl_ms: 60_000,
        })
        .await
        .unwrap()
        .into_inner();
    let entries = (0..=CAP)
        .map(|i| pb::Entry {
            key: format!("e{i}"),
            role: "user".to_owned(),
            content: format!("message {i}"),
            ..pb::Entry::default()
        })
        .collect();
    client
        .append_entries(pb::AppendEntriesRequest {
            session_id: session.id.clone(),
            epoch: claim.epoch,
            entries,
        })
        .await
        .unwrap();
    let newest = format!("e{CAP}");

    // Act and assert: every count a caller can send, at its largest.
    let history = client
        .get_history(pb::GetHistoryRequest {
            session_id: session.id.clone(),
            limit: u32::MAX,
        })
        .await
        .unwrap()
        .into_inner()
        .entries;
    // GetHistory reads further (the gateway pages back through it); all 1,001 come.
    assert_eq!(history.len(), CAP + 1, "GetHistory");
    assert_eq!(history.last().unwrap().key, newest);

    client
        .enqueue(pb::EnqueueRequest {
            session_id: session.id.clone(),
            idempotency_key: "k1".to_owned(),
            kind: "user".to_owned(),
            payload: b"hello".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap();
    let taken = client
        .take_next(pb::TakeNextRequest {
            session_id: session.id.clone(),
            epoch: claim.epoch,
            owner: "runner-a".to_owned(),
            history_limit: u32::MAX,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(taken.history.len(), CAP, "TakeNext");
    let run = taken.run.unwrap();
    client
        .finish_run(pb::FinishRunRequest {
            session_id: session.id.clone(),
            epoch: claim.epoch,
            run_id: run.id,
            inbox_seq: run.inbox_seq,
            status: "completed".to_owned(),
            release_if_idle: true,
            ..pb::FinishRunRequest::default()
        })
        .await
        .unwrap();

    let enqueued = client
        .enqueue(pb::EnqueueRequest {
            session_id: session.id.clone(),
            idempotency_key: "k2".to_owned(),
            kind: "user".to_owned(),
            payload: b"again".to_vec(),
            claim_owner: "runner-b".to_owned(),
            claim_ttl_ms: 60_000,
            take_when_claimed: true,
            history_limit: u32::MAX,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(enqueued.claimed, "the finished run released the lease");
    assert_eq!(enqueued.taken.unwrap().history.len(), CAP, "Enqueue");

    let claimable = client
        .list_claimable(pb::ListClaimableRequest { limit: u32::MAX })
        .await
        .unwrap()
        .into_inner();
    assert!(claimable.session_ids.is_empty(), "{claimable:?}");
    server.stop().await;
}
