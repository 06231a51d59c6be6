//! Remote tools: any process can serve a tool over NATS request/reply on
//! `<prefix>.tool.<name>`. Servers announce themselves on `<prefix>.tool._announce` (at start
//! and whenever someone publishes on `<prefix>.tool._discover`), so runners learn them at once.
//!
//! Request: `{"arguments": {...}, "context": {"sessionKey","sessionId","runId","callId"}}`.
//! Reply: `{"result": "text"}` or `{"error": "why"}`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use futures::StreamExt as _;
use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::json;

use agentloop_bus::Bus;
use agentloop_model::ToolSpec;

use super::{Tool, ToolContext, ToolError};

/// The most remote tools one runner keeps; announcements of further names are ignored. Every
/// run offers the known tools its agent allows, so their number bounds every request's size.
const MAX_REMOTE_TOOLS: usize = 256;
/// The largest announcement accepted, in bytes (its description and parameter schema go to
/// the model with every request).
const MAX_ANNOUNCEMENT_BYTES: usize = 64 * 1024;

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
        let known = self.known.read().unwrap_or_else(PoisonError::into_inner);
        known.values().cloned().collect()
    }

    /// Listens for announcements and asks servers already running to announce themselves;
    /// only announcements `admit` lets through become tools.
    pub(crate) async fn discover(
        &self,
        bus: &Bus,
        default_timeout: Duration,
        admit: Admit,
    ) -> Result<(), async_nats::SubscribeError> {
        let subjects = bus.subjects().clone();
        let mut announcements = bus.client().subscribe(subjects.tool_announce()).await?;
        let known = self.known.clone();
        let generation = self.generation.clone();
        let client = bus.client().clone();
        tokio::spawn(async move {
            while let Some(msg) = announcements.next().await {
                if msg.payload.len() > MAX_ANNOUNCEMENT_BYTES {
                    tracing::warn!(
                        bytes = msg.payload.len(),
                        max = MAX_ANNOUNCEMENT_BYTES,
                        "ignoring a tool announcement larger than allowed"
                    );
                    continue;
                }
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
                if let Err(why) = admit.check(&announcement.name) {
                    tracing::warn!(tool = %announcement.name, reason = %why, "ignoring a remote tool");
                    continue;
                }
                let subject = subjects.tool(&announcement.name);
                let tool = RemoteTool {
                    client: client.clone(),
                    subject,
                    timeout: announcement
                        .timeout_ms
                        .map_or(default_timeout, Duration::from_millis),
                    announcement: announcement.clone(),
                };
                let mut known = known.write().unwrap_or_else(PoisonError::into_inner);
                match known.get(&announcement.name) {
                    Some(_) => {}
                    None if known.len() >= MAX_REMOTE_TOOLS => {
                        tracing::warn!(tool = %announcement.name, max = MAX_REMOTE_TOOLS, "ignoring a remote tool: this runner knows as many as it keeps");
                        continue;
                    }
                    None => tracing::info!(tool = %announcement.name, "remote tool discovered"),
                }
                known.insert(announcement.name.clone(), Arc::new(tool));
                generation.fetch_add(1, Ordering::Release);
            }
        });
        let discover = bus.subjects().tool_discover();
        let _ = bus.client().publish(discover, "{}".into()).await;
        Ok(())
    }
}

/// Which announced tools a runner accepts: never one named like a built-in (or in-process)
/// tool, and only those `runner.remote_tools_allow` names.
pub(crate) struct Admit {
    reserved: std::collections::BTreeSet<String>,
    allow: Vec<String>,
}

/// Why an announced tool is not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum NotAdmitted {
    /// A tool of this runner already has the name; a remote one must not replace it.
    #[error("its name belongs to a built-in tool")]
    ShadowsBuiltIn,
    /// `runner.remote_tools_allow` does not name it.
    #[error("not in runner.remote_tools_allow")]
    NotAllowed,
}

impl Admit {
    pub(crate) fn new(local: &[Arc<dyn Tool>], allow: &[String]) -> Self {
        Self {
            reserved: local.iter().map(|tool| tool.spec().name).collect(),
            allow: allow.to_vec(),
        }
    }

    pub(crate) fn check(&self, name: &str) -> Result<(), NotAdmitted> {
        if self.reserved.contains(name) {
            return Err(NotAdmitted::ShadowsBuiltIn);
        }
        if !self.allow.iter().any(|pattern| glob_match(pattern, name)) {
            return Err(NotAdmitted::NotAllowed);
        }
        Ok(())
    }
}

/// Matches `name` against `pattern`, where `*` stands for any run of characters.
fn glob_match(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        // No `*`: the whole name must be the pattern.
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
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
            // No client timeout of its own (async-nats would cut every call at 10 s): the
            // tool's timeout around this call decides, as it does for every tool.
            let request = async_nats::Request::new()
                .headers(headers)
                .payload(request.to_string().into())
                .timeout(None);
            let reply = self
                .client
                .send_request(self.subject.clone(), request)
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
    fn globs_match_whole_names() {
        assert!(glob_match("*", "anything"));
        assert!(glob_match("word_count", "word_count"));
        assert!(!glob_match("word_count", "word_count2"));
        assert!(glob_match("web_*", "web_search"));
        assert!(!glob_match("web_*", "my_web_search"));
        assert!(glob_match("*_search", "web_search"));
        assert!(glob_match("a*b*c", "a-x-b-y-c"));
        assert!(!glob_match("a*b*c", "a-x-c"));
        assert!(!glob_match("ab*ba", "aba"));
    }

    #[test]
    fn a_remote_tool_named_like_a_built_in_or_not_allowed_is_refused() {
        let local: Vec<Arc<dyn Tool>> = vec![Arc::new(crate::tools::CurrentTime)];
        let admit = Admit::new(&local, &["word_*".to_owned()]);
        assert_eq!(
            admit.check("current_time"),
            Err(NotAdmitted::ShadowsBuiltIn)
        );
        assert_eq!(admit.check("rm_rf"), Err(NotAdmitted::NotAllowed));
        assert_eq!(admit.check("word_count"), Ok(()));
        let open = Admit::new(&local, &["*".to_owned()]);
        assert_eq!(open.check("current_time"), Err(NotAdmitted::ShadowsBuiltIn));
    }

    #[test]
    fn tool_names_must_be_one_safe_subject_token() {
        assert!(valid_name("word_count"));
        assert!(!valid_name("_announce"));
        assert!(!valid_name("a.b"));
        assert!(!valid_name("a b"));
        assert!(!valid_name(""));
    }
}
