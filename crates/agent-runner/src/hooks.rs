//! Hook points of the loop. In-process hooks implement [`Hook`]; external hooks are NATS
//! request/reply services configured by subject, with a timeout and fail-open or fail-closed.
//!
//! A hook receives `{"point": "...", ...details}` and answers an object whose optional fields
//! act on the point: `block` + `reason` (before_tool_call, message_sending), `arguments`
//! (before_tool_call), `content` (tool_result_persist), `systemPrompt` and `context`
//! (before_agent_start), `text` (message_sending).

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Where in the loop a hook runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HookPoint {
    /// Before the first model turn: add context, override the system prompt.
    BeforeAgentStart,
    /// Before a tool runs: block it or rewrite its arguments.
    BeforeToolCall,
    /// After a tool ran: observe the result.
    AfterToolCall,
    /// Before a tool result is stored: rewrite what is stored.
    ToolResultPersist,
    /// After the run ended: observe the outcome.
    AgentEnd,
    /// When a run takes its input: observe it.
    MessageReceived,
    /// Before the final reply is published: rewrite or block it.
    MessageSending,
    /// After the final reply was published.
    MessageSent,
}

impl HookPoint {
    /// Returns the snake_case name used in configuration and payloads.
    pub fn as_str(self) -> &'static str {
        match self {
            HookPoint::BeforeAgentStart => "before_agent_start",
            HookPoint::BeforeToolCall => "before_tool_call",
            HookPoint::AfterToolCall => "after_tool_call",
            HookPoint::ToolResultPersist => "tool_result_persist",
            HookPoint::AgentEnd => "agent_end",
            HookPoint::MessageReceived => "message_received",
            HookPoint::MessageSending => "message_sending",
            HookPoint::MessageSent => "message_sent",
        }
    }
}

/// What a hook asks for; every field is optional.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct HookOutcome {
    /// Stop the action (a tool call, a reply).
    pub block: bool,
    /// Why, shown to the model or logged.
    pub reason: Option<String>,
    /// Replacement tool arguments.
    pub arguments: Option<Value>,
    /// Replacement tool result to store.
    pub content: Option<String>,
    /// Replacement system prompt.
    pub system_prompt: Option<String>,
    /// Extra context appended to the system prompt.
    pub context: Option<String>,
    /// Replacement reply text.
    pub text: Option<String>,
}

/// An in-process hook.
pub trait Hook: Send + Sync {
    /// Returns the points this hook wants to see.
    fn points(&self) -> Vec<HookPoint>;

    /// Handles one hook call; an error counts as the hook failing (see fail-open).
    fn call<'a>(
        &'a self,
        point: HookPoint,
        payload: &'a Value,
    ) -> BoxFuture<'a, Result<HookOutcome, String>>;

    /// Returns whether the action goes ahead when this hook fails.
    fn fail_open(&self) -> bool {
        true
    }
}

/// An external hook from `[[runner.hooks]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExternalHookConfig {
    /// The hook point, e.g. `before_tool_call`.
    pub point: HookPoint,
    /// NATS subject answering the hook (request/reply, JSON).
    pub subject: String,
    /// How long to wait for an answer.
    #[serde(default = "default_hook_timeout")]
    pub timeout_ms: u64,
    /// Whether the action goes ahead when the hook fails or times out.
    #[serde(default = "default_true")]
    pub fail_open: bool,
}

fn default_hook_timeout() -> u64 {
    2_000
}

fn default_true() -> bool {
    true
}

struct ExternalHook {
    client: async_nats::Client,
    config: ExternalHookConfig,
}

impl Hook for ExternalHook {
    fn points(&self) -> Vec<HookPoint> {
        vec![self.config.point]
    }

    fn call<'a>(
        &'a self,
        _point: HookPoint,
        payload: &'a Value,
    ) -> BoxFuture<'a, Result<HookOutcome, String>> {
        Box::pin(async move {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("Content-Type", "application/json");
            agentloop_telemetry::inject_nats(&mut headers);
            // The hook's own timeout below decides, not the client's 10 s default.
            let request = self.client.send_request(
                self.config.subject.clone(),
                async_nats::Request::new()
                    .headers(headers)
                    .payload(payload.to_string().into())
                    .timeout(None),
            );
            let reply =
                tokio::time::timeout(Duration::from_millis(self.config.timeout_ms), request)
                    .await
                    .map_err(|_| {
                        format!(
                            "hook {} timed out after {} ms",
                            self.config.subject, self.config.timeout_ms
                        )
                    })?
                    .map_err(|e| format!("hook {} failed: {e}", self.config.subject))?;
            if reply.payload.iter().all(u8::is_ascii_whitespace) {
                return Ok(HookOutcome::default());
            }
            serde_json::from_slice(&reply.payload)
                .map_err(|e| format!("hook {} answered invalid JSON: {e}", self.config.subject))
        })
    }

    fn fail_open(&self) -> bool {
        self.config.fail_open
    }
}

