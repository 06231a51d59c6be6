//! Clients of the gateways' client protocols: agentloop's WebSocket RPC (`/ws`, `agent`
//! method) and the OpenAI-compatible `POST /v1/chat/completions` (agentloop and OpenClaw).

use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::{SinkExt as _, StreamExt as _};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::client::Done;

/// How long one request may take before it counts as lost.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// One WebSocket connection to agentloop's gateway, after `connect`.
pub struct WsClient {
    socket: WebSocketStream<MaybeTlsStream<TcpStream>>,
    next_id: u64,
}

impl WsClient {
    /// Opens `ws://<addr>/ws` and performs the `connect` handshake (no token: loopback).
    ///
    /// # Errors
    /// When the socket cannot be opened or `connect` is refused.
    pub async fn connect(url: &str) -> anyhow::Result<Self> {
        let (socket, _) = tokio::time::timeout(
            REQUEST_TIMEOUT,
            tokio_tungstenite::connect_async_with_config(url, None, true),
        )
        .await
        .context("ws connect timed out")?
        .with_context(|| format!("failed to open {url}"))?;
        let mut client = Self { socket, next_id: 0 };
        let id = client.send("connect", json!({})).await?;
        let hello = tokio::time::timeout(REQUEST_TIMEOUT, client.response(&id))
            .await
            .context("no answer to connect")??;
        if hello.get("ok") != Some(&Value::Bool(true)) {
            bail!("connect refused: {hello}");
        }
        Ok(client)
    }

    async fn send(&mut self, method: &str, params: Value) -> anyhow::Result<String> {
        self.next_id += 1;
        let id = self.next_id.to_string();
        let frame = json!({"type": "req", "id": id, "method": method, "params": params});
        self.socket
            .send(Message::Text(frame.to_string().into()))
            .await
            .context("ws send failed")?;
        Ok(id)
    }

    /// Reads frames until a response to `id` arrives (events are skipped).
    async fn response(&mut self, id: &str) -> anyhow::Result<Value> {
        loop {
            let frame = self.frame().await?;
            if frame.get("type").and_then(Value::as_str) == Some("res")
                && frame.get("id").and_then(Value::as_str) == Some(id)
            {
                return Ok(frame);
            }
        }
    }

    async fn frame(&mut self) -> anyhow::Result<Value> {
        loop {
            let message = self
                .socket
                .next()
                .await
                .context("ws closed")?
                .context("ws read failed")?;
            match message {
                Message::Text(text) => {
                    return serde_json::from_str(text.as_str()).context("frame is not JSON");
                }
                Message::Close(close) => bail!("ws closed by the gateway: {close:?}"),
                _ => {}
            }
        }
    }

    /// Sends one `agent` request and waits for its final response: the time to the first
    /// assistant delta event and to the final `res`.
    ///
    /// # Errors
    /// On a refused request, a closed socket or a timeout.
    pub async fn agent(&mut self, session_key: &str, tag: &str) -> anyhow::Result<Done> {
        let text = format!("bench {tag}");
        let expected = format!("echo: {text}");
        let start = Instant::now();
        tokio::time::timeout(REQUEST_TIMEOUT, async {
            let id = self
                .send(
                    "agent",
                    json!({"message": text, "sessionKey": session_key, "idempotencyKey": tag}),
                )
                .await?;
            let mut first_delta = None;
            loop {
                let frame = self.frame().await?;
                match frame.get("type").and_then(Value::as_str) {
                    Some("event") => {
                        let payload = frame.get("payload").unwrap_or(&Value::Null);
                        let is_delta = payload.get("stream").and_then(Value::as_str)
                            == Some("assistant")
                            && payload.get("phase").and_then(Value::as_str) == Some("delta");
                        if is_delta && first_delta.is_none() {
                            first_delta = Some(start.elapsed());
                        }
                    }
                    Some("res") if frame.get("id").and_then(Value::as_str) == Some(&id) => {
                        if frame.get("ok") != Some(&Value::Bool(true)) {
                            bail!("agent refused: {frame}");
                        }
                        let payload = frame.get("payload").unwrap_or(&Value::Null);
                        let status = payload.get("status").and_then(Value::as_str);
                        if status == Some("accepted") {
                            continue;
                        }
                        let total = start.elapsed();
                        let text_ok = status == Some("ok")
                            && payload.get("text").and_then(Value::as_str)
                                == Some(expected.as_str());
                        return Ok(Done {
                            total,
                            first_delta,
                            outbound: None,
                            text_ok,
                        });
                    }
                    _ => {}
                }
            }
        })
        .await
        .context("no final agent response in time")?
    }
}

