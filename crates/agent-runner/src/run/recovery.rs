//! The recovery chain of a failed model call, in order: context overflow → compact the history
//! into a summary and retry (at most 3 times); auth, rate-limit or timeout → next auth profile
//! of the provider, the failed one cooling down (in Postgres, so every replica honours it);
//! unsupported thinking level → lower it; anything else → next model of the fallback chain;
//! then a clear error. A model whose known context window is too small is skipped unasked.

use std::collections::HashSet;

use serde_json::json;
use tracing::Instrument as _;

use agentloop_model::{
    ChatMessage, ChatRequest, Credential, ErrorKind, ModelError, ModelRef, StreamEvent, ToolCall,
    ToolSpec, Usage, redact_secrets,
};
use agentloop_proto::v1::{Entry, ReportProfileFailureRequest};
use agentloop_proto::{EntryKey, EventPhase};

use super::{RunCtx, RunState};
use crate::error::MemoryCallError;
use crate::prompt;

/// At most this many compactions per run.
const MAX_COMPACTIONS: u32 = 3;

/// Yields allowed per streamed piece while gathering a burst into one delta event. One is
/// usually enough for the HTTP connection task to hand over the next chunk already read; a
/// couple more cover it running on the other worker thread.
const BURST_YIELDS: usize = 3;

/// What the model answered, and who answered it.
pub(super) struct Answer {
    pub(super) text: String,
    pub(super) calls: Vec<ToolCall>,
}

/// Who answered a run's last model turn.
#[derive(Debug, Clone, Default)]
pub(super) struct AnsweredBy {
    pub(super) model: String,
    pub(super) provider: String,
    pub(super) profile: String,
}

/// The conversation a turn sends, with the part before this run that compaction may replace.
pub(super) struct Context<'m> {
    pub(crate) messages: &'m mut Vec<ChatMessage>,
    /// Messages before this run's input: what a compaction summarizes.
    pub(crate) prior: usize,
    /// The transcript seq the prior messages reach up to.
    pub(crate) prior_through_seq: i64,
    /// Lent to each request like the messages: a copy would be held for the whole model wait.
    pub(crate) system: &'m mut String,
    /// The agent's tool specs, shared by every request of every run.
    pub(crate) tools: &'m std::sync::Arc<[ToolSpec]>,
    pub(crate) compactions: u32,
}

/// One auth profile: a name and the credentials to send (`None`: the provider's configured key).
struct Profile {
    name: String,
    credential: Option<Credential>,
    /// Whether cooldowns apply: a provider with a single implicit profile has nothing to switch to.
    tracked: bool,
}

fn lower(level: Option<String>) -> Option<String> {
    match level.as_deref() {
        Some("high") => Some("medium".to_owned()),
        Some("medium") => Some("low".to_owned()),
        _ => None,
    }
}

