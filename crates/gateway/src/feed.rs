//! The long-lived subscription methods (`inbox.subscribe`, `sessions.subscribe`): a bus
//! subscription, answered `{subscribed: true}`, read until the connection or the gateway closes.

use futures::StreamExt as _;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use agentloop_bus::Bus;

use crate::RequestError;
use crate::frames::{Outgoing, err, ok};
use crate::state::AppState;

/// A subscription that one connection's request holds.
pub(crate) struct Feed {
    messages: async_nats::Subscriber,
    closed: CancellationToken,
    shutdown: CancellationToken,
}

impl Feed {
    /// Subscribes to the subject `subject` names and answers request `id`; `None` when it
    /// cannot, the error already answered.
    pub(crate) async fn open(
        state: &AppState,
        id: &Value,
        out_tx: &mpsc::Sender<Outgoing>,
        subject: impl FnOnce(&Bus) -> String,
        closed: CancellationToken,
    ) -> Option<Self> {
        let subscribed =
            match state.bus() {
                Ok(bus) => bus.client().subscribe(subject(bus)).await.map_err(|error| {
                    RequestError::Unavailable(format!("cannot subscribe: {error}"))
                }),
                Err(error) => Err(error),
            };
        match subscribed {
            Ok(messages) => {
                let _ = out_tx.send(ok(id, json!({"subscribed": true}))).await;
                Some(Self {
                    messages,
                    closed,
                    shutdown: state.shutdown.clone(),
                })
            }
            Err(error) => {
                let _ = out_tx.send(err(id, &error)).await;
                None
            }
        }
    }

    /// The next message; `None` once the connection or the gateway closes.
    pub(crate) async fn next(&mut self) -> Option<async_nats::Message> {
        tokio::select! {
            () = self.closed.cancelled() => None,
            () = self.shutdown.cancelled() => None,
            msg = self.messages.next() => msg,
        }
    }

    /// Ends the subscription.
    pub(crate) async fn close(mut self) {
        let _ = self.messages.unsubscribe().await;
    }
}