/// An OpenAI-compatible chat completions endpoint.
#[derive(Clone)]
pub struct ChatApi {
    http: reqwest::Client,
    /// `http://host:port/v1/chat/completions`
    url: String,
    token: Option<String>,
    model: String,
    /// Sends the tag as `Idempotency-Key` (agentloop: lets the bench find the persisted run).
    idempotency_header: bool,
    /// Only a reply equal to `echo: bench <tag>` counts (otherwise: one containing the tag).
    exact: bool,
    /// Also accept any `echo: ...` answer of the fake model (OpenClaw: the fake model echoes
    /// OpenClaw's internal-context message, sent after the user's; the tag is then checked in
    /// the model's recorded requests).
    pub accept_echo: bool,
    /// Whether a reply without its tag was logged already.
    wrong_logged: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl ChatApi {
    /// A client of `base` (`http://host:port`).
    ///
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn new(
        base: &str,
        token: Option<&str>,
        model: &str,
        idempotency_header: bool,
        exact: bool,
    ) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .pool_max_idle_per_host(64)
            .build()
            .context("failed to build the HTTP client")?;
        Ok(Self {
            http,
            url: format!("{}/v1/chat/completions", base.trim_end_matches('/')),
            token: token.map(str::to_owned),
            model: model.to_owned(),
            idempotency_header,
            exact,
            accept_echo: false,
            wrong_logged: std::sync::Arc::default(),
        })
    }

    /// Whether each request carries its tag as `Idempotency-Key`.
    pub fn keyed(&self) -> bool {
        self.idempotency_header
    }

    /// Sends one non-streaming completion for `session` (the OpenAI `user` field) and checks the
    /// reply carries the tag.
    ///
    /// # Errors
    /// On a transport error, a non-200 answer or a timeout.
    pub async fn send(&self, session: &str, tag: &str) -> anyhow::Result<Done> {
        let text = format!("bench {tag}");
        let body = json!({
            "model": self.model,
            "user": session,
            "messages": [{"role": "user", "content": text}],
        });
        let mut request = self.http.post(&self.url).json(&body);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if self.idempotency_header {
            request = request.header("Idempotency-Key", tag);
        }
        let start = Instant::now();
        let response = request.send().await.context("request failed")?;
        let status = response.status();
        let answer: Value = response.json().await.context("answer is not JSON")?;
        let total = start.elapsed();
        if !status.is_success() {
            bail!("HTTP {status}: {answer}");
        }
        let content = answer
            .pointer("/choices/0/message/content")
            .and_then(Value::as_str)
            .unwrap_or("");
        let text_ok = if self.exact {
            content == format!("echo: {text}")
        } else {
            contains_word(content, tag) || (self.accept_echo && content.starts_with("echo: "))
        };
        if !text_ok
            && !self
                .wrong_logged
                .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            let shown: String = content.chars().take(400).collect();
            eprintln!(
                "[bench] first reply without its tag {tag:?} from {}: {shown:?}",
                self.url
            );
        }
        Ok(Done {
            total,
            first_delta: None,
            outbound: None,
            text_ok,
        })
    }
}

/// Whether `text` holds `tag` as a whole word (tags are letters, digits and `-`).
pub fn contains_word(text: &str, tag: &str) -> bool {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .any(|word| word == tag)
}

#[cfg(test)]
mod tests {
    use super::contains_word;

    #[test]
    fn a_tag_matches_only_as_a_whole_word() {
        assert!(contains_word("echo: bench oc-seq-0-1", "oc-seq-0-1"));
        assert!(contains_word(
            "[x] echo: \"bench oc-seq-0-1\".",
            "oc-seq-0-1"
        ));
        assert!(!contains_word("echo: bench oc-seq-0-12", "oc-seq-0-1"));
    }
}
