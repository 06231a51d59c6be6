//! `/ws` (and `/` with an upgrade): the WebSocket RPC. Frames are JSON:
//! `{"type":"req","id","method","params"}` from the client, `{"type":"res","id","ok",
//! "payload"|"error"}` and `{"type":"event","event","payload","seq"}` from the gateway. The
//! gateway speaks first (`connect.challenge`), `connect` (with the token) must be the client's
//! first request, and a connected client gets a `tick` event every `gateway.tick_interval_ms`.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use axum::{
    extract::{
        ConnectInfo, State,
        ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade, close_code},
    },
    http::HeaderMap,
    response::{IntoResponse as _, Response},
};
use futures::{SinkExt as _, StreamExt as _};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

use crate::frames::{Outgoing, err, ok};
use crate::handshake::{ConnectParams, Hello};
use crate::limits::{ClientSlot, PendingSlot};
use crate::principal::Principal;
use crate::state::AppState;
use crate::{RequestError, methods};

/// Frames waiting for a slow client before request handlers wait for it (backpressure).
const OUTGOING_CAPACITY: usize = 256;
/// The transport refuses frames this many times the configured limit; up to that the gateway
/// reads a frame and answers a clear `FRAME_TOO_LARGE` instead of just dropping the connection.
const HARD_LIMIT_FACTOR: usize = 4;

