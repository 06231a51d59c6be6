//! One run: the two-layer agent loop. The inner layer (`turns.rs`) continues while the model
//! asks for tools or steering is pending; the owner's loop around it takes follow-ups. Every
//! run ends with exactly one lifecycle `end` (completed, max_turns, aborted) or `error` (error,
//! timeout).
//!
//! What a run reads is in [`RunCtx`], fixed for the run; what it changes is in [`RunState`],
//! owned by the loop and lent with `&mut`. Only the `send_message` tool's record is shared,
//! because tools of one batch run at once.
//!
//! A run's future lives as long as the run, mostly waiting on the model, and is as large as the
//! largest state it can be in. So the steps off that wait (memory writes, tool batches, hooks,
//! events, the reply, the end) are awaited boxed: each takes its memory only while it runs,
//! and a run waiting on its model holds a few KiB, not every step's worth at once.

mod answer_size;
mod batch;
mod call_ids;
mod policy;
mod recovery;
mod reply;
mod resume;
mod set_aside;
mod turns;

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use prost::Message as _;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use agentloop_model::{ToolCall, Usage};
use agentloop_proto::v1::{Entry, FinishRunRequest, InboxItem, Run, RunCommand};
use agentloop_proto::{EntryKey, EventPhase, InboxKind, RunStatus, entry_key};

use crate::AgentConfig;
use crate::error::MemoryCallError;
use crate::events::RunEvents;
use crate::history::Window;
use crate::hooks::HookPoint;
use crate::replica::Replica;
use crate::signals::SessionSignals;
use crate::tools::{SentMessage, ToolContext, ToolServices};
use recovery::AnsweredBy;
use set_aside::Why;

/// Counts a live run in `agentloop_runner_runs_in_flight` until dropped, however the run ends.
struct InFlight<'a>(&'a agentloop_lifecycle::Gauge);

impl<'a> InFlight<'a> {
    fn enter(gauge: &'a agentloop_lifecycle::Gauge) -> Self {
        gauge.inc();
        Self(gauge)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// How a run ended.
struct Outcome {
    status: RunStatus,
    text: String,
    error: String,
    model: String,
    provider: String,
    profile: String,
    usage: Usage,
    turns: u32,
    /// What the model received at the run's first turn, part by part (JSON; empty: unknown).
    prompt_report: String,
}

/// What a run reads: its input, its session and the replica. Fixed for the whole run.
pub(crate) struct RunCtx<'a> {
    replica: &'a Arc<Replica>,
    session_id: &'a str,
    epoch: i64,
    run: &'a Run,
    command: &'a RunCommand,
    /// The agent's key in the configured agents; "" for an unknown one.
    agent_key: &'a str,
    agent: Arc<AgentConfig>,
    model_name: String,
    signals: &'a Arc<SessionSignals>,
    events: RunEvents<'a>,
    /// What the `send_message` tool sent: the final reply must not say it again.
    sends: Arc<Mutex<Vec<SentMessage>>>,
    /// When this attempt started, for the run's end line.
    started: std::time::Instant,
    /// Tool calls this attempt made (parallel calls count each).
    tool_calls: std::sync::atomic::AtomicU32,
}

/// What a run changes as it goes.
#[derive(Default)]
struct RunState {
    usage: Usage,
    /// Who answered the last model turn (after fallbacks and profile switches).
    answered: AnsweredBy,
    turns: u32,
    /// Tool calls asked for and not answered yet: if the run is cut, they get synthetic results.
    open_calls: Vec<(u32, ToolCall)>,
    /// The run's input entries, written with its first persisted step (or its end) to save a
    /// round trip; until then the inbox row holds the input.
    unwritten: Vec<Entry>,
    /// What the model received at the run's first turn, part by part (JSON), stored with the
    /// run's end.
    prompt_report: String,
    /// The final answer's entry, written in the same transaction that finishes the run.
    last: Option<Entry>,
    /// Every tool call id this attempt has given out ([`call_ids::make_unique`]).
    call_ids: std::collections::HashSet<String>,
}

impl RunState {
    /// The entries not written yet: inputs first, then the final answer.
    fn take_unwritten(&mut self) -> Vec<Entry> {
        let mut entries = std::mem::take(&mut self.unwritten);
        entries.extend(self.last.take());
        entries
    }
}

/// The owner of a session, as a run sees it.
#[derive(Clone, Copy)]
pub(crate) struct Owner<'a> {
    pub(crate) session_id: &'a str,
    pub(crate) epoch: i64,
    pub(crate) lease_lost: &'a CancellationToken,
    pub(crate) signals: &'a Arc<SessionSignals>,
}

