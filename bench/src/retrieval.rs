//! `--retrieval`: how well and how fast memory's long-term search finds what a user told the
//! assistant, by full text alone and hybrid (with the vectors of a real small embeddings model,
//! all-MiniLM-L6-v2 served by `bench/embed/server.py`). The memory service runs alone as a
//! process of its own on a fresh database; the bench saves the dataset's facts for one user
//! through `SaveMemory` (with their vectors), asks each question through `SearchMemories`
//! (limit 5, min_score 0) without and with the question's vector for recall@1 and recall@5,
//! fills the table to 100,000 memories (1,000 other users and 500 more of the measured user's
//! own) and times both searches over gRPC at that size. The markdown is `retrieval_report.rs`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::FutureExt as _;
use futures::future::BoxFuture;

use agentloop_proto::v1 as pb;
use pb::session_service_client::SessionServiceClient;

use crate::embed_server::{EmbedServer, MODEL, packed};
use crate::options::Options;
use crate::report::{Pct, pct};
use crate::retrieval_data::{Fact, Rng, dataset_path, filler, load, recall_at};
use crate::stack::Stack;
use crate::step;

pub use crate::retrieval_report::SECTION;

/// Memories in the table when the latency is measured.
pub(crate) const TOTAL: usize = 100_000;
/// Filler memories of the measured user itself: what its searches rank the facts among.
pub(crate) const OWN_FILLER: usize = 500;
/// Other users the rest of the filler is spread over.
pub(crate) const OTHER_USERS: usize = 1000;
/// Rows per `INSERT` of the filler.
pub(crate) const BATCH: usize = 5000;
/// The agent every memory belongs to.
pub(crate) const AGENT: &str = "main";
/// The most memories a search returns here, and the k of the wider recall.
pub(crate) const LIMIT: u32 = 5;
/// The full-text statement memory's `SearchMemories` runs (read from its crate, so that the two
/// agree).
const SEARCH_SQL: &str = include_str!("../../crates/memory/src/store/queries/search_memories.sql");
/// The length of all-MiniLM-L6-v2's vectors, which other users' filler gets at random.
const DIMENSIONS: usize = 384;

/// Where each question's fact came back.
#[derive(Debug, Clone, Default)]
pub struct Recall {
    /// 0-based place of each question's fact in its results, `None` when not returned.
    pub ranks: Vec<Option<usize>>,
    /// Questions that returned nothing at all.
    pub empty: usize,
}

/// Recall by full text alone and hybrid, at one fill.
#[derive(Debug, Clone, Default)]
pub struct Both {
    /// `SearchMemories` without a query vector.
    pub text: Recall,
    /// With the question's vector.
    pub hybrid: Recall,
}

/// What a `--retrieval` run measured.
pub struct Retrieval {
    pub(crate) date: String,
    pub(crate) commit: String,
    pub(crate) machine: (usize, String, String),
    pub(crate) postgres: String,
    pub(crate) facts: usize,
    /// Questions that share at least one word stem with their fact: the most full-text search
    /// can find.
    pub(crate) overlap: usize,
    /// With the facts alone stored for the user.
    pub(crate) alone: Both,
    /// With the measured user's filler as well, at [`TOTAL`] memories.
    pub(crate) crowded: Both,
    /// Memories and users in the table after the fill.
    pub(crate) stored: (i64, i64),
    /// How long embedding the filler, its `INSERT`s and the `ANALYZE` took.
    pub(crate) fill: Duration,
    pub(crate) passes: usize,
    /// `SearchMemories` over gRPC, full text alone.
    pub(crate) latency: Pct,
    /// `SearchMemories` over gRPC with the question's vector (embedded beforehand).
    pub(crate) hybrid_latency: Pct,
    /// Memory's full-text statement run by the bench itself over the same questions.
    pub(crate) sql_latency: Pct,
    /// One question embedded over HTTP by the model server, as a run's recall does first.
    pub(crate) embed_latency: Pct,
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

    async fn search(
        &self,
        user_key: &str,
        query: &str,
        vector: Option<&[f32]>,
    ) -> anyhow::Result<Vec<String>> {
        (self.search)(pb::SearchMemoriesRequest {
            scope: Some(scope(user_key)),
            query: query.to_owned(),
            limit: LIMIT,
            min_score: 0.0,
            query_embedding: vector.map(embedding),
        })
        .await
    }
}