/// Upgrades `/ws` with the configured frame limits, when the client address has a place left
/// and not too many sockets wait for `connect` (`Host` and `Origin` are checked before).
pub(crate) async fn upgrade(
    ws: WebSocketUpgrade,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Response {
    let client = state.guard.client_ip(peer, &headers);
    let slots = match state.limits.open(client) {
        Ok(slots) => slots,
        Err(refusal) => {
            tracing::debug!(%peer, %client, ?refusal, "websocket refused");
            return refusal.into_response();
        }
    };
    let hard = state
        .config
        .gateway
        .max_frame_bytes
        .saturating_mul(HARD_LIMIT_FACTOR);
    ws.max_frame_size(hard)
        .max_message_size(hard)
        .on_upgrade(move |socket| {
            let conn_id = uuid::Uuid::new_v4().to_string();
            let span = tracing::info_span!("ws", %peer, %client, %conn_id);
            connection(socket, client, conn_id, slots, state).instrument(span)
        })
}

async fn connection(
    socket: WebSocket,
    client: IpAddr,
    conn_id: String,
    (_client_slot, pending): (ClientSlot, PendingSlot),
    state: AppState,
) {
    let (mut sink, mut stream) = socket.split();
    let (out_tx, mut out_rx) = mpsc::channel::<Outgoing>(OUTGOING_CAPACITY);
    let writer = async move {
        let mut seq: u64 = 0;
        while let Some(outgoing) = out_rx.recv().await {
            let text = match outgoing {
                Outgoing::Frame(frame) => frame.to_string(),
                Outgoing::Event { event, payload } => {
                    seq += 1;
                    json!({"type": "event", "event": event, "payload": payload, "seq": seq})
                        .to_string()
                }
                Outgoing::Unnumbered { event, payload } => {
                    json!({"type": "event", "event": event, "payload": payload}).to_string()
                }
                Outgoing::Close(code, reason) => {
                    let frame = CloseFrame {
                        code,
                        reason: reason.into(),
                    };
                    let _ = sink.send(Message::Close(Some(frame))).await;
                    break;
                }
            };
            if sink.send(Message::Text(text.into())).await.is_err() {
                break;
            }
        }
    };
    let writer = tokio::spawn(writer);
    // The nonce a device signs: proof made for this connection, worthless on another.
    let challenge = uuid::Uuid::new_v4().to_string();
    let _ = out_tx
        .send(Outgoing::Unnumbered {
            event: "connect.challenge",
            payload: json!({"nonce": challenge, "ts": crate::status::millis_now()}),
        })
        .await;
    // Cancelled when the client is gone: subscriptions end, runs go on.
    let closed = tokio_util::sync::CancellationToken::new();
    let limit = state.config.gateway.max_frame_bytes;
    let mut conn = Conn {
        challenge,
        conn_id,
        principal: None,
        pending: Some(pending),
        bucket: Bucket::new(
            state.config.gateway.rate_limit_burst,
            state.config.gateway.rate_limit_per_sec,
            Instant::now(),
        ),
    };
    let in_flight = TaskTracker::new();
    let shutdown = state.shutdown.clone();
    let connect_within = Duration::from_millis(state.config.gateway.connect_timeout_ms);
    let connect_deadline = Instant::now() + connect_within;
    let every = crate::handshake::tick_interval(&state);
    let mut ticks = tokio::time::interval_at(Instant::now() + every, every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let next = tokio::select! {
            () = shutdown.cancelled() => {
                let stopping = Outgoing::Event { event: "shutdown", payload: json!({"reason": "gateway stopping"}) };
                let until = Some(Instant::now() + WRITER_GRACE);
                if queue(&out_tx, stopping, until).await {
                    queue(&out_tx, Outgoing::Close(close_code::AWAY, "gateway shutting down".into()), until).await;
                }
                break;
            }
            // A client that hears nothing for two intervals takes the connection for dead.
            _ = ticks.tick(), if conn.principal.is_some() => {
                let tick = Outgoing::Event { event: "tick", payload: json!({"ts": crate::status::millis_now()}) };
                let _ = out_tx.send(tick).await;
                continue;
            }
            // A socket that never authenticates holds a place others need.
            () = tokio::time::sleep_until(connect_deadline), if conn.principal.is_none() => {
                let reason = format!("connect not completed within {} ms", connect_within.as_millis());
                // Never waits: this client may be the one not reading.
                let _ = out_tx.try_send(Outgoing::Close(close_code::POLICY, reason));
                break;
            }
            next = stream.next() => next,
        };
        // Before `connect`, no answer waits past the connect deadline: a client that sends
        // without reading would otherwise stall this loop on a full queue, deadline and all,
        // and keep its place among the sockets waiting for `connect` for good.
        let until = conn.principal.is_none().then_some(connect_deadline);
        let text = match next {
            Some(Ok(Message::Text(text))) => text.to_string(),
            Some(Ok(Message::Binary(bytes))) => {
                if bytes.len() > limit {
                    refuse_oversized(&out_tx, bytes.len(), limit, until).await;
                    break;
                }
                let refusal = err(
                    &Value::Null,
                    &RequestError::InvalidRequest("frames must be JSON text".into()),
                );
                if !queue(&out_tx, refusal, until).await {
                    break;
                }
                continue;
            }
            Some(Ok(Message::Close(_))) | None => break,
            Some(Ok(_)) => continue, // ping/pong: answered by the transport
            Some(Err(error)) => {
                // Frames past the transport's hard limit end here; say why before closing.
                tracing::debug!(%error, "websocket read failed");
                let _ = out_tx
                    .send(Outgoing::Close(
                        close_code::SIZE,
                        "frame too large or malformed".into(),
                    ))
                    .await;
                break;
            }
        };
        if text.len() > limit {
            refuse_oversized(&out_tx, text.len(), limit, until).await;
            break;
        }
        match conn.accept(&text, client, &state) {
            Accepted::Reply(outgoing) => {
                if !queue(&out_tx, outgoing, until).await {
                    break;
                }
            }
            Accepted::Refuse(outgoing, code, reason) => {
                if queue(&out_tx, outgoing, until).await {
                    queue(&out_tx, Outgoing::Close(code, reason), until).await;
                }
                break;
            }
            Accepted::Call {
                principal,
                id,
                method,
                params,
            } => {
                // Each open request holds a task, and a subscription a NATS subscription to
                // every event: without a cap one socket could open them until memory ran out.
                let max = state.config.gateway.max_requests_in_flight;
                if in_flight.len() >= max {
                    let refusal = err(&id, &RequestError::TooManyInFlight { max });
                    if !queue(&out_tx, refusal, until).await {
                        break;
                    }
                    continue;
                }
                let (state, out_tx, closed) = (state.clone(), out_tx.clone(), closed.clone());
                // One trace per request, not one per connection: a connection lives for hours.
                let span = tracing::info_span!(
                    parent: None,
                    "ws_request",
                    method = %method,
                    conn_id = %conn.conn_id
                );
                in_flight.spawn(
                    async move {
                        methods::call(&state, &principal, id, &method, params, out_tx, closed)
                            .await;
                    }
                    .instrument(span),
                );
            }
        }
    }
    // A socket that never connected gives its place back now, not after its writer.
    drop(conn);
    // Runs started here keep going to their end so their answers are stored for a repeat.
    closed.cancel();
    drop(out_tx);
    in_flight.close();
    in_flight.wait().await;
    // What is queued gets a while to reach a client that reads; one that does not read would
    // hold the writer, and this connection's places, until TCP gave up on it.
    let mut writer = writer;
    if tokio::time::timeout(WRITER_GRACE, &mut writer)
        .await
        .is_err()
    {
        tracing::debug!("client did not read its last frames; connection dropped");
        writer.abort();
    }
}

/// How long a closing connection's queued frames may take to reach the client.
const WRITER_GRACE: Duration = Duration::from_secs(5);

/// Queues `outgoing` for the client, waiting no later than `until` when given. Returns false
/// when the connection should end: the wait ran out, or the writer is gone.
async fn queue(
    out_tx: &mpsc::Sender<Outgoing>,
    outgoing: Outgoing,
    until: Option<Instant>,
) -> bool {
    match until {
        Some(until) => matches!(
            tokio::time::timeout_at(until, out_tx.send(outgoing)).await,
            Ok(Ok(()))
        ),
        None => out_tx.send(outgoing).await.is_ok(),
    }
}

async fn refuse_oversized(
    out_tx: &mpsc::Sender<Outgoing>,
    size: usize,
    limit: usize,
    until: Option<Instant>,
) {
    let error = RequestError::FrameTooLarge { size, limit };
    if queue(out_tx, err(&Value::Null, &error), until).await {
        queue(
            out_tx,
            Outgoing::Close(close_code::SIZE, error.to_string()),
            until,
        )
        .await;
    }
}

/// The state of one connection's reader.
struct Conn {
    /// The nonce of this connection's `connect.challenge`.
    challenge: String,
    /// The connection's id, told to the client in hello-ok.
    conn_id: String,
    /// Whom the connection acts for, once `connect` succeeded.
    principal: Option<Principal>,
    /// Its place among the sockets waiting for `connect`, given up by `connect`.
    pending: Option<PendingSlot>,
    bucket: Bucket,
}

enum Accepted {
    /// Answer at once.
    Reply(Outgoing),
    /// Answer, then close the connection with the code and reason.
    Refuse(Outgoing, u16, String),
    /// Run the method.
    Call {
        principal: Principal,
        id: Value,
        method: String,
        params: Value,
    },
}

impl Conn {
    fn accept(&mut self, text: &str, client: IpAddr, state: &AppState) -> Accepted {
        let frame: Value = match serde_json::from_str(text) {
            Ok(frame) => frame,
            Err(error) => {
                let error = RequestError::InvalidRequest(format!("frame is not JSON: {error}"));
                return Accepted::Reply(err(&Value::Null, &error));
            }
        };
        let id = frame.get("id").cloned().unwrap_or(Value::Null);
        if frame.get("type").and_then(Value::as_str) != Some("req") {
            let error = RequestError::InvalidRequest("expected a frame of type \"req\"".into());
            return Accepted::Reply(err(&id, &error));
        }
        let Some(method) = frame.get("method").and_then(Value::as_str) else {
            let error = RequestError::InvalidRequest("a request needs a method".into());
            return Accepted::Reply(err(&id, &error));
        };
        if id.is_null() {
            let error = RequestError::InvalidRequest("a request needs an id".into());
            return Accepted::Reply(err(&id, &error));
        }
        if !self.bucket.take(Instant::now()) {
            let error = RequestError::RateLimited {
                per_sec: state.config.gateway.rate_limit_per_sec,
            };
            return Accepted::Reply(err(&id, &error));
        }
        let params = frame.get("params").cloned().unwrap_or(Value::Null);
        if method == "connect" {
            if self.principal.is_some() {
                let error = RequestError::InvalidRequest("already connected".into());
                return Accepted::Reply(err(&id, &error));
            }
            return match self.connect(params, client, state) {
                Ok(hello) => Accepted::Reply(ok(&id, hello)),
                Err(error) => {
                    let code = match error {
                        RequestError::ProtocolMismatch { .. } => close_code::PROTOCOL,
                        _ => close_code::POLICY,
                    };
                    let reason = match &error {
                        RequestError::AuthThrottled { .. } => {
                            "too many failed authentications".to_owned()
                        }
                        RequestError::Unauthorized(_) => "unauthorized".to_owned(),
                        other => other.to_string(),
                    };
                    Accepted::Refuse(err(&id, &error), code, reason)
                }
            };
        }
        let Some(principal) = &self.principal else {
            return Accepted::Reply(err(&id, &RequestError::NotConnected));
        };
        Accepted::Call {
            principal: principal.clone(),
            id,
            method: method.to_owned(),
            params,
        }
    }
}

impl Conn {
    /// Checks `connect` (protocol, token, then the device's proof) and returns hello-ok.
    fn connect(
        &mut self,
        params: Value,
        client: IpAddr,
        state: &AppState,
    ) -> Result<Value, RequestError> {
        let params = ConnectParams::parse(params)?;
        let protocol = params.protocol()?;
        let principal = state.authorize(client, params.token())?;
        let now = i64::try_from(crate::status::millis_now()).unwrap_or(i64::MAX);
        let device_id = params.device_id(&self.challenge, now)?;
        if let Some(device) = &device_id {
            tracing::info!(device, "device identity verified");
        }
        let hello = Hello {
            state,
            who: &principal,
            conn_id: &self.conn_id,
            protocol,
            device_id: device_id.as_deref(),
        }
        .payload();
        self.principal = Some(principal);
        self.pending = None;
        Ok(hello)
    }
}

/// A token bucket: `burst` requests at once, refilled at `per_sec`.
struct Bucket {
    tokens: f64,
    burst: f64,
    per_sec: f64,
    at: Instant,
}

impl Bucket {
    fn new(burst: u32, per_sec: u32, now: Instant) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            tokens: burst,
            burst,
            per_sec: f64::from(per_sec),
            at: now,
        }
    }

    fn take(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.per_sec).min(self.burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_bucket_allows_a_burst_then_refills_at_its_rate() {
        let start = Instant::now();
        let mut bucket = Bucket::new(3, 2, start);
        assert!(bucket.take(start));
        assert!(bucket.take(start));
        assert!(bucket.take(start));
        assert!(!bucket.take(start));
        assert!(bucket.take(start + Duration::from_millis(500)));
        assert!(!bucket.take(start + Duration::from_millis(500)));
    }
}