/// How the live part of a run stopped.
enum Ended {
    Finished(Result<Outcome, MemoryCallError>),
    TimedOut,
    Aborted,
    LeaseLost,
}

/// Runs one input; returns whether its last write gave the lease back.
#[allow(clippy::manual_async_fn)] // on purpose: see the block below
pub(crate) fn execute<'a>(
    replica: &'a Arc<Replica>,
    owner: Owner<'a>,
    item: InboxItem,
    run: Run,
    history: Window,
) -> impl Future<Output = Result<bool, MemoryCallError>> + 'a {
    // A block, not an `async fn`: the future of an `async fn` stores its arguments twice (as
    // arguments and as the locals they move into), and this one lives as long as the run.
    async move {
        let command = match RunCommand::decode(item.payload.as_slice()) {
            Ok(command) => command,
            Err(err) => {
                // Intake stored what it received; a corrupt row must still be consumed, not retried forever.
                tracing::error!(error = %err, seq = item.seq, "inbox item is not a RunCommand, finishing it as an error");
                let outcome = Outcome {
                    status: RunStatus::Error,
                    text: String::new(),
                    error: format!("inbox item is not a RunCommand: {err}"),
                    model: String::new(),
                    provider: String::new(),
                    profile: String::new(),
                    usage: Usage::default(),
                    turns: 0,
                    prompt_report: String::new(),
                };
                return Box::pin(finish(replica, owner, &run, &item, &outcome, Vec::new())).await;
            }
        };
        // An unknown agent runs on the default config, under the key "" (see `batch::toolset`).
        let (agent_key, agent) = match replica.agents.get_key_value(agent_id(&command)) {
            Some((key, agent)) => (key.as_str(), agent.clone()),
            None => ("", Arc::default()),
        };
        let model_name = if command.model.is_empty() {
            replica.default_model().to_owned()
        } else {
            command.model.clone()
        };
        let span = tracing::info_span!("run", run_id = %run.id, session_key = %command.session_key, attempt = run.attempts, trace_id = tracing::field::Empty, span_id = tracing::field::Empty);
        agentloop_telemetry::set_parent_from_map(&span, &command.metadata);
        agentloop_telemetry::record_trace_ids(&span);
        let ctx = RunCtx {
            replica,
            session_id: owner.session_id,
            epoch: owner.epoch,
            run: &run,
            command: &command,
            agent_key,
            agent,
            model_name,
            signals: owner.signals,
            events: RunEvents::new(
                &replica.bus,
                &run.id,
                owner.session_id,
                &command.session_key,
                replica.settings.tool_event_max_bytes,
            ),
            sends: Arc::default(),
            started: std::time::Instant::now(),
            tool_calls: std::sync::atomic::AtomicU32::new(0),
        };
        let mut state = RunState::default();
        if let Some(why) = Why::exhausted(run.attempts) {
            return Box::pin(
                ctx.set_aside(owner, &mut state, &item, why)
                    .instrument(span),
            )
            .await;
        }
        let executed = ctx
            .live(owner, &mut state, &item, history)
            .instrument(span.clone())
            .await;
        match executed {
            // Retrying a write memory refused for good would fail the same way forever.
            Err(MemoryCallError::Refused(detail)) => {
                Box::pin(
                    ctx.set_aside(owner, &mut state, &item, Why::Refused(detail))
                        .instrument(span),
                )
                .await
            }
            other => other,
        }
    }
}

/// The agent a command names, `main` when it names none.
fn agent_id(command: &RunCommand) -> &str {
    if command.agent_id.is_empty() {
        "main"
    } else {
        &command.agent_id
    }
}

