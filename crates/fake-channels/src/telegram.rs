//! A fake Telegram Bot API: `POST /bot<token>/sendMessage` and `editMessageText` answered as
//! Telegram does, with the
//! bot's token checked, every accepted message recorded and failures scripted in advance.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use axum::{
    Json, Router,
    extract::{Path, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::post,
};
use serde_json::{Value, json};

/// A failure the next `sendMessage` answers with.
#[derive(Debug, Clone)]
pub enum Failure {
    /// `429 Too Many Requests: retry after N` with `parameters.retry_after = N`.
    RateLimited {
        /// Seconds.
        retry_after: u64,
    },
    /// `400 Bad Request: chat not found`.
    ChatNotFound,
}

/// A `sendMessage` or `editMessageText` call as received.
#[derive(Debug, Clone)]
pub struct Sent {
    /// `sendMessage` or `editMessageText`.
    pub method: String,
    /// The request's JSON body.
    pub body: Value,
    /// Whether it was answered `ok`.
    pub accepted: bool,
}

#[derive(Default)]
struct Shared {
    failures: VecDeque<Failure>,
    sent: Vec<Sent>,
    next_id: i64,
    /// The bot's messages as they read now, by id.
    messages: std::collections::BTreeMap<i64, String>,
    /// Updates for `getUpdates`, until confirmed by a later offset.
    updates: Vec<Value>,
    /// The highest offset a `getUpdates` confirmed.
    confirmed: i64,
}

/// A running fake Bot API; stops when dropped.
pub struct FakeTelegram {
    addr: SocketAddr,
    token: String,
    shared: Arc<Mutex<Shared>>,
    arrived: Arc<tokio::sync::Notify>,
    server: tokio::task::JoinHandle<()>,
}

impl FakeTelegram {
    /// Starts on a free loopback port, accepting `token`.
    ///
    /// # Panics
    /// When no port can be bound.
    pub async fn start(token: &str) -> Self {
        let shared = Arc::new(Mutex::new(Shared::default()));
        let arrived = Arc::new(tokio::sync::Notify::new());
        let app = Router::new()
            .route("/{bot}/{method}", post(call))
            .with_state((token.to_owned(), shared.clone(), arrived.clone()));
        let (addr, server) = crate::serve(app).await;
        Self {
            addr,
            token: token.to_owned(),
            shared,
            arrived,
            server,
        }
    }

