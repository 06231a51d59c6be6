//! `agentloop memory embed`: vectors for the memories stored before `memory.embeddings_model`
//! was set (or while its endpoint failed), so hybrid search finds them by meaning as well as by
//! their words. Page by page in id order; a failure ends the run and a second run goes on with
//! what is still missing.

use agentloop_model::{MAX_EMBED_INPUTS, ModelClient, ModelError};
use agentloop_proto::v1::session_service_client::SessionServiceClient;
use agentloop_proto::v1::{Embedding, ListMemoriesToEmbedRequest, SetMemoryEmbeddingRequest};

use crate::RunnerConfig;

/// What a backfill did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backfilled {
    /// Memories that got their vector.
    pub embedded: usize,
    /// Memories whose text changed while they were embedded (left for the next run).
    pub changed: usize,
}

/// Why a backfill stopped.
#[derive(Debug, thiserror::Error)]
pub enum BackfillError {
    /// No embeddings model is configured.
    #[error("memory.embeddings_model is not set: there is no model to embed with")]
    NoModel,
    /// `[models]` or the embeddings model cannot be used, or the embeddings call failed.
    #[error(transparent)]
    Models(#[from] ModelError),
    /// `[memory]` cannot be used.
    #[error(transparent)]
    MemoryUrl(#[from] agentloop_lifecycle::MemoryEndpointError),
    /// Memory refused or did not answer.
    #[error("memory: {0}")]
    Memory(String),
}

/// Embeds every memory without a vector of `memory.embeddings_model`, `batch` texts per
/// embeddings request (at most 256), calling `progress` with the running count after each page.
///
/// # Errors
/// [`BackfillError`]; what was stored before the error stays stored.
pub async fn backfill_embeddings(
    config: &RunnerConfig,
    batch: usize,
    mut progress: impl FnMut(&Backfilled),
) -> Result<Backfilled, BackfillError> {
    let name = config.memory.embeddings_model.trim();
    let model = crate::memory::embeddings_model(name)?.ok_or(BackfillError::NoModel)?;
    let models = ModelClient::new(&config.models)?;
    let mut memory = SessionServiceClient::new(config.memory.channel()?);
    let refused = |status: tonic::Status| BackfillError::Memory(status.message().to_owned());
    let limit = u32::try_from(batch.clamp(1, MAX_EMBED_INPUTS)).unwrap_or(64);
    let mut done = Backfilled::default();
    let mut after = String::new();
    loop {
        let page = memory
            .list_memories_to_embed(ListMemoriesToEmbedRequest {
                model: name.to_owned(),
                after_id: after.clone(),
                limit,
            })
            .await
            .map_err(refused)?
            .into_inner()
            .memories;
        let Some(last) = page.last() else {
            return Ok(done);
        };
        after.clone_from(&last.id);
        let texts: Vec<&str> = page.iter().map(|m| m.text.as_str()).collect();
        let vectors = models.embed(&model, &texts).await?;
        for (stored, values) in page.iter().zip(vectors) {
            let set = memory
                .set_memory_embedding(SetMemoryEmbeddingRequest {
                    id: stored.id.clone(),
                    text: stored.text.clone(),
                    embedding: Some(Embedding {
                        model: name.to_owned(),
                        values,
                    }),
                })
                .await
                .map_err(refused)?
                .into_inner();
            if set.stored {
                done.embedded += 1;
            } else {
                done.changed += 1;
            }
        }
        progress(&done);
    }
}
