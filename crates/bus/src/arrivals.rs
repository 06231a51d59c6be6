//! The consumer's messages on their way to their lanes: each one's gap ([`crate::order`]) is
//! read while the next ones arrive, and they come out in the order they arrived, each with
//! where it goes. A gap read takes a round trip to the stream; read on the consume loop, one
//! per message (replicas sharing a consumer take turns, so every delivery leaves a gap) would
//! hold a replica to one message per round trip, and the messages waiting behind past their
//! ack wait.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use async_nats::jetstream;
use futures::StreamExt as _;
use futures::stream::FuturesOrdered;

use crate::{Arrival, InTurn};

/// Most messages whose gaps are read at once.
const MAX_READING: usize = 64;

/// A message taken in, with where it goes.
pub struct Arrived<T> {
    /// The message as delivered.
    pub msg: jetstream::Message,
    /// Its session.
    pub key: String,
    /// What the service made of it.
    pub item: T,
    /// Where it goes.
    pub arrival: Arrival,
}

type Reading<T> = Pin<Box<dyn Future<Output = (Arrived<T>, u64)> + Send>>;

/// The messages taken in and not yet handed on, in arrival order.
pub struct Arrivals<T> {
    in_turn: Arc<InTurn>,
    /// Placed already: nothing was being read when they came.
    placed: VecDeque<Arrived<T>>,
    /// Behind a gap being read (theirs or an earlier message's); placed when they come out.
    reading: FuturesOrdered<Reading<T>>,
}

impl<T: Send + 'static> Arrivals<T> {
    /// Messages placed by `in_turn`.
    pub fn new(in_turn: Arc<InTurn>) -> Self {
        Self {
            in_turn,
            placed: VecDeque::new(),
            reading: FuturesOrdered::new(),
        }
    }

    /// Whether another message may be taken in: the gap reads in flight are bounded.
    pub fn has_room(&self) -> bool {
        self.reading.len() < MAX_READING
    }

    /// Takes in `msg` of `key`: its gap is noted now and read meanwhile.
    pub fn push(&mut self, msg: jetstream::Message, key: String, item: T) {
        let noted = self.in_turn.note(&msg);
        // Which deliveries revealed which gaps: what tells, after a partition, why a message
        // went ahead of an earlier one or waited for it.
        tracing::debug!(
            key = %key,
            noted = ?noted,
            delivered = msg.info().map(|i| i.delivered).unwrap_or_default(),
            "message taken in"
        );
        let arrived = Arrived {
            msg,
            key,
            item,
            arrival: Arrival::Lane,
        };
        match noted {
            // The order is not kept: straight on.
            None => self.placed.push_back(arrived),
            Some((seq, None)) if self.reading.is_empty() => {
                let arrival = self.in_turn.place(&arrived.key, seq);
                tracing::debug!(key = %arrived.key, seq, arrival = ?arrival, "placed");
                self.placed.push_back(Arrived { arrival, ..arrived });
            }
            Some((seq, gap)) => {
                let in_turn = self.in_turn.clone();
                self.reading.push_back(Box::pin(async move {
                    if let Some(gap) = gap {
                        in_turn.read_gap(gap).await;
                    }
                    (arrived, seq)
                }));
            }
        }
    }

    /// The next message in arrival order, once the gaps before it are read; pending while
    /// there is none (cancel-safe, for `select!`).
    pub async fn next(&mut self) -> Arrived<T> {
        if let Some(arrived) = self.placed.pop_front() {
            return arrived;
        }
        match self.reading.next().await {
            Some((arrived, seq)) => {
                let arrival = self.in_turn.place(&arrived.key, seq);
                tracing::debug!(key = %arrived.key, seq, arrival = ?arrival, "placed after its gap");
                Arrived { arrival, ..arrived }
            }
            None => std::future::pending().await,
        }
    }
}
