//! Group commit for the run path: calls that arrive while an earlier batch is in Postgres wait
//! for the next one, and a batch is one round trip and one commit however many runs it carries.
//! A call that finds a lane idle goes at once, in its caller's task, so a quiet system pays
//! neither a wait nor a handoff between tasks.

use std::collections::VecDeque;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};

use agentloop_lifecycle::Counter;
use futures::FutureExt as _;
use tokio::sync::oneshot;

use crate::MemoryError;

/// How calls are gathered into batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchSettings {
    /// Batches in Postgres at once. Fewer lanes make larger batches under load.
    pub lanes: usize,
    /// Most calls in one batch.
    pub max_items: usize,
}

impl Default for BatchSettings {
    fn default() -> Self {
        Self {
            lanes: 1,
            max_items: 64,
        }
    }
}

/// Counts batches and the calls they carried (their ratio is the mean batch size).
#[derive(Clone, Debug, Default)]
pub struct BatchCounters {
    /// Batches sent to Postgres.
    pub batches: Counter,
    /// Calls carried by those batches.
    pub items: Counter,
    /// Batches Postgres refused (rolled back) that ran again in parts: a batch of one kind
    /// call by call, a batch of both kinds as its two halves (each of which may fall back too).
    pub fallbacks: Counter,
    /// Batches that carried enqueues and run ends together, as one statement.
    pub combined: Counter,
}

/// Calls waiting for a batch at most; beyond that a call is refused as overloaded (the caller
/// retries) instead of queueing without bound behind a slow or unreachable database.
const QUEUE_CAPACITY: usize = 16_384;

type Reply<O> = oneshot::Sender<Result<O, MemoryError>>;
type Running<O> = Pin<Box<dyn Future<Output = Vec<Result<O, MemoryError>>> + Send>>;
type Execute<I, O> = Arc<dyn Fn(Vec<I>) -> Running<O> + Send + Sync>;

/// Gathers calls into batches executed by `execute`, which returns one result per item, in
/// item order.
pub(crate) struct Batcher<I, O> {
    inner: Arc<Inner<I, O>>,
}

struct Inner<I, O> {
    settings: BatchSettings,
    counters: BatchCounters,
    execute: Execute<I, O>,
    state: Mutex<State<I, O>>,
}

struct State<I, O> {
    /// Lanes with no batch in Postgres.
    idle: usize,
    /// Calls waiting for a lane, oldest first.
    waiting: VecDeque<(I, Reply<O>)>,
}

/// Where a call goes: on a lane it found idle, or into the queue for the next batch.
enum Turn<I, O> {
    Lane(I),
    Queued(oneshot::Receiver<Result<O, MemoryError>>),
}

impl<I, O> std::fmt::Debug for Batcher<I, O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher")
            .field("settings", &self.inner.settings)
            .finish_non_exhaustive()
    }
}

impl<I: Send + 'static, O: Send + 'static> Batcher<I, O> {
    /// Returns a batcher with every lane idle.
    pub(crate) fn new(
        settings: BatchSettings,
        counters: BatchCounters,
        execute: Execute<I, O>,
    ) -> Self {
        let lanes = settings.lanes.max(1);
        Self {
            inner: Arc::new(Inner {
                settings,
                counters,
                execute,
                state: Mutex::new(State {
                    idle: lanes,
                    waiting: VecDeque::new(),
                }),
            }),
        }
    }

    /// Runs `item` in the next batch and returns its result.
    pub(crate) async fn call(&self, item: I) -> Result<O, MemoryError> {
        let turn = {
            let mut state = self.inner.state();
            if state.idle > 0 {
                state.idle -= 1;
                Turn::Lane(item)
            } else if state.waiting.len() >= QUEUE_CAPACITY {
                return Err(MemoryError::Overloaded);
            } else {
                let (reply, answer) = oneshot::channel();
                state.waiting.push_back((item, reply));
                Turn::Queued(answer)
            }
        };
        match turn {
            Turn::Lane(item) => self.inner.clone().alone(item).await,
            Turn::Queued(answer) => answer.await.unwrap_or(Err(MemoryError::Stopping)),
        }
    }
}