impl RunCtx<'_> {
    /// The run from its start event to its end event, with its timeout, abort and lease.
    async fn live(
        &self,
        owner: Owner<'_>,
        state: &mut RunState,
        item: &InboxItem,
        history: Window,
    ) -> Result<bool, MemoryCallError> {
        let replica = self.replica;
        Box::pin(self.events
            .lifecycle(EventPhase::Start, json!({ "model": self.model_name, "attempt": self.run.attempts, "agentId": agent_id(self.command) })))
            .await;
        let abort = self.signals.start_run();
        let _in_flight = InFlight::enter(&replica.metrics.in_flight);
        self.count_start();
        let timeout_ms = if self.agent.run_timeout_ms > 0 {
            self.agent.run_timeout_ms
        } else {
            replica.settings.run_timeout_ms
        };
        let timeout = Duration::from_millis(timeout_ms);
        let ended = tokio::select! {
            done = tokio::time::timeout(timeout, turns::converse(self, state, item, history)) => match done {
                Ok(finished) => Ended::Finished(finished),
                Err(_) => Ended::TimedOut,
            },
            () = abort.cancelled() => Ended::Aborted,
            () = owner.lease_lost.cancelled() => Ended::LeaseLost,
        };
        self.signals.end_run();
        // Boxed: what follows holds its own locals, which inline would add to the room this
        // future keeps for the whole model wait.
        Box::pin(self.conclude(owner, state, item, ended, timeout_ms)).await
    }

    /// Ends the run once its live part stopped: the outcome, the reply, the run's last write
    /// and its end event.
    async fn conclude(
        &self,
        owner: Owner<'_>,
        state: &mut RunState,
        item: &InboxItem,
        ended: Ended,
        timeout_ms: u64,
    ) -> Result<bool, MemoryCallError> {
        let replica = self.replica;
        let outcome = match ended {
            Ended::Finished(outcome) => outcome?,
            Ended::TimedOut => self.outcome(
                state,
                RunStatus::Timeout,
                String::new(),
                format!("the run took longer than {timeout_ms} ms"),
            ),
            Ended::Aborted => self.outcome(
                state,
                RunStatus::Aborted,
                String::new(),
                "the run was aborted".to_owned(),
            ),
            Ended::LeaseLost => {
                return Err(MemoryCallError::LeaseLost(
                    "lease renewal refused".to_owned(),
                ));
            }
        };
        if !outcome.status.answered() {
            Box::pin(self.close_open_calls(state, outcome.status)).await?;
        }
        Box::pin(self.reply(&outcome)).await;
        let entries = state.take_unwritten();
        let released = Box::pin(finish(replica, owner, self.run, item, &outcome, entries)).await?;
        Box::pin(self.ended(&outcome, false)).await;
        Box::pin(replica
            .hooks
            .run(HookPoint::AgentEnd, json!({ "sessionKey": self.command.session_key, "runId": self.run.id, "reason": outcome.status.as_str(), "error": outcome.error })))
            .await;
        Ok(released)
    }

    /// The agent as a metric label: the configured key, or `default` for an unknown agent.
    fn agent_label(&self) -> &str {
        if self.agent_key.is_empty() {
            "default"
        } else {
            self.agent_key
        }
    }

    /// Counts the run's start: its wait in the queue on a first attempt, a takeover otherwise.
    fn count_start(&self) {
        let metrics = &self.replica.metrics;
        let labels = vec![("agent", self.agent_label().to_owned())];
        if self.run.attempts > 1 {
            metrics.resumed.get_or_create(&labels).inc();
            return;
        }
        if let Some(waited) = self
            .command
            .received_at
            .as_ref()
            .and_then(agentloop_proto::age)
        {
            metrics
                .queue_wait_seconds
                .get_or_create(&labels)
                .observe(waited.as_secs_f64());
        }
    }

    /// Counts the run and emits its lifecycle `end` or `error`.
    async fn ended(&self, outcome: &Outcome, set_aside: bool) {
        // One line per run, what an operator greps for first.
        tracing::info!(
            session_id = %self.session_id,
            session_key = %self.command.session_key,
            run_id = %self.run.id,
            agent = %agent_id(self.command),
            model = %outcome.model,
            outcome = %outcome.status,
            duration_ms = self.started.elapsed().as_millis() as u64,
            turns = outcome.turns,
            input_tokens = outcome.usage.input_tokens,
            output_tokens = outcome.usage.output_tokens,
            tool_calls = self.tool_calls.load(std::sync::atomic::Ordering::Relaxed),
            attempt = self.run.attempts,
            set_aside,
            error = %outcome.error,
            "run ended"
        );
        let metrics = &self.replica.metrics;
        let labels = vec![
            ("agent", self.agent_label().to_owned()),
            ("outcome", outcome.status.as_str().to_owned()),
        ];
        metrics.runs.get_or_create(&labels).inc();
        metrics
            .run_seconds
            .get_or_create(&labels)
            .observe(self.started.elapsed().as_secs_f64());
        if !outcome.model.is_empty() {
            for (direction, tokens) in [
                ("input", outcome.usage.input_tokens),
                ("output", outcome.usage.output_tokens),
            ] {
                metrics
                    .tokens
                    .get_or_create(&vec![
                        ("provider", outcome.provider.clone()),
                        ("model", outcome.model.clone()),
                        ("direction", direction.to_owned()),
                    ])
                    .inc_by(tokens);
            }
        }
        if outcome.status == RunStatus::Completed {
            metrics.runs_completed.inc();
        } else {
            metrics.runs_failed.inc();
        }
        let mut data = json!({ "reason": outcome.status.as_str(), "error": outcome.error, "model": outcome.model, "turns": outcome.turns });
        let phase = if outcome.status.ends_normally() {
            data["usage"] = json!({ "input_tokens": outcome.usage.input_tokens, "output_tokens": outcome.usage.output_tokens });
            EventPhase::End
        } else {
            EventPhase::Error
        };
        if set_aside {
            data["setAside"] = json!(true);
        }
        self.events.lifecycle(phase, data).await;
    }

    /// An outcome with the run's usage and who answered it.
    fn outcome(&self, state: &RunState, status: RunStatus, text: String, error: String) -> Outcome {
        let by = &state.answered;
        Outcome {
            status,
            text,
            error,
            model: if by.model.is_empty() {
                self.model_name.clone()
            } else {
                by.model.clone()
            },
            provider: by.provider.clone(),
            profile: by.profile.clone(),
            usage: state.usage,
            turns: state.turns,
            prompt_report: state.prompt_report.clone(),
        }
    }

    /// The key of one of this run's transcript entries.
    fn key(&self, entry: EntryKey<'_>) -> String {
        entry_key(&self.run.id, entry)
    }

    /// Writes `entries`, after the inputs not written yet.
    async fn append(
        &self,
        state: &mut RunState,
        mut entries: Vec<Entry>,
    ) -> Result<(), MemoryCallError> {
        if !state.unwritten.is_empty() {
            let mut unwritten = std::mem::take(&mut state.unwritten);
            unwritten.append(&mut entries);
            entries = unwritten;
        }
        if entries.is_empty() {
            return Ok(());
        }
        self.replica
            .memory
            .append(self.session_id, self.epoch, entries)
            .await
    }

    /// Takes the queued inputs of `kind` into this run, oldest first.
    async fn take_queued(
        &self,
        kind: InboxKind,
    ) -> Result<Vec<(i64, RunCommand)>, MemoryCallError> {
        let items = self
            .replica
            .memory
            .take_queued(self.session_id, self.epoch, &self.run.id, kind)
            .await?;
        Ok(items
            .into_iter()
            .filter_map(|item| match RunCommand::decode(item.payload.as_slice()) {
                Ok(command) => Some((item.seq, command)),
                Err(err) => {
                    // Intake validated it before storing; a row that no longer decodes is
                    // consumed by the take, so it is logged with its seq for the record.
                    tracing::error!(seq = item.seq, error = %err, "queued input is not a RunCommand; skipped");
                    None
                }
            })
            .collect())
    }

    /// A user's message as a transcript entry, under `key`. Its idempotency key is kept (in
    /// `data`) so a client recognises the message it sent in the history, and so is the
    /// scanner's flag, so later runs show it to the model wrapped as well.
    fn user_entry(&self, key: String, input: &resume::Input) -> Entry {
        let mut data = serde_json::Map::new();
        if !input.idempotency_key.is_empty() {
            data.insert("idempotencyKey".into(), json!(input.idempotency_key));
        }
        if let Some(flag) = &input.flag {
            data.insert("security".into(), flag.to_json());
        }
        let data = if data.is_empty() {
            String::new()
        } else {
            serde_json::Value::Object(data).to_string()
        };
        Entry {
            key,
            role: "user".to_owned(),
            content: input.text.clone(),
            run_id: self.run.id.clone(),
            data,
            ..Default::default()
        }
    }

    /// Stores synthetic results for calls a cut run never answered, so every call has one.
    async fn close_open_calls(
        &self,
        state: &mut RunState,
        status: RunStatus,
    ) -> Result<(), MemoryCallError> {
        let entries = std::mem::take(&mut state.open_calls)
            .into_iter()
            .map(|(turn, call)| Entry {
                key: self.key(EntryKey::ToolResult(turn, &call.id)),
                role: "tool".to_owned(),
                content: format!("skipped: the run ended ({status}) before this tool finished"),
                run_id: self.run.id.clone(),
                tool_call_id: call.id,
                tool_name: call.name,
                data: json!({"isError": true, "synthetic": true}).to_string(),
                ..Default::default()
            })
            .collect();
        self.append(state, entries).await
    }

    /// Queues the run's exchange for auto-learn, when it is on and the agent keeps memory.
    fn learn_from(&self, inputs: &[String], answer: &str) {
        if self.replica.learner.is_none() {
            return;
        }
        let Some(scope) = crate::memory::memory_scope(
            agent_id(self.command),
            self.agent.memory,
            self.session_id,
            &self.command.sender_id,
            &self.command.channel,
        ) else {
            return;
        };
        crate::learn::queue(
            self.replica,
            agentloop_proto::v1::LearnJob {
                session_id: self.session_id.to_owned(),
                run_id: self.run.id.clone(),
                scope: Some(scope),
                exchange: crate::learn::exchange(inputs, answer),
                ..Default::default()
            },
        );
    }

    fn tool_context(&self, call_id: &str) -> ToolContext {
        ToolContext {
            session_id: self.session_id.to_owned(),
            session_key: self.command.session_key.clone(),
            run_id: self.run.id.clone(),
            call_id: call_id.to_owned(),
            channel: self.command.channel.clone(),
            sender_id: self.command.sender_id.clone(),
            agent_id: agent_id(self.command).to_owned(),
            memory: self.agent.memory,
            services: Some(ToolServices {
                bus: self.replica.bus.clone(),
                memory: self.replica.memory.clone(),
            }),
            route: self.command.metadata.clone(),
            sends: Some(self.sends.clone()),
        }
    }

    /// What the `send_message` tool sent so far.
    fn sent(&self) -> Vec<SentMessage> {
        self.sends
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// Finishes the run in memory with its last entries; returns whether the lease went back.
async fn finish(
    replica: &Arc<Replica>,
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
        status: outcome.status.as_str().to_owned(),
        error: outcome.error.clone(),
        model: outcome.model.clone(),
        input_tokens: outcome.usage.input_tokens,
        output_tokens: outcome.usage.output_tokens,
        provider: outcome.provider.clone(),
        profile: outcome.profile.clone(),
        entries,
        release_if_idle: true,
        prompt_report: outcome.prompt_report.clone(),
    };
    // The lease may go back with this call: leave the owned set first, so input arriving now
    // claims the session (or, if the lease stays, is seen by this owner's next take).
    replica.forget(session_id, signals);
    let finished = replica.memory.finish_run(&request).await;
    let released = matches!(&finished, Ok(response) if response.released);
    if !released {
        replica.keep(session_id, signals);
    }
    finished.map(|response| response.released)
}
