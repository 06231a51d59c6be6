//! Errors of the bus layer.

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