impl RunCtx<'_> {
    /// Calls the model with the recovery chain and streams deltas of the successful attempt.
    pub(super) async fn answer(
        &self,
        state: &mut RunState,
        cx: &mut Context<'_>,
    ) -> Result<Result<Answer, String>, MemoryCallError> {
        let config = &self.replica.models_config;
        let mut chain = vec![self.model_name.clone()];
        for fallback in &config.fallbacks {
            if !chain.contains(fallback) {
                chain.push(fallback.clone());
            }
        }
        let mut failures: Vec<String> = Vec::new();
        for model_name in chain {
            let model = match ModelRef::parse(&model_name) {
                Ok(model) => model,
                Err(err) => {
                    failures.push(format!("{model_name}: {err}"));
                    continue;
                }
            };
            if let Some(window) = config.context_windows.get(&model_name) {
                let needed = prompt::estimate_request(cx.messages, cx.system.as_str(), cx.tools)
                    + self.agent.reserve_tokens;
                if *window < needed {
                    tracing::warn!(model = %model_name, window, needed, "model skipped: its context window is too small");
                    failures.push(format!("{model_name}: context window of {window} tokens is too small (about {needed} needed)"));
                    continue;
                }
            }
            let provider = model.provider.as_str().to_owned();
            let profiles = Box::pin(self.usable_profiles(&provider)).await;
            if profiles.is_empty() {
                failures.push(format!("{model_name}: every auth profile is cooling down"));
                continue;
            }
            let mut thinking = (!config.thinking.is_empty()).then(|| config.thinking.clone());
            let mut index = 0;
            while index < profiles.len() {
                let profile = &profiles[index];
                // The conversation is lent to the request, not copied (it is the session's
                // whole history), and comes back for the next turn, retry or compaction.
                let mut request = ChatRequest {
                    model: model.clone(),
                    system: Some(std::mem::take(cx.system)),
                    messages: std::mem::take(cx.messages),
                    tools: cx.tools.clone(),
                    max_tokens: None,
                    thinking: thinking.clone(),
                    credential: profile.credential.clone(),
                };
                let streamed = self.stream_turn(&request, &mut state.usage).await;
                *cx.messages = std::mem::take(&mut request.messages);
                *cx.system = request.system.take().unwrap_or_default();
                let err = match streamed {
                    Ok(answer) => {
                        if profile.tracked {
                            Box::pin(self.profile_succeeded(&provider, &profile.name)).await;
                        }
                        state.answered = AnsweredBy {
                            model: model_name.clone(),
                            provider: provider.clone(),
                            profile: profile.name.clone(),
                        };
                        return Ok(Ok(answer));
                    }
                    Err(err) => err,
                };
                // The provider's text (which can quote the API key) stays in the log, masked;
                // the user, the events and Postgres get only its class.
                let detail = agentloop_bus::error_chain(&err);
                tracing::warn!(model = %model_name, profile = %profile.name, kind = ?err.kind(), error = %redact_secrets(&detail), "model call failed");
                let text = match err.status() {
                    Some(status) => format!("{} (HTTP {status})", err.label()),
                    None => err.label().to_owned(),
                };
                match err.kind() {
                    ErrorKind::ContextOverflow if cx.compactions < MAX_COMPACTIONS => {
                        cx.compactions += 1;
                        if !Box::pin(self.compact(state, cx, &request)).await? {
                            failures
                                .push(format!("{model_name}: {text} (nothing left to compact)"));
                            break;
                        }
                    }
                    ErrorKind::Auth | ErrorKind::RateLimit | ErrorKind::Timeout => {
                        if profile.tracked {
                            Box::pin(self.profile_failed(&provider, &profile.name, &text)).await;
                        }
                        failures.push(format!("{model_name} ({}): {text}", profile.name));
                        index += 1;
                    }
                    ErrorKind::UnsupportedThinking if thinking.is_some() => {
                        let lowered = lower(thinking.take());
                        tracing::info!(model = %model_name, thinking = ?lowered, "lowering the thinking level");
                        thinking = lowered;
                    }
                    _ => {
                        failures.push(format!("{model_name}: {text}"));
                        break;
                    }
                }
            }
        }
        Ok(Err(format!("every model failed: {}", failures.join("; "))))
    }

    /// The provider's profiles in configured order, without those cooling down.
    async fn usable_profiles(&self, provider: &str) -> Vec<Profile> {
        let configured: Vec<Profile> = self
            .replica
            .models_config
            .profiles
            .iter()
            .filter(|p| p.provider == provider)
            .map(|p| Profile {
                name: p.name.clone(),
                credential: Some(Credential {
                    api_key: p.api_key.clone(),
                    base_url: p.base_url.clone(),
                }),
                tracked: true,
            })
            .collect();
        if configured.is_empty() {
            return vec![Profile {
                name: "default".to_owned(),
                credential: None,
                tracked: false,
            }];
        }
        let cooling: HashSet<String> = match self.replica.memory.cooldowns(provider).await {
            Ok(profiles) => profiles.into_iter().collect(),
            Err(err) => {
                // Without the shared view, trying every profile is better than trying none.
                tracing::warn!(error = %err, "cooldowns unavailable, trying every profile");
                HashSet::new()
            }
        };
        configured
            .into_iter()
            .filter(|p| !cooling.contains(&p.name))
            .collect()
    }

    async fn profile_failed(&self, provider: &str, profile: &str, error: &str) {
        let config = &self.replica.models_config;
        let reported = self
            .replica
            .memory
            .profile_failed(ReportProfileFailureRequest {
                provider: provider.to_owned(),
                profile: profile.to_owned(),
                error: error.to_owned(),
                base_ms: config.cooldown_base_ms,
                max_ms: config.cooldown_max_ms,
            })
            .await;
        match reported {
            Ok(cooldown) => {
                tracing::warn!(
                    provider,
                    profile,
                    failures = cooldown.failures,
                    "auth profile put in cooldown"
                );
            }
            Err(err) => {
                tracing::warn!(error = %err, "could not record the profile's cooldown")
            }
        }
    }

    async fn profile_succeeded(&self, provider: &str, profile: &str) {
        self.replica
            .memory
            .profile_succeeded(provider, profile)
            .await;
    }

    /// One streamed model call: emits deltas, returns the text and the tool calls.
    async fn stream_turn(
        &self,
        request: &ChatRequest,
        usage: &mut Usage,
    ) -> Result<Answer, ModelError> {
        let _permit = self.replica.model_slots.acquire().await;
        let started = std::time::Instant::now();
        let mut first_token: Option<std::time::Duration> = None;
        let span = tracing::info_span!(
            "model_call",
            provider = request.model.provider.as_str(),
            model = %request.model.model,
            outcome = tracing::field::Empty,
            first_token_ms = tracing::field::Empty,
            input_tokens = tracing::field::Empty,
            output_tokens = tracing::field::Empty,
        );
        let before = (usage.input_tokens, usage.output_tokens);
        let result = self
            .stream_call(request, usage, started, &mut first_token)
            .instrument(span.clone())
            .await;
        span.record(
            "outcome",
            match &result {
                Ok(_) => "ok".to_owned(),
                Err(err) => format!("{:?}", err.kind()).to_lowercase(),
            },
        );
        if let Some(first) = first_token {
            span.record("first_token_ms", first.as_millis() as u64);
        }
        span.record("input_tokens", usage.input_tokens - before.0);
        span.record("output_tokens", usage.output_tokens - before.1);
        self.model_metrics(request, started, first_token, &result);
        result
    }

    /// Counts a model call: its duration, its time to the first token and its error class.
    fn model_metrics(
        &self,
        request: &ChatRequest,
        started: std::time::Instant,
        first_token: Option<std::time::Duration>,
        result: &Result<Answer, ModelError>,
    ) {
        let metrics = &self.replica.metrics;
        let provider = request.model.provider.as_str().to_owned();
        let model = request.model.model.clone();
        let outcome = match result {
            Ok(_) => "ok".to_owned(),
            Err(err) => format!("{:?}", err.kind()).to_lowercase(),
        };
        metrics
            .model_seconds
            .get_or_create(&vec![
                ("provider", provider.clone()),
                ("model", model.clone()),
                ("outcome", outcome),
            ])
            .observe(started.elapsed().as_secs_f64());
        if let Some(first) = first_token {
            metrics
                .first_token_seconds
                .get_or_create(&vec![("provider", provider), ("model", model)])
                .observe(first.as_secs_f64());
        }
    }

    /// The streamed call itself; `first_token` is set when the first text or tool call arrives.
    async fn stream_call(
        &self,
        request: &ChatRequest,
        usage: &mut Usage,
        started: std::time::Instant,
        first_token: &mut Option<std::time::Duration>,
    ) -> Result<Answer, ModelError> {
        // This future is held for the whole model wait of every run in flight, so only the
        // chunk wait is inline: the call's start, each delta and each progress edit are awaited
        // boxed (inline, the largest of them sized the run's future for its whole life).
        let mut stream = Box::pin(self.replica.models.stream(request)).await?;
        let mut text = String::new();
        let mut calls = Vec::new();
        // What ended a burst, handled after the burst's delta went out (an error included, so
        // the text before it is not lost from the events).
        let mut held: Option<Result<StreamEvent, ModelError>> = None;
        let mut ended = false;
        // A channel that edits its message in place gets the text so far, at most this often.
        let progress_every = self.progress_every();
        let mut last_progress = tokio::time::Instant::now();
        loop {
            let event = match held.take() {
                Some(event) => event?,
                None if ended => break,
                None => match stream.next().await {
                    Some(event) => event?,
                    None => break,
                },
            };
            if first_token.is_none() && !matches!(event, StreamEvent::Done { .. }) {
                *first_token = Some(started.elapsed());
            }
            match event {
                StreamEvent::TextDelta(mut delta) => {
                    // Pieces that have already arrived go out as one event: a burst costs one
                    // message instead of one per piece. The HTTP client hands the body over one
                    // chunk per poll (its connection task sends the next one when asked), so a
                    // piece that came in the same read shows up only after that task has run.
                    // Hence a few yields per piece: a few passes through the runtime's queue,
                    // no timer, and a piece still on its way is not waited for.
                    loop {
                        let mut next = stream.next_ready();
                        for _ in 0..BURST_YIELDS {
                            if next.is_some() {
                                break;
                            }
                            tokio::task::yield_now().await;
                            next = stream.next_ready();
                        }
                        match next {
                            Some(Some(Ok(StreamEvent::TextDelta(more)))) => delta.push_str(&more),
                            Some(Some(next)) => {
                                held = Some(next);
                                break;
                            }
                            Some(None) => {
                                ended = true;
                                break;
                            }
                            None => break,
                        }
                    }
                    // Per piece: a secret cut across two pieces is caught in the text so far
                    // (progress) and in the answer (turns.rs), not here.
                    Box::pin(
                        self.events
                            .delta(&agentloop_scanner::redact::redact(&delta)),
                    )
                    .await;
                    text.push_str(&delta);
                    if let Some(every) = progress_every
                        && last_progress.elapsed() >= every
                    {
                        last_progress = tokio::time::Instant::now();
                        Box::pin(self.progress(&text)).await;
                    }
                }
                StreamEvent::ToolCall(call) => calls.push(call),
                StreamEvent::Done { usage: used, .. } => {
                    usage.input_tokens += used.input_tokens;
                    usage.output_tokens += used.output_tokens;
                }
            }
        }
        Ok(Answer { text, calls })
    }

    /// Replaces the conversation before this run with a summary, stored in the transcript so
    /// later runs start from it. Returns false when there is nothing before this run to compact.
    async fn compact(
        &self,
        state: &mut RunState,
        cx: &mut Context<'_>,
        failed: &ChatRequest,
    ) -> Result<bool, MemoryCallError> {
        let attempt = cx.compactions;
        if cx.prior < 2 {
            return Ok(false);
        }
        self.events
            .compaction(
                EventPhase::Start,
                json!({ "attempt": attempt, "messages": cx.prior }),
            )
            .await;
        let transcript = render(&cx.messages[..cx.prior]);
        let request = ChatRequest {
            model: failed.model.clone(),
            system: Some(
                "You compress conversations. Summarize the conversation below in a few short \
                 paragraphs: facts, decisions, open questions, anything the assistant must remember."
                    .to_owned(),
            ),
            messages: vec![ChatMessage::user(transcript.clone())],
            tools: std::sync::Arc::default(),
            max_tokens: Some(1_024),
            thinking: None,
            credential: failed.credential.clone(),
        };
        let summary = match self.replica.models.complete(&request).await {
            Ok(response) if !response.text.trim().is_empty() => {
                state.usage.input_tokens += response.usage.input_tokens;
                state.usage.output_tokens += response.usage.output_tokens;
                response.text
            }
            Ok(_) | Err(_) => {
                // A summary that loses detail beats no answer at all.
                tracing::warn!("the model could not summarize; keeping the start of each message");
                mechanical_summary(&cx.messages[..cx.prior])
            }
        };
        self.append(
            state,
            vec![Entry {
                key: self.key(EntryKey::Compaction(attempt)),
                role: "summary".to_owned(),
                content: summary.clone(),
                run_id: self.run.id.clone(),
                data: json!({ "throughSeq": cx.prior_through_seq }).to_string(),
                ..Default::default()
            }],
        )
        .await?;
        let replaced = cx.prior;
        cx.messages
            .splice(..cx.prior, [prompt::summary_message(&summary)]);
        cx.prior = 1;
        self.events
            .compaction(EventPhase::End, json!({ "attempt": attempt, "replacedMessages": replaced, "summaryChars": summary.len() }))
            .await;
        Ok(true)
    }
}

