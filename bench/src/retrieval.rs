//! `--retrieval`: how well and how fast memory's long-term search finds what a user told the
//! assistant. The memory service runs alone as a process of its own on a fresh database; the
//! bench saves the dataset's facts for one user through `SaveMemory`, asks each question through
//! `SearchMemories` (limit 5, min_score 0) for recall@1 and recall@5, fills the table to 100,000
//! memories (1,000 other users and 500 more of the measured user's own) and times
//! `SearchMemories` over gRPC at that size. One table, kept in its own section of
//! `bench/RESULTS.md`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::FutureExt as _;
use futures::future::BoxFuture;

use agentloop_proto::v1 as pb;
use pb::session_service_client::SessionServiceClient;

use crate::options::Options;
use crate::report::{Pct, pct};
use crate::retrieval_data::{Fact, dataset_path, filler, load, recall_at};
use crate::stack::Stack;
use crate::step;

/// Opens the retrieval section of `bench/RESULTS.md`.
pub const BEGIN: &str = "<!-- retrieval:begin -->";
/// Closes it.
pub const END: &str = "<!-- retrieval:end -->";
/// Where this section stands in `bench/RESULTS.md`.
pub const SECTION: crate::section::Markers = crate::section::Markers {
    begin: BEGIN,
    end: END,
};

/// Memories in the table when the latency is measured.
const TOTAL: usize = 100_000;
/// Filler memories of the measured user itself: what its searches rank the facts among.
const OWN_FILLER: usize = 500;
/// Other users the rest of the filler is spread over.
const OTHER_USERS: usize = 1000;
/// Rows per `INSERT` of the filler.
const BATCH: usize = 5000;
/// The agent every memory belongs to.
const AGENT: &str = "main";
/// The most memories a search returns here, and the k of the wider recall.
const LIMIT: u32 = 5;
/// The statement memory's `SearchMemories` runs (read from its crate, so that the two agree).
const SEARCH_SQL: &str = include_str!("../../crates/memory/src/store/queries/search_memories.sql");
/// Recall@k and latency at the scale of a real assistant: hybrid search (full-text with
/// embeddings) is to reach these.
const TARGET_RECALL_AT_5: f64 = 0.9;
const TARGET_P50_MS: f64 = 2.0;

/// Where each question's fact came back.
#[derive(Debug, Clone, Default)]
pub struct Recall {
    /// 0-based place of each question's fact in its results, `None` when not returned.
    pub ranks: Vec<Option<usize>>,
    /// Questions that returned nothing at all.
    pub empty: usize,
}

/// What a `--retrieval` run measured.
pub struct Retrieval {
    date: String,
    commit: String,
    machine: (usize, String, String),
    postgres: String,
    facts: usize,
    /// Questions that share at least one word stem with their fact: the most full-text search
    /// can find.
    overlap: usize,
    /// With the facts alone stored for the user.
    alone: Recall,
    /// With the measured user's filler as well, at [`TOTAL`] memories.
    crowded: Recall,
    /// Memories and users in the table after the fill.
    stored: (i64, i64),
    /// How long the filler's `INSERT`s and the `ANALYZE` took.
    fill: Duration,
    passes: usize,
    latency: Pct,
    /// Memory's search statement run by the bench itself over the same questions.
    sql_latency: Pct,
}

/// Memory's gRPC calls as the bench makes them (boxed so that nothing here names the client's
/// transport type, which lives in tonic, not a dependency of the bench).
struct Api {
    save: Box<dyn Fn(pb::SaveMemoryRequest) -> BoxFuture<'static, anyhow::Result<String>>>,
    search:
        Box<dyn Fn(pb::SearchMemoriesRequest) -> BoxFuture<'static, anyhow::Result<Vec<String>>>>,
}

impl Api {
    async fn connect(url: String) -> anyhow::Result<Self> {
        let client = SessionServiceClient::connect(url)
            .await
            .context("failed to connect to memory's gRPC API")?;
        let for_save = client.clone();
        Ok(Self {
            save: Box::new(move |req| {
                let mut c = for_save.clone();
                async move { Ok(c.save_memory(req).await?.into_inner().id) }.boxed()
            }),
            search: Box::new(move |req| {
                let mut c = client.clone();
                async move {
                    let found = c.search_memories(req).await?.into_inner().memories;
                    Ok(found.into_iter().map(|m| m.id).collect())
                }
                .boxed()
            }),
        })
    }

