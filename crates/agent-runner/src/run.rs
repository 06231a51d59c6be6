//! One run: the two-layer agent loop. The inner layer continues while the model asks for tools
//! or steering is pending; the owner's loop around it takes follow-ups. Every run ends with
//! exactly one lifecycle `end` (completed, max_turns, aborted) or `error` (error, timeout).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::join_all;
use prost::Message as _;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use agentloop_model::{ChatMessage, ToolCall, Usage};
use agentloop_proto::v1::{
    AppendEntriesRequest, Entry, FinishRunRequest, InboxItem, OutboundMessage, Run, RunCommand,
    TakeQueuedRequest,
};

mod set_aside;

use crate::AgentConfig;
use crate::control::SessionSignals;
use crate::error::MemoryCallError;
use crate::events::RunEvents;
use crate::history::{HistoryEntry, Role, Window};
use crate::hooks::HookPoint;
use crate::intake::Shared;
use crate::prompt;
use crate::recovery::{AnsweredBy, Context};
use crate::retry::{Backoff, retry};
use crate::tools::{SentMessage, Tool, ToolContext, ToolSet};
use set_aside::Why;

/// How a run ended.
struct Outcome {
    status: &'static str,
    text: String,
    error: String,
    model: String,
    provider: String,
    profile: String,
    usage: Usage,
    turns: u32,
}

impl Outcome {
    fn failed(status: &'static str, model: &str, error: String) -> Self {
        Self {
            status,
            text: String::new(),
            error,
            model: model.to_owned(),
            provider: String::new(),
            profile: String::new(),
            usage: Usage::default(),
            turns: 0,
        }
    }
}

/// Everything one run needs, shared by its tools.
pub(crate) struct RunCtx<'a> {
    pub(crate) shared: &'a Arc<Shared>,
    session_id: &'a str,
    epoch: i64,
    pub(crate) run: &'a Run,
    command: &'a RunCommand,
    /// The agent's key in the configured agents; "" for an unknown one.
    agent_key: &'a str,
    pub(crate) agent: Arc<AgentConfig>,
    pub(crate) model_name: String,
    signals: &'a Arc<SessionSignals>,
    pub(crate) events: RunEvents,
    sends: Arc<Mutex<Vec<SentMessage>>>,
    /// Tool calls asked for and not answered yet: if the run is cut, they get synthetic results.
    open_calls: Mutex<Vec<(u32, ToolCall)>>,
    pub(crate) usage: Mutex<Usage>,
    turns: std::sync::atomic::AtomicU32,
    /// Who answered the last model turn (after fallbacks and profile switches).
    pub(crate) answered: Mutex<AnsweredBy>,
    /// The run's input entries, written with its first persisted step (or its end) to save a
    /// round trip; until then the inbox row holds the input.
    unwritten: Mutex<Vec<Entry>>,
    /// The final answer's entry, written in the same transaction that finishes the run.
    final_entries: Mutex<Vec<Entry>>,
}

/// A tool call's outcome.
struct ToolOutcome {
    call: ToolCall,
    content: String,
    is_error: bool,
    /// What is stored in the transcript (a hook may rewrite it).
    stored: String,
}

/// The owner of a session, as a run sees it.
#[derive(Clone, Copy)]
pub(crate) struct Owner<'a> {
    pub(crate) session_id: &'a str,
    pub(crate) epoch: i64,
    pub(crate) lease_lost: &'a CancellationToken,
    pub(crate) signals: &'a Arc<SessionSignals>,
}

