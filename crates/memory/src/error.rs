//! What can go wrong in the memory service, in terms a caller can act on.

use uuid::Uuid;

/// An error of the memory service or its store.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// The caller's epoch no longer holds the session's lease: another replica claimed it, or
    /// the lease was released. The caller must stop writing for this session.
    #[error("lease lost: epoch {epoch} no longer holds session {session_id}")]
    LeaseLost {
        /// The session whose lease was lost.
        session_id: Uuid,
        /// The stale epoch the caller presented.
        epoch: i64,
    },
    /// The session does not exist.
    #[error("session {0} not found")]
    SessionNotFound(Uuid),
    /// The run does not exist, or does not belong to the given session and input.
    #[error("run {run_id} for input {inbox_seq} not found")]
    RunNotFound {
        /// The run id the caller presented.
        run_id: Uuid,
        /// The inbox sequence number the caller presented.
        inbox_seq: i64,
    },
    /// A pairing code or approval request that does not exist (or no longer does).
    #[error("{0}")]
    NotFound(String),
    /// The request is malformed (missing id, unparsable UUID, unknown kind or status).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The database is still being connected to at startup.
    #[error("memory is starting: database not ready")]
    Starting,
    /// The service is shutting down and its batch workers are gone; another replica or a
    /// retry after the restart will answer.
    #[error("memory is stopping: the call was not run")]
    Stopping,
    /// Too many calls are waiting for the database; retrying shortly may succeed.
    #[error("memory is overloaded: too many calls waiting for the database")]
    Overloaded,
    /// A concurrent change got in the way of the call (a record it found was gone when read
    /// back); nothing was written, and retrying shortly may succeed.
    #[error("aborted by a concurrent change, retry: {0}")]
    Aborted(String),
    /// A bug: the service failed in a way no request should cause.
    #[error("internal error: {0}")]
    Internal(String),
    /// Postgres cannot be reached right now; retrying later may succeed.
    #[error("database unavailable")]
    Unavailable(#[source] sqlx::Error),
    /// Postgres refused the configured user or password: retrying cannot help.
    #[error(
        "the database refused memory's credentials: check the user and password in [memory] database_url (DATABASE_URL)"
    )]
    Credentials(#[source] sqlx::Error),
    /// Postgres rejected a statement for a reason retrying will not fix.
    #[error("database error")]
    Database(#[source] sqlx::Error),
    /// The database URL in the configuration does not parse.
    #[error("invalid database url in [memory] database_url")]
    DatabaseUrl(#[source] sqlx::Error),
    /// The schema migrations could not be applied.
    #[error("failed to run database migrations")]
    Migrate(#[source] sqlx::migrate::MigrateError),
    /// A listener could not be bound.
    #[error("failed to bind {addr}")]
    Bind {
        /// The configured address.
        addr: String,
        /// The socket error.
        #[source]
        source: std::io::Error,
    },
    /// Only one of `tls_cert_file` and `tls_key_file` is set; TLS needs both.
    #[error("TLS needs both [memory] tls_cert_file and tls_key_file; only {set} is set")]
    TlsIncomplete {
        /// The key that is set.
        set: &'static str,
    },
    /// A TLS certificate or key file cannot be read.
    #[error("cannot read the TLS file {path}")]
    TlsFile {
        /// The configured path.
        path: String,
        /// Why reading failed.
        #[source]
        source: std::io::Error,
    },
    /// The certificate and key were read but do not make a TLS server (not PEM, a key that
    /// does not parse).
    #[error("invalid TLS certificate {cert} or key {key}")]
    Tls {
        /// The configured certificate path.
        cert: String,
        /// The configured key path.
        key: String,
        /// tonic's complaint.
        #[source]
        source: tonic::transport::Error,
    },
    /// The gRPC server stopped with an error.
    #[error("grpc server failed")]
    Serve(#[source] tonic::transport::Error),
}

impl MemoryError {
    /// Returns whether the error means the database is unreachable (as opposed to a bad request
    /// or a bug), which turns readiness off until a query succeeds again.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            Self::Unavailable(_) | Self::Starting | Self::Stopping | Self::Overloaded
        )
    }
}

/// Displays an error with its whole source chain (`outer: inner: root`), for logs and for the
/// status messages of errors whose cause the caller should see.
pub(crate) struct Chain<'a>(pub(crate) &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(err) = source {
            write!(f, ": {err}")?;
            source = err.source();
        }
        Ok(())
    }
}
