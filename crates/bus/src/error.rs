//! Errors of the bus layer, and which of them retrying cannot fix.

use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::context::CreateStreamErrorKind;

/// What went wrong talking to NATS.
#[derive(Debug, thiserror::Error)]
pub enum BusError {
    /// The server could not be reached.
    #[error("failed to connect to nats at {url}")]
    Connect {
        /// The URL tried.
        url: String,
        /// The client's error.
        #[source]
        source: async_nats::ConnectError,
    },
    /// A configured URL cannot be used; retrying cannot fix it.
    #[error("invalid NATS URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL, credentials masked.
        url: String,
        /// Why it was refused.
        reason: String,
    },
    /// The server is older than agentloop supports.
    #[error(
        "nats-server {version} at {url} is too old: agentloop needs 2.11 or newer (older servers silently drop stream settings)"
    )]
    ServerTooOld {
        /// The URL connected to.
        url: String,
        /// The version the server reported.
        version: String,
    },
    /// The server runs without JetStream, which every stream of agentloop needs.
    #[error(
        "nats-server at {url} runs without JetStream: start it with -js (or `jetstream {{}}` in its config)"
    )]
    JetStreamDisabled {
        /// The URL connected to.
        url: String,
    },
    /// A stream could not be created or updated.
    #[error("failed to create or update stream {name}")]
    Stream {
        /// The stream's name.
        name: String,
        /// The server's error.
        #[source]
        source: Box<async_nats::jetstream::context::CreateStreamError>,
    },
    /// A consumer could not be created.
    #[error("failed to create consumer {name}")]
    Consumer {
        /// The consumer's name.
        name: String,
        /// The server's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A message could not be published.
    #[error("failed to publish on {subject}")]
    Publish {
        /// The subject.
        subject: String,
        /// The client's or server's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// An operator's action on a stream (reading or removing dead letters) failed.
    #[error("failed to {what}")]
    Admin {
        /// What was being done.
        what: String,
        /// The client's or server's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A credentials file (`creds_file`, `nkey_seed_file`) could not be used.
    #[error("failed to use nats credentials {path}")]
    Credentials {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Server answers to a stream request that no retry changes: the server or account has no
/// JetStream, or it refuses the settings themselves (replicas it cannot have, subjects another
/// stream holds). An operator has to act. Capacity refusals (no room for the streams' reserved
/// bytes, too many streams) are not among them: space freed elsewhere lets the next try
/// through, so a service waits for it, not ready, and says why.
const PERMANENT_REFUSALS: [ErrorCode; 7] = [
    ErrorCode::JETSTREAM_NOT_ENABLED,
    ErrorCode::JETSTREAM_NOT_ENABLED_FOR_ACCOUNT,
    ErrorCode::STREAM_REPLICAS_NOT_SUPPORTED,
    ErrorCode::STREAM_REPLICAS_NOT_UPDATABLE,
    ErrorCode::STREAM_INVALID_CONFIG,
    ErrorCode::STREAM_SUBJECT_OVERLAP,
    ErrorCode::STREAM_MAX_BYTES_REQUIRED,
];

impl BusError {
    /// Returns whether retrying cannot help: a URL or credentials that cannot be used, a
    /// server too old or without JetStream, a stream the server refuses for good. Everything
    /// else (unreachable, timed out, a cluster still electing its leaders) may pass.
    pub fn is_permanent(&self) -> bool {
        match self {
            Self::InvalidUrl { .. }
            | Self::Credentials { .. }
            | Self::ServerTooOld { .. }
            | Self::JetStreamDisabled { .. } => true,
            Self::Stream { source, .. } => is_permanent_refusal(&source.kind()),
            Self::Connect { .. }
            | Self::Consumer { .. }
            | Self::Publish { .. }
            | Self::Admin { .. } => false,
        }
    }
}

fn is_permanent_refusal(kind: &CreateStreamErrorKind) -> bool {
    match kind {
        CreateStreamErrorKind::JetStream(answer) => {
            PERMANENT_REFUSALS.contains(&answer.error_code())
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(err_code: u64) -> CreateStreamErrorKind {
        let json = format!(r#"{{"code":400,"err_code":{err_code},"description":"refused"}}"#);
        CreateStreamErrorKind::JetStream(serde_json::from_str(&json).expect("an API error"))
    }

    #[test]
    fn refusals_of_the_settings_are_permanent_and_a_cluster_in_transition_is_not() {
        // No JetStream for the account; R3 on a single server; subjects another stream holds.
        for code in [10039, 10074, 10065] {
            assert!(is_permanent_refusal(&answer(code)), "{code}");
        }
        // Cluster temporarily unavailable; no peers to place it on yet (a node restarting);
        // a stream name in use (a replica creating it at the same moment); no room yet.
        for code in [10008, 10005, 10058, 10023] {
            assert!(!is_permanent_refusal(&answer(code)), "{code}");
        }
        assert!(!is_permanent_refusal(&CreateStreamErrorKind::TimedOut));
        assert!(!is_permanent_refusal(
            &CreateStreamErrorKind::JetStreamUnavailable
        ));
    }
}