    async fn search(&self, user_key: &str, query: &str) -> anyhow::Result<Vec<String>> {
        (self.search)(pb::SearchMemoriesRequest {
            scope: Some(scope(user_key)),
            query: query.to_owned(),
            limit: LIMIT,
            min_score: 0.0,
            query_embedding: None,
        })
        .await
    }
}

fn scope(user_key: &str) -> pb::MemoryScope {
    pb::MemoryScope {
        agent_id: AGENT.to_owned(),
        user_key: user_key.to_owned(),
        ..Default::default()
    }
}

/// Starts the memory service on the stack's fresh database and measures; the caller stops it.
///
/// # Errors
/// When the dataset does not load, memory does not start, or a call fails.
pub async fn run(
    stack: &mut Stack,
    options: &Options,
    commit: String,
) -> anyhow::Result<Retrieval> {
    let facts = load(&dataset_path())?;
    step(&format!(
        "retrieval: starting the memory service (database {})",
        stack.db_name
    ));
    stack.start_memory().await?;
    let api = Api::connect(stack.memory_url()).await?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&stack.database_url)
        .await
        .context("failed to connect to the bench database")?;
    let user_key = format!("bench:retrieval:{}", stack.db_name);

    step(&format!("saving {} facts through SaveMemory", facts.len()));
    let mut memory_of = HashMap::with_capacity(facts.len());
    for fact in &facts {
        let id = (api.save)(pb::SaveMemoryRequest {
            scope: Some(scope(&user_key)),
            text: fact.fact.clone(),
            source: "tool".to_owned(),
            ..Default::default()
        })
        .await
        .with_context(|| format!("SaveMemory of fact {}", fact.id))?;
        memory_of.insert(fact.id, id);
    }
    let overlap = overlap(&pool, &facts).await?;

    step("recall, the facts alone");
    let alone = recall(&api, &user_key, &facts, &memory_of).await?;
    report_misses("facts alone", &facts, &alone);

    let filler_total = TOTAL - facts.len() - OWN_FILLER;
    step(&format!(
        "filling to {TOTAL} memories: {OWN_FILLER} more for the user, {filler_total} for {OTHER_USERS} others (SQL, batches of {BATCH})"
    ));
    let t0 = Instant::now();
    let mut rows: Vec<(String, String)> = filler(1, OWN_FILLER)
        .into_iter()
        .map(|t| (user_key.clone(), t))
        .collect();
    for user in 0..OTHER_USERS {
        let count = filler_total / OTHER_USERS + usize::from(user < filler_total % OTHER_USERS);
        let key = format!("bench:filler:{user}");
        rows.extend(
            filler(1000 + user as u64, count)
                .into_iter()
                .map(|t| (key.clone(), t)),
        );
    }
    for chunk in rows.chunks(BATCH) {
        insert(&pool, chunk).await?;
    }
    sqlx::query("ANALYZE memories").execute(&pool).await?;
    let fill = t0.elapsed();
    let stored: (i64, i64) =
        sqlx::query_as("SELECT count(*), count(DISTINCT user_key) FROM memories")
            .fetch_one(&pool)
            .await?;
    step(&format!(
        "{} memories of {} users in {:.1} s",
        stored.0,
        stored.1,
        fill.as_secs_f64()
    ));

    step("recall among the user's filler (also the latency warm-up)");
    let crowded = recall(&api, &user_key, &facts, &memory_of).await?;
    report_misses("with filler", &facts, &crowded);

    let passes = if options.quick { 2 } else { 5 };
    step(&format!(
        "latency: {passes} passes over {} questions, one call at a time",
        facts.len()
    ));
    let mut sample = Vec::with_capacity(passes * facts.len());
    for _ in 0..passes {
        for fact in &facts {
            let t = Instant::now();
            api.search(&user_key, &fact.question).await?;
            sample.push(t.elapsed());
        }
    }
    // The same statement memory runs, straight from the bench: what of the call is Postgres.
    let mut sql_sample = Vec::with_capacity(passes * facts.len());
    for _ in 0..passes {
        for fact in &facts {
            let t = Instant::now();
            sqlx::query(SEARCH_SQL)
                .bind(None::<sqlx::types::Uuid>)
                .bind("")
                .bind("")
                .bind("")
                .bind(&user_key)
                .bind(AGENT)
                .bind(&fact.question)
                .bind(0.0_f64)
                .bind(i64::from(LIMIT))
                .fetch_all(&pool)
                .await?;
            sql_sample.push(t.elapsed());
        }
    }
    let postgres: String = sqlx::query_scalar("SHOW server_version")
        .fetch_one(&pool)
        .await
        .unwrap_or_default();
    pool.close().await;
    Ok(Retrieval {
        date: chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string(),
        commit,
        machine: crate::procfs::machine(),
        postgres,
        facts: facts.len(),
        overlap,
        alone,
        crowded,
        stored,
        fill,
        passes,
        latency: pct(&sample),
        sql_latency: pct(&sql_sample),
    })
}

