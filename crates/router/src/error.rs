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

/// Why one message could not be routed, as the retry needs to know it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RouteFailure {
    /// May pass (memory or a stream unreachable, a leader being elected): routed again, capped.
    #[error("{0}")]
    Transient(String),
    /// Will not pass (memory refused the request, a stream refused the command for good):
    /// dead-lettered at once, so the session's next messages do not wait behind it.
    #[error("{0}")]
    Permanent(String),
}

impl RouteFailure {
    /// Whether trying again may succeed.
    pub(crate) fn passes(&self) -> bool {
        matches!(self, Self::Transient(_))
    }

    /// A failed call to memory (`what` names it in the reason).
    pub(crate) fn memory(what: &str, status: &tonic::Status) -> Self {
        let reason = format!("memory ({what}): {:?}: {}", status.code(), status.message());
        if agentloop_proto::may_pass(status.code()) {
            Self::Transient(reason)
        } else {
            Self::Permanent(reason)
        }
    }
}

impl From<agentloop_bus::BusError> for RouteFailure {
    fn from(err: agentloop_bus::BusError) -> Self {
        let reason = agentloop_bus::error_chain(&err);
        if err.is_permanent() {
            Self::Permanent(reason)
        } else {
            Self::Transient(reason)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_out_of_reach_is_tried_again_and_a_refused_request_is_not() {
        let down = RouteFailure::memory("resolve session", &tonic::Status::unavailable("down"));
        assert!(down.passes());
        let refused = RouteFailure::memory(
            "check sender",
            &tonic::Status::invalid_argument("sender_id is required"),
        );
        assert!(!refused.passes());
        assert!(
            refused.to_string().contains("check sender")
                && refused.to_string().contains("sender_id")
        );
        let missing = RouteFailure::memory("resolve session", &tonic::Status::not_found("no"));
        assert!(!missing.passes());
    }
}
