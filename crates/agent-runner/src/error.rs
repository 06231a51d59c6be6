//! Runner errors.

/// What stops the runner (per-message failures are dead-lettered or answered, never returned).
#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    /// The bus could not be set up.
    #[error("bus setup failed")]
    Bus(#[from] agentloop_bus::BusError),
    /// `[memory] url` is not a valid URI, or its TLS settings cannot be used.
    #[error(transparent)]
    MemoryUrl(#[from] agentloop_lifecycle::MemoryEndpointError),
    /// The model client could not be built.
    #[error("invalid model configuration")]
    Models(#[from] agentloop_model::ModelError),
    /// The admin server could not bind.
    #[error(transparent)]
    Admin(#[from] agentloop_lifecycle::AdminError),
    /// `[scanner]` rules cannot be read or compiled.
    #[error(transparent)]
    Scanner(#[from] agentloop_scanner::ScannerError),
    /// The consumer's message stream could not be opened.
    #[error("failed to open the run command stream")]
    Stream(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// Why a call to the memory service failed, as the owner loop needs to know it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MemoryCallError {
    /// Another replica holds the session now; stop writing.
    #[error("lease lost: {0}")]
    LeaseLost(String),
    /// Memory is unreachable or failing; retry later.
    #[error("memory unavailable: {0}")]
    Unavailable(String),
    /// The request was refused (invalid data, a constraint, an unknown run); retrying won't help.
    #[error("memory refused the call: {0}")]
    Refused(String),
}

impl MemoryCallError {
    /// Returns whether retrying later may succeed (memory unreachable, overloaded, failing).
    pub(crate) fn is_transient(&self) -> bool {
        matches!(self, MemoryCallError::Unavailable(_))
    }
}

impl From<tonic::Status> for MemoryCallError {
    fn from(status: tonic::Status) -> Self {
        use tonic::Code;
        let text = format!("{:?}: {}", status.code(), status.message());
        match status.code() {
            Code::FailedPrecondition => MemoryCallError::LeaseLost(text),
            code if agentloop_proto::may_pass(code) => MemoryCallError::Unavailable(text),
            _ => MemoryCallError::Refused(text),
        }
    }
}