    /// The API base (`api_base` of `[channels.telegram]`).
    pub fn api_base(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The token it accepts.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// Queues an update for `getUpdates` (as a user writing to the bot).
    pub fn push_update(&self, update: Value) {
        self.lock().updates.push(update);
        self.arrived.notify_waiters();
    }

    /// The offset the last `getUpdates` confirmed (updates below it are done).
    pub fn confirmed_offset(&self) -> i64 {
        self.lock().confirmed
    }

    /// Makes the next calls fail, in order.
    pub fn fail_next(&self, failures: impl IntoIterator<Item = Failure>) {
        self.lock().failures.extend(failures);
    }

    /// Every `sendMessage` received so far.
    pub fn sent(&self) -> Vec<Sent> {
        self.lock().sent.clone()
    }

    /// The texts of the accepted `sendMessage` calls, in order.
    pub fn delivered_texts(&self) -> Vec<String> {
        self.sent()
            .iter()
            .filter(|s| s.accepted && s.method == "sendMessage")
            .filter_map(|s| s.body["text"].as_str().map(str::to_owned))
            .collect()
    }

    /// Deletes every message of the bot, as a user may in a private chat ("delete for both"):
    /// editing one then answers `message to edit not found`.
    pub fn delete_all(&self) {
        self.lock().messages.clear();
    }

    /// The bot's messages as a user sees them now (edits applied), oldest first.
    pub fn chat_view(&self) -> Vec<String> {
        self.lock().messages.values().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for FakeTelegram {
    fn drop(&mut self) {
        self.server.abort();
    }
}

type AppState = (String, Arc<Mutex<Shared>>, Arc<tokio::sync::Notify>);

async fn call(
    State((token, shared, arrived)): State<AppState>,
    Path((bot, method)): Path<(String, String)>,
    body: Option<Json<Value>>,
) -> Response {
    if bot.strip_prefix("bot") != Some(token.as_str()) {
        return error(StatusCode::UNAUTHORIZED, "Unauthorized", None);
    }
    if method == "getUpdates" {
        let body = body.map(|Json(b)| b).unwrap_or_default();
        return get_updates(&shared, &arrived, &body).await;
    }
    if method != "sendMessage" && method != "editMessageText" {
        return error(StatusCode::NOT_FOUND, "Not Found", None);
    }
    let Some(Json(body)) = body else {
        return error(
            StatusCode::BAD_REQUEST,
            "Bad Request: message text is empty",
            None,
        );
    };
    let mut shared = shared.lock().unwrap_or_else(PoisonError::into_inner);
    let text = body["text"].as_str().unwrap_or_default();
    let failure = shared.failures.pop_front();
    let answer = match failure {
        Some(Failure::RateLimited { retry_after }) => error(
            StatusCode::TOO_MANY_REQUESTS,
            &format!("Too Many Requests: retry after {retry_after}"),
            Some(retry_after),
        ),
        Some(Failure::ChatNotFound) => {
            error(StatusCode::BAD_REQUEST, "Bad Request: chat not found", None)
        }
        None if text.is_empty() => error(
            StatusCode::BAD_REQUEST,
            "Bad Request: message text is empty",
            None,
        ),
        None if text.encode_utf16().count() > 4096 => error(
            StatusCode::BAD_REQUEST,
            "Bad Request: message is too long",
            None,
        ),
        None if method == "editMessageText" => {
            let id = body["message_id"].as_i64().unwrap_or_default();
            match shared.messages.get(&id) {
                None => error(
                    StatusCode::BAD_REQUEST,
                    "Bad Request: message to edit not found",
                    None,
                ),
                Some(old) if old == text => error(
                    StatusCode::BAD_REQUEST,
                    "Bad Request: message is not modified: specified new message content and reply markup are exactly the same as a current content and reply markup of the message",
                    None,
                ),
                Some(_) => {
                    shared.messages.insert(id, text.to_owned());
                    let result = json!({"message_id": id, "date": 1_700_000_000, "edit_date": 1_700_000_001,
                                        "chat": {"id": body["chat_id"].clone(), "type": "private"}, "text": text});
                    (StatusCode::OK, Json(json!({"ok": true, "result": result}))).into_response()
                }
            }
        }
        None => {
            shared.next_id += 1;
            let id = shared.next_id;
            shared.messages.insert(id, text.to_owned());
            let result = json!({
                "message_id": id,
                "date": 1_700_000_000,
                "chat": {"id": body["chat_id"].clone(), "type": "private"},
                "text": text,
            });
            (StatusCode::OK, Json(json!({"ok": true, "result": result}))).into_response()
        }
    };
    let accepted = answer.status() == StatusCode::OK;
    shared.sent.push(Sent {
        method,
        body,
        accepted,
    });
    answer
}

/// Answers the updates from `offset` on, waiting up to `timeout` seconds for one.
async fn get_updates(
    shared: &Mutex<Shared>,
    arrived: &tokio::sync::Notify,
    body: &Value,
) -> Response {
    let offset = body["offset"].as_i64().unwrap_or(0);
    let wait = std::time::Duration::from_secs(body["timeout"].as_u64().unwrap_or(0));
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let notified = arrived.notified();
        {
            let mut shared = shared.lock().unwrap_or_else(PoisonError::into_inner);
            shared.confirmed = shared.confirmed.max(offset);
            shared
                .updates
                .retain(|u| u["update_id"].as_i64().unwrap_or(0) >= offset);
            if !shared.updates.is_empty() || tokio::time::Instant::now() >= deadline {
                let result = Value::Array(shared.updates.clone());
                return Json(json!({"ok": true, "result": result})).into_response();
            }
        }
        let _ = tokio::time::timeout_at(deadline, notified).await;
    }
}

fn error(status: StatusCode, description: &str, retry_after: Option<u64>) -> Response {
    let mut body = json!({"ok": false, "error_code": status.as_u16(), "description": description});
    if let Some(seconds) = retry_after {
        body["parameters"] = json!({"retry_after": seconds});
    }
    (status, Json(body)).into_response()
}