/// Every hook of a runner.
#[derive(Clone, Default)]
pub(crate) struct Hooks {
    hooks: Vec<Arc<dyn Hook>>,
}

impl Hooks {
    pub(crate) fn new(
        in_process: Vec<Arc<dyn Hook>>,
        external: &[ExternalHookConfig],
        client: &async_nats::Client,
    ) -> Self {
        let mut hooks = in_process;
        for config in external {
            hooks.push(Arc::new(ExternalHook {
                client: client.clone(),
                config: config.clone(),
            }));
        }
        Self { hooks }
    }

    /// Runs every hook of `point` in order, merging their outcomes; a failed hook blocks only
    /// when it is fail-closed.
    pub(crate) async fn run(&self, point: HookPoint, mut payload: Value) -> HookOutcome {
        let mut merged = HookOutcome::default();
        let interested: Vec<&Arc<dyn Hook>> = self
            .hooks
            .iter()
            .filter(|h| h.points().contains(&point))
            .collect();
        if interested.is_empty() {
            return merged;
        }
        if let Value::Object(map) = &mut payload {
            map.insert("point".to_owned(), Value::String(point.as_str().to_owned()));
        }
        for hook in interested {
            match hook.call(point, &payload).await {
                Ok(outcome) => {
                    if let Some(arguments) = &outcome.arguments
                        && let Value::Object(map) = &mut payload
                    {
                        // Later hooks see the rewritten arguments.
                        map.insert("arguments".to_owned(), arguments.clone());
                    }
                    merge(&mut merged, outcome);
                    if merged.block {
                        break;
                    }
                }
                Err(error) => {
                    tracing::warn!(point = point.as_str(), error, "hook failed");
                    if !hook.fail_open() {
                        merged.block = true;
                        merged.reason = Some(format!("{error} (the hook is fail-closed)"));
                        break;
                    }
                }
            }
        }
        merged
    }
}

fn merge(into: &mut HookOutcome, outcome: HookOutcome) {
    into.block |= outcome.block;
    if outcome.reason.is_some() {
        into.reason = outcome.reason;
    }
    if outcome.arguments.is_some() {
        into.arguments = outcome.arguments;
    }
    if outcome.content.is_some() {
        into.content = outcome.content;
    }
    if outcome.system_prompt.is_some() {
        into.system_prompt = outcome.system_prompt;
    }
    if let Some(context) = outcome.context {
        into.context = Some(match into.context.take() {
            Some(existing) => format!("{existing}\n{context}"),
            None => context,
        });
    }
    if outcome.text.is_some() {
        into.text = outcome.text;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(HookPoint, Result<HookOutcome, String>, bool);

    impl Hook for Fixed {
        fn points(&self) -> Vec<HookPoint> {
            vec![self.0]
        }

        fn call<'a>(
            &'a self,
            _point: HookPoint,
            _payload: &'a Value,
        ) -> BoxFuture<'a, Result<HookOutcome, String>> {
            let result = self.1.clone();
            Box::pin(async move { result })
        }

        fn fail_open(&self) -> bool {
            self.2
        }
    }

    #[tokio::test]
    async fn a_failing_fail_closed_hook_blocks_and_a_fail_open_one_does_not() {
        let open = Hooks {
            hooks: vec![Arc::new(Fixed(
                HookPoint::BeforeToolCall,
                Err("down".into()),
                true,
            ))],
        };
        assert!(
            !open
                .run(HookPoint::BeforeToolCall, serde_json::json!({}))
                .await
                .block
        );
        let closed = Hooks {
            hooks: vec![Arc::new(Fixed(
                HookPoint::BeforeToolCall,
                Err("down".into()),
                false,
            ))],
        };
        let outcome = closed
            .run(HookPoint::BeforeToolCall, serde_json::json!({}))
            .await;
        assert!(outcome.block);
        assert!(outcome.reason.unwrap().contains("down"));
    }

    #[tokio::test]
    async fn hooks_of_other_points_are_not_called_and_contexts_add_up() {
        let hooks = Hooks {
            hooks: vec![
                Arc::new(Fixed(HookPoint::AgentEnd, Err("never".into()), false)),
                Arc::new(Fixed(
                    HookPoint::BeforeAgentStart,
                    Ok(HookOutcome {
                        context: Some("a".into()),
                        ..Default::default()
                    }),
                    true,
                )),
                Arc::new(Fixed(
                    HookPoint::BeforeAgentStart,
                    Ok(HookOutcome {
                        context: Some("b".into()),
                        ..Default::default()
                    }),
                    true,
                )),
            ],
        };
        let outcome = hooks
            .run(HookPoint::BeforeAgentStart, serde_json::json!({}))
            .await;
        assert!(!outcome.block);
        assert_eq!(outcome.context.as_deref(), Some("a\nb"));
    }
}