impl<I: Send + 'static, O: Send + 'static> Inner<I, O> {
    fn state(&self) -> MutexGuard<'_, State<I, O>> {
        // The lock is never held across a panic-prone step; recover the data if it was.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs `item` as a batch of one on the lane its caller took.
    async fn alone(self: Arc<Self>, item: I) -> Result<O, MemoryError> {
        self.counters.batches.inc();
        self.counters.items.inc();
        let running = (self.execute)(vec![item]);
        let mut lane = Lane {
            inner: self,
            running: Some(running),
        };
        let results = match lane.running.as_mut() {
            Some(running) => outcome(AssertUnwindSafe(running).catch_unwind().await, 1),
            None => Vec::new(),
        };
        lane.running = None;
        drop(lane);
        results.into_iter().next().unwrap_or_else(|| {
            Err(MemoryError::Internal(
                "a batch of one answered nothing".to_owned(),
            ))
        })
    }

    /// The lane's batch is over: it serves the calls that queued meanwhile, in a task of its
    /// own so that the caller it served answers now, or goes idle.
    fn hand_on(self: Arc<Self>) {
        let Some(batch) = self.next_batch() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(self.drain(batch));
            }
            Err(_) => {
                // No runtime (it is shutting down): the waiting calls fail, their callers retry.
                drop(batch);
                self.fail_waiting();
            }
        }
    }

    /// Takes the next batch of waiting calls, or marks the lane idle when none wait.
    fn next_batch(&self) -> Option<Vec<(I, Reply<O>)>> {
        let mut state = self.state();
        if state.waiting.is_empty() {
            state.idle += 1;
            return None;
        }
        let n = state.waiting.len().min(self.settings.max_items.max(1));
        Some(state.waiting.drain(..n).collect())
    }

    fn fail_waiting(&self) {
        let mut state = self.state();
        state.waiting.clear();
        state.idle += 1;
    }

    /// Runs batches of waiting calls until none wait.
    async fn drain(self: Arc<Self>, mut batch: Vec<(I, Reply<O>)>) {
        loop {
            // A caller that gave up (its request was cancelled or timed out) retries on its own;
            // running its call late could claim a lease nobody works on.
            batch.retain(|(_, reply)| !reply.is_closed());
            if !batch.is_empty() {
                self.counters.batches.inc();
                self.counters.items.add(batch.len() as u64);
                let (items, replies): (Vec<I>, Vec<Reply<O>>) = batch.into_iter().unzip();
                // A panic fails this batch's calls, not the lane. Caught in place rather than in
                // a task of its own: one task wakeup less per batch.
                let calls = replies.len();
                let results = outcome(
                    AssertUnwindSafe((self.execute)(items)).catch_unwind().await,
                    calls,
                );
                for (reply, result) in replies.into_iter().zip(results) {
                    let _ = reply.send(result);
                }
            }
            match self.next_batch() {
                Some(next) => batch = next,
                None => return,
            }
        }
    }
}

/// A lane taken by a call that runs its batch in its own task. Dropped mid-batch (the caller
/// gave up), the batch still runs to its end, in a task of its own, as a queued one would; so
/// a statement is never cut off in Postgres and the lane is always handed on.
struct Lane<I: Send + 'static, O: Send + 'static> {
    inner: Arc<Inner<I, O>>,
    running: Option<Running<O>>,
}

impl<I: Send + 'static, O: Send + 'static> Drop for Lane<I, O> {
    fn drop(&mut self) {
        let inner = self.inner.clone();
        let Some(running) = self.running.take() else {
            inner.hand_on();
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    let _ = AssertUnwindSafe(running).catch_unwind().await;
                    inner.hand_on();
                });
            }
            Err(_) => {
                drop(running);
                inner.hand_on();
            }
        }
    }
}

