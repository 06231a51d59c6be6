//! Hybrid search's scoring, written once: vector similarity and full-text rank in one score.

use super::Memory;
use crate::MemoryError;

/// How much of a hybrid score is vector similarity; the rest is full-text rank. Vectors find
/// paraphrases that share no word with the fact; the text rank still lifts exact names and
/// numbers that embeddings blur.
pub const VECTOR_WEIGHT: f64 = 0.7;

/// The longest vector stored (16 KiB packed, as the column's check says).
pub const MAX_DIMENSIONS: usize = 4096;

/// A text's embedding: unit length, from the model it names.
#[derive(Clone, Debug, PartialEq)]
pub struct Embedding {
    model: String,
    values: Vec<f32>,
}

impl Embedding {
    /// Checks and normalizes a vector from `model`.
    ///
    /// # Errors
    /// [`MemoryError::InvalidArgument`] without a model name, for an empty, too long, all-zero
    /// or non-finite vector.
    pub fn new(model: &str, mut values: Vec<f32>) -> Result<Self, MemoryError> {
        let invalid = |what: &str| Err(MemoryError::InvalidArgument(format!("embedding {what}")));
        if model.trim().is_empty() {
            return invalid("needs the name of its model");
        }
        if values.is_empty() || values.len() > MAX_DIMENSIONS {
            return invalid(&format!("must have 1 to {MAX_DIMENSIONS} values"));
        }
        if values.iter().any(|v| !v.is_finite()) {
            return invalid("holds a value that is not finite");
        }
        let norm = values
            .iter()
            .map(|v| f64::from(*v).powi(2))
            .sum::<f64>()
            .sqrt();
        if norm == 0.0 {
            return invalid("is all zero");
        }
        #[allow(clippy::cast_possible_truncation)]
        values
            .iter_mut()
            .for_each(|v| *v = (f64::from(*v) / norm) as f32);
        Ok(Self {
            model: model.to_owned(),
            values,
        })
    }

    /// The model that made it.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// As stored: packed little-endian float32.
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        self.values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    /// Cosine similarity with a stored vector; `None` when it has another length (a model
    /// renamed or swapped under the same name), so it is never compared.
    fn cosine(&self, stored: &[u8]) -> Option<f64> {
        if stored.len() != self.values.len() * 4 {
            return None;
        }
        let dot: f32 = stored
            .chunks_exact(4)
            .zip(&self.values)
            .map(|(b, q)| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) * q)
            .sum();
        Some(f64::from(dot))
    }
}

/// A hybrid score in 0..1: vector similarity (negative counts as none) weighted with the
/// full-text score; a memory without a comparable vector has only its text share.
pub fn hybrid_score(text: f64, cosine: Option<f64>) -> f64 {
    VECTOR_WEIGHT * cosine.unwrap_or(0.0).clamp(0.0, 1.0) + (1.0 - VECTOR_WEIGHT) * text
}

/// A candidate of a hybrid search: the memory with its text score, and its stored vector.
#[derive(sqlx::FromRow)]
pub(super) struct Candidate {
    #[sqlx(flatten)]
    pub(super) memory: Memory,
    pub(super) embedding: Option<Vec<u8>>,
}

/// The candidates scoring at least `min_score`, best first, at most `limit`; each memory's
/// `score` becomes its hybrid score.
pub(super) fn rank(
    candidates: Vec<Candidate>,
    query: &Embedding,
    limit: usize,
    min_score: f64,
) -> Vec<Memory> {
    let mut scored: Vec<Memory> = candidates
        .into_iter()
        .map(|c| {
            let cosine = c.embedding.as_deref().and_then(|v| query.cosine(v));
            Memory {
                score: hybrid_score(c.memory.score, cosine),
                ..c.memory
            }
        })
        .filter(|m| m.score >= min_score)
        .collect();
    scored.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then(b.updated_at.cmp(&a.updated_at))
    });
    scored.truncate(limit);
    scored
}

#[cfg(test)]
mod tests {
    use chrono::Utc;
    use uuid::Uuid;

    use super::*;

    fn candidate(text: &str, text_score: f64, vector: Option<&[f32]>) -> Candidate {
        let now = Utc::now();
        Candidate {
            memory: Memory {
                id: Uuid::now_v7(),
                agent_id: "main".into(),
                user_key: "u".into(),
                text: text.into(),
                source: "tool".into(),
                created_at: now,
                updated_at: now,
                score: text_score,
            },
            embedding: vector.map(|v| Embedding::new("m", v.to_vec()).unwrap().to_bytes()),
        }
    }

    #[test]
    fn an_embedding_is_normalized_and_refuses_what_cannot_be_compared() {
        let e = Embedding::new("m", vec![3.0, 4.0]).unwrap();
        assert_eq!(e.values, vec![0.6, 0.8]);
        assert!(Embedding::new("", vec![1.0]).is_err());
        assert!(Embedding::new("m", vec![]).is_err());
        assert!(Embedding::new("m", vec![0.0, 0.0]).is_err());
        assert!(Embedding::new("m", vec![f32::NAN]).is_err());
        assert!(Embedding::new("m", vec![1.0; MAX_DIMENSIONS + 1]).is_err());
    }

    #[test]
    fn the_score_weighs_vector_and_text_and_ignores_opposite_vectors() {
        assert!((hybrid_score(0.0, Some(1.0)) - VECTOR_WEIGHT).abs() < 1e-9);
        assert!((hybrid_score(1.0, None) - (1.0 - VECTOR_WEIGHT)).abs() < 1e-9);
        assert!((hybrid_score(1.0, Some(-0.9)) - hybrid_score(1.0, None)).abs() < 1e-9);
        assert!((hybrid_score(1.0, Some(1.0)) - 1.0).abs() < 1e-9);
    }

    #[test]
    fn a_paraphrase_without_shared_words_outranks_a_weak_text_match() {
        let query = Embedding::new("m", vec![1.0, 0.0, 0.0]).unwrap();
        let ranked = rank(
            vec![
                candidate("word match only", 0.2, Some(&[0.0, 1.0, 0.0])),
                candidate("paraphrase", 0.0, Some(&[0.9, 0.1, 0.0])),
                candidate("no vector, no words", 0.0, None),
                candidate("other model's length", 0.0, None),
            ],
            &query,
            5,
            0.05,
        );
        let texts: Vec<&str> = ranked.iter().map(|m| m.text.as_str()).collect();
        assert_eq!(texts, ["paraphrase", "word match only"]);
        assert!(
            query.cosine(&[0u8; 8]).is_none(),
            "another length is never compared"
        );
    }
}
