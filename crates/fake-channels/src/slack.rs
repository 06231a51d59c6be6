//! A fake Slack: the Web API's `POST /api/chat.postMessage` answered as Slack does (the bot
//! token checked, `{"ok":false,"error":...}` with HTTP 200 for refusals, 429 with `Retry-After`
//! when rate limited), and Events API requests signed as Slack signs them.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use axum::{
    Json, Router,
    extract::State,
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Response},
    routing::post,
};
use hmac::{Hmac, KeyInit as _, Mac as _};
use serde_json::{Value, json};
use sha2::Sha256;

/// A failure the next `chat.postMessage` answers with.
#[derive(Debug, Clone)]
pub enum Failure {
    /// HTTP 429 with `Retry-After: N` and `{"ok":false,"error":"ratelimited"}`.
    RateLimited {
        /// Seconds.
        retry_after: u64,
    },
    /// `{"ok":false,"error":"channel_not_found"}`.
    ChannelNotFound,
}

/// A `chat.postMessage` or `chat.update` call as received.
#[derive(Debug, Clone)]
pub struct Posted {
    /// `chat.postMessage` or `chat.update`.
    pub method: &'static str,
    /// The request's JSON body.
    pub body: Value,
    /// Whether it was answered `ok`.
    pub accepted: bool,
}

#[derive(Default)]
struct Shared {
    failures: VecDeque<Failure>,
    posted: Vec<Posted>,
    next_ts: u64,
    /// The bot's messages as they read now, by ts.
    messages: std::collections::BTreeMap<String, String>,
}

/// A running fake Slack Web API; stops when dropped.
pub struct FakeSlack {
    addr: SocketAddr,
    shared: Arc<Mutex<Shared>>,
    server: tokio::task::JoinHandle<()>,
}

impl FakeSlack {
    /// Starts on a free loopback port, accepting the bot token `token`.
    ///
    /// # Panics
    /// When no port can be bound.
    pub async fn start(token: &str) -> Self {
        let shared = Arc::new(Mutex::new(Shared::default()));
        let app = Router::new()
            .route("/api/chat.postMessage", post(post_message))
            .route("/api/chat.update", post(update))
            .with_state((token.to_owned(), shared.clone()));
        let (addr, server) = crate::serve(app).await;
        Self {
            addr,
            shared,
            server,
        }
    }

    /// The Web API base (`api_base` of `[channels.slack]`).
    pub fn api_base(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Makes the next calls fail, in order.
    pub fn fail_next(&self, failures: impl IntoIterator<Item = Failure>) {
        self.lock().failures.extend(failures);
    }

    /// Every `chat.postMessage` received so far.
    pub fn posted(&self) -> Vec<Posted> {
        self.lock().posted.clone()
    }

    /// The bot's messages as a user sees them now (updates applied), oldest first.
    pub fn chat_view(&self) -> Vec<String> {
        self.lock().messages.values().cloned().collect()
    }

    /// The texts of the accepted `chat.postMessage` calls, in order.
    pub fn delivered_texts(&self) -> Vec<String> {
        self.posted()
            .iter()
            .filter(|p| p.accepted && p.method == "chat.postMessage")
            .filter_map(|p| p.body["text"].as_str().map(str::to_owned))
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for FakeSlack {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// The headers Slack sends with an Events API request: `X-Slack-Request-Timestamp` (`at`, Unix
/// seconds) and `X-Slack-Signature` of `body` with the app's `signing_secret`.
pub fn signed_headers(signing_secret: &str, at: u64, body: &[u8]) -> [(&'static str, String); 2] {
    let mut mac = Hmac::<Sha256>::new_from_slice(signing_secret.as_bytes())
        .expect("HMAC takes a key of any length");
    mac.update(format!("v0:{at}:").as_bytes());
    mac.update(body);
    [
        ("X-Slack-Request-Timestamp", at.to_string()),
        (
            "X-Slack-Signature",
            format!("v0={}", hex::encode(mac.finalize().into_bytes())),
        ),
    ]
}

type AppState = (String, Arc<Mutex<Shared>>);

async fn post_message(
    State((token, shared)): State<AppState>,
    headers: HeaderMap,
    body: Option<Json<Value>>,
) -> Response {
    let body = match authorized(&headers, &token, body) {
        Ok(body) => body,
        Err(error) => return refusal(error),
    };
    let mut shared = shared.lock().unwrap_or_else(PoisonError::into_inner);
    let (answer, accepted) = match shared.failures.pop_front() {
        Some(Failure::RateLimited { retry_after }) => (
            (
                StatusCode::TOO_MANY_REQUESTS,
                [(header::RETRY_AFTER, retry_after.to_string())],
                Json(json!({"ok": false, "error": "ratelimited"})),
            )
                .into_response(),
            false,
        ),
        Some(Failure::ChannelNotFound) => (refusal("channel_not_found"), false),
        None if body["text"].as_str().unwrap_or_default().is_empty() => (refusal("no_text"), false),
        None => {
            shared.next_ts += 1;
            let ts = format!("1700000000.{:06}", shared.next_ts);
            let text = body["text"].as_str().unwrap_or_default().to_owned();
            shared.messages.insert(ts.clone(), text);
            let answer = Json(
                json!({"ok": true, "channel": body["channel"].clone(), "ts": ts,
                                     "message": {"text": body["text"].clone(), "ts": ts}}),
            );
            (answer.into_response(), true)
        }
    };
    shared.posted.push(Posted {
        method: "chat.postMessage",
        body,
        accepted,
    });
    answer
}

async fn update(
    State((token, shared)): State<AppState>,
    headers: HeaderMap,
    body: Option<Json<Value>>,
) -> Response {
    let body = match authorized(&headers, &token, body) {
        Ok(body) => body,
        Err(error) => return refusal(error),
    };
    let mut shared = shared.lock().unwrap_or_else(PoisonError::into_inner);
    let ts = body["ts"].as_str().unwrap_or_default().to_owned();
    let text = body["text"].as_str().unwrap_or_default().to_owned();
    let (answer, accepted) = if shared.messages.contains_key(&ts) {
        shared.messages.insert(ts.clone(), text.clone());
        let answer =
            Json(json!({"ok": true, "channel": body["channel"].clone(), "ts": ts, "text": text}));
        (answer.into_response(), true)
    } else {
        (refusal("message_not_found"), false)
    };
    shared.posted.push(Posted {
        method: "chat.update",
        body,
        accepted,
    });
    answer
}

/// The body of a call made with the bot's token, or the `error` Slack refuses it with.
fn authorized(
    headers: &HeaderMap,
    token: &str,
    body: Option<Json<Value>>,
) -> Result<Value, &'static str> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if bearer != Some(token) {
        return Err("invalid_auth");
    }
    body.map(|Json(body)| body).ok_or("invalid_arguments")
}

/// Slack refuses with HTTP 200 and `ok: false`.
fn refusal(error: &str) -> Response {
    Json(json!({"ok": false, "error": error})).into_response()
}
