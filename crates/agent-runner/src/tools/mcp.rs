//! Tools of MCP servers (`[mcp.servers.<name>]`): each server is reached at the runner's start,
//! as a child process speaking MCP over stdio (`command`) or at a streamable HTTP endpoint
//! (`url`), through the official SDK (`rmcp`); its tools are listed once and offered to the
//! model as `<server>__<tool>`. A server that does not start or answer is
//! logged and left out: the runner serves without its tools rather than not at all.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use rmcp::RoleClient;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{RunningService, ServiceExt as _};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};

use agentloop_model::{Secret, ToolSpec};

use super::{Tool, ToolContext, ToolError};

/// One MCP server the runner starts.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(default)]
pub struct McpServerConfig {
    /// The program to run (found on `PATH` unless a path), for a server over stdio.
    pub command: String,
    /// The streamable HTTP endpoint (`https://host/mcp`) of a server run elsewhere; instead
    /// of `command`.
    pub url: String,
    /// With `url`: sent as `Authorization: Bearer <token>` (never logged).
    pub bearer_token: Secret,
    /// With `url`: more headers sent with every request (`X-Api-Key`, ...); their values are
    /// never logged either.
    pub headers: BTreeMap<String, Secret>,
    /// Its arguments.
    pub args: Vec<String>,
    /// Environment variables it gets besides the runner's.
    pub env: BTreeMap<String, String>,
    /// How long starting it and listing its tools may take, in ms (default 20000).
    pub start_timeout_ms: u64,
}

/// `[mcp]`: the MCP servers whose tools every agent may be offered.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(default)]
pub struct McpConfig {
    /// Servers by name; the name prefixes their tools' names.
    pub servers: BTreeMap<String, McpServerConfig>,
}

type Client = RunningService<RoleClient, ()>;

/// A tool of an MCP server.
struct McpTool {
    client: Arc<Client>,
    /// The tool's name on its server.
    remote: String,
    spec: ToolSpec,
}

/// The name a server's tool is offered under: `<server>__<tool>`, with anything a model
/// provider refuses in a tool name (outside `[A-Za-z0-9_-]`) replaced by `_`.
pub(crate) fn offered_name(server: &str, tool: &str) -> String {
    format!("{server}__{tool}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect()
}

/// The text of a tool's result: its text blocks, one per line; other blocks as JSON. A result
/// the server flags as an error is the tool's error.
fn result_text(result: CallToolResult) -> Result<String, ToolError> {
    let mut text = String::new();
    for block in &result.content {
        if !text.is_empty() {
            text.push('\n');
        }
        match block.as_text() {
            Some(t) => text.push_str(&t.text),
            None => text.push_str(&serde_json::to_string(block).unwrap_or_default()),
        }
    }
    if text.is_empty()
        && let Some(structured) = &result.structured_content
    {
        text = structured.to_string();
    }
    if result.is_error == Some(true) {
        return Err(ToolError(text));
    }
    Ok(text)
}

impl Tool for McpTool {
    fn spec(&self) -> ToolSpec {
        self.spec.clone()
    }

    fn call<'a>(
        &'a self,
        _ctx: &'a ToolContext,
        arguments: serde_json::Value,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let serde_json::Value::Object(arguments) = arguments else {
                return Err(ToolError(
                    "the arguments of an MCP tool must be a JSON object".to_owned(),
                ));
            };
            let params = CallToolRequestParams::new(self.remote.clone()).with_arguments(arguments);
            let result = self
                .client
                .call_tool(params)
                .await
                .map_err(|err| ToolError(format!("MCP server: {err}")))?;
            result_text(result)
        })
    }
}

