//! The inner loop of a run: build the context, then alternate model answers and tool batches
//! until the model answers without calls and no steering waits, or the turn budget is spent.

use serde_json::json;

use agentloop_model::ChatMessage;
use agentloop_proto::v1::{Entry, InboxItem, RunCommand};
use agentloop_proto::{EntryKey, EventPhase, InboxKind, RunStatus};

use super::batch::{SafePoint, ToolOutcome, toolset};
use super::recovery::Context;
use super::resume::{self, Input};
use super::{Outcome, RunCtx, RunState, agent_id};
use crate::error::MemoryCallError;
use crate::history::Window;
use crate::hooks::HookPoint;
use crate::untrusted::{Flag, for_model};
use crate::{context, prompt};

/// Builds the context, then turns model answers and tool batches until a final answer.
pub(super) async fn converse(
    ctx: &RunCtx<'_>,
    state: &mut RunState,
    item: &InboxItem,
    history: Window,
) -> Result<Outcome, MemoryCallError> {
    let replica = ctx.replica;
    // Collected messages queued behind this one are merged into the same turn.
    let mut inputs = vec![Input {
        key: ctx.key(EntryKey::Input),
        text: ctx.command.text.clone(),
        idempotency_key: ctx.command.idempotency_key.clone(),
        flag: Flag::of(&ctx.command.metadata),
    }];
    if item.kind.parse() == Ok(InboxKind::Collect) {
        for (seq, command) in Box::pin(ctx.take_queued(InboxKind::Collect)).await? {
            inputs.push(Input {
                key: ctx.key(EntryKey::Collected(seq)),
                flag: Flag::of(&command.metadata),
                text: command.text,
                idempotency_key: command.idempotency_key,
            });
        }
    }
    // What the memories are recalled for: the message (and those collected with it).
    let start_inputs: Vec<String> = inputs.iter().map(|i| i.text.clone()).collect();
    // The history came with the input; a resumed run finds its own steps in it already.
    let start = resume::start(&history, &ctx.run.id, inputs);
    state.unwritten.extend(
        start
            .unwritten
            .iter()
            .map(|input| ctx.user_entry(input.key.clone(), input)),
    );
    if let Some(refusal) = Box::pin(second_opinion(ctx, state, &start.unwritten)).await {
        return Ok(refusal);
    }
    let mut messages = start.messages;
    let mut prior = start.prior;
    let mut compactions = 0;
    let mut turn = start.turns_done;
    state.turns = turn;

    let tools = toolset(ctx);
    let specs = tools.specs().clone();

    if !start.unanswered.is_empty() {
        tracing::info!(
            calls = start.unanswered.len(),
            "resuming: running the tool calls the previous attempt did not finish"
        );
        let (outcomes, steering) = Box::pin(ctx.run_batch(&tools, start.unanswered)).await?;
        persist_batch(ctx, state, turn, &outcomes, &steering, &mut messages).await?;
    }

    let command = ctx.command;
    let begin = Box::pin(replica
        .hooks
        .run(HookPoint::BeforeAgentStart, json!({ "sessionKey": command.session_key, "runId": ctx.run.id, "agentId": command.agent_id, "text": command.text })))
        .await;
    Box::pin(replica
        .hooks
        .run(HookPoint::MessageReceived, json!({ "sessionKey": command.session_key, "runId": ctx.run.id, "channel": command.channel, "senderId": command.sender_id, "text": command.text })))
        .await;
    let instructions = if ctx.agent.instructions.is_empty() {
        replica.settings.system_prompt.as_str()
    } else {
        ctx.agent.instructions.as_str()
    };
    // A hook that gives the whole system prompt leaves no parts to report.
    let (mut system, parts) = match begin.system_prompt {
        Some(system) => (system, Vec::new()),
        None => {
            let query: Vec<&str> = start_inputs.iter().map(String::as_str).collect();
            let who = context::Who {
                agent_id: agent_id(command),
                mode: ctx.agent.memory,
                session_id: ctx.session_id,
                sender_id: &command.sender_id,
                channel: &command.channel,
            };
            let gathered = Box::pin(context::gather(
                &replica.memory,
                &replica.recall,
                &replica.settings.skills_dir,
                &ctx.agent,
                &who,
                &query.join("\n"),
                context::Snapshot::Take,
            ))
            .await;
            let parts = context::parts(&context::Inputs {
                agent_id: agent_id(command),
                identity: &ctx.agent.identity,
                instructions,
                tools: &specs,
                files: &gathered.files,
                skills: &gathered.skills,
                memories: &gathered.memories,
                session_key: &command.session_key,
                channel: &command.channel,
                sender_id: &command.sender_id,
                date: &context::today(),
                hook_context: begin.context.as_deref(),
            });
            (context::system_prompt(&parts), parts)
        }
    };
    let budget = ctx
        .agent
        .context_window_tokens
        .saturating_sub(ctx.agent.reserve_tokens)
        .max(1);
    let max_turns = if ctx.agent.max_turns > 0 {
        ctx.agent.max_turns
    } else {
        replica.settings.max_turns
    };
    // Only the first turn's report needs the parts: they are let go before the model wait.
    let mut unreported = Some(parts);
    let mut last_text = String::new();
    loop {
        if turn >= max_turns {
            let text = if last_text.trim().is_empty() {
                format!("I stopped after {max_turns} model turns without reaching an answer.")
            } else {
                last_text
            };
            return Ok(ctx.outcome(
                state,
                RunStatus::MaxTurns,
                text,
                format!("the turn budget of {max_turns} was used up"),
            ));
        }
        turn += 1;
        state.turns = turn;
        let fitted = prompt::fit(&mut messages, &system, &specs, budget);
        prior = prior.saturating_sub(fitted.dropped);
        if let Some(parts) = unreported.take() {
            state.prompt_report = context::report(&parts, &system, fitted);
        }
        let mut cx = Context {
            messages: &mut messages,
            prior,
            prior_through_seq: start.prior_through_seq,
            system: &mut system,
            tools: &specs,
            compactions,
        };
        let answer = ctx.answer(state, &mut cx).await?;
        prior = cx.prior;
        compactions = cx.compactions;
        let (text, mut calls) = match answer {
            // Secrets the model repeats are gone before the answer is stored, sent or replayed.
            Ok(answer) => match agentloop_scanner::redact::redact(&answer.text) {
                std::borrow::Cow::Borrowed(_) => (answer.text, answer.calls),
                std::borrow::Cow::Owned(clean) => (clean, answer.calls),
            },
            Err(error) => return Ok(ctx.outcome(state, RunStatus::Error, String::new(), error)),
        };
        super::call_ids::make_unique(turn, &mut calls, &mut state.call_ids);
        let text = super::answer_size::fit(text);
        if !text.is_empty() {
            last_text = text.clone();
        }
        let assistant = Entry {
            key: ctx.key(EntryKey::Answer(turn)),
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
            let steering = Box::pin(ctx.steering(SafePoint::AfterAnswer)).await?;
            if steering.is_empty() {
                state.last = Some(assistant);
                ctx.learn_from(&start_inputs, &text);
                return Ok(ctx.outcome(state, RunStatus::Completed, text, String::new()));
            }
            // Steering that arrived during the answer continues the run.
            let mut entries = vec![assistant];
            for (seq, command) in &steering {
                entries
                    .push(ctx.user_entry(ctx.key(EntryKey::Steering(*seq)), &Input::of(command)));
                messages.push(ChatMessage::user(for_model(
                    &command.text,
                    Flag::of(&command.metadata).as_ref(),
                )));
            }
            Box::pin(ctx.append(state, entries)).await?;
            continue;
        }
        // The calls are persisted before they run, so a crash resumes them instead of asking again.
        Box::pin(ctx.append(state, vec![assistant])).await?;
        state.open_calls = calls.iter().map(|c| (turn, c.clone())).collect();
        let (outcomes, mut steering) = Box::pin(ctx.run_batch(&tools, calls)).await?;
        if steering.is_empty() {
            steering = Box::pin(ctx.steering(SafePoint::AfterBatch)).await?;
        }
        persist_batch(ctx, state, turn, &outcomes, &steering, &mut messages).await?;
    }
}

