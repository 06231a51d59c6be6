//! Work of one key in arrival order, work of different keys at once.
//!
//! A fixed set of lanes, each session hashed to one, also keeps a session's messages in order,
//! but under load the sessions of a lane queue behind each other's round trips (100 sessions in
//! 32 lanes: 19 ms p50 from a RunCommand's arrival to its enqueue). Here an item waits only for
//! the earlier items of its own key.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, PoisonError};

use futures::FutureExt as _;

use tokio::sync::Semaphore;
use tokio_util::task::TaskTracker;

type Queues<T> = Arc<Mutex<HashMap<String, VecDeque<T>>>>;

/// Hands each item to a handler: items of one key one after another, in the order given, and
/// items of different keys concurrently, at most `limit` keys at a time.
pub struct InOrder<T, H> {
    /// Items waiting behind their key's item in flight; a key is present while it has one.
    queues: Queues<T>,
    slots: Arc<Semaphore>,
    tasks: TaskTracker,
    handler: Arc<H>,
}

impl<T, H, Fut> InOrder<T, H>
where
    T: Send + 'static,
    H: Fn(T) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    /// Runs `handler` for at most `limit` keys at once (0 counts as 1).
    pub fn new(limit: usize, handler: H) -> Self {
        Self {
            queues: Arc::default(),
            slots: Arc::new(Semaphore::new(limit.max(1))),
            tasks: TaskTracker::new(),
            handler: Arc::new(handler),
        }
    }

    /// Queues `item` behind the items of `key` still in flight, or starts it once a slot is
    /// free. Waiting for a slot is the caller's back-pressure: it should stop taking work.
    /// Dropping the future while it waits drops `item` and leaves nothing half done.
    pub async fn push(&mut self, key: &str, item: T) {
        {
            let mut queues = self.queues.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(queue) = queues.get_mut(key) {
                queue.push_back(item);
                return;
            }
        }
        // The semaphore is never closed, so acquiring only fails if that changes.
        let Ok(permit) = self.slots.clone().acquire_owned().await else {
            return;
        };
        // Only this method inserts keys, and `&mut self` keeps it from running twice at once, so
        // the key is still absent; its entry queues later items of the key behind this one.
        self.queues
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(key.to_owned())
            .or_default();
        let queues = self.queues.clone();
        let handler = self.handler.clone();
        let key = key.to_owned();
        self.tasks.spawn(async move {
            let _permit = permit;
            let mut next = item;
            loop {
                // A handler that panics loses its own item (unacknowledged, so redelivered), not
                // every later item of its key.
                if AssertUnwindSafe(handler(next)).catch_unwind().await.is_err() {
                    tracing::error!(key = %key, "handler panicked; going on with the key's next item");
                }
                let mut guard = queues.lock().unwrap_or_else(PoisonError::into_inner);
                match guard.get_mut(&key).and_then(VecDeque::pop_front) {
                    Some(item) => next = item,
                    None => {
                        guard.remove(&key);
                        return;
                    }
                }
            }
        });
    }

    /// Waits until every item given so far has been handled.
    pub async fn finish(self) {
        self.tasks.close();
        self.tasks.wait().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_key_keeps_its_order_while_other_keys_pass_it() {
        let log = Arc::new(Mutex::new(Vec::<(String, u32)>::new()));
        let gate = Arc::new(tokio::sync::Notify::new());
        let (log2, gate2) = (log.clone(), gate.clone());
        let mut in_order = InOrder::new(8, move |(key, n): (String, u32)| {
            let (log, gate) = (log2.clone(), gate2.clone());
            async move {
                // Key "slow"'s first item holds until the test releases it.
                if key == "slow" && n == 0 {
                    gate.notified().await;
                }
                log.lock().unwrap().push((key, n));
            }
        });
        for n in 0..3 {
            in_order.push("slow", ("slow".to_owned(), n)).await;
            in_order.push("fast", ("fast".to_owned(), n)).await;
        }
        // "fast" gets through all its items while "slow" is held up.
        tokio::time::timeout(Duration::from_secs(5), async {
            while log.lock().unwrap().len() < 3 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the other key's items were held up");
        assert_eq!(
            *log.lock().unwrap(),
            vec![
                ("fast".to_owned(), 0),
                ("fast".to_owned(), 1),
                ("fast".to_owned(), 2)
            ]
        );
        gate.notify_one();
        in_order.finish().await;
        let slow: Vec<u32> = log
            .lock()
            .unwrap()
            .iter()
            .filter(|(k, _)| k == "slow")
            .map(|(_, n)| *n)
            .collect();
        assert_eq!(slow, vec![0, 1, 2]);
    }

    #[tokio::test]
    async fn a_push_given_up_while_waiting_for_a_slot_leaves_nothing_behind() {
        let handled = Arc::new(Mutex::new(Vec::<u32>::new()));
        let gate = Arc::new(tokio::sync::Notify::new());
        let (handled2, gate2) = (handled.clone(), gate.clone());
        let mut in_order = InOrder::new(1, move |n: u32| {
            let (handled, gate) = (handled2.clone(), gate2.clone());
            async move {
                if n == 0 {
                    gate.notified().await;
                }
                handled.lock().unwrap().push(n);
            }
        });
        in_order.push("a", 0).await;
        // The only slot is taken: this push waits, and is given up.
        let gave_up = tokio::time::timeout(Duration::from_millis(50), in_order.push("b", 1)).await;
        assert!(gave_up.is_err(), "the push found a slot it should not have");
        gate.notify_one();
        // Key "b" was never entered, so its next item starts rather than queueing forever.
        tokio::time::timeout(Duration::from_secs(5), in_order.push("b", 2))
            .await
            .expect("no slot came free");
        in_order.finish().await;
        assert_eq!(*handled.lock().unwrap(), vec![0, 2]);
    }

    #[tokio::test]
    async fn a_panicking_handler_does_not_stall_its_key() {
        let handled = Arc::new(Mutex::new(Vec::<u32>::new()));
        let handled2 = handled.clone();
        let mut in_order = InOrder::new(4, move |n: u32| {
            let handled = handled2.clone();
            async move {
                assert!(n != 1, "item 1 fails");
                handled.lock().unwrap().push(n);
            }
        });
        for n in 0..3 {
            in_order.push("k", n).await;
        }
        tokio::time::timeout(Duration::from_secs(5), in_order.finish())
            .await
            .expect("the key stalled");
        assert_eq!(*handled.lock().unwrap(), vec![0, 2]);
    }

    #[tokio::test]
    async fn no_more_keys_than_the_limit_run_at_once() {
        let running = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let most = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (running2, most2) = (running.clone(), most.clone());
        let mut in_order = InOrder::new(2, move |(): ()| {
            let (running, most) = (running2.clone(), most2.clone());
            async move {
                use std::sync::atomic::Ordering::SeqCst;
                let now = running.fetch_add(1, SeqCst) + 1;
                most.fetch_max(now, SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
                running.fetch_sub(1, SeqCst);
            }
        });
        for key in 0..10 {
            in_order.push(&key.to_string(), ()).await;
        }
        in_order.finish().await;
        assert_eq!(most.load(std::sync::atomic::Ordering::SeqCst), 2);
    }
}