fn render(messages: &[ChatMessage]) -> String {
    let mut text = String::new();
    for message in messages {
        let line = match message {
            ChatMessage::User { content } => format!("User: {content}\n"),
            ChatMessage::Assistant {
                content,
                tool_calls,
            } => {
                let calls: Vec<&str> = tool_calls.iter().map(|c| c.name.as_str()).collect();
                if calls.is_empty() {
                    format!("Assistant: {content}\n")
                } else {
                    format!("Assistant: {content} [called {}]\n", calls.join(", "))
                }
            }
            ChatMessage::Tool { content, .. } => format!("Tool result: {content}\n"),
        };
        text.push_str(&line);
    }
    // The summarizer must fit where the conversation did not.
    crate::events::cap(&text, 48_000)
}

fn mechanical_summary(messages: &[ChatMessage]) -> String {
    let mut text = String::from("Earlier conversation (shortened):\n");
    for line in render(messages).lines() {
        text.push_str(&crate::events::cap(line, 200));
        text.push('\n');
    }
    crate::events::cap(&text, 8_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thinking_levels_step_down_to_none() {
        assert_eq!(lower(Some("high".into())).as_deref(), Some("medium"));
        assert_eq!(lower(Some("medium".into())).as_deref(), Some("low"));
        assert_eq!(lower(Some("low".into())), None);
        assert_eq!(lower(None), None);
    }
}
