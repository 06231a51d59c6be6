//! Tools the model may call: a trait for in-process tools, the built-ins, remote tools served
//! over NATS, and the per-agent registry with allow and deny lists.

mod builtin;
mod knowledge;
pub(crate) mod mcp;
pub(crate) mod remote;

use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use futures::future::BoxFuture;

use agentloop_model::ToolSpec;

pub(crate) use builtin::{CurrentTime, SendMessage, SessionHistory};
pub(crate) use knowledge::{
    LOAD_SKILL, LoadSkill, MEMORY_TOOLS, MemoryForget, MemorySave, MemorySearch,
};

/// The runner's own tools, in the order they win over a remote tool of the same name.
pub(crate) fn builtins() -> Vec<Arc<dyn Tool>> {
    vec![
        Arc::new(CurrentTime),
        Arc::new(SessionHistory),
        Arc::new(SendMessage),
        Arc::new(MemorySave),
        Arc::new(MemorySearch),
        Arc::new(MemoryForget),
        Arc::new(LoadSkill),
    ]
}

/// The tools an agent is not offered: its deny list, and the tools over what it does not have
/// (memory when it keeps none, `load_skill` without skill folders).
pub(crate) fn denied(agent: &crate::AgentConfig, skills_dir: &str) -> Vec<String> {
    let mut deny = agent.tools_deny.clone();
    if agent.memory == crate::config::MemoryMode::Off {
        deny.extend(MEMORY_TOOLS.iter().map(|&t| t.to_owned()));
    }
    if crate::context::skill_dirs(skills_dir, agent).is_empty() {
        deny.push(LOAD_SKILL.to_owned());
    }
    deny
}

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
    /// The agent running.
    pub agent_id: String,
    /// Whose memory the agent keeps.
    pub memory: crate::config::MemoryMode,
    pub(crate) services: Option<ToolServices>,
    /// The run command's metadata: where a message back to this conversation goes (a chat
    /// app's chat and thread).
    pub(crate) route: std::collections::HashMap<String, String>,
    pub(crate) sends: Option<Arc<std::sync::Mutex<Vec<SentMessage>>>>,
}

/// What the built-in tools reach of the runner: the bus and the memory service, no more.
#[derive(Clone)]
pub(crate) struct ToolServices {
    pub(crate) bus: agentloop_bus::Bus,
    pub(crate) memory: crate::memory::MemoryClient,
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

/// The tools an agent may use, by name, with their specs. Built once per agent and kept while
/// the known tools stay the same: a spec holds a JSON schema, costly to build and to drop on
/// every run.
#[derive(Clone, Default)]
pub(crate) struct ToolSet {
    tools: BTreeMap<String, Arc<dyn Tool>>,
    /// The specs in name order.
    specs: Arc<[ToolSpec]>,
}

impl ToolSet {
    /// Builds the set from every known tool filtered by the agent's allow and deny lists
    /// (`*` allows everything; deny wins). Of two tools with one name the first is kept: the
    /// runner's own tools come first, so a remote one can never replace them.
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
                tools.entry(spec.name.clone()).or_insert((tool, spec));
            }
        }
        let (tools, specs): (BTreeMap<_, _>, Vec<_>) = tools
            .into_iter()
            .map(|(name, (tool, spec))| ((name, tool), spec))
            .unzip();
        Self {
            tools,
            specs: specs.into(),
        }
    }

    pub(crate) fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.get(name)
    }

    /// The specs in name order.
    pub(crate) fn specs(&self) -> &Arc<[ToolSpec]> {
        &self.specs
    }
}

/// Each agent's tool set, kept with the generation of the remote tools it was built from.
#[derive(Default)]
pub(crate) struct ToolSets {
    built: std::sync::Mutex<std::collections::HashMap<String, (u64, Arc<ToolSet>)>>,
}

impl ToolSets {
    /// Returns the set kept for `key` if it was built at `generation`, else builds and keeps it.
    pub(crate) fn get(
        &self,
        key: &str,
        generation: u64,
        build: impl FnOnce() -> ToolSet,
    ) -> Arc<ToolSet> {
        // Single inserts leave the map whole, so a panic elsewhere does not spoil it.
        let mut built = self.built.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((at, set)) = built.get(key)
            && *at == generation
        {
            return set.clone();
        }
        let set = Arc::new(build());
        built.insert(key.to_owned(), (generation, set.clone()));
        set
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
    fn a_kept_tool_set_serves_until_the_remote_tools_change() {
        let sets = ToolSets::default();
        let builds = std::cell::Cell::new(0);
        let build = || {
            builds.set(builds.get() + 1);
            ToolSet::build(known(), &["*".to_owned()], &[])
        };
        let first = sets.get("main", 0, build);
        let again = sets.get("main", 0, build);
        assert!(
            Arc::ptr_eq(&first, &again),
            "the same generation reuses the set"
        );
        assert_eq!(builds.get(), 1);
        let other_agent = sets.get("ops", 0, build);
        assert!(!Arc::ptr_eq(&first, &other_agent), "each agent has its own");
        let after_discovery = sets.get("main", 1, build);
        assert!(
            !Arc::ptr_eq(&first, &after_discovery),
            "a new generation rebuilds"
        );
        assert_eq!(builds.get(), 3);
    }

    #[test]
    fn a_later_tool_of_the_same_name_does_not_replace_the_first() {
        struct Impostor;
        impl Tool for Impostor {
            fn spec(&self) -> ToolSpec {
                ToolSpec {
                    name: "a".to_owned(),
                    description: "impostor".to_owned(),
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
        let mut tools = known();
        tools.push(Arc::new(Impostor));
        let set = ToolSet::build(tools, &["*".into()], &[]);
        let a = set.specs().iter().find(|s| s.name == "a").unwrap();
        assert_eq!(a.description, "");
    }

    #[test]
    fn deny_wins_over_allow() {
        let set = ToolSet::build(known(), &["*".into()], &["b".into()]);
        let names: Vec<_> = set.specs().iter().map(|s| s.name.clone()).collect();
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
