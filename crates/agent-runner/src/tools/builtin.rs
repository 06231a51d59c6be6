//! Built-in tools: `current_time`, `session_history`, `send_message`.

use futures::future::BoxFuture;
use serde_json::json;

use agentloop_model::ToolSpec;
use agentloop_proto::v1::OutboundMessage;
use agentloop_proto::{RunMessage, run_msg_id};

use super::{SentMessage, Tool, ToolContext, ToolError};

/// Returns the current UTC time.
pub(crate) struct CurrentTime;

impl Tool for CurrentTime {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "current_time".to_owned(),
            description:
                "Returns the current date and time in UTC (RFC 3339) and as a Unix timestamp."
                    .to_owned(),
            parameters: json!({"type": "object", "properties": {}, "additionalProperties": false}),
        }
    }

    fn parallel_safe(&self) -> bool {
        true
    }

    fn call<'a>(
        &'a self,
        _ctx: &'a ToolContext,
        _arguments: serde_json::Value,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_err(|e| ToolError(e.to_string()))?;
            let ts = agentloop_proto::now();
            let text = serde_json::to_string(&ts).unwrap_or_default();
            Ok(json!({"utc": text.trim_matches('"'), "unix": now.as_secs()}).to_string())
        })
    }
}

/// Reads this session's transcript.
pub(crate) struct SessionHistory;

impl Tool for SessionHistory {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "session_history".to_owned(),
            description: "Returns the latest messages of this conversation, oldest first."
                .to_owned(),
            parameters: json!({
                "type": "object",
                "properties": {"limit": {"type": "integer", "minimum": 1, "maximum": 200, "description": "How many entries (default 20)."}},
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
            let services = ctx
                .services
                .as_ref()
                .ok_or_else(|| ToolError("no runtime".into()))?;
            let limit = arguments["limit"].as_u64().unwrap_or(20).clamp(1, 200) as u32;
            let history = services
                .memory
                .history(&ctx.session_id, limit)
                .await
                .map_err(|err| ToolError(format!("history unavailable: {err}")))?;
            let entries: Vec<_> = history
                .entries
                .iter()
                .map(|e| json!({"role": e.role, "content": e.content, "toolName": e.tool_name}))
                .collect();
            Ok(serde_json::Value::Array(entries).to_string())
        })
    }
}

/// Sends a message to a channel and recipient while the run goes on.
pub(crate) struct SendMessage;

impl Tool for SendMessage {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "send_message".to_owned(),
            description: "Sends a message now, to this conversation by default or to another channel and recipient.".to_owned(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "text": {"type": "string"},
                    "channel": {"type": "string", "description": "Defaults to this conversation's channel."},
                    "recipient": {"type": "string", "description": "Defaults to this conversation's sender."}
                },
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
            let services = ctx
                .services
                .as_ref()
                .ok_or_else(|| ToolError("no runtime".into()))?;
            let text = arguments["text"]
                .as_str()
                .filter(|t| !t.trim().is_empty())
                .ok_or_else(|| ToolError("text is required".into()))?
                .to_owned();
            let channel = arguments["channel"]
                .as_str()
                .unwrap_or(&ctx.channel)
                .to_owned();
            let recipient = arguments["recipient"]
                .as_str()
                .unwrap_or(&ctx.sender_id)
                .to_owned();
            // Back to this conversation, the message goes where its reply goes (a chat app's
            // chat and thread); elsewhere, the channel has only the recipient to go by.
            let mut metadata = if channel == ctx.channel && recipient == ctx.sender_id {
                ctx.route.clone()
            } else {
                std::collections::HashMap::new()
            };
            metadata.insert(
                agentloop_proto::SENT_BY_TOOL.to_owned(),
                ctx.call_id.clone(),
            );
            let message = OutboundMessage {
                run_id: ctx.run_id.clone(),
                session_key: ctx.session_key.clone(),
                session_id: ctx.session_id.clone(),
                channel: channel.clone(),
                recipient: recipient.clone(),
                text: text.clone(),
                r#final: false,
                metadata,
                ts: Some(agentloop_proto::now()),
                ..Default::default()
            };
            // Keyed by the call, so a resumed run that repeats the call does not send twice.
            let msg_id = run_msg_id(&ctx.run_id, RunMessage::Sent(&ctx.call_id));
            services
                .bus
                .publish_durable(
                    services.bus.subjects().outbound(&channel),
                    &message,
                    Some(&msg_id),
                )
                .await
                .map_err(|e| {
                    ToolError(format!("send failed: {}", agentloop_bus::error_chain(&e)))
                })?;
            if let Some(sends) = &ctx.sends {
                // A poisoned list is still a list: a panic elsewhere must not lose this send.
                let mut sends = sends
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                sends.push(SentMessage {
                    channel: channel.clone(),
                    recipient,
                    text,
                });
            }
            Ok(format!("sent to {channel}"))
        })
    }
}
