//! Serves agentloop tools from any process. Each tool answers JSON requests on
//! `<prefix>.tool.<name>` (a queue group, so several copies share the load) and is announced on
//! `<prefix>.tool._announce` at start and whenever a runner asks on `<prefix>.tool._discover`.
//!
//! Request: `{"arguments": {...}, "context": {"sessionKey", "sessionId", "runId", "callId"}}`.
//! Reply: `{"result": "text"}` or `{"error": "why"}`.

use std::sync::Arc;

use futures::StreamExt as _;
use futures::future::BoxFuture;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// The function behind a tool: arguments in, result text or error text out.
pub type Handler = Arc<dyn Fn(Value) -> BoxFuture<'static, Result<String, String>> + Send + Sync>;

/// One tool served by this process.
#[derive(Clone)]
pub struct RemoteTool {
    /// Tool name: one subject token of letters, digits, `_` and `-`.
    pub name: String,
    /// What the tool does, for the model.
    pub description: String,
    /// JSON schema of the arguments object.
    pub parameters: Value,
    /// Whether the runner may run it concurrently with other parallel-safe calls.
    pub parallel_safe: bool,
    /// How long the runner waits for an answer.
    pub timeout_ms: Option<u64>,
    /// The implementation.
    pub handler: Handler,
}

impl RemoteTool {
    fn announcement(&self) -> Value {
        json!({
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters,
            "parallelSafe": self.parallel_safe,
            "timeoutMs": self.timeout_ms,
        })
    }
}

/// Why the tool server stopped.
#[derive(Debug, thiserror::Error)]
pub enum ToolServerError {
    /// NATS could not be reached.
    #[error("failed to connect to nats at {url}")]
    Connect {
        /// The URL tried.
        url: String,
        /// The client's error.
        #[source]
        source: async_nats::ConnectError,
    },
    /// A subject could not be subscribed.
    #[error("failed to subscribe to {subject}")]
    Subscribe {
        /// The subject.
        subject: String,
        /// The client's error.
        #[source]
        source: async_nats::SubscribeError,
    },
    /// A tool name is not a valid subject token.
    #[error("invalid tool name {0:?}: use letters, digits, _ and -, not starting with _")]
    InvalidName(String),
}

/// A set of tools served over one NATS connection.
pub struct ToolServer {
    client: async_nats::Client,
    prefix: String,
    tools: Vec<RemoteTool>,
}

impl ToolServer {
    /// Connects to NATS; tools are served under `prefix` (`agentloop` by default in agentloop).
    ///
    /// # Errors
    /// [`ToolServerError::Connect`].
    pub async fn connect(url: &str, prefix: &str) -> Result<Self, ToolServerError> {
        Self::connect_with(url, prefix, async_nats::ConnectOptions::new()).await
    }

    /// Connects with `options`, e.g. the credentials of the `tool` NATS user.
    ///
    /// # Errors
    /// [`ToolServerError::Connect`].
    pub async fn connect_with(
        url: &str,
        prefix: &str,
        options: async_nats::ConnectOptions,
    ) -> Result<Self, ToolServerError> {
        let client = options
            .name("agentloop-tool-server")
            .connect(url)
            .await
            .map_err(|source| ToolServerError::Connect {
                url: url.to_owned(),
                source,
            })?;
        Ok(Self {
            client,
            prefix: prefix.to_owned(),
            tools: Vec::new(),
        })
    }

    /// Adds a tool.
    pub fn tool(mut self, tool: RemoteTool) -> Self {
        self.tools.push(tool);
        self
    }

    /// Subscribes every tool, announces them, and serves until `shutdown`; `ready` is called
    /// once the tools are announced.
    ///
    /// # Errors
    /// [`ToolServerError`] when a tool is invalid or a subject cannot be subscribed.
    pub async fn serve(
        self,
        shutdown: CancellationToken,
        ready: impl FnOnce(),
    ) -> Result<(), ToolServerError> {
        let mut tasks = tokio::task::JoinSet::new();
        for tool in &self.tools {
            if tool.name.is_empty()
                || tool.name.starts_with('_')
                || !tool
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                return Err(ToolServerError::InvalidName(tool.name.clone()));
            }
            let subject = format!("{}.tool.{}", self.prefix, tool.name);
            let mut requests = self
                .client
                .queue_subscribe(subject.clone(), format!("agentloop-tool-{}", tool.name))
                .await
                .map_err(|source| ToolServerError::Subscribe { subject, source })?;
            let client = self.client.clone();
            let tool = tool.clone();
            tasks.spawn(async move {
                while let Some(request) = requests.next().await {
                    let client = client.clone();
                    let handler = tool.handler.clone();
                    // Each call runs on its own so a slow one does not hold up the next.
                    tokio::spawn(async move {
                        let Some(reply) = request.reply.clone() else {
                            return;
                        };
                        let answer = match serde_json::from_slice::<Value>(&request.payload) {
                            Ok(body) => match handler(body["arguments"].clone()).await {
                                Ok(result) => json!({ "result": result }),
                                Err(error) => json!({ "error": error }),
                            },
                            Err(err) => json!({ "error": format!("request is not JSON: {err}") }),
                        };
                        if let Err(err) = client.publish(reply, answer.to_string().into()).await {
                            tracing::warn!(error = %err, "failed to answer a tool call");
                        }
                    });
                }
            });
        }
        let discover = format!("{}.tool._discover", self.prefix);
        let mut discovers = self
            .client
            .subscribe(discover.clone())
            .await
            .map_err(|source| ToolServerError::Subscribe {
                subject: discover,
                source,
            })?;
        let announce = format!("{}.tool._announce", self.prefix);
        self.announce(&announce).await;
        ready();
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                next = discovers.next() => match next {
                    Some(_) => self.announce(&announce).await,
                    None => break,
                },
            }
        }
        tasks.abort_all();
        let _ = self.client.flush().await;
        Ok(())
    }

    async fn announce(&self, subject: &str) {
        for tool in &self.tools {
            if let Err(err) = self
                .client
                .publish(subject.to_owned(), tool.announcement().to_string().into())
                .await
            {
                tracing::warn!(error = %err, tool = %tool.name, "failed to announce a tool");
            }
        }
        let _ = self.client.flush().await;
    }
}