/// Runs one input; returns whether its last write gave the lease back.
pub(crate) async fn execute(
    shared: &Arc<Shared>,
    owner: Owner<'_>,
    item: InboxItem,
    run: Run,
    history: Window,
) -> Result<bool, MemoryCallError> {
    let Owner {
        session_id,
        epoch,
        lease_lost,
        signals,
    } = owner;
    let command = match RunCommand::decode(item.payload.as_slice()) {
        Ok(command) => command,
        Err(err) => {
            // Intake stored what it received; a corrupt row must still be consumed, not retried forever.
            tracing::error!(error = %err, seq = item.seq, "inbox item is not a RunCommand, finishing it as an error");
            let outcome = Outcome::failed(
                "error",
                "",
                format!("inbox item is not a RunCommand: {err}"),
            );
            return finish(shared, owner, &run, &item, &outcome, Vec::new()).await;
        }
    };
    let agent_id = if command.agent_id.is_empty() {
        "main"
    } else {
        command.agent_id.as_str()
    };
    // An unknown agent runs on the default config, under the key "" (see `toolset`).
    let (agent_key, agent) = match shared.agents.get_key_value(agent_id) {
        Some((key, agent)) => (key.as_str(), agent.clone()),
        None => ("", Arc::default()),
    };
    let model_name = if command.model.is_empty() {
        shared.default_model.clone()
    } else {
        command.model.clone()
    };
    let span = tracing::info_span!("run", run_id = %run.id, session_key = %command.session_key, attempt = run.attempts);
    agentloop_telemetry::set_parent_from_map(&span, &command.metadata);
    let ctx = RunCtx {
        shared,
        session_id,
        epoch,
        run: &run,
        command: &command,
        agent_key,
        agent,
        model_name,
        signals,
        events: RunEvents::new(
            shared.bus.clone(),
            &run.id,
            session_id,
            &command.session_key,
            shared.settings.tool_event_max_bytes,
        ),
        sends: Arc::new(Mutex::new(Vec::new())),
        open_calls: Mutex::new(Vec::new()),
        usage: Mutex::new(Usage::default()),
        turns: std::sync::atomic::AtomicU32::new(0),
        answered: Mutex::new(AnsweredBy::default()),
        unwritten: Mutex::new(Vec::new()),
        final_entries: Mutex::new(Vec::new()),
    };
    if let Some(why) = Why::exhausted(run.attempts) {
        return ctx.set_aside(owner, &item, why).instrument(span).await;
    }
    let executed = async {
        ctx.events
            .lifecycle("start", json!({ "model": ctx.model_name, "attempt": run.attempts, "agentId": agent_id }))
            .await;
        let abort = signals.start_run();
        let timeout_ms = if ctx.agent.run_timeout_ms > 0 {
            ctx.agent.run_timeout_ms
        } else {
            shared.settings.run_timeout_ms
        };
        let timeout = Duration::from_millis(timeout_ms);
        let outcome = tokio::select! {
            outcome = tokio::time::timeout(timeout, converse(&ctx, &item, history)) => match outcome {
                Ok(Ok(outcome)) => outcome,
                Ok(Err(err)) => {
                    signals.end_run();
                    return Err(err);
                }
                Err(_) => ctx.cut("timeout", format!("the run took longer than {timeout_ms} ms")),
            },
            () = abort.cancelled() => ctx.cut("aborted", "the run was aborted".to_owned()),
            () = lease_lost.cancelled() => {
                signals.end_run();
                return Err(MemoryCallError::LeaseLost("lease renewal refused".to_owned()));
            }
        };
        signals.end_run();
        if outcome.status != "completed" && outcome.status != "max_turns" {
            ctx.close_open_calls(outcome.status).await?;
        }
        ctx.reply(&outcome).await;
        let entries = ctx.take_unwritten();
        let released = finish(shared, owner, &run, &item, &outcome, entries).await?;
        let usage = json!({ "input_tokens": outcome.usage.input_tokens, "output_tokens": outcome.usage.output_tokens });
        match outcome.status {
            "completed" | "max_turns" | "aborted" => {
                if outcome.status == "completed" {
                    shared.metrics.runs_completed.inc();
                } else {
                    shared.metrics.runs_failed.inc();
                }
                ctx.events
                    .lifecycle("end", json!({ "reason": outcome.status, "model": outcome.model, "turns": outcome.turns, "usage": usage, "error": outcome.error }))
                    .await;
            }
            _ => {
                shared.metrics.runs_failed.inc();
                ctx.events
                    .lifecycle("error", json!({ "reason": outcome.status, "error": outcome.error, "model": outcome.model, "turns": outcome.turns }))
                    .await;
            }
        }
        ctx.shared
            .hooks
            .run(HookPoint::AgentEnd, json!({ "sessionKey": command.session_key, "runId": run.id, "reason": outcome.status, "error": outcome.error }))
            .await;
        Ok(released)
    }
    .instrument(span.clone())
    .await;
    match executed {
        // Retrying a write memory refused for good would fail the same way forever.
        Err(MemoryCallError::Refused(detail)) => {
            ctx.set_aside(owner, &item, Why::Refused(detail))
                .instrument(span)
                .await
        }
        other => other,
    }
}

