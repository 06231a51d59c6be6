//! Hybrid search's scoring, written once: vector similarity and full-text rank in one score.

use std::collections::HashMap;

use uuid::Uuid;

use super::Memory;
use super::vectors::Entry;
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

    /// Cosine similarity with a stored (unit) vector; `None` when it has another length (a
    /// model swapped under the same name), so it is never compared.
    fn cosine(&self, stored: &[f32]) -> Option<f64> {
        if stored.len() != self.values.len() {
            return None;
        }
        let dot: f32 = stored.iter().zip(&self.values).map(|(a, b)| a * b).sum();
        Some(f64::from(dot))
    }
}

/// A stored vector read back: packed little-endian float32; `None` for a length that is not.
pub(crate) fn unpacked(bytes: &[u8]) -> Option<Vec<f32>> {
    if bytes.is_empty() || !bytes.len().is_multiple_of(4) {
        return None;
    }
    Some(
        bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
    )
}

/// A hybrid score in 0..1: vector similarity (negative counts as none) weighted with the
/// full-text score; a memory without a comparable vector has only its text share.
pub fn hybrid_score(text: f64, cosine: Option<f64>) -> f64 {
    VECTOR_WEIGHT * cosine.unwrap_or(0.0).clamp(0.0, 1.0) + (1.0 - VECTOR_WEIGHT) * text
}

/// The user's memories (`entry`) scoring at least `min_score`, best first, at most `limit`;
/// `text_scores` holds the full-text score of those the query's words match. Each memory's
/// `score` is its hybrid score.
pub(super) fn rank(
    entry: &Entry,
    text_scores: &HashMap<Uuid, f64>,
    query: &Embedding,
    limit: usize,
    min_score: f64,
) -> Vec<Memory> {
    let mut scored: Vec<(f64, usize)> = entry
        .memories
        .iter()
        .enumerate()
        .map(|(i, (memory, vector))| {
            let text = text_scores.get(&memory.id).copied().unwrap_or(0.0);
            let cosine = vector.as_deref().and_then(|v| query.cosine(v));
            (hybrid_score(text, cosine), i)
        })
        .filter(|(score, _)| *score >= min_score)
        .collect();
    scored.sort_by(|a, b| {
        b.0.total_cmp(&a.0).then_with(|| {
            let (x, y) = (&entry.memories[a.1].0, &entry.memories[b.1].0);
            y.updated_at.cmp(&x.updated_at)
        })
    });
    scored
        .into_iter()
        .take(limit)
        .map(|(score, i)| Memory {
            score,
            ..entry.memories[i].0.clone()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use chrono::Utc;
    use uuid::Uuid;

    use super::*;

    fn entry(memories: &[(&str, Option<&[f32]>)]) -> Entry {
        let now = Utc::now();
        let rows = memories
            .iter()
            .map(|(text, vector)| {
                let memory = Memory {
                    id: Uuid::now_v7(),
                    agent_id: "main".into(),
                    user_key: "u".into(),
                    text: (*text).into(),
                    source: "tool".into(),
                    created_at: now,
                    updated_at: now,
                    score: 0.0,
                };
                let vector = vector.map(|v| Embedding::new("m", v.to_vec()).unwrap().values);
                (memory, vector)
            })
            .collect();
        Entry::new(0, rows)
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
        let entry = entry(&[
            ("word match only", Some(&[0.0, 1.0, 0.0])),
            ("paraphrase", Some(&[0.9, 0.1, 0.0])),
            ("no vector, no words", None),
            ("another length", Some(&[1.0, 0.0])),
        ]);
        let text_scores = HashMap::from([(entry.memories[0].0.id, 0.2)]);
        let ranked = rank(&entry, &text_scores, &query, 5, 0.05);
        let texts: Vec<&str> = ranked.iter().map(|m| m.text.as_str()).collect();
        assert_eq!(texts, ["paraphrase", "word match only"]);
        assert!(
            query.cosine(&[1.0, 0.0]).is_none(),
            "another length is never compared"
        );
    }

    #[test]
    fn a_stored_vector_reads_back_as_packed() {
        let e = Embedding::new("m", vec![3.0, 4.0]).unwrap();
        assert_eq!(unpacked(&e.to_bytes()), Some(vec![0.6, 0.8]));
        assert_eq!(unpacked(&[0, 0, 0]), None);
        assert_eq!(unpacked(&[]), None);
    }
}
