//! Acknowledges run commands once their inbox rows are on disk. Memory commits an enqueue
//! without waiting for the WAL flush (the run starts meanwhile), so one Flush covers every
//! command enqueued before it and reports which rows it found, and only those commands are
//! acked. A command whose row was lost (the database crashed first) or whose flush failed
//! stays unacknowledged: JetStream delivers it again and the inbox absorbs any repeat.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use agentloop_proto::v1::{FlushRequest, InboxRow};

use crate::memory::MemoryClient;
use crate::order::CommandOrder;

/// How long the first command of a batch waits for others before the flush: at most 20 flushes
/// a second, and nobody waits for an ack.
const GATHER: Duration = Duration::from_millis(50);

/// Where intake hands a command over once its enqueue has returned, with its inbox row.
pub(crate) type AckSender = mpsc::UnboundedSender<(jetstream::Message, InboxRow)>;

/// Starts the acknowledger; after `stop` it flushes and acknowledges what it holds, then ends.
pub(crate) fn start(
    memory: MemoryClient,
    order: Arc<CommandOrder>,
    stop: CancellationToken,
) -> (AckSender, JoinHandle<()>) {
    let (tx, rx) = mpsc::unbounded_channel();
    (tx, tokio::spawn(acknowledge(memory, order, rx, stop)))
}

async fn acknowledge(
    memory: MemoryClient,
    order: Arc<CommandOrder>,
    mut rx: mpsc::UnboundedReceiver<(jetstream::Message, InboxRow)>,
    stop: CancellationToken,
) {
    let mut batch = Vec::new();
    loop {
        let stopping = tokio::select! {
            biased;
            msg = rx.recv() => match msg {
                Some(msg) => {
                    batch.push(msg);
                    false
                }
                None => true,
            },
            () = stop.cancelled() => true,
        };
        // Acks wait a little so that one flush covers many commands: nobody waits for an ack,
        // and each flush is a disk write.
        if !stopping && !batch.is_empty() {
            tokio::time::sleep(GATHER).await;
        }
        while let Ok(msg) = rx.try_recv() {
            batch.push(msg);
        }
        if !batch.is_empty() {
            flush_and_ack(&memory, &batch).await;
            // Acked or left for redelivery: either way no longer this replica's to account for.
            for (msg, _) in batch.drain(..) {
                order.settled(&msg);
            }
        }
        if stopping {
            return;
        }
    }
}

/// Acks the commands of `batch` whose rows are on disk; leaves the batch as it was.
async fn flush_and_ack(memory: &MemoryClient, batch: &[(jetstream::Message, InboxRow)]) {
    let request = FlushRequest {
        rows: batch.iter().map(|(_, row)| row.clone()).collect(),
    };
    let flushed = memory.flush(&request).await;
    let response = match flushed {
        Ok(response) => response,
        Err(err) => {
            tracing::warn!(
                error = %err,
                commands = batch.len(),
                "cannot confirm the inbox rows are on disk; leaving the commands for redelivery"
            );
            return;
        }
    };
    let durable: HashSet<(i64, &str)> = response
        .durable
        .iter()
        .map(|row| (row.seq, row.idempotency_key.as_str()))
        .collect();
    for (msg, row) in batch {
        if !durable.contains(&(row.seq, row.idempotency_key.as_str())) {
            tracing::warn!(
                seq = row.seq,
                subject = %msg.subject,
                "inbox row not found after a flush (lost in a database crash?); leaving the command for redelivery"
            );
            continue;
        }
        // A plain ack: a lost one only brings a redelivery the inbox absorbs.
        if let Err(err) = msg.ack().await {
            tracing::warn!(error = %err, "ack failed; a redelivery will be absorbed by the inbox");
        }
    }
}
