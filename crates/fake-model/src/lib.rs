//! Fake model server for tests and benchmarks.
//!
//! Speaks the real wire protocols, streaming included: OpenAI Chat Completions
//! (`POST /v1/chat/completions`, `POST /v1/embeddings`, `GET /v1/models`) and Anthropic
//! Messages (`POST /v1/messages`).
//! By default it echoes the last user message (`echo: <text>`). Tests in other processes steer it
//! with directives inside that message:
//!
//! | directive | effect |
//! |---|---|
//! | `[[fail:500]]`, `[[fail:429]]`, `[[fail:401]]` | that error, in the provider's shape |
//! | `[[overflow]]` | a 400 context-overflow error |
//! | `[[delay_ms:N]]` / `[[chunk_delay_ms:N]]` | wait before the first byte / between chunks |
//! | `[[reply:TEXT]]` | reply with exactly `TEXT` |
//! | `[[tool:NAME:{json}]]` | answer with that tool call (several directives, several calls) |
//!
//! Once tool results follow the user message, the reply is `tool results: <a> | <b>` (or the
//! `[[reply:…]]` text when there is one). Scripted replies (`FakeModel::push_script` or
//! `POST /_fake/script`) take precedence over directives; `GET /_fake/requests` lists the
//! recorded requests and `POST /_fake/reset` clears the script, the log and the failure knob.

mod anthropic;
pub mod embeddings;
mod openai;
mod plan;
mod request;
mod state;
mod wire;

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use state::{Failure, FakeModelState, RecordedRequest, ScriptedReply, ScriptedToolCall};

use crate::plan::Protocol;
use crate::wire::ReplyContext;

/// Settings of a fake model server.
#[derive(Debug, Clone)]
pub struct FakeModelConfig {
    /// Address to listen on; port 0 picks a free port. Default `127.0.0.1:0`.
    pub listen: String,
    /// Wait between streamed chunks unless a directive or script says otherwise. Default zero.
    pub default_chunk_delay: Duration,
    /// When set, requests must carry this key (`Authorization: Bearer` or `x-api-key`) or get a 401.
    pub api_key: Option<String>,
    /// How many requests the log keeps (oldest dropped first); 0 disables recording. Default 10000.
    pub max_recorded_requests: usize,
}

impl Default for FakeModelConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:0".to_owned(),
            default_chunk_delay: Duration::ZERO,
            api_key: None,
            max_recorded_requests: 10_000,
        }
    }
}

impl FakeModelConfig {
    /// Returns a config from command-line arguments (`--listen ADDR`, `--chunk-delay-ms N`,
    /// `--api-key KEY`, `--max-recorded N`), with `listen_env` as the default listen address.
    ///
    /// # Errors
    /// `FakeModelError::Usage` for an unknown flag, a missing value or a bad number.
    pub fn from_args(
        args: impl IntoIterator<Item = String>,
        listen_env: Option<String>,
    ) -> Result<Self, FakeModelError> {
        let mut config = Self::default();
        if let Some(listen) = listen_env.filter(|l| !l.is_empty()) {
            config.listen = listen;
        }
        let mut args = args.into_iter();
        while let Some(flag) = args.next() {
            let mut value = || {
                args.next()
                    .ok_or_else(|| FakeModelError::Usage(format!("missing value for {flag}")))
            };
            let number = |v: String| {
                v.parse::<u64>()
                    .map_err(|_| FakeModelError::Usage(format!("not a number: {v}")))
            };
            match flag.as_str() {
                "--listen" => config.listen = value()?,
                "--chunk-delay-ms" => {
                    config.default_chunk_delay = Duration::from_millis(number(value()?)?);
                }
                "--api-key" => config.api_key = Some(value()?),
                "--max-recorded" => {
                    config.max_recorded_requests =
                        usize::try_from(number(value()?)?).unwrap_or(usize::MAX);
                }
                _ => return Err(FakeModelError::Usage(format!("unknown argument {flag}"))),
            }
        }
        Ok(config)
    }
}

/// Errors starting or running the fake model server.
#[derive(Debug, thiserror::Error)]
pub enum FakeModelError {
    /// The listen address could not be bound.
    #[error("failed to bind fake model server to {addr}")]
    Bind {
        /// The address that was asked for.
        addr: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The server failed while serving.
    #[error("fake model server failed")]
    Serve(#[source] std::io::Error),
    /// Bad command-line arguments.
    #[error("invalid arguments: {0}")]
    Usage(String),
}

/// A running fake model server; dropping it stops the server.
#[derive(Debug)]
pub struct FakeModel {
    addr: SocketAddr,
    state: FakeModelState,
    shutdown: CancellationToken,
    task: Option<JoinHandle<Result<(), FakeModelError>>>,
}

/// Connections the kernel queues for `accept` (tokio's default is 1,024). A provider takes a
/// burst of thousands of new connections; with a short queue, the connections past it lose
/// their SYN and retry a second later, which a benchmark would count as the runner's time.
const ACCEPT_BACKLOG: u32 = 8_192;

/// Binds `addr` (`host:port`) with a long accept queue.
async fn listen(addr: &str) -> std::io::Result<TcpListener> {
    let addr = tokio::net::lookup_host(addr).await?.next().ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, "no address to bind")
    })?;
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(ACCEPT_BACKLOG)
}