impl RunCtx<'_> {
    fn cut(&self, status: &'static str, error: String) -> Outcome {
        self.outcome(status, String::new(), error)
    }

    /// An outcome with the run's usage and who answered it.
    fn outcome(&self, status: &'static str, text: String, error: String) -> Outcome {
        let usage = self.usage.lock().map(|u| *u).unwrap_or_default();
        let by = self.answered.lock().map(|b| b.clone()).unwrap_or_default();
        Outcome {
            status,
            text,
            error,
            model: if by.model.is_empty() {
                self.model_name.clone()
            } else {
                by.model
            },
            provider: by.provider,
            profile: by.profile,
            usage,
            turns: self.turns.load(std::sync::atomic::Ordering::SeqCst),
        }
    }

    pub(crate) fn key(&self, suffix: &str) -> String {
        format!("{}:{suffix}", self.run.id)
    }

    /// Returns the entries not written yet (inputs first, then the final answer).
    fn take_unwritten(&self) -> Vec<Entry> {
        let mut entries = self
            .unwritten
            .lock()
            .map(|mut u| std::mem::take(&mut *u))
            .unwrap_or_default();
        if let Ok(mut last) = self.final_entries.lock() {
            entries.append(&mut last);
        }
        entries
    }

    pub(crate) async fn append(&self, mut entries: Vec<Entry>) -> Result<(), MemoryCallError> {
        let mut unwritten = self
            .unwritten
            .lock()
            .map(|mut u| std::mem::take(&mut *u))
            .unwrap_or_default();
        if !unwritten.is_empty() {
            unwritten.append(&mut entries);
            entries = unwritten;
        }
        if entries.is_empty() {
            return Ok(());
        }
        let request = AppendEntriesRequest {
            session_id: self.session_id.to_owned(),
            epoch: self.epoch,
            entries,
        };
        crate::memory::call(
            &self.shared.memory,
            "append_entries",
            &request,
            async |m, r| m.append_entries(r).await,
        )
        .await
        .map(|_| ())
    }

    async fn take_queued(&self, kind: &str) -> Result<Vec<(i64, RunCommand)>, MemoryCallError> {
        let request = TakeQueuedRequest {
            session_id: self.session_id.to_owned(),
            epoch: self.epoch,
            run_id: self.run.id.clone(),
            kinds: vec![kind.to_owned()],
        };
        let taken = crate::memory::call(
            &self.shared.memory,
            "take_queued",
            &request,
            async |m, r| m.take_queued(r).await,
        )
        .await?;
        Ok(taken
            .items
            .into_iter()
            .filter_map(|item| {
                RunCommand::decode(item.payload.as_slice())
                    .ok()
                    .map(|c| (item.seq, c))
            })
            .collect())
    }

    fn user_entry(&self, key: String, text: &str) -> Entry {
        Entry {
            key,
            role: "user".to_owned(),
            content: text.to_owned(),
            run_id: self.run.id.clone(),
            ..Default::default()
        }
    }

    /// Stores synthetic results for calls a cut run never answered, so every call has one.
    async fn close_open_calls(&self, status: &str) -> Result<(), MemoryCallError> {
        let open: Vec<(u32, ToolCall)> = self
            .open_calls
            .lock()
            .map(|o| o.clone())
            .unwrap_or_default();
        let entries = open
            .iter()
            .map(|(turn, call)| Entry {
                key: self.key(&format!("t{turn}:r:{}", call.id)),
                role: "tool".to_owned(),
                content: format!("skipped: the run ended ({status}) before this tool finished"),
                run_id: self.run.id.clone(),
                tool_call_id: call.id.clone(),
                tool_name: call.name.clone(),
                data: json!({"isError": true, "synthetic": true}).to_string(),
                ..Default::default()
            })
            .collect();
        self.append(entries).await
    }

    /// Publishes the final reply before the run is marked finished, so a crash in between re-runs
    /// into the same message id and the stream drops the duplicate.
    async fn reply(&self, outcome: &Outcome) {
        self.reply_as(outcome, "final").await;
    }

    /// Publishes a final reply under the message id `<run_id>:<suffix>`.
    async fn reply_as(&self, outcome: &Outcome, suffix: &str) {
        let command = self.command;
        let mut text = match outcome.status {
            "completed" | "max_turns" => outcome.text.clone(),
            "aborted" => "Stopped.".to_owned(),
            _ => format!("Sorry, I could not answer: {}", outcome.error),
        };
        let mut metadata = command.metadata.clone();
        let sending = self
            .shared
            .hooks
            .run(
                HookPoint::MessageSending,
                json!({ "sessionKey": command.session_key, "runId": self.run.id, "text": text }),
            )
            .await;
        if let Some(rewritten) = sending.text {
            text = rewritten;
        }
        if sending.block {
            metadata.insert(
                "suppressed".to_owned(),
                sending
                    .reason
                    .unwrap_or_else(|| "blocked by a hook".to_owned()),
            );
        }
        // The messaging tool already said it: the final reply must not say it twice.
        let already_sent = self.sends.lock().map(|sends| {
            sends
                .iter()
                .any(|s| s.channel == command.channel && s.text.trim() == text.trim())
        });
        if already_sent.unwrap_or(false) {
            metadata.insert("deliveredByTool".to_owned(), "send_message".to_owned());
        }
        let message = OutboundMessage {
            run_id: self.run.id.clone(),
            session_key: command.session_key.clone(),
            channel: command.channel.clone(),
            recipient: command.sender_id.clone(),
            text: text.clone(),
            r#final: true,
            reply_to_id: command.message_id.clone(),
            session_id: self.session_id.to_owned(),
            error: match outcome.status {
                "completed" | "max_turns" => String::new(),
                status => format!("{status}: {}", outcome.error),
            },
            reply_subject: command.reply_subject.clone(),
            reply_encoding: command.reply_encoding.clone(),
            metadata,
            ts: Some(agentloop_proto::now()),
        };
        let subject = self.shared.bus.subjects().outbound(&command.channel);
        let msg_id = format!("{}:{suffix}", self.run.id);
        let published = retry(
            "publish_reply",
            Backoff::PUBLISH,
            |_| true,
            || {
                self.shared
                    .bus
                    .publish_durable(subject.clone(), &message, Some(&msg_id))
            },
        )
        .await;
        match published {
            Ok(()) => {
                self.shared
                    .hooks
                    .run(HookPoint::MessageSent, json!({ "sessionKey": command.session_key, "runId": self.run.id, "text": text }))
                    .await;
            }
            // Each attempt already waited `bus.publish_retry_ms` for a stream leader.
            Err(err) => {
                tracing::error!(run_id = %self.run.id, session_key = %command.session_key, error = %agentloop_bus::error_chain(&err), "gave up publishing the reply: the outbound stream stored nothing for minutes");
            }
        }
    }

    fn tool_context(&self, call_id: &str) -> ToolContext {
        ToolContext {
            session_id: self.session_id.to_owned(),
            session_key: self.command.session_key.clone(),
            run_id: self.run.id.clone(),
            call_id: call_id.to_owned(),
            channel: self.command.channel.clone(),
            sender_id: self.command.sender_id.clone(),
            runtime: Some(self.shared.clone()),
            sends: Some(self.sends.clone()),
        }
    }

    /// Runs one tool call through the hooks, with its timeout; failures become error results.
    async fn call_tool(&self, tools: &ToolSet, call: ToolCall) -> ToolOutcome {
        let started = Instant::now();
        let mut arguments = call.arguments.clone();
        let before = self
            .shared
            .hooks
            .run(HookPoint::BeforeToolCall, json!({ "sessionKey": self.command.session_key, "runId": self.run.id, "toolName": call.name, "toolCallId": call.id, "arguments": arguments }))
            .await;
        self.events
            .tool(
                "start",
                &call.name,
                &call.id,
                json!({ "arguments": self.events.cap(&arguments.to_string()) }),
            )
            .await;
        let result: Result<String, String> = if before.block {
            Err(format!(
                "blocked by a hook: {}",
                before
                    .reason
                    .unwrap_or_else(|| "no reason given".to_owned())
            ))
        } else {
            if let Some(rewritten) = before.arguments {
                arguments = rewritten;
            }
            match tools.get(&call.name) {
                None => Err(format!("unknown tool {:?}", call.name)),
                Some(tool) => self.invoke(tool, &call, arguments.clone()).await,
            }
        };
        let (content, is_error) = match result {
            Ok(text) => (text, false),
            Err(error) => (format!("error: {error}"), true),
        };
        let payload = json!({ "sessionKey": self.command.session_key, "runId": self.run.id, "toolName": call.name, "toolCallId": call.id, "arguments": arguments, "result": content, "isError": is_error });
        self.shared
            .hooks
            .run(HookPoint::AfterToolCall, payload.clone())
            .await;
        let persist = self
            .shared
            .hooks
            .run(HookPoint::ToolResultPersist, payload)
            .await;
        let stored = persist.content.unwrap_or_else(|| content.clone());
        self.events
            .tool("result", &call.name, &call.id, json!({ "result": self.events.cap(&content), "isError": is_error, "durationMs": started.elapsed().as_millis() as u64 }))
            .await;
        ToolOutcome {
            call,
            content,
            is_error,
            stored,
        }
    }

    async fn invoke(
        &self,
        tool: &Arc<dyn Tool>,
        call: &ToolCall,
        arguments: serde_json::Value,
    ) -> Result<String, String> {
        let timeout = tool
            .timeout()
            .unwrap_or(Duration::from_millis(self.shared.settings.tool_timeout_ms));
        let ctx = self.tool_context(&call.id);
        let started = Instant::now();
        let every = Duration::from_millis(self.shared.settings.tool_update_interval_ms.max(100));
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        let work = tokio::time::timeout(timeout, tool.call(&ctx, arguments));
        tokio::pin!(work);
        loop {
            tokio::select! {
                done = &mut work => return match done {
                    Ok(Ok(text)) => Ok(text),
                    Ok(Err(err)) => Err(err.0),
                    Err(_) => Err(format!("the tool did not answer within {} ms", timeout.as_millis())),
                },
                // A long call tells watchers it is still alive.
                _ = ticker.tick() => {
                    self.events
                        .tool("update", &call.name, &call.id, json!({ "status": "running", "elapsedMs": started.elapsed().as_millis() as u64 }))
                        .await;
                }
            }
        }
    }

    /// Runs a batch: consecutive parallel-safe calls together, the others one at a time. Before
    /// starting anything new it checks for steering; once steering is pending, calls not yet
    /// started get a paired "skipped" result. Returns the outcomes in call order and the steering.
    async fn run_batch(
        &self,
        tools: &ToolSet,
        calls: Vec<ToolCall>,
    ) -> Result<(Vec<ToolOutcome>, Vec<(i64, RunCommand)>), MemoryCallError> {
        let mut outcomes: Vec<ToolOutcome> = Vec::with_capacity(calls.len());
        let mut steering = Vec::new();
        let parallel = |call: &ToolCall| tools.get(&call.name).is_some_and(|t| t.parallel_safe());
        let mut i = 0;
        while i < calls.len() {
            if steering.is_empty() && self.signals.take_input_pending() {
                steering = self.take_queued("steer").await?;
            }
            if !steering.is_empty() {
                for call in &calls[i..] {
                    self.events
                        .tool(
                            "result",
                            &call.name,
                            &call.id,
                            json!({ "result": "skipped", "isError": true, "skipped": true }),
                        )
                        .await;
                    outcomes.push(ToolOutcome {
                        call: call.clone(),
                        content: "skipped: the user sent a new message before this tool ran"
                            .to_owned(),
                        is_error: true,
                        stored: "skipped: the user sent a new message before this tool ran"
                            .to_owned(),
                    });
                }
                break;
            }
            let mut end = i + 1;
            if parallel(&calls[i]) {
                while end < calls.len() && parallel(&calls[end]) {
                    end += 1;
                }
            }
            let group = calls[i..end]
                .iter()
                .cloned()
                .map(|call| self.call_tool(tools, call));
            outcomes.extend(join_all(group).await);
            i = end;
        }
        Ok((outcomes, steering))
    }
}

