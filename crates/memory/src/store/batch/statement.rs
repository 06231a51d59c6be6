//! A batch statement's answer turned into one result per call: settled in call order, or
//! judged when Postgres failed it, and the helpers that build its arrays in lock order.

use super::BatchCounters;
use crate::MemoryError;

/// Turns what a batch statement answered into one result per call, in call order; `None` when
/// Postgres refused the batch and rolled it back (one bad call, a deadlock), so each call must
/// run again on its own and only the bad one fails.
pub(crate) fn settle<O>(
    what: &str,
    answered: Result<Vec<(i32, O)>, sqlx::Error>,
    order: &[usize],
    counters: &BatchCounters,
) -> Option<Vec<Result<O, MemoryError>>> {
    match answered {
        Ok(rows) => Some(settle_rows(what, rows, order)),
        Err(err) => judge(what, &err, order.len(), counters)
            .map(|failure| failure.answers(what, &err, order.len())),
    }
}

/// Maps a committed batch's rows, which carry their 1-based position in `order` (the lock order
/// the arrays were built in), back to the calls, in call order.
pub(crate) fn settle_rows<O>(
    what: &str,
    rows: Vec<(i32, O)>,
    order: &[usize],
) -> Vec<Result<O, MemoryError>> {
    let calls = order.len();
    let answered = rows.len();
    let mut results: Vec<Option<O>> = (0..calls).map(|_| None).collect();
    for (idx, row) in rows {
        let at = usize::try_from(idx - 1).ok().and_then(|i| order.get(i));
        if let Some(&at) = at {
            results[at] = Some(row);
        }
    }
    if answered == calls && results.iter().all(Option::is_some) {
        return results.into_iter().flatten().map(Ok).collect();
    }
    // It committed, so running the calls again could claim leases twice: every call fails
    // instead (and its caller retries).
    tracing::error!(calls, answered, "{what} batch answered out of shape");
    out_of_shape(what, calls)
}

/// How the calls of a failed batch statement fail when they may not run again.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Failure {
    /// The database could not be reached.
    Unavailable,
    /// Postgres committed, but the answer could not be read.
    Unreadable,
}

impl Failure {
    /// One failure per call, for `calls` calls.
    pub(crate) fn answers<O>(
        self,
        what: &str,
        err: &sqlx::Error,
        calls: usize,
    ) -> Vec<Result<O, MemoryError>> {
        match self {
            Self::Unavailable => unavailable(calls, err),
            Self::Unreadable => out_of_shape(what, calls),
        }
    }
}

/// Judges a batch statement of `calls` calls that failed: `None` when Postgres refused it, so
/// nothing was written and each call may run again on its own; otherwise how every call fails.
pub(crate) fn judge(
    what: &str,
    err: &sqlx::Error,
    calls: usize,
    counters: &BatchCounters,
) -> Option<Failure> {
    if crate::store::error::is_outage(err) {
        // Running the calls one by one would only wait out the pool timeout again and again.
        tracing::debug!(error = %err, calls, "{what} batch failed: database unreachable");
        return Some(Failure::Unavailable);
    }
    if rolled_back(err) {
        counters.fallbacks.inc();
        tracing::debug!(error = %err, calls, "{what} batch failed; running its calls apart");
        return None;
    }
    // Failed reading an answer Postgres had already committed: running the calls again would
    // find their work done (a run finished, a lease taken by this very call) and answer wrongly.
    tracing::error!(error = %err, calls, "{what} batch committed but its answer could not be read");
    Some(Failure::Unreadable)
}

/// Whether a failed statement wrote nothing: Postgres refused it (and, in autocommit, rolled it
/// back), or its arguments could not be encoded, so it was never sent.
fn rolled_back(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(_) | sqlx::Error::Encode(_))
}

/// Fails `calls` calls of a committed batch whose answer did not match them.
pub(crate) fn out_of_shape<O>(what: &str, calls: usize) -> Vec<Result<O, MemoryError>> {
    (0..calls)
        .map(|_| {
            Err(MemoryError::Internal(format!(
                "the {what} batch carrying this call answered out of shape"
            )))
        })
        .collect()
}

/// Fails `calls` calls of a batch that could not reach the database with `err`.
pub(crate) fn unavailable<O>(calls: usize, err: &sqlx::Error) -> Vec<Result<O, MemoryError>> {
    (0..calls)
        .map(|_| {
            Err(MemoryError::Unavailable(sqlx::Error::Io(
                std::io::Error::other(format!("the batch carrying this call failed: {err}")),
            )))
        })
        .collect()
}

/// One array argument of a batch statement: `f` of each call, in lock order.
pub(crate) fn column<'a, A, T>(ordered: &[&'a A], f: impl Fn(&'a A) -> T) -> Vec<T> {
    ordered.iter().map(|&call| f(call)).collect()
}

/// Runs each call on its own, in order, on `conn`: a batch of one, or what a failed batch left.
pub(crate) async fn one_by_one<A, R>(
    conn: &mut sqlx::PgConnection,
    calls: &[A],
    mut run: impl AsyncFnMut(&mut sqlx::PgConnection, &A) -> Result<R, MemoryError>,
) -> Vec<Result<R, MemoryError>> {
    let mut results = Vec::with_capacity(calls.len());
    for call in calls {
        results.push(run(conn, call).await);
    }
    results
}

/// Orders batch positions by session so that concurrent batches take session locks in the same
/// order; a session's own items keep their arrival order.
pub(crate) fn lock_order<T>(items: &[T], session: impl Fn(&T) -> uuid::Uuid) -> Vec<usize> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| session(&items[i]));
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_statement_that_wrote_nothing_runs_again() {
        let counters = BatchCounters::default();
        let unsent = sqlx::Error::Encode("a value that cannot be encoded".into());
        assert!(judge("test", &unsent, 3, &counters).is_none());
        assert_eq!(counters.fallbacks.get(), 1);
        let outage = sqlx::Error::Io(std::io::Error::other("connection reset"));
        assert!(matches!(
            judge("test", &outage, 3, &counters),
            Some(Failure::Unavailable)
        ));
        // Postgres committed; the answer is what could not be read.
        let unreadable = sqlx::Error::ColumnNotFound("held".to_owned());
        assert!(matches!(
            judge("test", &unreadable, 3, &counters),
            Some(Failure::Unreadable)
        ));
        assert_eq!(
            counters.fallbacks.get(),
            1,
            "only the unsent statement ran again"
        );
        let answers: Vec<Result<(), MemoryError>> =
            Failure::Unreadable.answers("test", &unreadable, 3);
        assert_eq!(answers.len(), 3);
        assert!(
            answers
                .iter()
                .all(|a| matches!(a, Err(MemoryError::Internal(_))))
        );
    }

    #[test]
    fn lock_order_sorts_by_session_and_keeps_each_sessions_arrival_order() {
        let a = uuid::Uuid::from_u128(1);
        let b = uuid::Uuid::from_u128(2);
        let items = [(b, 0), (a, 1), (b, 2), (a, 3)];
        assert_eq!(lock_order(&items, |item| item.0), vec![1, 3, 0, 2]);
    }
}
