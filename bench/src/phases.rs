//! The measured phases: closed-loop load at a given concurrency, with CPU accounting,
//! reply checks and a persistence check in Postgres.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use sqlx::PgPool;

use crate::api::{ChatApi, WsClient};
use crate::client::{Done, LoadClient, Tally, Trace};
use crate::procfs::{self, CpuSnapshot};
use crate::stack::{ALL_PROCESS, Stack};

/// What one phase measured.
#[derive(Debug, Default, Clone)]
pub struct PhaseResult {
    /// Phase tag (also the prefix of every idempotency key it sent).
    pub name: String,
    /// Sessions sending at once.
    pub concurrency: usize,
    /// Runner replicas.
    pub runners: usize,
    /// Messages sent.
    pub sent: u64,
    /// Replies received with the right text.
    pub ok: u64,
    /// Replies with a wrong text or an error.
    pub wrong: u64,
    /// Messages without a reply in time (or failed publishes).
    pub lost: u64,
    /// First publish to last reply.
    pub elapsed: Duration,
    /// Publish to final reply, per message.
    pub totals: Vec<Duration>,
    /// Publish to first assistant delta, per message (when events were watched).
    pub first_deltas: Vec<Duration>,
    /// Publish to the final reply on `<prefix>.outbound.>`, per message (bus messages only).
    pub outbounds: Vec<Duration>,
    /// Duplicates and strays seen by the reply watcher.
    pub tally: Tally,
    /// CPU ticks spent per process group.
    pub cpu_ticks: BTreeMap<String, u64>,
    /// Runs of this phase with status `completed` in the runs table.
    pub persisted: Option<i64>,
    /// Transcript entries of those runs.
    pub transcript_entries: Option<i64>,
    /// The first failure seen (a lost message's error), for the log.
    pub first_error: Option<String>,
    /// Enqueue and FinishRun calls memory carried during the phase, and the batches (one round
    /// trip and commit each) it sent them in.
    pub batched: Option<(u64, u64)>,
    /// The whole machine's CPU time over the phase (every process, and the hypervisor's steal).
    pub machine: Option<procfs::MachineTicks>,
}

impl PhaseResult {
    /// Completed runs per second.
    pub fn rate(&self) -> f64 {
        self.ok as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// CPU-ms per completed run over the given groups.
    pub fn cpu_ms_per_run(&self, groups: &[&str], tck: u64) -> f64 {
        let ticks: u64 = groups
            .iter()
            .map(|g| self.cpu_ticks.get(*g).copied().unwrap_or(0))
            .sum();
        ticks as f64 * 1000.0 / tck as f64 / self.ok.max(1) as f64
    }
}

/// Groups whose CPU counts as "the whole stack" (`agentloop`: the one process of `--mode all`).
pub const STACK_GROUPS: [&str; 8] = [
    ALL_PROCESS,
    "gateway",
    "router",
    "runner",
    "memory",
    "delivery",
    "nats-server",
    "postgres",
];

/// Postgres processes working for the bench: the bench database's backends (but the bench's
/// own), the shared background writers, and the postmaster.
///
/// # Errors
/// When `pg_stat_activity` cannot be read.
pub async fn postgres_pids(pool: &PgPool, db_name: &str) -> anyhow::Result<Vec<(u32, String)>> {
    let pids: Vec<i32> = sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity \
         WHERE (datname = $1 AND pid <> pg_backend_pid()) \
            OR backend_type IN ('checkpointer', 'background writer', 'walwriter', 'autovacuum launcher')",
    )
    .bind(db_name)
    .fetch_all(pool)
    .await
    .context("failed to read pg_stat_activity")?;
    let mut out: Vec<(u32, String)> = pids
        .iter()
        .filter_map(|p| u32::try_from(*p).ok())
        .map(|p| (p, "postgres".to_owned()))
        .collect();
    if let Some(postmaster) = out.first().and_then(|(p, _)| procfs::parent_pid(*p)) {
        out.push((postmaster, "postgres".to_owned()));
    }
    Ok(out)
}

fn all_pids(stack: &Stack, pg: &[(u32, String)]) -> Vec<(u32, String)> {
    let mut pids = stack.pids();
    pids.extend(pg.iter().cloned());
    pids.push((std::process::id(), "bench".to_owned()));
    pids
}

/// How a phase loads the stack.
#[derive(Debug, Clone)]
pub struct Load {
    /// Phase tag; must not contain `_` or `%` (used in a LIKE pattern).
    pub name: String,
    /// Distinct sessions.
    pub sessions: usize,
    /// Sessions sending at once (workers); each worker takes sessions in turn.
    pub concurrency: usize,
    /// Messages each session sends, one after the other.
    pub per_session: usize,
    /// No new message is sent after this.
    pub max_duration: Duration,
    /// How messages reach the stack.
    pub via: Via,
}

