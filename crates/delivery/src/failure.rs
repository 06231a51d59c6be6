//! Why a reply was not delivered: the retry rule's two kinds.

/// Why a reply was not delivered.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Failure {
    /// May pass: retried in place, then handed back for a later delivery.
    #[error("{0}")]
    Transient(String),
    /// Cannot pass (a chat app refused the reply for good): dead-lettered at once.
    #[error("refused for good: {0}")]
    Permanent(String),
}

impl Failure {
    pub(crate) fn passes(&self) -> bool {
        matches!(self, Self::Transient(_))
    }
}

impl From<String> for Failure {
    fn from(reason: String) -> Self {
        Self::Transient(reason)
    }
}
