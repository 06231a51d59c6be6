//! `inbox.subscribe`: every message into and out of every channel, as `inbox` events, for a
//! view of all conversations (the web chat's inbox). An admin's method: it shows everyone's
//! messages.

use futures::StreamExt as _;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use agentloop_proto::v1::InboxEvent;

use crate::RequestError;
use crate::frames::{Outgoing, err, ok};
use crate::state::AppState;

/// Answers at once, then forwards inbox events until the connection closes.
pub(crate) async fn subscribe(
    state: &AppState,
    id: &Value,
    out_tx: &mpsc::Sender<Outgoing>,
    closed: CancellationToken,
) {
    let bus = match state.bus() {
        Ok(bus) => bus,
        Err(error) => {
            let _ = out_tx.send(err(id, &error)).await;
            return;
        }
    };
    let mut events = match bus.client().subscribe(bus.subjects().inbox_all()).await {
        Ok(events) => events,
        Err(error) => {
            let error = RequestError::Unavailable(format!("cannot subscribe: {error}"));
            let _ = out_tx.send(err(id, &error)).await;
            return;
        }
    };
    let _ = out_tx.send(ok(id, json!({"subscribed": true}))).await;
    loop {
        let msg = tokio::select! {
            () = closed.cancelled() => break,
            () = state.shutdown.cancelled() => break,
            msg = events.next() => match msg {
                Some(msg) => msg,
                None => break,
            },
        };
        let Ok((event, _)) = agentloop_bus::decode::<InboxEvent>(&msg) else {
            continue;
        };
        let payload = payload(&event);
        if out_tx
            .send(Outgoing::Event {
                event: "inbox",
                payload,
            })
            .await
            .is_err()
        {
            break;
        }
    }
    let _ = events.unsubscribe().await;
}

/// An inbox event as clients read it.
fn payload(event: &InboxEvent) -> Value {
    let ts = event
        .ts
        .as_ref()
        .map_or(0, |t| t.seconds * 1000 + i64::from(t.nanos / 1_000_000));
    json!({
        "direction": event.direction,
        "channel": event.channel,
        "sessionKey": event.session_key,
        "sessionId": event.session_id,
        "peer": event.peer,
        "text": event.text,
        "runId": event.run_id,
        "ts": ts,
    })
}