fn embedding(values: &[f32]) -> pb::Embedding {
    pb::Embedding {
        model: MODEL.to_owned(),
        values: values.to_vec(),
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

    step("starting the embeddings model (bench/embed/server.py, all-MiniLM-L6-v2)");
    let embedder = EmbedServer::start().await?;
    let t0 = Instant::now();
    let texts: Vec<&str> = facts.iter().map(|f| f.fact.as_str()).collect();
    let fact_vectors = embedder.embed(&texts).await?;
    let questions: Vec<&str> = facts.iter().map(|f| f.question.as_str()).collect();
    let question_vectors = embedder.embed(&questions).await?;
    step(&format!(
        "embedded {} facts and questions in {:.1} s",
        texts.len() + questions.len(),
        t0.elapsed().as_secs_f64()
    ));

    step(&format!("saving {} facts through SaveMemory", facts.len()));
    let mut memory_of = HashMap::with_capacity(facts.len());
    for (fact, vector) in facts.iter().zip(&fact_vectors) {
        let id = (api.save)(pb::SaveMemoryRequest {
            scope: Some(scope(&user_key)),
            text: fact.fact.clone(),
            source: "tool".to_owned(),
            embedding: Some(embedding(vector)),
            ..Default::default()
        })
        .await
        .with_context(|| format!("SaveMemory of fact {}", fact.id))?;
        memory_of.insert(fact.id, id);
    }
    let overlap = overlap(&pool, &facts).await?;
    let ask = Ask {
        api: &api,
        user_key: &user_key,
        facts: &facts,
        vectors: &question_vectors,
        memory_of: &memory_of,
    };

    step("recall, the facts alone");
    let alone = ask.both("facts alone").await?;

    let filler_total = TOTAL - facts.len() - OWN_FILLER;
    step(&format!(
        "filling to {TOTAL} memories: {OWN_FILLER} more for the user, {filler_total} for {OTHER_USERS} others (SQL, batches of {BATCH})"
    ));
    let t0 = Instant::now();
    // The user's own filler gets the model's vectors: it is what hybrid search ranks the facts
    // among. Other users' get random ones: never compared, they give the table its real size.
    let own = filler(1, OWN_FILLER);
    let own_texts: Vec<&str> = own.iter().map(String::as_str).collect();
    let own_vectors = embedder.embed(&own_texts).await?;
    let mut rows: Vec<(String, String, Vec<u8>)> = own
        .iter()
        .zip(&own_vectors)
        .map(|(t, v)| (user_key.clone(), t.clone(), packed(v)))
        .collect();
    let mut rng = Rng::new(7);
    for user in 0..OTHER_USERS {
        let count = filler_total / OTHER_USERS + usize::from(user < filler_total % OTHER_USERS);
        let key = format!("bench:filler:{user}");
        rows.extend(
            filler(1000 + user as u64, count)
                .into_iter()
                .map(|t| (key.clone(), t, packed(&rng.vector(DIMENSIONS)))),
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
    let crowded = ask.both("with filler").await?;

    let passes = if options.quick { 2 } else { 5 };
    step(&format!(
        "latency: {passes} passes over {} questions, one call at a time",
        facts.len()
    ));
    let mut sample = Vec::with_capacity(passes * facts.len());
    let mut hybrid_sample = Vec::with_capacity(passes * facts.len());
    let mut embed_sample = Vec::with_capacity(passes * facts.len());
    for _ in 0..passes {
        for (fact, vector) in facts.iter().zip(&question_vectors) {
            let t = Instant::now();
            api.search(&user_key, &fact.question, None).await?;
            sample.push(t.elapsed());
            let t = Instant::now();
            api.search(&user_key, &fact.question, Some(vector)).await?;
            hybrid_sample.push(t.elapsed());
            let t = Instant::now();
            embedder.embed(&[fact.question.as_str()]).await?;
            embed_sample.push(t.elapsed());
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
                // As memory's `ranked_text_matches` computes it.
                .bind(i64::from(LIMIT.max(20)) * 4)
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
        hybrid_latency: pct(&hybrid_sample),
        sql_latency: pct(&sql_sample),
        embed_latency: pct(&embed_sample),
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

/// Filler rows straight into `memories` (its tsvector column is generated), each with its
/// vector as memory stores one; ids from the user and text, so a run's filler is the same on
/// every machine.
async fn insert(pool: &sqlx::PgPool, rows: &[(String, String, Vec<u8>)]) -> anyhow::Result<()> {
    let users: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    let texts: Vec<&str> = rows.iter().map(|r| r.1.as_str()).collect();
    let vectors: Vec<&[u8]> = rows.iter().map(|r| r.2.as_slice()).collect();
    sqlx::query(
        "INSERT INTO memories (id, agent_id, user_key, text, source, embedding, embedding_model) \
         SELECT md5(u || chr(10) || t)::uuid, $3, u, t, 'tool', v, $5 \
         FROM unnest($1::text[], $2::text[], $4::bytea[]) AS x(u, t, v)",
    )
    .bind(users)
    .bind(texts)
    .bind(AGENT)
    .bind(vectors)
    .bind(MODEL)
    .execute(pool)
    .await
    .context("failed to insert filler memories")?;
    Ok(())
}

/// The dataset's questions put to one user's memories.
struct Ask<'a> {
    api: &'a Api,
    user_key: &'a str,
    facts: &'a [Fact],
    /// Each question's vector, in the facts' order.
    vectors: &'a [Vec<f32>],
    memory_of: &'a HashMap<u32, String>,
}

impl Ask<'_> {
    /// Recall by full text alone, then hybrid.
    async fn both(&self, when: &str) -> anyhow::Result<Both> {
        let text = self.recall(false).await?;
        report_misses(&format!("{when}, full text"), self.facts, &text);
        let hybrid = self.recall(true).await?;
        report_misses(&format!("{when}, hybrid"), self.facts, &hybrid);
        Ok(Both { text, hybrid })
    }

    async fn recall(&self, hybrid: bool) -> anyhow::Result<Recall> {
        let mut out = Recall::default();
        for (fact, vector) in self.facts.iter().zip(self.vectors) {
            let vector = hybrid.then_some(vector.as_slice());
            let found = self
                .api
                .search(self.user_key, &fact.question, vector)
                .await?;
            out.empty += usize::from(found.is_empty());
            let expected = self.memory_of.get(&fact.id);
            out.ranks
                .push(found.iter().position(|id| Some(id) == expected));
        }
        Ok(out)
    }
}

/// A few questions whose fact was not found, on stderr: what the search misses.
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