/// Starts every configured server and returns its tools; a server that fails is logged with
/// the reason and left out.
pub(crate) async fn connect_all(config: &McpConfig) -> Vec<Arc<dyn Tool>> {
    let mut tools: Vec<Arc<dyn Tool>> = Vec::new();
    for (name, server) in &config.servers {
        let timeout = Duration::from_millis(if server.start_timeout_ms == 0 {
            20_000
        } else {
            server.start_timeout_ms
        });
        match tokio::time::timeout(timeout, connect(name, server)).await {
            Ok(Ok(found)) => {
                tracing::info!(server = %name, tools = found.len(), "MCP server connected");
                tools.extend(found);
            }
            Ok(Err(reason)) => {
                tracing::error!(server = %name, command = %server.command, url = %server.url, error = %reason, "MCP server left out");
            }
            Err(_) => {
                tracing::error!(server = %name, command = %server.command, url = %server.url, timeout_ms = timeout.as_millis(), "MCP server left out: no tool list within its start timeout");
            }
        }
    }
    tools
}

async fn connect(name: &str, server: &McpServerConfig) -> Result<Vec<Arc<dyn Tool>>, String> {
    let client = match (server.command.trim(), server.url.trim()) {
        ("", "") => return Err("neither a command nor a url is configured".to_owned()),
        (_, "") => {
            let mut command = tokio::process::Command::new(&server.command);
            command
                .args(&server.args)
                .envs(&server.env)
                .stderr(std::process::Stdio::null())
                .kill_on_drop(true);
            let transport =
                TokioChildProcess::new(command).map_err(|err| format!("cannot start: {err}"))?;
            ().serve(transport).await
        }
        ("", url) => {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(format!("url {url:?} is not http:// or https://"));
            }
            // The HTTP client's TLS takes the process's crypto provider; ring is the one the
            // rest of the program uses. Installing it a second time is refused, harmlessly.
            let _ = rustls::crypto::ring::default_provider().install_default();
            let mut config = StreamableHttpClientTransportConfig::with_uri(url)
                .custom_headers(headers(&server.headers)?);
            if !server.bearer_token.is_empty() {
                config = config.auth_header(server.bearer_token.expose());
            }
            ().serve(StreamableHttpClientTransport::from_config(config))
                .await
        }
        _ => return Err("both a command and a url are configured; give one".to_owned()),
    }
    .map_err(|err| format!("no MCP handshake: {err}"))?;
    let listed = client
        .list_all_tools()
        .await
        .map_err(|err| format!("tools/list failed: {err}"))?;
    let client = Arc::new(client);
    Ok(listed
        .into_iter()
        .map(|tool| {
            let spec = ToolSpec {
                name: offered_name(name, &tool.name),
                description: tool.description.as_deref().unwrap_or_default().to_owned(),
                parameters: serde_json::Value::Object((*tool.input_schema).clone()),
            };
            Arc::new(McpTool {
                client: client.clone(),
                remote: tool.name.into_owned(),
                spec,
            }) as Arc<dyn Tool>
        })
        .collect())
}

/// The configured headers as HTTP headers, or which one is not one.
fn headers(
    configured: &BTreeMap<String, Secret>,
) -> Result<std::collections::HashMap<http::HeaderName, http::HeaderValue>, String> {
    configured
        .iter()
        .map(|(name, value)| {
            let name = http::HeaderName::try_from(name.as_str())
                .map_err(|_| format!("headers: {name:?} is no header name"))?;
            let mut value = http::HeaderValue::try_from(value.expose())
                .map_err(|_| format!("headers: the value of {name} is no header value"))?;
            value.set_sensitive(true);
            Ok((name, value))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_is_offered_under_its_servers_name_in_characters_providers_accept() {
        assert_eq!(offered_name("everything", "echo"), "everything__echo");
        assert_eq!(
            offered_name("my server", "get.weather"),
            "my_server__get_weather"
        );
        assert_eq!(offered_name("s", &"x".repeat(100)).len(), 64);
    }

    #[test]
    fn configured_headers_are_checked_by_name() {
        let mut configured = BTreeMap::new();
        configured.insert("X-Api-Key".to_owned(), Secret::from("k1"));
        assert_eq!(headers(&configured).unwrap().len(), 1);
        configured.insert("bad header".to_owned(), Secret::from("v"));
        assert!(headers(&configured).unwrap_err().contains("bad header"));
        let mut broken = BTreeMap::new();
        broken.insert("X-Ok".to_owned(), Secret::from("line\nbreak"));
        assert!(headers(&broken).unwrap_err().contains("x-ok"));
    }
}