impl FakeModel {
    /// Binds `config.listen` and serves in a background task.
    ///
    /// # Errors
    /// `FakeModelError::Bind` when the address cannot be bound.
    pub async fn start(config: FakeModelConfig) -> Result<Self, FakeModelError> {
        let listener = listen(&config.listen)
            .await
            .map_err(|source| FakeModelError::Bind {
                addr: config.listen.clone(),
                source,
            })?;
        let addr = listener
            .local_addr()
            .map_err(|source| FakeModelError::Bind {
                addr: config.listen.clone(),
                source,
            })?;
        let state = FakeModelState::new(&config);
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(serve(listener, state.clone(), shutdown.clone()));
        Ok(Self {
            addr,
            state,
            shutdown,
            task: Some(task),
        })
    }

    /// Returns the bound socket address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Returns `http://HOST:PORT`, without `/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Returns the base URL OpenAI clients expect: `http://HOST:PORT/v1`.
    pub fn openai_base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Returns the base URL Anthropic clients expect: `http://HOST:PORT` (they add `/v1/messages`).
    pub fn anthropic_base_url(&self) -> String {
        self.base_url()
    }

    /// Returns the shared state handle (script, request log, failure knob).
    pub fn state(&self) -> &FakeModelState {
        &self.state
    }

    /// Returns the requests received so far, oldest first.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.state.requests()
    }

    /// Queues a scripted reply; queued replies are used first, one per request.
    pub fn push_script(&self, reply: ScriptedReply) {
        self.state.push_script(reply);
    }

    /// Sets (or clears with `None`) a failure returned for every request until cleared.
    pub fn set_failure(&self, failure: Option<Failure>) {
        self.state.set_failure(failure);
    }

    /// Clears the script queue, the request log and the failure knob.
    pub fn reset(&self) {
        self.state.reset();
    }

    /// Stops accepting, waits for in-flight responses and returns.
    pub async fn shutdown(mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            match task.await {
                Ok(Ok(())) => {}
                Ok(Err(err)) => tracing::warn!(error = %err, "fake model server failed"),
                Err(err) => tracing::warn!(error = %err, "fake model server task panicked"),
            }
        }
    }
}

impl Drop for FakeModel {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Serves the fake model on `listener` until `shutdown` is cancelled.
///
/// # Errors
/// `FakeModelError::Serve` when the accept loop fails.
pub async fn serve(
    listener: TcpListener,
    state: FakeModelState,
    shutdown: CancellationToken,
) -> Result<(), FakeModelError> {
    axum::serve(
        listener,
        router(state).into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown.cancelled_owned())
    .await
    .map_err(FakeModelError::Serve)
}

/// Returns the fake model's routes, for embedding in another axum server.
pub fn router(state: FakeModelState) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(openai_chat))
        .route("/v1/embeddings", post(openai_embeddings))
        .route("/v1/models", get(|| async { openai::models() }))
        .route("/v1/messages", post(anthropic_messages))
        .route("/_fake/script", post(push_script))
        .route("/_fake/requests", get(recorded_requests))
        .route("/_fake/reset", post(reset))
        .with_state(state)
}

/// Who sent a request: the connection it came on (when the server knows it) and the HTTP
/// version, so a test can tell how calls shared connections.
struct Caller {
    peer: Option<SocketAddr>,
    version: axum::http::Version,
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Caller {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _state: &S,
    ) -> Result<Self, Self::Rejection> {
        let peer = parts
            .extensions
            .get::<axum::extract::ConnectInfo<SocketAddr>>()
            .map(|info| info.0);
        Ok(Self {
            peer,
            version: parts.version,
        })
    }
}

async fn openai_chat(
    State(state): State<FakeModelState>,
    caller: Caller,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    handle(&state, Protocol::OpenAi, &caller, headers, body).await
}

async fn openai_embeddings(
    State(state): State<FakeModelState>,
    caller: Caller,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let key = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let parsed = serde_json::from_slice::<embeddings::EmbeddingsRequest>(&body);
    record(&state, "/v1/embeddings", &caller, &headers, &body);
    if !is_authorized(state.api_key(), Protocol::OpenAi, &headers) {
        return openai::error(Failure::Auth, key);
    }
    let request = match parsed {
        Ok(request) => request,
        Err(err) => return openai::bad_request(&format!("invalid embeddings request: {err}")),
    };
    if let Some(failure) = state.knob_failure(key, request.model.as_deref(), None) {
        return openai::error(failure, key);
    }
    embeddings::answer(&request)
}

