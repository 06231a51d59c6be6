//! Group commit for the run path: calls that arrive while an earlier batch is in Postgres wait
//! for the next one, and a batch is one round trip and one commit however many runs it carries.
//! A call that finds a lane idle goes at once, in its caller's task, so a quiet system pays
//! neither a wait nor a handoff between tasks.

mod lanes;
mod statement;

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use agentloop_lifecycle::Counter;
use tokio::sync::oneshot;

pub(crate) use statement::{
    column, judge, lock_order, one_by_one, settle, settle_rows, unavailable,
};

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
    /// Calls per batch, when counted.
    pub sizes: Option<agentloop_lifecycle::HistogramFamily>,
}

impl BatchCounters {
    /// Counts one batch of `calls` calls.
    pub(crate) fn batch_of(&self, calls: usize) {
        self.batches.inc();
        self.items.add(calls as u64);
        if let Some(sizes) = &self.sizes {
            sizes.get_or_create(&Vec::new()).observe(calls as f64);
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;

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