/// The run's agent's tool set, built once and kept while the remote tools stay the same.
/// Unknown agents run on the default config and so share one entry: clients naming agents
/// cannot grow the cache.
fn toolset(ctx: &RunCtx<'_>) -> Arc<ToolSet> {
    let (shared, agent) = (ctx.shared, &ctx.agent);
    shared
        .toolsets
        .get(ctx.agent_key, shared.remote_tools.generation(), || {
            let known: Vec<Arc<dyn Tool>> = shared
                .local_tools
                .iter()
                .cloned()
                .chain(shared.remote_tools.tools())
                .collect();
            ToolSet::build(known, &agent.tools_allow, &agent.tools_deny)
        })
}

/// Builds the context, then turns model answers and tool batches until a final answer.
async fn converse(
    ctx: &RunCtx<'_>,
    item: &InboxItem,
    history: Window,
) -> Result<Outcome, MemoryCallError> {
    let shared = ctx.shared;
    // Collected messages queued behind this one are merged into the same turn.
    let mut inputs = vec![(ctx.key("user"), ctx.command.text.clone())];
    if item.kind == "collect" {
        for (seq, command) in ctx.take_queued("collect").await? {
            inputs.push((ctx.key(&format!("user:{seq}")), command.text));
        }
    }
    let user_entries: Vec<Entry> = inputs
        .iter()
        .map(|(key, text)| ctx.user_entry(key.clone(), text))
        .collect();
    // The history came with the input; a resumed run finds its own inputs in it already.
    let entries: &[HistoryEntry] = &history;
    // This run's entries, if any, are the window's tail: the session's lease lets one run at a
    // time write, and a resumed run continues its own. Scanning only the tail keeps the work per
    // run independent of the history's length.
    let first_of_run = entries.len()
        - entries
            .iter()
            .rev()
            .take_while(|e| e.run_id == ctx.run.id)
            .count();
    let own = &entries[first_of_run..];
    if let Ok(mut unwritten) = ctx.unwritten.lock() {
        unwritten.extend(
            user_entries
                .into_iter()
                .filter(|entry| !own.iter().any(|e| e.key == entry.key)),
        );
    }
    let mut messages = prompt::conversation(entries, &ctx.run.id);
    // What came before this run is what a compaction may summarize; a new run has nothing of
    // its own in the history yet, so all of it came before.
    let mut prior = if first_of_run == entries.len() {
        messages.len()
    } else {
        prompt::conversation(&entries[..first_of_run], &ctx.run.id).len()
    };
    let prior_through_seq = entries[..first_of_run]
        .iter()
        .map(|e| e.seq)
        .max()
        .unwrap_or(0);
    let mut compactions = 0;
    for (key, text) in &inputs {
        if !own.iter().any(|e| &e.key == key) {
            messages.push(ChatMessage::user(text.clone()));
        }
    }
    // A resumed run continues after its last persisted step.
    let mut turn: u32 = own.iter().filter(|e| e.role == Role::Assistant).count() as u32;
    ctx.turns.store(turn, std::sync::atomic::Ordering::SeqCst);

    let tools = toolset(ctx);
    let specs = tools.specs().clone();

    if let Some(last) = own.iter().rev().find(|e| e.role == Role::Assistant) {
        let answered: Vec<&str> = entries
            .iter()
            .filter(|e| e.role == Role::Tool)
            .map(|e| e.tool_call_id.as_str())
            .collect();
        let missing: Vec<ToolCall> = prompt::tool_calls_of(last)
            .into_iter()
            .filter(|c| !answered.contains(&c.id.as_str()))
            .collect();
        if !missing.is_empty() {
            tracing::info!(
                calls = missing.len(),
                "resuming: running the tool calls the previous attempt did not finish"
            );
            let (outcomes, steering) = ctx.run_batch(&tools, missing).await?;
            persist_batch(ctx, turn, &outcomes, &steering, &mut messages).await?;
        }
    }

    let start = shared
        .hooks
        .run(HookPoint::BeforeAgentStart, json!({ "sessionKey": ctx.command.session_key, "runId": ctx.run.id, "agentId": ctx.command.agent_id, "text": ctx.command.text }))
        .await;
    shared
        .hooks
        .run(HookPoint::MessageReceived, json!({ "sessionKey": ctx.command.session_key, "runId": ctx.run.id, "channel": ctx.command.channel, "senderId": ctx.command.sender_id, "text": ctx.command.text }))
        .await;
    let instructions = if ctx.agent.instructions.is_empty() {
        shared.settings.system_prompt.as_str()
    } else {
        ctx.agent.instructions.as_str()
    };
    let system = start.system_prompt.unwrap_or_else(|| {
        prompt::system_prompt(&prompt::PromptParts {
            agent_id: if ctx.command.agent_id.is_empty() {
                "main"
            } else {
                &ctx.command.agent_id
            },
            identity: &ctx.agent.identity,
            instructions,
            tools: &specs,
            session_key: &ctx.command.session_key,
            channel: &ctx.command.channel,
            extra_context: start.context.as_deref(),
        })
    });
    let budget = ctx
        .agent
        .context_window_tokens
        .saturating_sub(ctx.agent.reserve_tokens)
        .max(1);
    let max_turns = if ctx.agent.max_turns > 0 {
        ctx.agent.max_turns
    } else {
        shared.settings.max_turns
    };
    let mut last_text = String::new();
    loop {
        if turn >= max_turns {
            let text = if last_text.trim().is_empty() {
                format!("I stopped after {max_turns} model turns without reaching an answer.")
            } else {
                last_text
            };
            return Ok(ctx.outcome(
                "max_turns",
                text,
                format!("the turn budget of {max_turns} was used up"),
            ));
        }
        turn += 1;
        ctx.turns.store(turn, std::sync::atomic::Ordering::SeqCst);
        let dropped = prompt::fit(&mut messages, &system, &specs, budget);
        prior = prior.saturating_sub(dropped);
        let mut cx = Context {
            messages: &mut messages,
            prior,
            prior_through_seq,
            system: &system,
            tools: &specs,
            compactions,
        };
        let answer = ctx.answer(&mut cx).await?;
        prior = cx.prior;
        compactions = cx.compactions;
        let (text, calls) = match answer {
            Ok(answer) => (answer.text, answer.calls),
            Err(error) => return Ok(ctx.outcome("error", String::new(), error)),
        };
        if !text.is_empty() {
            last_text = text.clone();
        }
        let assistant = Entry {
            key: ctx.key(&format!("t{turn}:a")),
            role: "assistant".to_owned(),
            content: text.clone(),
            run_id: ctx.run.id.clone(),
            data: if calls.is_empty() {
                String::new()
            } else {
                json!({ "toolCalls": calls }).to_string()
            },
            ..Default::default()
        };
        messages.push(ChatMessage::Assistant {
            content: text.as_str().into(),
            tool_calls: calls.clone(),
        });
        if calls.is_empty() {
            // A safe point: steering that arrived during the answer continues the run.
            let steering = if ctx.signals.take_input_pending() {
                ctx.take_queued("steer").await?
            } else {
                Vec::new()
            };
            if steering.is_empty() {
                if let Ok(mut last) = ctx.final_entries.lock() {
                    last.push(assistant);
                }
                return Ok(ctx.outcome("completed", text, String::new()));
            }
            let mut entries = vec![assistant];
            for (seq, command) in &steering {
                entries.push(ctx.user_entry(ctx.key(&format!("s:{seq}")), &command.text));
                messages.push(ChatMessage::user(command.text.clone()));
            }
            ctx.append(entries).await?;
            continue;
        }
        // The calls are persisted before they run, so a crash resumes them instead of asking again.
        ctx.append(vec![assistant]).await?;
        if let Ok(mut open) = ctx.open_calls.lock() {
            *open = calls.iter().map(|c| (turn, c.clone())).collect();
        }
        let (outcomes, mut steering) = ctx.run_batch(&tools, calls).await?;
        // After the batch is a safe point too.
        if steering.is_empty() {
            steering = ctx.take_queued("steer").await?;
        }
        persist_batch(ctx, turn, &outcomes, &steering, &mut messages).await?;
    }
}