/// One result per call of a batch that returned or panicked.
fn outcome<O>(
    ran: Result<Vec<Result<O, MemoryError>>, Box<dyn std::any::Any + Send>>,
    calls: usize,
) -> Vec<Result<O, MemoryError>> {
    match ran {
        Ok(results) => results,
        Err(panic) => {
            let why = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".to_owned());
            tracing::error!(error = %why, calls, "a batch of the run path panicked; its calls fail");
            (0..calls)
                .map(|_| {
                    Err(MemoryError::Internal(format!(
                        "the batch carrying this call failed: {why}"
                    )))
                })
                .collect()
        }
    }
}

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
    if super::error::is_outage(err) {
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
    use tokio::sync::mpsc;

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

    #[tokio::test]
    async fn calls_arriving_while_a_batch_runs_share_the_next_one() {
        let (entered_tx, mut entered) = mpsc::unbounded_channel::<usize>();
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let execute: Execute<u32, u32> = {
            let gate = gate.clone();
            Arc::new(move |items: Vec<u32>| {
                let gate = gate.clone();
                let entered = entered_tx.clone();
                Box::pin(async move {
                    let _ = entered.send(items.len());
                    let _ = gate.acquire().await.map(|permit| permit.forget());
                    items.into_iter().map(|i| Ok(i * 10)).collect()
                })
            })
        };
        let counters = BatchCounters::default();
        let batcher = Arc::new(Batcher::new(
            BatchSettings {
                lanes: 1,
                max_items: 64,
            },
            counters.clone(),
            execute,
        ));
        let first = tokio::spawn({
            let batcher = batcher.clone();
            async move { batcher.call(1).await }
        });
        assert_eq!(
            entered.recv().await,
            Some(1),
            "the first call goes alone, at once"
        );
        let rest: Vec<_> = (2..=4)
            .map(|i| {
                let batcher = batcher.clone();
                tokio::spawn(async move { batcher.call(i).await })
            })
            .collect();
        // Let the three calls reach the queue while the lane is held in the first batch.
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        gate.add_permits(2);
        assert_eq!(first.await.unwrap().unwrap(), 10);
        assert_eq!(
            entered.recv().await,
            Some(3),
            "the three waiting calls form one batch"
        );
        let mut answers = Vec::new();
        for call in rest {
            answers.push(call.await.unwrap().unwrap());
        }
        assert_eq!(
            answers,
            vec![20, 30, 40],
            "each call gets its own item's result"
        );
        assert_eq!((counters.batches.get(), counters.items.get()), (2, 4));
    }

    #[tokio::test]
    async fn a_batch_whose_caller_gives_up_still_ends_and_the_lane_serves_the_next_call() {
        let (entered_tx, mut entered) = mpsc::unbounded_channel::<Vec<u32>>();
        let (ended_tx, mut ended) = mpsc::unbounded_channel::<Vec<u32>>();
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let execute: Execute<u32, u32> = {
            let gate = gate.clone();
            Arc::new(move |items: Vec<u32>| {
                let (gate, entered, ended) = (gate.clone(), entered_tx.clone(), ended_tx.clone());
                Box::pin(async move {
                    let _ = entered.send(items.clone());
                    let _ = gate.acquire().await.map(|permit| permit.forget());
                    let _ = ended.send(items.clone());
                    items.into_iter().map(Ok).collect()
                })
            })
        };
        let batcher = Arc::new(Batcher::new(
            BatchSettings {
                lanes: 1,
                max_items: 64,
            },
            BatchCounters::default(),
            execute,
        ));
        let given_up = tokio::spawn({
            let batcher = batcher.clone();
            async move { batcher.call(1).await }
        });
        assert_eq!(
            entered.recv().await,
            Some(vec![1]),
            "the first call runs in its task"
        );
        let next = tokio::spawn({
            let batcher = batcher.clone();
            async move { batcher.call(2).await }
        });
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        given_up.abort();
        assert!(given_up.await.unwrap_err().is_cancelled());
        gate.add_permits(2);
        let within = std::time::Duration::from_secs(5);
        assert_eq!(
            tokio::time::timeout(within, ended.recv())
                .await
                .ok()
                .flatten(),
            Some(vec![1]),
            "the abandoned batch ran to its end"
        );
        let served = tokio::time::timeout(within, next)
            .await
            .expect("the lane was handed on to the waiting call");
        assert_eq!(served.unwrap().unwrap(), 2);
        assert_eq!(entered.recv().await, Some(vec![2]));
    }

    #[tokio::test]
    async fn a_panicking_batch_fails_its_calls_and_the_lane_goes_on() {
        let execute: Execute<u32, u32> = Arc::new(|items: Vec<u32>| {
            Box::pin(async move {
                assert!(!items.contains(&0), "zero is the poison");
                items.into_iter().map(Ok).collect()
            })
        });
        let batcher = Batcher::new(
            BatchSettings {
                lanes: 1,
                max_items: 64,
            },
            BatchCounters::default(),
            execute,
        );
        let poisoned = batcher.call(0).await;
        assert!(
            matches!(poisoned, Err(MemoryError::Internal(_))),
            "{poisoned:?}"
        );
        assert_eq!(
            batcher.call(7).await.unwrap(),
            7,
            "the one lane still serves"
        );
    }
}
