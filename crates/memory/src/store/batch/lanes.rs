//! How a lane runs: a call that found it idle runs alone in its caller's task, then the lane
//! serves the calls that queued meanwhile, in batches, until none wait.

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, MutexGuard};

use futures::FutureExt as _;

use super::{Inner, Reply, Running, State};
use crate::MemoryError;

impl<I: Send + 'static, O: Send + 'static> Inner<I, O> {
    /// The lanes and waiting calls, locked.
    pub(super) fn state(&self) -> MutexGuard<'_, State<I, O>> {
        // The lock is never held across a panic-prone step; recover the data if it was.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs `item` as a batch of one on the lane its caller took.
    pub(super) async fn alone(self: Arc<Self>, item: I) -> Result<O, MemoryError> {
        self.counters.batch_of(1);
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

    /// Fails the waiting calls (their callers retry) and marks the lane idle.
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
                self.counters.batch_of(batch.len());
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
