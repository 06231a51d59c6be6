//! Shared server state: the script queue, the request log and the sticky failure knob.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::FakeModelConfig;

/// An error the fake server can answer with, in the calling provider's real error shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Failure {
    /// 401, invalid API key.
    Auth,
    /// 429, rate limit reached.
    RateLimit,
    /// 500, internal server error.
    Server,
    /// 400, the prompt does not fit the model's context window.
    Overflow,
    /// 400, the requested reasoning effort (thinking level) is not supported by the model.
    UnsupportedThinking,
}

impl Failure {
    /// Returns the failure matching an HTTP status (401, 429, 5xx), if any.
    pub fn from_status(status: u16) -> Option<Self> {
        match status {
            401 | 403 => Some(Self::Auth),
            429 => Some(Self::RateLimit),
            500..=599 => Some(Self::Server),
            _ => None,
        }
    }

    /// Returns the HTTP status code this failure is served with.
    pub fn status(self) -> u16 {
        match self {
            Self::Auth => 401,
            Self::RateLimit => 429,
            Self::Server => 500,
            Self::Overflow | Self::UnsupportedThinking => 400,
        }
    }
}

/// A tool call the fake model answers with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScriptedToolCall {
    /// Tool name.
    pub name: String,
    /// Tool arguments (a JSON object, normally).
    #[serde(default)]
    pub arguments: serde_json::Value,
    /// The call id to send, as a server that picks its own would (an empty one, one already
    /// used); `None` numbers the calls of the whole conversation apart.
    #[serde(default)]
    pub id: Option<String>,
}

/// One scripted response; queued replies take precedence over directives and echo.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ScriptedReply {
    /// Text to answer with (streamed word by word).
    pub text: String,
    /// Tool calls to answer with, after the text.
    pub tool_calls: Vec<ScriptedToolCall>,
    /// When set, answer with this error instead of a reply.
    pub error: Option<Failure>,
    /// Milliseconds to wait before the first byte.
    pub delay_ms: u64,
    /// Milliseconds between streamed chunks; the server default when `None`.
    pub chunk_delay_ms: Option<u64>,
}

impl ScriptedReply {
    /// Returns a reply with this text.
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            ..Self::default()
        }
    }

    /// Returns a reply with one tool call.
    pub fn tool_call(name: impl Into<String>, arguments: serde_json::Value) -> Self {
        Self::default().with_tool_call(name, arguments)
    }

    /// Returns an error reply.
    pub fn error(failure: Failure) -> Self {
        Self {
            error: Some(failure),
            ..Self::default()
        }
    }

    /// Adds a tool call to this reply.
    #[must_use]
    pub fn with_tool_call(mut self, name: impl Into<String>, arguments: serde_json::Value) -> Self {
        self.tool_calls.push(ScriptedToolCall {
            name: name.into(),
            arguments,
            id: None,
        });
        self
    }

    /// Adds a tool call sent under the call id `id`.
    #[must_use]
    pub fn with_tool_call_id(
        mut self,
        id: impl Into<String>,
        name: impl Into<String>,
        arguments: serde_json::Value,
    ) -> Self {
        self.tool_calls.push(ScriptedToolCall {
            name: name.into(),
            arguments,
            id: Some(id.into()),
        });
        self
    }

    /// Sets the wait before the first byte.
    #[must_use]
    pub fn with_delay(mut self, delay: Duration) -> Self {
        self.delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self
    }

    /// Sets the wait between streamed chunks.
    #[must_use]
    pub fn with_chunk_delay(mut self, delay: Duration) -> Self {
        self.chunk_delay_ms = Some(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX));
        self
    }
}

/// A request the fake server received.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedRequest {
    /// Request path, e.g. `/v1/chat/completions`.
    pub path: String,
    /// The client's address and port: one per connection (none when embedded in a server
    /// that does not say).
    pub peer: Option<String>,
    /// `HTTP/1.1` or `HTTP/2.0`.
    #[serde(default)]
    pub http_version: String,
    /// Parsed JSON body (`null` when the body was empty or not JSON).
    pub body: serde_json::Value,
    /// Request headers, names lowercase.
    pub headers: BTreeMap<String, String>,
}

impl RecordedRequest {
    /// Returns a header value by lowercase name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
}

/// Handle on a fake server's shared state; cheap to clone.
#[derive(Debug, Clone)]
pub struct FakeModelState {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    default_chunk_delay: Duration,
    max_recorded_requests: usize,
    api_key: Option<String>,
    script: Mutex<VecDeque<ScriptedReply>>,
    requests: Mutex<VecDeque<RecordedRequest>>,
    failure: Mutex<Option<Failure>>,
    key_failures: Mutex<BTreeMap<String, Failure>>,
    model_failures: Mutex<BTreeMap<String, Failure>>,
    max_thinking: Mutex<Option<String>>,
    next_id: AtomicU64,
}