/// Questions that share a word stem with their fact, by the same rule the search uses.
async fn overlap(pool: &sqlx::PgPool, facts: &[Fact]) -> anyhow::Result<usize> {
    let (texts, questions): (Vec<String>, Vec<String>) = facts
        .iter()
        .map(|f| (f.fact.clone(), f.question.clone()))
        .unzip();
    let n: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM unnest($1::text[], $2::text[]) AS x(fact, question) \
         WHERE to_tsvector('english'::regconfig, fact) @@ agentloop_memory_query(question)",
    )
    .bind(texts)
    .bind(questions)
    .fetch_one(pool)
    .await?;
    Ok(usize::try_from(n).unwrap_or(0))
}

/// Filler rows straight into `memories` (its tsvector column is generated); ids from the user
/// and text, so a run's filler is the same on every machine.
async fn insert(pool: &sqlx::PgPool, rows: &[(String, String)]) -> anyhow::Result<()> {
    let (users, texts): (Vec<String>, Vec<String>) = rows.iter().cloned().unzip();
    sqlx::query(
        "INSERT INTO memories (id, agent_id, user_key, text, source) \
         SELECT md5(u || chr(10) || t)::uuid, $3, u, t, 'tool' \
         FROM unnest($1::text[], $2::text[]) AS x(u, t)",
    )
    .bind(users)
    .bind(texts)
    .bind(AGENT)
    .execute(pool)
    .await
    .context("failed to insert filler memories")?;
    Ok(())
}

async fn recall(
    api: &Api,
    user_key: &str,
    facts: &[Fact],
    memory_of: &HashMap<u32, String>,
) -> anyhow::Result<Recall> {
    let mut out = Recall::default();
    for fact in facts {
        let found = api.search(user_key, &fact.question).await?;
        out.empty += usize::from(found.is_empty());
        let expected = memory_of.get(&fact.id);
        out.ranks
            .push(found.iter().position(|id| Some(id) == expected));
    }
    Ok(out)
}

/// A few questions whose fact was not found, on stderr: what full-text search misses.
fn report_misses(when: &str, facts: &[Fact], recall: &Recall) {
    let misses: Vec<&Fact> = facts
        .iter()
        .zip(&recall.ranks)
        .filter(|(_, r)| r.is_none())
        .map(|(f, _)| f)
        .collect();
    step(&format!(
        "{when}: recall@1 {:.3}, recall@5 {:.3}, {} of {} missed, e.g.:",
        recall_at(&recall.ranks, 1),
        recall_at(&recall.ranks, LIMIT as usize),
        misses.len(),
        facts.len()
    ));
    for f in misses.iter().take(5) {
        eprintln!("    {:?} -> {:?}", f.question, f.fact);
    }
}

/// Whether full-text alone meets the hybrid target, in words.
fn verdict(recall_at_5: f64, p50_ms: f64) -> &'static str {
    match (recall_at_5 >= TARGET_RECALL_AT_5, p50_ms < TARGET_P50_MS) {
        (true, true) => "meets it",
        (false, true) => "does not meet it: its latency is within the target, its recall is not",
        (true, false) => "does not meet it: its recall is within the target, its latency is not",
        (false, false) => "does not meet it: neither its recall nor its latency",
    }
}

