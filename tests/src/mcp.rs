//! Tools of a real MCP server nobody here wrote (`@modelcontextprotocol/server-everything`, from
//! npm, installed by `tests/mcp/setup.sh`), started by the runner over stdio: the fake model's
//! call of its `echo` tool reaches it and the result reaches the reply. A server that cannot
//! start leaves the runner answering without its tools.

use std::path::PathBuf;

use agentloop_agent_runner::{McpServerConfig, RunnerConfig};

use crate::harness::{Sandbox, SandboxOptions};
use crate::knowledge::{ask, request_for};

fn everything() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("mcp/node_modules/.bin/mcp-server-everything")
}

#[tokio::test]
async fn the_model_calls_a_real_mcp_servers_tool_over_stdio_and_a_broken_server_is_left_out() {
    let server = everything();
    assert!(
        server.exists(),
        "{} is missing: run `bash tests/mcp/setup.sh` (./scripts/test.sh does)",
        server.display()
    );
    let options = SandboxOptions {
        runner: Some(Box::new(move |config: &mut RunnerConfig| {
            config.mcp.servers.insert(
                "everything".into(),
                McpServerConfig {
                    command: server.display().to_string(),
                    args: vec!["stdio".into()],
                    ..Default::default()
                },
            );
            config.mcp.servers.insert(
                "broken".into(),
                McpServerConfig {
                    command: "/nonexistent/mcp-server".into(),
                    ..Default::default()
                },
            );
        })),
        ..Default::default()
    };
    let sandbox = Sandbox::start_with(options).await.unwrap();
    let mut replies = sandbox.subscribe("deliver.>").await;
    let call = r#"[[tool:everything__echo:{"message":"hello from agentloop"}]]"#;
    let reply = ask(&sandbox, &mut replies, "mcp-1", "ann", "", call).await;
    assert!(
        reply.contains("Echo: hello from agentloop"),
        "the MCP tool's result did not reach the reply: {reply}"
    );
    let sent = request_for(&sandbox, call);
    let offered: Vec<&str> = sent["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["function"]["name"].as_str())
        .collect();
    assert!(offered.contains(&"everything__echo"), "{offered:?}");
    assert!(
        !offered.iter().any(|t| t.starts_with("broken__")),
        "{offered:?}"
    );
    sandbox.shutdown().await.unwrap();
}
