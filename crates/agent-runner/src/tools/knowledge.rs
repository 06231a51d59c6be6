//! Built-in tools over what the assistant knows beyond the conversation: long-term memory
//! (`memory_save`, `memory_search`, `memory_forget`) and skills (`load_skill`).

use futures::future::BoxFuture;
use serde_json::json;

use agentloop_model::ToolSpec;
use agentloop_proto::v1::MemoryScope;

use super::{Tool, ToolContext, ToolError, ToolServices};
use crate::memory::memory_scope;

/// The names of the memory tools, offered only to agents that keep memory.
pub(crate) const MEMORY_TOOLS: [&str; 3] = ["memory_save", "memory_search", "memory_forget"];

/// The name of the skill tool, offered only to agents that have skill folders.
pub(crate) const LOAD_SKILL: &str = "load_skill";

/// The most memories one search returns.
const MAX_SEARCH: u64 = 20;

fn services(ctx: &ToolContext) -> Result<&ToolServices, ToolError> {
    ctx.services
        .as_ref()
        .ok_or_else(|| ToolError("no runtime".into()))
}

fn scope(ctx: &ToolContext) -> Result<MemoryScope, ToolError> {
    memory_scope(
        &ctx.agent_id,
        ctx.memory,
        &ctx.session_id,
        &ctx.sender_id,
        &ctx.channel,
    )
    .ok_or_else(|| ToolError("this agent keeps no memory".into()))
}

fn text_arg<'a>(arguments: &'a serde_json::Value, name: &str) -> Option<&'a str> {
    arguments[name]
        .as_str()
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// Stores a fact about the user for later conversations.
pub(crate) struct MemorySave;

impl Tool for MemorySave {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: MEMORY_TOOLS[0].to_owned(),
            description: "Remembers a durable fact about the user (a preference, a name, a plan) for later conversations. Returns its id.".to_owned(),
            parameters: json!({
                "type": "object",
                "properties": {"text": {"type": "string", "description": "The fact, as one short sentence."}},
                "required": ["text"],
                "additionalProperties": false
            }),
        }
    }

    fn call<'a>(
        &'a self,
        ctx: &'a ToolContext,
        arguments: serde_json::Value,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let text =
                text_arg(&arguments, "text").ok_or_else(|| ToolError("text is required".into()))?;
            let saved = services(ctx)?
                .memory
                .save_memory(scope(ctx)?, text)
                .await
                .map_err(|err| ToolError(format!("not saved: {err}")))?;
            Ok(json!({"id": saved.id, "text": saved.text}).to_string())
        })
    }
}

/// Searches what is remembered about the user.
pub(crate) struct MemorySearch;

impl Tool for MemorySearch {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: MEMORY_TOOLS[1].to_owned(),
            description: "Searches what you remember about the user. Returns the best matches with their ids and scores (0 to 1).".to_owned(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "limit": {"type": "integer", "minimum": 1, "maximum": MAX_SEARCH, "description": "Most results (default 5)."}
                },
                "required": ["query"],
                "additionalProperties": false
            }),
        }
    }

    fn parallel_safe(&self) -> bool {
        true
    }

    fn call<'a>(
        &'a self,
        ctx: &'a ToolContext,
        arguments: serde_json::Value,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let query = text_arg(&arguments, "query")
                .ok_or_else(|| ToolError("query is required".into()))?;
            let limit = arguments["limit"]
                .as_u64()
                .unwrap_or(5)
                .clamp(1, MAX_SEARCH);
            let found = services(ctx)?
                .memory
                .search_memories(
                    scope(ctx)?,
                    query,
                    u32::try_from(limit).unwrap_or(5),
                    crate::memory::MinScore::ANY,
                )
                .await
                .map_err(|err| ToolError(format!("search failed: {err}")))?;
            let found: Vec<_> = found
                .into_iter()
                .map(|m| json!({"id": m.id, "text": m.text, "score": (m.score * 1000.0).round() / 1000.0}))
                .collect();
            Ok(serde_json::Value::Array(found).to_string())
        })
    }
}

/// Forgets memories of the user, by id or by what a query matches.
pub(crate) struct MemoryForget;

impl Tool for MemoryForget {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: MEMORY_TOOLS[2].to_owned(),
            description: "Forgets what you remember about the user: one memory by id, or every memory a query matches. Returns the ids forgotten.".to_owned(),
            parameters: json!({
                "type": "object",
                "properties": {"id": {"type": "string"}, "query": {"type": "string"}},
                "additionalProperties": false
            }),
        }
    }

    fn call<'a>(
        &'a self,
        ctx: &'a ToolContext,
        arguments: serde_json::Value,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let id = text_arg(&arguments, "id").unwrap_or_default();
            let query = text_arg(&arguments, "query").unwrap_or_default();
            if id.is_empty() == query.is_empty() {
                return Err(ToolError("give either id or query".into()));
            }
            let ids = services(ctx)?
                .memory
                .forget_memories(scope(ctx)?, id, query, 0.0)
                .await
                .map_err(|err| ToolError(format!("not forgotten: {err}")))?;
            Ok(json!({"forgotten": ids}).to_string())
        })
    }
}

/// Returns a skill's instructions, or one of its files, from the session's snapshot.
pub(crate) struct LoadSkill;

impl Tool for LoadSkill {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: LOAD_SKILL.to_owned(),
            description: "Loads a skill listed under Skills: returns its instructions (SKILL.md), or with file one of its files.".to_owned(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "file": {"type": "string", "description": "A file of the skill, by its path inside the skill's folder."}
                },
                "required": ["name"],
                "additionalProperties": false
            }),
        }
    }

    fn parallel_safe(&self) -> bool {
        true
    }

    fn call<'a>(
        &'a self,
        ctx: &'a ToolContext,
        arguments: serde_json::Value,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let name =
                text_arg(&arguments, "name").ok_or_else(|| ToolError("name is required".into()))?;
            let file = text_arg(&arguments, "file");
            let snapshot = services(ctx)?
                .memory
                .skill_snapshot(&ctx.session_id)
                .await
                .map_err(|err| ToolError(format!("skills unavailable: {err}")))?;
            let skills: Vec<crate::skills::Skill> = if snapshot.version == 0 {
                Vec::new()
            } else {
                serde_json::from_str(&snapshot.skills_json)
                    .map_err(|err| ToolError(format!("skills unreadable: {err}")))?
            };
            crate::skills::lookup(&skills, name, file)
                .map(str::to_owned)
                .map_err(|err| ToolError(err.to_string()))
        })
    }
}
