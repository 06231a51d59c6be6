//! Tools of a real MCP server nobody here wrote (`@modelcontextprotocol/server-everything`, from
//! npm, installed by `tests/mcp/setup.sh`), started by the runner over stdio: the fake model's
//! call of its `echo` tool reaches it and the result reaches the reply. A server that cannot
//! start leaves the runner answering without its tools.

use std::path::PathBuf;

use agentloop_agent_runner::{McpServerConfig, RunnerConfig};

use crate::harness::{Sandbox, SandboxOptions};
use crate::knowledge::{ask, request_for};

/// The tool names the model was offered with the request that carried `text`.
fn offered_tools(sandbox: &Sandbox, text: &str) -> Vec<String> {
    request_for(sandbox, text)["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["function"]["name"].as_str().map(str::to_owned))
        .collect()
}

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
    let offered = offered_tools(&sandbox, call);
    assert!(
        offered.iter().any(|t| t == "everything__echo"),
        "{offered:?}"
    );
    assert!(
        !offered.iter().any(|t| t.starts_with("broken__")),
        "{offered:?}"
    );
    sandbox.shutdown().await.unwrap();
}

/// A free loopback port (bound, then released for the server to take).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test]
async fn the_model_calls_a_real_mcp_servers_tool_over_streamable_http() {
    let server = everything();
    assert!(
        server.exists(),
        "{} is missing: run `bash tests/mcp/setup.sh` (./scripts/test.sh does)",
        server.display()
    );
    // The same npm server, run elsewhere as a streamable HTTP endpoint.
    let port = free_port();
    let _http_server = tokio::process::Command::new(&server)
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    agentloop_testkit::wait_until(
        "the MCP server listening",
        std::time::Duration::from_secs(20),
        || async move {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .ok()
        },
    )
    .await
    .unwrap();
    let url = format!("http://127.0.0.1:{port}/mcp");
    let options = SandboxOptions {
        runner: Some(Box::new(move |config: &mut RunnerConfig| {
            config.mcp.servers.insert(
                "remote".into(),
                McpServerConfig {
                    url,
                    ..Default::default()
                },
            );
            // Nothing listens there: left out, the runner serves on.
            config.mcp.servers.insert(
                "gone".into(),
                McpServerConfig {
                    url: format!("http://127.0.0.1:{}/mcp", free_port()),
                    start_timeout_ms: 3_000,
                    ..Default::default()
                },
            );
        })),
        ..Default::default()
    };
    let sandbox = Sandbox::start_with(options).await.unwrap();
    let mut replies = sandbox.subscribe("deliver.>").await;
    let call = r#"[[tool:remote__echo:{"message":"over http"}]]"#;
    let reply = ask(&sandbox, &mut replies, "mcp-http-1", "ann", "", call).await;
    assert!(
        reply.contains("Echo: over http"),
        "the MCP tool's result did not reach the reply: {reply}"
    );
    let offered = offered_tools(&sandbox, call);
    assert!(offered.iter().any(|t| t == "remote__echo"), "{offered:?}");
    assert!(
        !offered.iter().any(|t| t.starts_with("gone__")),
        "{offered:?}"
    );
    sandbox.shutdown().await.unwrap();
}