/// Stores a batch's results (and steering taken during it), then adds them to the context.
async fn persist_batch(
    ctx: &RunCtx<'_>,
    state: &mut RunState,
    turn: u32,
    outcomes: &[ToolOutcome],
    steering: &[(i64, RunCommand)],
    messages: &mut Vec<ChatMessage>,
) -> Result<(), MemoryCallError> {
    let mut entries = Vec::with_capacity(outcomes.len() + steering.len());
    for outcome in outcomes {
        entries.push(Entry {
            key: ctx.key(EntryKey::ToolResult(turn, &outcome.call.id)),
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
        entries.push(ctx.user_entry(ctx.key(EntryKey::Steering(*seq)), &Input::of(command)));
        messages.push(ChatMessage::user(for_model(
            &command.text,
            Flag::of(&command.metadata).as_ref(),
        )));
    }
    Box::pin(ctx.append(state, entries)).await?;
    state.open_calls.clear();
    Ok(())
}

/// The Guardian's second look at an input the scanner rated medium, when a review model is
/// configured: a denied input ends the run before the model sees it, with the reason as the
/// answer.
async fn second_opinion(
    ctx: &RunCtx<'_>,
    state: &mut RunState,
    inputs: &[Input],
) -> Option<Outcome> {
    let replica = ctx.replica;
    if !replica.guardian.has_model() {
        return None;
    }
    for input in inputs
        .iter()
        .filter(|i| i.flag.as_ref().is_some_and(Flag::is_medium))
    {
        let verdict = replica
            .guardian
            .review(
                &replica.models,
                replica.scanner.as_ref(),
                &replica.scanner_config,
                agent_id(ctx.command),
                "incoming message",
                &json!(input.text),
            )
            .await;
        if verdict.allow {
            continue;
        }
        tracing::warn!(level = %verdict.level, by = verdict.by.as_str(), reason = %verdict.reason, "flagged message denied by the guardian");
        let data = json!({ "level": verdict.level.as_str(), "reason": verdict.reason, "by": verdict.by.as_str(), "origin": "inbound" });
        ctx.events
            .security(EventPhase::Denied, data.to_string())
            .await;
        ctx.audit(
            agentloop_proto::AuditSource::Guardian,
            "denied",
            "inbound message",
            verdict.by.as_str(),
            &format!("{} risk: {}", verdict.level, verdict.reason),
        )
        .await;
        let text = format!(
            "I won't act on this message: a security review judged it {} risk ({}).",
            verdict.level, verdict.reason
        );
        state.last = Some(Entry {
            key: ctx.key(EntryKey::Answer(1)),
            role: "assistant".to_owned(),
            content: text.clone(),
            run_id: ctx.run.id.clone(),
            ..Default::default()
        });
        return Some(ctx.outcome(state, RunStatus::Completed, text, String::new()));
    }
    None
}