/// Locks a mutex, recovering from poisoning: every critical section here is a plain
/// push or pop that cannot leave the data half-updated.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl FakeModelState {
    /// Returns fresh state for a server built from `config`.
    pub fn new(config: &FakeModelConfig) -> Self {
        Self {
            inner: Arc::new(Inner {
                default_chunk_delay: config.default_chunk_delay,
                max_recorded_requests: config.max_recorded_requests,
                api_key: config.api_key.clone(),
                script: Mutex::new(VecDeque::new()),
                requests: Mutex::new(VecDeque::new()),
                failure: Mutex::new(None),
                key_failures: Mutex::new(BTreeMap::new()),
                model_failures: Mutex::new(BTreeMap::new()),
                max_thinking: Mutex::new(None),
                next_id: AtomicU64::new(1),
            }),
        }
    }

    /// Queues a scripted reply (FIFO).
    pub fn push_script(&self, reply: ScriptedReply) {
        lock(&self.inner.script).push_back(reply);
    }

    /// Returns the requests received so far, oldest first.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.inner.requests).iter().cloned().collect()
    }

    /// Sets (or clears with `None`) a failure returned for every request until cleared.
    pub fn set_failure(&self, failure: Option<Failure>) {
        *lock(&self.inner.failure) = failure;
    }

    /// Fails every request made with API key `key` (bearer or `x-api-key`), or stops (`None`).
    pub fn fail_key(&self, key: &str, failure: Option<Failure>) {
        let mut failures = lock(&self.inner.key_failures);
        match failure {
            Some(failure) => failures.insert(key.to_owned(), failure),
            None => failures.remove(key),
        };
    }

    /// Fails every request for model `model` (the body's `model` field), or stops (`None`).
    pub fn fail_model(&self, model: &str, failure: Option<Failure>) {
        let mut failures = lock(&self.inner.model_failures);
        match failure {
            Some(failure) => failures.insert(model.to_owned(), failure),
            None => failures.remove(model),
        };
    }

    /// Refuses thinking levels above `level` (`low` < `medium` < `high`); `None` accepts all.
    pub fn set_max_thinking(&self, level: Option<&str>) {
        *lock(&self.inner.max_thinking) = level.map(str::to_owned);
    }

    /// Clears the script queue, the request log and every failure knob.
    pub fn reset(&self) {
        lock(&self.inner.script).clear();
        lock(&self.inner.requests).clear();
        *lock(&self.inner.failure) = None;
        lock(&self.inner.key_failures).clear();
        lock(&self.inner.model_failures).clear();
        *lock(&self.inner.max_thinking) = None;
    }

    /// Returns the failure the knobs impose on a request, before any script is consumed.
    pub(crate) fn knob_failure(
        &self,
        key: Option<&str>,
        model: Option<&str>,
        thinking: Option<&str>,
    ) -> Option<Failure> {
        if let Some(key) = key
            && let Some(failure) = lock(&self.inner.key_failures).get(key)
        {
            return Some(*failure);
        }
        if let Some(model) = model
            && let Some(failure) = lock(&self.inner.model_failures).get(model)
        {
            return Some(*failure);
        }
        let rank = |level: &str| match level {
            "low" => 1,
            "medium" => 2,
            _ => 3,
        };
        if let (Some(asked), Some(max)) = (thinking, lock(&self.inner.max_thinking).as_deref())
            && rank(asked) > rank(max)
        {
            return Some(Failure::UnsupportedThinking);
        }
        None
    }

    /// Whether requests are kept for `/_fake/requests`.
    pub(crate) fn recording(&self) -> bool {
        self.inner.max_recorded_requests > 0
    }

    pub(crate) fn record(&self, request: RecordedRequest) {
        if self.inner.max_recorded_requests == 0 {
            return;
        }
        let mut requests = lock(&self.inner.requests);
        // Bounded so a long benchmark cannot grow the log without limit.
        if requests.len() >= self.inner.max_recorded_requests {
            requests.pop_front();
        }
        requests.push_back(request);
    }

    pub(crate) fn pop_script(&self) -> Option<ScriptedReply> {
        lock(&self.inner.script).pop_front()
    }

    pub(crate) fn failure(&self) -> Option<Failure> {
        *lock(&self.inner.failure)
    }

    pub(crate) fn api_key(&self) -> Option<&str> {
        self.inner.api_key.as_deref()
    }

    pub(crate) fn default_chunk_delay(&self) -> Duration {
        self.inner.default_chunk_delay
    }

    pub(crate) fn next_id(&self) -> u64 {
        self.inner.next_id.fetch_add(1, Ordering::Relaxed)
    }
}
