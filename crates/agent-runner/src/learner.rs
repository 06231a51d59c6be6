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
    /// `memory.learn_lease_ms`: how long a claimed job is this runner's.
    pub(crate) lease_ms: u32,
}

impl Learner {
    /// A learner for `memory.learn_model`, or none when it is empty.
    ///
    /// # Errors
    /// The model reference is not `provider/model`, or the lease is zero.
    pub(crate) fn new(
        config: &agentloop_lifecycle::MemoryEndpoint,
    ) -> Result<Option<Arc<Self>>, agentloop_model::ModelError> {
        let learn_model = config.learn_model.trim();
        if learn_model.is_empty() {
            return Ok(None);
        }
        if config.learn_lease_ms == 0 {
            return Err(agentloop_model::ModelError::InvalidConfig(
                "memory.learn_lease_ms must be positive".to_owned(),
            ));
        }
        Ok(Some(Arc::new(Self {
            model: ModelRef::parse(learn_model)?,
            queued: Notify::new(),
            lease_ms: config.learn_lease_ms,
        })))
    }
}