impl Retrieval {
    /// The section for `bench/RESULTS.md` (also printed), between [`BEGIN`] and [`END`].
    pub fn markdown(&self) -> String {
        let (cores, model, mem) = &self.machine;
        let n = self.facts;
        let k = LIMIT as usize;
        let rate = |r: &Recall, k: usize| format!("{:.3}", recall_at(&r.ranks, k));
        let (stored, users) = self.stored;
        let l = &self.latency;
        let r5 = recall_at(&self.crowded.ranks, k);
        format!(
            "{BEGIN}\n## Long-term memory retrieval: full-text search (`./scripts/bench.sh --retrieval`)\n\n\
             {date}, commit {commit}, {cores} cores ({model}), memory (`free -h`): {mem}, \
             Postgres {pg}. The memory service as a process of its own on a fresh database; the \
             bench calls its gRPC API: `SaveMemory` for the facts, `SearchMemories` (limit {k}, \
             min_score 0) with each question, one user (`user_key`), agent `{AGENT}`. Dataset: \
             `bench/retrieval/facts.jsonl`, {n} facts a user might tell an assistant, each with \
             a question asked later in other words (`bench/retrieval/README.md`); {overlap} of \
             the {n} questions share at least one word stem with their fact, the most that \
             Postgres full-text search (any of the question's words) can find.\n\n\
             | | the {n} facts alone | among {own} more memories of the same user, {stored} in all |\n\
             |---|---:|---:|\n\
             | recall@1 | {a1} | {c1} |\n\
             | recall@{k} | {a5} | {c5} |\n\
             | questions with no result at all | {ae} | {ce} |\n\n\
             | `SearchMemories` over gRPC, {stored} memories of {users} users | calls | p50 ms | p90 ms | p99 ms | max ms |\n\
             |---|---:|---:|---:|---:|---:|\n\
             | one call at a time, {passes} passes over the {n} questions | {calls} | {p50:.2} | {p90:.2} | {p99:.2} | {max:.2} |\n\
             | the same statement as memory runs it, in SQL from the bench (no gRPC, no service) | {s_calls} | {s50:.2} | {s90:.2} | {s99:.2} | {smax:.2} |\n\n\
             The filler ({own} memories for the measured user, {others} for {OTHER_USERS} other \
             users) is generated deterministically from templates and inserted with SQL straight \
             into `memories`, {BATCH} rows per `INSERT`, then `ANALYZE` ({fill:.1} s); only the \
             {n} facts go through `SaveMemory`.\n\n\
             Full-text only: hybrid search with embeddings is not built yet. The target is \
             hybrid recall@5 ≥ {TARGET_RECALL_AT_5} with recall adding < {TARGET_P50_MS} ms p50 \
             to a run; full-text alone {verdict} (recall@5 {r5:.3} among the user's {total_own} \
             memories, `SearchMemories` p50 {p50:.2} ms).\n{END}\n",
            date = self.date,
            commit = self.commit,
            pg = self.postgres,
            overlap = self.overlap,
            own = OWN_FILLER,
            a1 = rate(&self.alone, 1),
            c1 = rate(&self.crowded, 1),
            a5 = rate(&self.alone, k),
            c5 = rate(&self.crowded, k),
            ae = self.alone.empty,
            ce = self.crowded.empty,
            passes = self.passes,
            calls = l.n,
            p50 = l.p50,
            p90 = l.p90,
            p99 = l.p99,
            max = l.max,
            s_calls = self.sql_latency.n,
            s50 = self.sql_latency.p50,
            s90 = self.sql_latency.p90,
            s99 = self.sql_latency.p99,
            smax = self.sql_latency.max,
            others = usize::try_from(stored)
                .unwrap_or(0)
                .saturating_sub(n + OWN_FILLER),
            fill = self.fill.as_secs_f64(),
            verdict = verdict(r5, l.p50),
            total_own = n + OWN_FILLER,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_verdict_needs_both_recall_and_latency() {
        assert_eq!(verdict(0.95, 1.2), "meets it");
        assert!(verdict(0.5, 1.2).contains("its recall is not"));
        assert!(verdict(0.95, 3.0).contains("its latency is not"));
        assert!(verdict(0.9, 1.99).starts_with("meets"));
    }
}
