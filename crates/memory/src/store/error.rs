//! The one place where Postgres and sqlx errors are translated, by SQLSTATE, into
//! [`MemoryError`]s a caller can act on.

use uuid::Uuid;

use crate::MemoryError;

/// `invalid_catalog_name`: the database named in the URL does not exist.
const MISSING_DATABASE: &str = "3D000";
/// `duplicate_database`: another replica created it first.
const DUPLICATE_DATABASE: &str = "42P04";
const FOREIGN_KEY_VIOLATION: &str = "23503";
/// SQLSTATE class 22, data exception: a value the column cannot hold (a NUL byte in text, an
/// unparsable number, a string too long). The same request fails the same way every time.
const DATA_EXCEPTION_CLASS: &str = "22";
/// SQLSTATE class 23, integrity constraint violation (not null, check, unique).
const CONSTRAINT_VIOLATION_CLASS: &str = "23";
/// SQLSTATE class 54, program limit exceeded: a value past what an index row holds, a statement
/// too large. The same request fails the same way every time.
const PROGRAM_LIMIT_CLASS: &str = "54";
const SERIALIZATION_FAILURE: &str = "40001";
const DEADLOCK_DETECTED: &str = "40P01";
const LOCK_NOT_AVAILABLE: &str = "55P03";
const QUERY_CANCELED: &str = "57014";

/// Translates a store error for a statement about `session_id`.
///
/// A foreign-key violation can only come from a row pointing at a session that does not exist,
/// because every table the store writes hangs off `sessions`.
pub(crate) fn translate(err: sqlx::Error, session_id: Uuid) -> MemoryError {
    if is_transient(&err) {
        return MemoryError::Unavailable(err);
    }
    let Some(code) = sqlstate(&err) else {
        return MemoryError::Database(err);
    };
    match code.as_str() {
        FOREIGN_KEY_VIOLATION => MemoryError::SessionNotFound(session_id),
        // Permanent: reported as InvalidArgument so the caller gives the request up instead of
        // retrying it forever, as it would an Internal or Unavailable.
        _ if is_invalid_data(&code) => {
            MemoryError::InvalidArgument(format!("rejected by the database: {err}"))
        }
        _ => MemoryError::Database(err),
    }
}

/// Returns whether a SQLSTATE says the data itself was refused (classes 22, 23 and 54).
fn is_invalid_data(code: &str) -> bool {
    [
        DATA_EXCEPTION_CLASS,
        CONSTRAINT_VIOLATION_CLASS,
        PROGRAM_LIMIT_CLASS,
    ]
    .iter()
    .any(|class| code.starts_with(class))
}

/// Returns whether retrying later may succeed: the database is out of reach (see
/// [`is_outage`]) or the statement lost a concurrency race.
pub(crate) fn is_transient(err: &sqlx::Error) -> bool {
    is_outage(err)
        || sqlstate(err).is_some_and(|code| {
            code == SERIALIZATION_FAILURE
                || code == DEADLOCK_DETECTED
                || code == LOCK_NOT_AVAILABLE
                || code == QUERY_CANCELED
        })
}

/// Returns whether Postgres refused the user or password (class 28: invalid authorization),
/// which no retry fixes.
pub(crate) fn is_refused_credentials(err: &sqlx::Error) -> bool {
    sqlstate(err).is_some_and(|code| code.starts_with("28"))
}

/// Returns whether the database itself is out of reach (unreachable, restarting, out of
/// connections, dropped), which makes the service not ready, unlike a lost race.
pub(crate) fn is_outage(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(_) => sqlstate(err).is_some_and(|code| {
            // Class 08: connection exception; 53: insufficient resources (too many
            // connections, disk full); 57P0x: the server is shutting down or starting up.
            code.starts_with("08")
                || code.starts_with("53")
                || code.starts_with("57P")
                || code == MISSING_DATABASE
        }),
        _ => false,
    }
}

/// Returns whether the database named in the connection options does not exist.
pub(crate) fn is_missing_database(err: &sqlx::Error) -> bool {
    sqlstate(err).as_deref() == Some(MISSING_DATABASE)
}

/// Returns whether `CREATE DATABASE` lost a race with another replica.
pub(crate) fn is_duplicate_database(err: &sqlx::Error) -> bool {
    sqlstate(err).as_deref() == Some(DUPLICATE_DATABASE)
}

fn sqlstate(err: &sqlx::Error) -> Option<String> {
    match err {
        sqlx::Error::Database(db) => db.code().map(|code| code.into_owned()),
        _ => None,
    }
}

/// Returns whether a migration failed for a reason retrying may fix (the server went away
/// mid-migration) rather than a broken or diverged schema.
pub(crate) fn is_transient_migration(err: &sqlx::migrate::MigrateError) -> bool {
    match err {
        sqlx::migrate::MigrateError::Execute(err) => is_transient(err),
        sqlx::migrate::MigrateError::ExecuteMigration(err, _) => is_transient(err),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_and_io_errors_are_transient() {
        assert!(is_transient(&sqlx::Error::PoolTimedOut));
        assert!(is_transient(&sqlx::Error::Io(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused
        ))));
        assert!(!is_transient(&sqlx::Error::RowNotFound));
    }

    #[test]
    fn data_exceptions_and_constraint_violations_are_invalid_data() {
        // 22021: a NUL byte in text; 22001: a string too long; 23505: a unique violation;
        // 54000: an index row past its size.
        for code in ["22021", "22P05", "22001", "23505", "23514", "54000"] {
            assert!(is_invalid_data(code), "{code}");
        }
        for code in ["40001", "08006", "57014", "XX000", "42P01"] {
            assert!(!is_invalid_data(code), "{code}");
        }
    }

    #[test]
    fn an_unavailable_error_maps_to_unavailable() {
        let err = translate(sqlx::Error::PoolTimedOut, Uuid::nil());
        assert!(matches!(err, MemoryError::Unavailable(_)));
        assert!(err.is_unavailable());
    }
}
