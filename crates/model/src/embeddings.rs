//! OpenAI-compatible `POST /v1/embeddings`: the vectors behind hybrid memory search.

use serde::Deserialize;

use crate::{ModelClient, ModelError, ModelRef, Provider};

/// The most texts sent in one embeddings request; OpenAI accepts 2048, small local servers less.
pub const MAX_EMBED_INPUTS: usize = 256;

#[derive(Deserialize)]
struct EmbeddingsBody {
    data: Vec<EmbeddingItem>,
}

#[derive(Deserialize)]
struct EmbeddingItem {
    index: usize,
    embedding: Vec<f32>,
}

impl ModelClient {
    /// Embeds `inputs` with `model` (an `openai/...` reference: any OpenAI-compatible
    /// `/v1/embeddings`), one vector per input, in input order. The request timeout bounds the
    /// whole call.
    ///
    /// # Errors
    /// `InvalidConfig` for an Anthropic model, no inputs or more than [`MAX_EMBED_INPUTS`];
    /// as [`ModelClient::stream`] for the call; `Protocol` when the answer lacks a vector,
    /// holds a non-finite or all-zero one, or vectors of different lengths.
    pub async fn embed(
        &self,
        model: &ModelRef,
        inputs: &[&str],
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        if model.provider != Provider::OpenAi {
            return Err(ModelError::InvalidConfig(format!(
                "embeddings need an OpenAI-compatible model (openai/...), got {model}"
            )));
        }
        if inputs.is_empty() || inputs.len() > MAX_EMBED_INPUTS {
            return Err(ModelError::InvalidConfig(format!(
                "an embeddings request takes 1 to {MAX_EMBED_INPUTS} inputs, got {}",
                inputs.len()
            )));
        }
        let inner = &*self.inner;
        let provider = Provider::OpenAi;
        let url = inner.embeddings_url.as_str();
        let body = serde_json::json!({ "model": model.model, "input": inputs });
        // The slot is held until the answer is read.
        let (http, _slot) = inner.connections.take()?;
        let mut request = http.post(inner.embeddings_url.clone()).json(&body);
        if let Some(key) = inner.openai_api_key.as_ref() {
            request = request.bearer_auth(key.expose());
        }
        let timeout_ms = u64::try_from(inner.request_timeout.as_millis()).unwrap_or(u64::MAX);
        let call = async {
            let response = request
                .send()
                .await
                .map_err(|err| ModelError::transport(provider, url, err))?;
            let status = response.status();
            let retry_after = response
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(std::time::Duration::from_secs);
            let bytes = response
                .bytes()
                .await
                .map_err(|err| ModelError::transport(provider, url, err))?;
            if !status.is_success() {
                return Err(ModelError::from_response(
                    provider,
                    status.as_u16(),
                    &bytes,
                    retry_after,
                ));
            }
            Ok(bytes)
        };
        let bytes = tokio::time::timeout(inner.request_timeout, call)
            .await
            .map_err(|_| ModelError::Timeout {
                provider,
                timeout_ms,
            })??;
        vectors_of(&bytes, inputs.len())
    }
}

/// The vectors of an embeddings answer, checked and put in input order.
fn vectors_of(body: &[u8], expected: usize) -> Result<Vec<Vec<f32>>, ModelError> {
    let protocol = |message: String| ModelError::Protocol {
        provider: Provider::OpenAi,
        message,
    };
    let parsed: EmbeddingsBody = serde_json::from_slice(body)
        .map_err(|err| protocol(format!("embeddings answer is not the expected JSON: {err}")))?;
    if parsed.data.len() != expected {
        return Err(protocol(format!(
            "asked for {expected} embeddings, got {}",
            parsed.data.len()
        )));
    }
    let mut vectors: Vec<Option<Vec<f32>>> = vec![None; expected];
    for item in parsed.data {
        let slot = vectors
            .get_mut(item.index)
            .ok_or_else(|| protocol(format!("embedding index {} out of range", item.index)))?;
        if slot.is_some() {
            return Err(protocol(format!(
                "embedding index {} given twice",
                item.index
            )));
        }
        let v = item.embedding;
        if v.is_empty() || v.iter().any(|x| !x.is_finite()) || v.iter().all(|x| *x == 0.0) {
            return Err(protocol(format!(
                "embedding {} is empty, all zero or not finite",
                item.index
            )));
        }
        *slot = Some(v);
    }
    let vectors: Vec<Vec<f32>> = vectors.into_iter().flatten().collect();
    let dims = vectors.first().map_or(0, Vec::len);
    if vectors.iter().any(|v| v.len() != dims) {
        return Err(protocol("embeddings of different lengths".to_owned()));
    }
    Ok(vectors)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectors_come_back_in_input_order() {
        let body =
            br#"{"data":[{"index":1,"embedding":[0.0,1.0]},{"index":0,"embedding":[1.0,0.0]}]}"#;
        let vectors = vectors_of(body, 2).unwrap();
        assert_eq!(vectors, vec![vec![1.0, 0.0], vec![0.0, 1.0]]);
    }

    #[test]
    fn a_missing_duplicate_or_unusable_vector_is_a_protocol_error() {
        let cases: [&[u8]; 6] = [
            br#"{"data":[{"index":0,"embedding":[1.0]}]}"#,
            br#"{"data":[{"index":0,"embedding":[1.0]},{"index":0,"embedding":[1.0]}]}"#,
            br#"{"data":[{"index":0,"embedding":[1.0]},{"index":5,"embedding":[1.0]}]}"#,
            br#"{"data":[{"index":0,"embedding":[0.0]},{"index":1,"embedding":[1.0]}]}"#,
            br#"{"data":[{"index":0,"embedding":[1.0,2.0]},{"index":1,"embedding":[1.0]}]}"#,
            b"not json",
        ];
        for body in cases {
            let err = vectors_of(body, 2).unwrap_err();
            assert!(matches!(err, ModelError::Protocol { .. }), "{err}");
        }
    }
}
