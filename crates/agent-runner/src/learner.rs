//! The learn model and the wakeup of the auto-learn worker (`learn.rs`), held by the replica.

use std::sync::Arc;

use agentloop_model::ModelRef;
use tokio::sync::Notify;

/// The learn model and the wakeup of this runner's worker.
pub(crate) struct Learner {
    /// `memory.learn_model`.
    pub(crate) model: ModelRef,
    /// Woken when this runner queued a job.
    pub(crate) queued: Notify,
}

impl Learner {
    /// A learner for `learn_model`, or none when it is empty.
    ///
    /// # Errors
    /// The model reference is not `provider/model`.
    pub(crate) fn new(learn_model: &str) -> Result<Option<Arc<Self>>, agentloop_model::ModelError> {
        if learn_model.trim().is_empty() {
            return Ok(None);
        }
        Ok(Some(Arc::new(Self {
            model: ModelRef::parse(learn_model.trim())?,
            queued: Notify::new(),
        })))
    }
}
