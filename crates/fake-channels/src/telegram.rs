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
}

/// A running fake Bot API; stops when dropped.
pub struct FakeTelegram {
    addr: SocketAddr,
    token: String,
    shared: Arc<Mutex<Shared>>,
    server: tokio::task::JoinHandle<()>,
}

impl FakeTelegram {
    /// Starts on a free loopback port, accepting `token`.
    ///
    /// # Panics
    /// When no port can be bound.
    pub async fn start(token: &str) -> Self {
        let shared = Arc::new(Mutex::new(Shared::default()));
        let app = Router::new()
            .route("/{bot}/{method}", post(call))
            .with_state((token.to_owned(), shared.clone()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a free loopback port");
        let addr = listener.local_addr().expect("a bound address");
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            addr,
            token: token.to_owned(),
            shared,
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

type AppState = (String, Arc<Mutex<Shared>>);

async fn call(
    State((token, shared)): State<AppState>,
    Path((bot, method)): Path<(String, String)>,
    body: Option<Json<Value>>,
) -> Response {
    if bot.strip_prefix("bot") != Some(token.as_str()) {
        return error(StatusCode::UNAUTHORIZED, "Unauthorized", None);
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

fn error(status: StatusCode, description: &str, retry_after: Option<u64>) -> Response {
    let mut body = json!({"ok": false, "error_code": status.as_u16(), "description": description});
    if let Some(seconds) = retry_after {
        body["parameters"] = json!({"retry_after": seconds});
    }
    (status, Json(body)).into_response()
}
