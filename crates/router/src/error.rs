//! Router errors.

/// What stops the router (per-message failures are dead-lettered, never returned).
#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    /// The bus could not be set up.
    #[error("bus setup failed")]
    Bus(#[from] agentloop_bus::BusError),
    /// `[memory] url` is not a valid URI, or its TLS settings cannot be used.
    #[error(transparent)]
    MemoryUrl(#[from] agentloop_lifecycle::MemoryEndpointError),
    /// The admin server could not bind.
    #[error(transparent)]
    Admin(#[from] agentloop_lifecycle::AdminError),
    /// `[scanner]` rules cannot be read or compiled.
    #[error(transparent)]
    Scanner(#[from] agentloop_scanner::ScannerError),
    /// The consumer's message stream could not be opened.
    #[error("failed to open the inbound message stream")]
    Stream(#[source] Box<dyn std::error::Error + Send + Sync>),
}
