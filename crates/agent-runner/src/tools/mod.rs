//! Tools the model may call: a trait for in-process tools, the built-ins, remote tools served
//! over NATS, and the per-agent registry with allow and deny lists.

mod builtin;
pub(crate) mod remote;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;

use agentloop_model::ToolSpec;

pub(crate) use builtin::{CurrentTime, SendMessage, SessionHistory};

/// What a tool sees of the run that calls it.
#[derive(Clone)]
pub struct ToolContext {
    /// The session's id.
    pub session_id: String,
    /// The session's key.
    pub session_key: String,
    /// The run's id.
    pub run_id: String,
    /// The tool call's id.
    pub call_id: String,
    /// The channel the run's input came from.
    pub channel: String,
    /// Who sent the run's input.
    pub sender_id: String,
    pub(crate) runtime: Option<Arc<crate::intake::Shared>>,
    pub(crate) sends: Option<Arc<std::sync::Mutex<Vec<SentMessage>>>>,
}

/// A message sent by the `send_message` tool during a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentMessage {
    /// Channel it went to.
    pub channel: String,
    /// Recipient it went to.
    pub recipient: String,
    /// Its text.
    pub text: String,
}

/// Why a tool call failed; the model sees the message as an error result.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct ToolError(pub String);

/// A tool the model may call.
pub trait Tool: Send + Sync {
    /// Returns the tool's name, description and JSON-schema parameters.
    fn spec(&self) -> ToolSpec;

    /// Returns whether calls may run concurrently with other parallel-safe calls.
    fn parallel_safe(&self) -> bool {
        false
    }

    /// Returns how long a call may take before it is cut; `None` uses the runner's default.
    fn timeout(&self) -> Option<Duration> {
        None
    }

    /// Runs the tool with the model's arguments and returns the result text.
    fn call<'a>(
        &'a self,
        ctx: &'a ToolContext,
        arguments: serde_json::Value,
    ) -> BoxFuture<'a, Result<String, ToolError>>;
}

/// The tools an agent may use, by name, with their specs (each built once per set: a spec
/// holds a JSON schema, and building one is the most expensive part of a tool lookup).
#[derive(Clone, Default)]
pub(crate) struct ToolSet {
    tools: BTreeMap<String, (Arc<dyn Tool>, ToolSpec)>,
}

impl ToolSet {
    /// Builds the set from every known tool filtered by the agent's allow and deny lists
    /// (`*` allows everything; deny wins).
    pub(crate) fn build(
        known: impl IntoIterator<Item = Arc<dyn Tool>>,
        allow: &[String],
        deny: &[String],
    ) -> Self {
        let mut tools = BTreeMap::new();
        for tool in known {
            let spec = tool.spec();
            let name = spec.name.as_str();
            let allowed = allow.iter().any(|a| a == "*" || a == name);
            let denied = deny.iter().any(|d| d == "*" || d == name);
            if allowed && !denied {
                tools.insert(spec.name.clone(), (tool, spec));
            }
        }
        Self { tools }
    }

    pub(crate) fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.get(name).map(|(tool, _)| tool)
    }

    /// The specs in name order.
    pub(crate) fn specs(&self) -> Vec<ToolSpec> {
        self.tools.values().map(|(_, spec)| spec.clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Named(&'static str);

    impl Tool for Named {
        fn spec(&self) -> ToolSpec {
            ToolSpec {
                name: self.0.to_owned(),
                description: String::new(),
                parameters: serde_json::json!({"type": "object"}),
            }
        }

        fn call<'a>(
            &'a self,
            _ctx: &'a ToolContext,
            _arguments: serde_json::Value,
        ) -> BoxFuture<'a, Result<String, ToolError>> {
            Box::pin(async { Ok(String::new()) })
        }
    }

    fn known() -> Vec<Arc<dyn Tool>> {
        vec![
            Arc::new(Named("a")),
            Arc::new(Named("b")),
            Arc::new(Named("c")),
        ]
    }

    #[test]
    fn deny_wins_over_allow() {
        let set = ToolSet::build(known(), &["*".into()], &["b".into()]);
        let names: Vec<_> = set.specs().into_iter().map(|s| s.name).collect();
        assert_eq!(names, vec!["a", "c"]);
    }

    #[test]
    fn only_allowed_tools_are_offered() {
        let set = ToolSet::build(known(), &["a".into()], &[]);
        assert!(set.get("a").is_some());
        assert!(set.get("b").is_none());
        assert!(ToolSet::build(known(), &[], &[]).specs().is_empty());
    }
}