/// The way a phase sends its messages.
#[derive(Clone, Default)]
pub enum Via {
    /// Publish InboundMessages on JetStream, replies on `<prefix>.deliver.>`.
    #[default]
    Bus,
    /// The gateway's `<prefix>.ask` request/reply.
    Ask,
    /// The gateway's WebSocket `agent` method at this URL, one connection per worker.
    Ws(String),
    /// An OpenAI-compatible `POST /v1/chat/completions`.
    Http(ChatApi),
    /// Every message published on JetStream at once (see [`crate::burst`]).
    Burst,
}

impl std::fmt::Debug for Via {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Bus => "Bus",
            Self::Ask => "Ask",
            Self::Ws(_) => "Ws",
            Self::Http(_) => "Http",
            Self::Burst => "Burst",
        })
    }
}

/// Runs one closed-loop phase and measures it.
///
/// # Errors
/// When the stack's bookkeeping (Postgres) fails; lost messages are counted, not errors.
pub async fn run(
    stack: &Stack,
    client: &LoadClient,
    pool: &PgPool,
    load: &Load,
    runners: usize,
) -> anyhow::Result<PhaseResult> {
    let _ = client.take_tally();
    let pg_before = postgres_pids(pool, &stack.db_name).await?;
    let cpu_before = CpuSnapshot::take(&all_pids(stack, &pg_before));
    let machine_before = procfs::MachineTicks::take();
    let batches_before = stack.memory_batches().await;
    let mut result = match load.via {
        Via::Burst => crate::burst::drive(client, load).await?,
        _ => drive(client, load, runners).await?,
    };
    let machine_after = procfs::MachineTicks::take();
    let batches_after = stack.memory_batches().await;
    let pg_after = postgres_pids(pool, &stack.db_name).await?;
    let mut pids = all_pids(stack, &pg_before);
    pids.extend(pg_after);
    let cpu_after = CpuSnapshot::take(&pids);
    result.cpu_ticks = cpu_after.delta_since(&cpu_before);
    result.machine = machine_before
        .zip(machine_after)
        .map(|(before, after)| after.since(&before));
    result.batched = batches_before
        .zip(batches_after)
        .map(|(before, after)| (after.0 - before.0, after.1 - before.1));
    // Runs are marked finished just after their reply is published: give the last ones a moment.
    // Found by the tag as idempotency key, or (keyless requests) by the user entry's text.
    let keyless = matches!(&load.via, Via::Http(api) if !api.keyed());
    let (pattern, runs_sql, entries_sql) = if keyless {
        (
            format!("bench {}-%", load.name),
            "SELECT count(*) FROM runs r JOIN transcript_entries t \
             ON t.run_id = r.id AND t.session_id = r.session_id AND t.role = 'user' \
             WHERE r.status = 'completed' AND t.content LIKE $1",
            "SELECT count(*) FROM transcript_entries t WHERE t.run_id IN \
             (SELECT u.run_id FROM transcript_entries u WHERE u.role = 'user' AND u.content LIKE $1)",
        )
    } else {
        (
            format!("{}-%", load.name),
            "SELECT count(*) FROM runs WHERE status = 'completed' AND idempotency_key LIKE $1",
            "SELECT count(*) FROM transcript_entries t JOIN runs r ON r.id = t.run_id \
             WHERE r.idempotency_key LIKE $1",
        )
    };
    let settle = Instant::now() + Duration::from_secs(5);
    loop {
        let persisted: i64 = sqlx::query_scalar(runs_sql)
            .bind(&pattern)
            .fetch_one(pool)
            .await
            .context("failed to count runs")?;
        result.persisted = Some(persisted);
        if persisted >= i64::try_from(result.ok).unwrap_or(i64::MAX) || Instant::now() > settle {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let entries: i64 = sqlx::query_scalar(entries_sql)
        .bind(&pattern)
        .fetch_one(pool)
        .await
        .context("failed to count transcript entries")?;
    result.transcript_entries = Some(entries);
    // Late duplicates would show up within this pause.
    tokio::time::sleep(Duration::from_millis(300)).await;
    result.tally = client.take_tally();
    // Answered on the outbound subject but never delivered: the user did not get it.
    result.ok = result.ok.saturating_sub(result.tally.undelivered);
    result.lost += result.tally.undelivered;
    Ok(result)
}

/// Drives one closed-loop phase: `load.concurrency` workers, each taking its sessions in turn;
/// counts replies and latencies (no CPU or persistence accounting).
///
/// # Errors
/// When a load worker panics; lost messages are counted, not errors.
pub async fn drive(
    client: &LoadClient,
    load: &Load,
    runners: usize,
) -> anyhow::Result<PhaseResult> {
    let start = Instant::now();
    let deadline = start + load.max_duration;
    let mut workers = Vec::with_capacity(load.concurrency);
    for w in 0..load.concurrency {
        let client = client.clone();
        let load = load.clone();
        workers.push(tokio::spawn(async move {
            let mut done: Vec<anyhow::Result<Done>> = Vec::new();
            let mut asked: Vec<anyhow::Result<Duration>> = Vec::new();
            let mut session = w;
            let mut ws = match &load.via {
                Via::Ws(url) => match WsClient::connect(url).await {
                    Ok(ws) => Some(ws),
                    Err(err) => {
                        eprintln!("[bench] worker {w}: {err:#}");
                        done.push(Err(err));
                        return (done, asked);
                    }
                },
                _ => None,
            };
            while session < load.sessions {
                let key = format!("bench:{}:{session}", load.name);
                for m in 0..load.per_session {
                    if Instant::now() > deadline {
                        return (done, asked);
                    }
                    let tag = format!("{}-{session}-{m}", load.name);
                    match (&load.via, ws.as_mut()) {
                        (Via::Ask, _) => asked.push(client.ask(&key, &tag).await),
                        (Via::Ws(_), Some(ws)) => done.push(ws.agent(&key, &tag).await),
                        (Via::Http(api), _) => done.push(api.send(&key, &tag).await),
                        _ => done.push(client.send(&key, &tag).await),
                    }
                }
                session += load.concurrency;
            }
            (done, asked)
        }));
    }
    let mut result = PhaseResult {
        name: load.name.clone(),
        concurrency: load.concurrency,
        runners,
        ..Default::default()
    };
    for worker in workers {
        let (done, asked) = worker.await.context("load worker panicked")?;
        for outcome in done {
            result.sent += 1;
            match outcome {
                Ok(d) if d.text_ok => {
                    result.ok += 1;
                    result.totals.push(d.total);
                    if let Some(f) = d.first_delta {
                        result.first_deltas.push(f);
                    }
                    if let Some(o) = d.outbound {
                        result.outbounds.push(o);
                    }
                }
                Ok(_) => result.wrong += 1,
                Err(err) => {
                    result.lost += 1;
                    result.first_error.get_or_insert_with(|| format!("{err:#}"));
                }
            }
        }
        for outcome in asked {
            result.sent += 1;
            match outcome {
                Ok(total) => {
                    result.ok += 1;
                    result.totals.push(total);
                }
                Err(err) if format!("{err:#}").contains("answered") => result.wrong += 1,
                Err(_) => result.lost += 1,
            }
        }
    }
    result.elapsed = start.elapsed();
    Ok(result)
}

/// A run's timestamps joined from the bench's trace and the database (µs since the epoch).
#[derive(Debug, Clone, Default)]
pub struct HopRow {
    /// From the bus.
    pub trace: Trace,
    /// `session_inbox.enqueued_at`
    pub enqueued: Option<f64>,
    /// `runs.started_at`
    pub started: Option<f64>,
    /// `runs.finished_at`
    pub finished: Option<f64>,
    /// The assistant transcript entry's `created_at` (FinishRun's transaction start).
    pub assistant_entry: Option<f64>,
}

type DbTimes = (String, Option<f64>, Option<f64>, Option<f64>, Option<f64>);

/// Joins traces with the database timestamps of the same runs.
///
/// # Errors
/// When the query fails.
pub async fn hop_rows(
    pool: &PgPool,
    phase: &str,
    traces: Vec<(String, Trace)>,
) -> anyhow::Result<Vec<HopRow>> {
    let rows: Vec<DbTimes> = sqlx::query_as(
        "SELECT r.idempotency_key, \
                extract(epoch FROM i.enqueued_at)::float8 * 1e6, \
                extract(epoch FROM r.started_at)::float8 * 1e6, \
                extract(epoch FROM r.finished_at)::float8 * 1e6, \
                (SELECT extract(epoch FROM max(t.created_at))::float8 * 1e6 FROM transcript_entries t \
                  WHERE t.session_id = r.session_id AND t.run_id = r.id AND t.role = 'assistant') \
         FROM runs r \
         JOIN session_inbox i ON i.seq = r.inbox_seq \
         WHERE r.idempotency_key LIKE $1",
    )
    .bind(format!("{phase}-%"))
    .fetch_all(pool)
    .await
    .context("failed to read run timestamps")?;
    let by_key: BTreeMap<String, DbTimes> = rows.into_iter().map(|r| (r.0.clone(), r)).collect();
    Ok(traces
        .into_iter()
        .filter_map(|(tag, trace)| {
            let (_, enqueued, started, finished, assistant_entry) = by_key.get(&tag)?.clone();
            Some(HopRow {
                trace,
                enqueued,
                started,
                finished,
                assistant_entry,
            })
        })
        .collect())
}
