//! An example remote tool process: `word_count` and `reverse_text`, served over NATS.
//! `NATS_URL` (default nats://127.0.0.1:4222) and `AGENTLOOP_BUS__PREFIX` (default agentloop);
//! `AGENTLOOP_BUS__USER`/`AGENTLOOP_BUS__PASSWORD` log in (as `tool` with the shipped users).

use std::sync::Arc;

use anyhow::Context as _;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use agentloop_tool_server::{RemoteTool, ToolServer};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let url = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned());
    let prefix = std::env::var("AGENTLOOP_BUS__PREFIX").unwrap_or_else(|_| "agentloop".to_owned());
    let word_count = RemoteTool {
        name: "word_count".to_owned(),
        description: "Counts the words of a text.".to_owned(),
        parameters: json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}),
        parallel_safe: true,
        timeout_ms: Some(5_000),
        handler: Arc::new(|args| {
            Box::pin(async move {
                let text = args["text"].as_str().ok_or("text is required")?;
                Ok(text.split_whitespace().count().to_string())
            })
        }),
    };
    let reverse = RemoteTool {
        name: "reverse_text".to_owned(),
        description: "Reverses a text.".to_owned(),
        parameters: json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}),
        parallel_safe: true,
        timeout_ms: Some(5_000),
        handler: Arc::new(|args| {
            Box::pin(async move {
                let text = args["text"].as_str().ok_or("text is required")?;
                Ok(text.chars().rev().collect())
            })
        }),
    };
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        stop.cancel();
    });
    // A NATS run with agentloop's users needs a login (the `tool` user).
    let options = match std::env::var("AGENTLOOP_BUS__USER") {
        Ok(user) if !user.is_empty() => async_nats::ConnectOptions::with_user_and_password(
            user,
            std::env::var("AGENTLOOP_BUS__PASSWORD").unwrap_or_default(),
        ),
        _ => async_nats::ConnectOptions::new(),
    };
    let server = ToolServer::connect_with(&url, &prefix, options)
        .await
        .context("example tool cannot reach nats")?
        .tool(word_count)
        .tool(reverse);
    server
        .serve(shutdown, || {
            println!("ready: word_count, reverse_text on {prefix}.tool.*")
        })
        .await
        .context("example tool failed")
}
