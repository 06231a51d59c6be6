//! A sandbox whose runner calls an external hook, answered by the test over NATS.

use futures::StreamExt as _;
use serde_json::Value;

use agentloop_agent_runner::{ExternalHookConfig, HookPoint};

use super::{Sandbox, SandboxOptions};

impl Sandbox {
    /// Starts a sandbox whose runner calls a hook at `point` on a subject of its own, and answers
    /// every call with `answer` of the call's JSON body (the hook fails closed).
    pub async fn start_with_hook(
        point: HookPoint,
        answer: impl Fn(&Value) -> Value + Send + 'static,
    ) -> anyhow::Result<Self> {
        let hook_subject = format!("hooks{}.{}", &agentloop_bus::nuid()[24..], point.as_str());
        let subject = hook_subject.clone();
        let sandbox = Self::start_with(SandboxOptions {
            runner: Some(Box::new(move |config| {
                config.runner.hooks.push(ExternalHookConfig {
                    point,
                    subject,
                    timeout_ms: 2_000,
                    fail_open: false,
                });
            })),
            ..Default::default()
        })
        .await?;
        let mut calls = sandbox.client.subscribe(hook_subject).await?;
        let client = sandbox.client.clone();
        tokio::spawn(async move {
            while let Some(call) = calls.next().await {
                let body: Value = serde_json::from_slice(&call.payload).unwrap_or_default();
                if let Some(reply) = call.reply {
                    let _ = client
                        .publish(reply, answer(&body).to_string().into())
                        .await;
                }
            }
        });
        Ok(sandbox)
    }
}
