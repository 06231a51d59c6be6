//! `inbox.subscribe`: every message into and out of every channel, as `inbox` events, for a
//! view of all conversations (the web chat's inbox). An admin's method: it shows everyone's
//! messages.

use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use agentloop_proto::v1::InboxEvent;

use crate::feed::Feed;
use crate::frames::Outgoing;
use crate::state::AppState;

/// Answers at once, then forwards inbox events until the connection closes.
pub(crate) async fn subscribe(
    state: &AppState,
    id: &Value,
    out_tx: &mpsc::Sender<Outgoing>,
    closed: CancellationToken,
) {
    let Some(mut feed) =
        Feed::open(state, id, out_tx, |bus| bus.subjects().inbox_all(), closed).await
    else {
        return;
    };
    while let Some(msg) = feed.next().await {
        let Ok((event, _)) = agentloop_bus::decode::<InboxEvent>(&msg) else {
            continue;
        };
        let inbox = Outgoing::Event {
            event: "inbox",
            payload: payload(&event),
        };
        if out_tx.send(inbox).await.is_err() {
            break;
        }
    }
    feed.close().await;
}

/// An inbox event as clients read it.
fn payload(event: &InboxEvent) -> Value {
    let ts = event.ts.as_ref().map_or(0, crate::status::timestamp_ms);
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
