//! Acknowledgements of handled messages, held for a moment and sent together.
//!
//! A work-queue stream deletes a message when it is acknowledged, and nats-server's file store
//! removes a message block that the delete empties and creates a new one for the next message:
//! acked one by one as a session sends in turn, every message cost the server a file created
//! and a file deleted. Acks gathered for a few milliseconds leave the block holding the next
//! messages, and their server work happens after the reply instead of beside it. Nobody waits
//! for these acks: a service that crashes first has its messages redelivered, which every
//! consumer here absorbs (idempotency keys, message ids, delivered-reply keys).

use std::future::Future;
use std::time::Duration;

use async_nats::jetstream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Sends acknowledgements in batches. Cheap to clone; the sending task ends once every clone
/// is dropped, after it has acknowledged everything it was given.
#[derive(Clone, Debug)]
pub struct Acks {
    tx: mpsc::UnboundedSender<jetstream::Message>,
}

impl Acks {
    /// Starts the sending task; await its handle after dropping every clone so that a service
    /// stops only once its acks are out.
    #[must_use]
    pub fn start(gather: Duration) -> (Self, JoinHandle<()>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Self { tx }, tokio::spawn(send(rx, gather)))
    }

    /// Acknowledges `msg` within the gather interval.
    pub fn ack(&self, msg: jetstream::Message) {
        if let Err(mpsc::error::SendError(msg)) = self.tx.send(msg) {
            // The task has ended (the runtime is shutting down): ack directly, best effort.
            tokio::spawn(async move { ack(&msg).await });
        }
    }
}

async fn send(mut rx: mpsc::UnboundedReceiver<jetstream::Message>, gather: Duration) {
    let mut batch = Vec::new();
    // The connection the last acks went out on: flushed at the end, since an ack is only
    // written to the client's buffer, and a stopping service may close it before that buffer
    // reaches the server.
    let mut client = None;
    while let Some(first) = rx.recv().await {
        batch.push(first);
        // Gathers until the interval is over or the last handle is gone (the service stops and
        // must not wait out the interval; the next `recv` then ends the loop).
        let until = tokio::time::Instant::now() + gather;
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(until) => break,
                next = rx.recv() => match next {
                    Some(msg) => batch.push(msg),
                    None => break,
                },
            }
        }
        for msg in batch.drain(..) {
            ack(&msg).await;
            client.get_or_insert_with(|| msg.context.client());
        }
    }
    if let Some(client) = client
        && let Err(err) = client.flush().await
    {
        tracing::warn!(error = %err, "failed to flush the last acks; their messages will be redelivered");
    }
}

async fn ack(msg: &jetstream::Message) {
    if let Err(err) = msg.ack().await {
        // The server redelivers it after the ack wait, and the consumer absorbs the repeat.
        tracing::warn!(subject = %msg.subject, error = %err, "failed to ack; the message will be redelivered");
    }
}

/// Runs `work` for `msg`, telling the server every `every` that the message is still being
/// worked on. Without it a delivery that outlasts the ack wait (a chat app's `retry_after`, a
/// slow post) is handed to another replica mid-way and done twice.
pub async fn holding<F: Future>(msg: &jetstream::Message, every: Duration, work: F) -> F::Output {
    let mut work = std::pin::pin!(work);
    loop {
        match tokio::time::timeout(every, &mut work).await {
            Ok(done) => return done,
            Err(_) => {
                let _ = msg.ack_with(jetstream::AckKind::Progress).await;
            }
        }
    }
}