/// Stores a batch's results (and steering taken during it), then adds them to the context.
async fn persist_batch(
    ctx: &RunCtx<'_>,
    turn: u32,
    outcomes: &[ToolOutcome],
    steering: &[(i64, RunCommand)],
    messages: &mut Vec<ChatMessage>,
) -> Result<(), MemoryCallError> {
    let mut entries = Vec::with_capacity(outcomes.len() + steering.len());
    for outcome in outcomes {
        entries.push(Entry {
            key: ctx.key(&format!("t{turn}:r:{}", outcome.call.id)),
            role: "tool".to_owned(),
            content: outcome.stored.clone(),
            run_id: ctx.run.id.clone(),
            tool_call_id: outcome.call.id.clone(),
            tool_name: outcome.call.name.clone(),
            data: json!({ "isError": outcome.is_error }).to_string(),
            ..Default::default()
        });
        messages.push(ChatMessage::tool_result(
            outcome.call.id.clone(),
            outcome.content.clone(),
            outcome.is_error,
        ));
    }
    for (seq, command) in steering {
        entries.push(ctx.user_entry(ctx.key(&format!("s:{seq}")), &command.text));
        messages.push(ChatMessage::user(command.text.clone()));
    }
    ctx.append(entries).await?;
    if let Ok(mut open) = ctx.open_calls.lock() {
        open.clear();
    }
    Ok(())
}

