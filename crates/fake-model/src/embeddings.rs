//! `POST /v1/embeddings` in OpenAI's wire format, with vectors that need no model: each text
//! becomes a bag of its words' character trigrams hashed into [`DIMENSIONS`] buckets, then
//! normalized. Texts sharing word stems ("Rotterdam", "Rotterdammer") come out close, texts
//! sharing nothing come out orthogonal: enough for tests to tell vector search from full text.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

/// The length of every fake embedding.
pub const DIMENSIONS: usize = 256;

/// What an embeddings request asks for.
#[derive(Debug, Deserialize)]
pub(crate) struct EmbeddingsRequest {
    #[serde(default)]
    pub(crate) model: Option<String>,
    pub(crate) input: Input,
}

/// One text or several, as the API accepts both.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum Input {
    One(String),
    Many(Vec<String>),
}

impl Input {
    fn texts(&self) -> Vec<&str> {
        match self {
            Self::One(text) => vec![text.as_str()],
            Self::Many(texts) => texts.iter().map(String::as_str).collect(),
        }
    }
}

/// The fake embedding of `text`: unit length, or all zero for a text without letters or digits.
pub fn embed(text: &str) -> Vec<f32> {
    let mut vector = vec![0f32; DIMENSIONS];
    let lower = text.to_lowercase();
    for word in lower
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        let chars: Vec<char> = std::iter::once('#')
            .chain(word.chars())
            .chain(std::iter::once('#'))
            .collect();
        for gram in chars.windows(3) {
            let bucket = fnv1a(gram) % DIMENSIONS as u64;
            vector[bucket as usize] += 1.0;
        }
    }
    let norm = vector.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        vector.iter_mut().for_each(|x| *x /= norm);
    }
    vector
}

fn fnv1a(chars: &[char]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for c in chars {
        for byte in u32::from(*c).to_le_bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    hash
}

/// The answer to `request`: every input's vector, in order, with the usage OpenAI reports.
pub(crate) fn answer(request: &EmbeddingsRequest) -> Response {
    let texts = request.input.texts();
    if texts.is_empty() {
        return crate::openai::bad_request("'input' must not be empty");
    }
    let data: Vec<_> = texts
        .iter()
        .enumerate()
        .map(|(index, text)| json!({"object": "embedding", "index": index, "embedding": embed(text)}))
        .collect();
    let tokens: usize = texts
        .iter()
        .map(|t| t.split_whitespace().count().max(1))
        .sum();
    let body = json!({
        "object": "list",
        "data": data,
        "model": request.model.as_deref().unwrap_or("fake-embeddings"),
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    });
    (StatusCode::OK, axum::Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cosine(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    #[test]
    fn shared_stems_come_out_close_and_unrelated_texts_apart() {
        let fact = embed("I was born in Rotterdam");
        let question = embed("Am I a Rotterdammer?");
        let unrelated = embed("What should I cook tonight?");
        assert!(
            cosine(&fact, &question) > 0.3,
            "{}",
            cosine(&fact, &question)
        );
        assert!(cosine(&fact, &question) > 2.0 * cosine(&question, &unrelated));
    }

    #[test]
    fn vectors_are_unit_length_and_deterministic() {
        let a = embed("Hello, World");
        assert_eq!(a.len(), DIMENSIONS);
        assert!((cosine(&a, &a) - 1.0).abs() < 1e-5);
        assert_eq!(a, embed("hello world"));
        assert!(embed("?!").iter().all(|x| *x == 0.0));
    }
}
