//! `agentloop send SESSION TEXT`: sends one message through the gateway's OpenAI-compatible API
//! and prints the final reply. Also the HTTP client `agentloop chat` shares.

use anyhow::{Context as _, bail};
use futures::StreamExt as _;
use serde_json::{Value, json};

/// Where the gateway is and how to authenticate, from flags, environment and config.
pub(crate) struct GatewayClient {
    http: reqwest::Client,
    url: String,
    token: Option<String>,
}

impl GatewayClient {
    /// Reads `--url`/`AGENTLOOP_GATEWAY_URL` (else `http://<gateway.listen>`) and
    /// `--token`/`AGENTLOOP_TOKEN` (else the first configured token).
    pub(crate) fn from_args(args: &[String]) -> anyhow::Result<Self> {
        let config: agentloop_gateway::GatewayConfig =
            agentloop_lifecycle::load_config().context("failed to load config")?;
        let url = flag(args, "--url")
            .or_else(|| std::env::var("AGENTLOOP_GATEWAY_URL").ok())
            .unwrap_or_else(|| format!("http://{}", config.gateway.listen));
        let token = flag(args, "--token")
            .or_else(|| std::env::var("AGENTLOOP_TOKEN").ok())
            .or_else(|| {
                let first = config.gateway.tokens.first();
                first.map(|grant| grant.token.expose().to_owned())
            });
        Ok(Self {
            http: reqwest::Client::new(),
            url: url.trim_end_matches('/').to_owned(),
            token,
        })
    }

    /// Sends `text` to `session` and calls `on_delta` with each piece of the reply as it
    /// streams; returns the whole reply.
    pub(crate) async fn ask(
        &self,
        session: &str,
        text: &str,
        mut on_delta: impl FnMut(&str),
    ) -> anyhow::Result<String> {
        let mut request = self
            .http
            .post(format!("{}/v1/chat/completions", self.url))
            .header("X-Session-Key", session)
            .json(&json!({"model": "agentloop", "stream": true,
                          "messages": [{"role": "user", "content": text}]}));
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let response = request
            .send()
            .await
            .with_context(|| format!("cannot reach the gateway at {}", self.url))?;
        if !response.status().is_success() {
            let status = response.status();
            let body: Value = response.json().await.unwrap_or_default();
            bail!("gateway answered {status}: {}", body["error"]["message"]);
        }
        let mut reply = String::new();
        let mut pending = String::new();
        let mut body = response.bytes_stream();
        while let Some(bytes) = body.next().await {
            pending.push_str(&String::from_utf8_lossy(
                &bytes.context("reply stream broke")?,
            ));
            // SSE events end with a blank line; keep a partial one for the next read.
            while let Some(end) = pending.find("\n\n") {
                let event: String = pending.drain(..end + 2).collect();
                for data in event.lines().filter_map(|l| l.strip_prefix("data: ")) {
                    if data == "[DONE]" {
                        return Ok(reply);
                    }
                    let chunk: Value = serde_json::from_str(data).context("bad stream chunk")?;
                    if let Some(message) = chunk["error"]["message"].as_str() {
                        bail!("{message}");
                    }
                    if let Some(delta) = chunk["choices"][0]["delta"]["content"].as_str() {
                        on_delta(delta);
                        reply.push_str(delta);
                    }
                }
            }
        }
        Ok(reply)
    }
}

/// Returns the value after `name` in `args`.
fn flag(args: &[String], name: &str) -> Option<String> {
    let at = args.iter().position(|a| a == name)?;
    args.get(at + 1).cloned()
}

/// Returns the positional arguments after the subcommand (flags and their values removed).
pub(crate) fn positional(args: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut skip = false;
    for arg in args.iter().skip(1) {
        if skip {
            skip = false;
        } else if matches!(arg.as_str(), "--url" | "--token" | "--config") {
            skip = true;
        } else {
            out.push(arg.clone());
        }
    }
    out.into_iter().skip(1).collect()
}

/// Runs `agentloop send SESSION TEXT`.
pub(crate) async fn run(args: &[String]) -> anyhow::Result<()> {
    let positional = positional(args);
    let [session, words @ ..] = positional.as_slice() else {
        bail!("usage: agentloop send SESSION TEXT [--url URL] [--token TOKEN]");
    };
    if words.is_empty() {
        bail!("usage: agentloop send SESSION TEXT [--url URL] [--token TOKEN]");
    }
    let client = GatewayClient::from_args(args)?;
    let reply = client.ask(session, &words.join(" "), |_| {}).await?;
    println!("{reply}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positional_arguments_skip_the_subcommand_and_flag_values() {
        let args: Vec<String> = [
            "agentloop",
            "send",
            "--url",
            "http://x",
            "cli:a",
            "hi",
            "there",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(positional(&args), ["cli:a", "hi", "there"]);
        assert_eq!(flag(&args, "--url").as_deref(), Some("http://x"));
    }
}