async fn anthropic_messages(
    State(state): State<FakeModelState>,
    caller: Caller,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    handle(&state, Protocol::Anthropic, &caller, headers, body).await
}

async fn handle(
    state: &FakeModelState,
    protocol: Protocol,
    caller: &Caller,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = match protocol {
        Protocol::OpenAi => "/v1/chat/completions",
        Protocol::Anthropic => "/v1/messages",
    };
    let parsed = request::Request::parse(&body);
    let model = parsed.as_ref().ok().and_then(request::Request::model);
    let authorized = is_authorized(state.api_key(), protocol, &headers);
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let key = match protocol {
        Protocol::OpenAi => header("authorization").and_then(|v| v.strip_prefix("Bearer ")),
        Protocol::Anthropic => header("x-api-key"),
    };
    let plan = match &parsed {
        Ok(request) if authorized => {
            let thinking = match protocol {
                Protocol::OpenAi => request.reasoning_effort(),
                Protocol::Anthropic => request.thinking_budget().map(|b| {
                    match b {
                        0..=1024 => "low",
                        1025..=4096 => "medium",
                        _ => "high",
                    }
                    .to_owned()
                }),
            };
            // Knob failures come first so they never use up a scripted reply.
            match state.knob_failure(key, model.as_deref(), thinking.as_deref()) {
                Some(failure) => Some(plan::Plan::failed(failure)),
                None => Some(plan::plan(state, protocol, &request.messages())),
            }
        }
        _ => None,
    };
    let request = parsed.as_ref().ok();
    let ctx = ReplyContext {
        id: state.next_id(),
        model: model.unwrap_or_else(|| "fake-model".to_owned()),
        input_tokens: (body.len() / 4).max(1) as u64,
        include_usage: request.is_some_and(request::Request::include_usage),
    };
    let stream = request.is_some_and(request::Request::stream);
    record(state, path, caller, &headers, &body);
    let Some(plan) = plan else {
        return match (protocol, authorized) {
            (Protocol::OpenAi, false) => openai::error(Failure::Auth, key),
            (Protocol::Anthropic, false) => anthropic::error(Failure::Auth),
            (Protocol::OpenAi, true) => openai::bad_request("request body is not valid JSON"),
            (Protocol::Anthropic, true) => anthropic::bad_request("request body is not valid JSON"),
        };
    };
    if !plan.delay.is_zero() {
        tokio::time::sleep(plan.delay).await;
    }
    match (protocol, plan.failure, stream) {
        (Protocol::OpenAi, Some(failure), _) => openai::error(failure, key),
        (Protocol::Anthropic, Some(failure), _) => anthropic::error(failure),
        (Protocol::OpenAi, None, false) => openai::complete(&plan, &ctx),
        (Protocol::OpenAi, None, true) => openai::stream(&plan, &ctx),
        (Protocol::Anthropic, None, false) => anthropic::complete(&plan, &ctx),
        (Protocol::Anthropic, None, true) => anthropic::stream(&plan, &ctx),
    }
}

/// Keeps the request for `/_fake/requests`, when recording; the body is parsed in full only then.
fn record(state: &FakeModelState, path: &str, caller: &Caller, headers: &HeaderMap, body: &[u8]) {
    if state.recording() {
        state.record(RecordedRequest {
            path: path.to_owned(),
            peer: caller.peer.map(|peer| peer.to_string()),
            http_version: format!("{:?}", caller.version),
            body: serde_json::from_slice(body).unwrap_or(Value::Null),
            headers: headers
                .iter()
                .filter_map(|(name, value)| {
                    Some((name.as_str().to_owned(), value.to_str().ok()?.to_owned()))
                })
                .collect(),
        });
    }
}

fn is_authorized(api_key: Option<&str>, protocol: Protocol, headers: &HeaderMap) -> bool {
    let Some(expected) = api_key else {
        return true;
    };
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    match protocol {
        Protocol::OpenAi => header("authorization")
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(|key| key == expected),
        Protocol::Anthropic => header("x-api-key").is_some_and(|key| key == expected),
    }
}

/// Accepts one scripted reply or an array of them.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum ScriptBody {
    Many(Vec<ScriptedReply>),
    One(ScriptedReply),
}

async fn push_script(State(state): State<FakeModelState>, body: Bytes) -> Response {
    match serde_json::from_slice::<ScriptBody>(&body) {
        Ok(ScriptBody::One(reply)) => state.push_script(reply),
        Ok(ScriptBody::Many(replies)) => replies.into_iter().for_each(|r| state.push_script(r)),
        Err(err) => {
            return (StatusCode::BAD_REQUEST, format!("invalid script: {err}")).into_response();
        }
    }
    StatusCode::NO_CONTENT.into_response()
}

async fn recorded_requests(State(state): State<FakeModelState>) -> Response {
    axum::Json(state.requests()).into_response()
}

async fn reset(State(state): State<FakeModelState>) -> StatusCode {
    state.reset();
    StatusCode::NO_CONTENT
}
