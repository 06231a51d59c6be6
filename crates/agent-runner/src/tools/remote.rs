//! Remote tools: any process can serve a tool over NATS request/reply on
//! `<prefix>.tool.<name>`. Servers announce themselves on `<prefix>.tool._announce` (at start
//! and whenever someone publishes on `<prefix>.tool._discover`), so runners learn them at once.
//!
//! Request: `{"arguments": {...}, "context": {"sessionKey","sessionId","runId","callId"}}`.
//! Reply: `{"result": "text"}` or `{"error": "why"}`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::StreamExt as _;
use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::json;

use agentloop_bus::Bus;
use agentloop_model::ToolSpec;

use super::{Tool, ToolContext, ToolError};

/// What a tool server announces.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Announcement {
    name: String,
    #[serde(default)]
    description: String,
    #[serde(default = "empty_schema")]
    parameters: serde_json::Value,
    #[serde(default)]
    parallel_safe: bool,
    #[serde(default)]
    timeout_ms: Option<u64>,
}

fn empty_schema() -> serde_json::Value {
    json!({"type": "object"})
}

/// Remote tools this runner has heard of.
#[derive(Clone, Default)]
pub(crate) struct RemoteTools {
    known: Arc<RwLock<BTreeMap<String, Arc<dyn Tool>>>>,
    /// Bumped on every change to `known`: tool sets built before it are stale.
    generation: Arc<AtomicU64>,
}

impl RemoteTools {
    /// Returns the number of changes to the known tools so far.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Returns the remote tools known now.
    pub(crate) fn tools(&self) -> Vec<Arc<dyn Tool>> {
        self.known
            .read()
            .map(|known| known.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Listens for announcements and asks servers already running to announce themselves.
    pub(crate) async fn discover(
        &self,
        bus: &Bus,
        default_timeout: Duration,
    ) -> Result<(), async_nats::SubscribeError> {
        let prefix = bus.subjects().prefix().to_owned();
        let mut announcements = bus
            .client()
            .subscribe(format!("{prefix}.tool._announce"))
            .await?;
        let known = self.known.clone();
        let generation = self.generation.clone();
        let client = bus.client().clone();
        tokio::spawn(async move {
            while let Some(msg) = announcements.next().await {
                let announcement: Announcement = match serde_json::from_slice(&msg.payload) {
                    Ok(a) => a,
                    Err(err) => {
                        tracing::warn!(error = %err, "ignoring a malformed tool announcement");
                        continue;
                    }
                };
                if !valid_name(&announcement.name) {
                    tracing::warn!(name = %announcement.name, "ignoring a tool with an invalid name");
                    continue;
                }
                let subject = format!("{prefix}.tool.{}", announcement.name);
                let tool = RemoteTool {
                    client: client.clone(),
                    subject,
                    timeout: announcement
                        .timeout_ms
                        .map_or(default_timeout, Duration::from_millis),
                    announcement: announcement.clone(),
                };
                if let Ok(mut known) = known.write() {
                    if !known.contains_key(&announcement.name) {
                        tracing::info!(tool = %announcement.name, "remote tool discovered");
                    }
                    known.insert(announcement.name.clone(), Arc::new(tool));
                    generation.fetch_add(1, Ordering::Release);
                }
            }
        });
        let discover = format!("{}.tool._discover", bus.subjects().prefix());
        let _ = bus.client().publish(discover, "{}".into()).await;
        Ok(())
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('_')
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

struct RemoteTool {
    client: async_nats::Client,
    subject: String,
    timeout: Duration,
    announcement: Announcement,
}

impl Tool for RemoteTool {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.announcement.name.clone(),
            description: self.announcement.description.clone(),
            parameters: self.announcement.parameters.clone(),
        }
    }

    fn parallel_safe(&self) -> bool {
        self.announcement.parallel_safe
    }

    fn timeout(&self) -> Option<Duration> {
        Some(self.timeout)
    }

    fn call<'a>(
        &'a self,
        ctx: &'a ToolContext,
        arguments: serde_json::Value,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let request = json!({
                "arguments": arguments,
                "context": {
                    "sessionKey": ctx.session_key,
                    "sessionId": ctx.session_id,
                    "runId": ctx.run_id,
                    "callId": ctx.call_id,
                },
            });
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("Content-Type", "application/json");
            agentloop_telemetry::inject_nats(&mut headers);
            let reply = self
                .client
                .request_with_headers(self.subject.clone(), headers, request.to_string().into())
                .await
                .map_err(|e| {
                    ToolError(format!(
                        "remote tool {} unreachable: {e}",
                        self.announcement.name
                    ))
                })?;
            let body: serde_json::Value = serde_json::from_slice(&reply.payload)
                .map_err(|e| ToolError(format!("remote tool answered invalid JSON: {e}")))?;
            if let Some(error) = body["error"].as_str() {
                return Err(ToolError(error.to_owned()));
            }
            match &body["result"] {
                serde_json::Value::String(text) => Ok(text.clone()),
                serde_json::Value::Null => Err(ToolError("remote tool answered no result".into())),
                other => Ok(other.to_string()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_names_must_be_one_safe_subject_token() {
        assert!(valid_name("word_count"));
        assert!(!valid_name("_announce"));
        assert!(!valid_name("a.b"));
        assert!(!valid_name("a b"));
        assert!(!valid_name(""));
    }
}