async fn finish(
    shared: &Arc<Shared>,
    owner: Owner<'_>,
    run: &Run,
    item: &InboxItem,
    outcome: &Outcome,
    entries: Vec<Entry>,
) -> Result<bool, MemoryCallError> {
    let Owner {
        session_id,
        epoch,
        signals,
        ..
    } = owner;
    let request = FinishRunRequest {
        session_id: session_id.to_owned(),
        epoch,
        run_id: run.id.clone(),
        inbox_seq: item.seq,
        status: outcome.status.to_owned(),
        error: outcome.error.clone(),
        model: outcome.model.clone(),
        input_tokens: outcome.usage.input_tokens,
        output_tokens: outcome.usage.output_tokens,
        provider: outcome.provider.clone(),
        profile: outcome.profile.clone(),
        entries,
        release_if_idle: true,
    };
    // The lease may go back with this call: leave the owned set first, so input arriving now
    // claims the session (or, if the lease stays, is seen by this owner's next take).
    crate::owner::forget(shared, session_id, signals);
    let finished = crate::memory::call(&shared.memory, "finish_run", &request, async |m, r| {
        m.finish_run(r).await
    })
    .await;
    let released = matches!(&finished, Ok(response) if response.released);
    if !released && let Ok(mut owned) = shared.owned.lock() {
        owned
            .entry(session_id.to_owned())
            .or_insert_with(|| signals.clone());
    }
    finished.map(|response| response.released)
}
