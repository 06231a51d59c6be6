//! One run: context from the transcript, a streamed model call, the transcript writes, the final
//! reply and exactly one lifecycle end or error event.

use std::sync::Arc;
use std::time::Duration;

use prost::Message as _;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use agentloop_model::{ChatMessage, ChatRequest, ModelRef, StreamEvent, Usage};
use agentloop_proto::v1::{
    AppendEntriesRequest, Entry, FinishRunRequest, GetHistoryRequest, InboxItem, OutboundMessage,
    Run, RunCommand,
};

use crate::error::MemoryCallError;
use crate::events::RunEvents;
use crate::intake::Shared;
use crate::memory::with_retry;

/// How a run ended.
struct Outcome {
    status: &'static str,
    text: String,
    error: String,
    model: String,
    usage: Usage,
}

pub(crate) async fn execute(
    shared: &Arc<Shared>,
    session_id: &str,
    epoch: i64,
    item: InboxItem,
    run: Run,
    lease_lost: &CancellationToken,
) -> Result<(), MemoryCallError> {
    let command = match RunCommand::decode(item.payload.as_slice()) {
        Ok(command) => command,
        Err(err) => {
            // Intake stored what it received; a corrupt row must still be consumed, not retried forever.
            tracing::error!(error = %err, seq = item.seq, "inbox item is not a RunCommand, finishing it as an error");
            return finish(
                shared,
                session_id,
                epoch,
                &run,
                &item,
                &Outcome {
                    status: "error",
                    text: String::new(),
                    error: format!("inbox item is not a RunCommand: {err}"),
                    model: String::new(),
                    usage: Usage::default(),
                },
            )
            .await;
        }
    };
    let span = tracing::info_span!("run", run_id = %run.id, session_key = %command.session_key, attempt = run.attempts);
    async {
        let mut events = RunEvents::new(shared.bus.clone(), &run.id, session_id, &command.session_key);
        let model_name = if command.model.is_empty() {
            shared.default_model.clone()
        } else {
            command.model.clone()
        };
        events
            .lifecycle("start", json!({ "model": model_name, "attempt": run.attempts }))
            .await;
        let timeout = Duration::from_millis(shared.settings.run_timeout_ms);
        let outcome = tokio::select! {
            outcome = tokio::time::timeout(timeout, converse(shared, session_id, epoch, &run, &command, &model_name, &mut events)) => match outcome {
                Ok(Ok(outcome)) => outcome,
                Ok(Err(err)) => return Err(err),
                Err(_) => failed("timeout", &model_name, format!("the run took longer than {} ms", timeout.as_millis())),
            },
            () = lease_lost.cancelled() => return Err(MemoryCallError::LeaseLost("lease renewal refused".to_owned())),
            () = shared.hard_stop.cancelled() => failed("aborted", &model_name, "the runner shut down before the run finished".to_owned()),
        };
        reply(shared, session_id, &run, &command, &outcome).await;
        finish(shared, session_id, epoch, &run, &item, &outcome).await?;
        if outcome.status == "completed" {
            shared.metrics.runs_completed.inc();
            events
                .lifecycle("end", json!({
                    "reason": "completed",
                    "model": outcome.model,
                    "usage": { "input_tokens": outcome.usage.input_tokens, "output_tokens": outcome.usage.output_tokens },
                }))
                .await;
        } else {
            shared.metrics.runs_failed.inc();
            events
                .lifecycle("error", json!({ "reason": outcome.status, "error": outcome.error, "model": outcome.model }))
                .await;
        }
        Ok(())
    }
    .instrument(span)
    .await
}

fn failed(status: &'static str, model: &str, error: String) -> Outcome {
    Outcome {
        status,
        text: String::new(),
        error,
        model: model.to_owned(),
        usage: Usage::default(),
    }
}

/// Builds the context, writes the user entry, streams the model's answer, writes it.
async fn converse(
    shared: &Arc<Shared>,
    session_id: &str,
    epoch: i64,
    run: &Run,
    command: &RunCommand,
    model_name: &str,
    events: &mut RunEvents,
) -> Result<Outcome, MemoryCallError> {
    let model = match ModelRef::parse(model_name) {
        Ok(model) => model,
        Err(err) => return Ok(failed("error", model_name, err.to_string())),
    };
    let history_request = GetHistoryRequest {
        session_id: session_id.to_owned(),
        limit: shared.settings.history_limit,
    };
    let user_entry = Entry {
        key: format!("{}:user", run.id),
        role: "user".to_owned(),
        content: command.text.clone(),
        run_id: run.id.clone(),
        ..Default::default()
    };
    let memory = shared.memory.clone();
    // History and the user entry are independent round trips; doing them together saves one.
    let (history, appended) = tokio::join!(
        with_retry("get_history", || {
            let mut memory = memory.clone();
            let request = history_request.clone();
            async move { memory.get_history(request).await }
        }),
        append(shared, session_id, epoch, vec![user_entry]),
    );
    let history = history?;
    appended?;
    let mut messages = Vec::with_capacity(history.entries.len() + 1);
    for entry in history.entries {
        // A resumed run already wrote its own user entry; it is added once, below.
        if entry.run_id == run.id {
            continue;
        }
        match entry.role.as_str() {
            "user" => messages.push(ChatMessage::user(entry.content)),
            "assistant" => messages.push(ChatMessage::assistant(entry.content)),
            _ => {}
        }
    }
    messages.push(ChatMessage::user(command.text.clone()));
    let request = ChatRequest {
        model,
        system: Some(shared.settings.system_prompt.clone()),
        messages,
        tools: Vec::new(),
        max_tokens: None,
    };
    let Ok(_permit) = shared.model_slots.acquire().await else {
        return Ok(failed(
            "aborted",
            model_name,
            "the runner is shutting down".to_owned(),
        ));
    };
    let mut text = String::new();
    let mut usage = Usage::default();
    let mut stream = match shared.models.stream(&request).await {
        Ok(stream) => stream,
        Err(err) => {
            return Ok(failed(
                "error",
                model_name,
                agentloop_bus::error_chain(&err),
            ));
        }
    };
    while let Some(event) = stream.next().await {
        match event {
            Ok(StreamEvent::TextDelta(delta)) => {
                events.delta(&delta).await;
                text.push_str(&delta);
            }
            Ok(StreamEvent::ToolCall(call)) => {
                tracing::warn!(tool = %call.name, "model asked for a tool, but this agent has none");
            }
            Ok(StreamEvent::Done { usage: u, .. }) => usage = u,
            Err(err) => {
                return Ok(failed(
                    "error",
                    model_name,
                    agentloop_bus::error_chain(&err),
                ));
            }
        }
    }
    let assistant_entry = Entry {
        key: format!("{}:assistant", run.id),
        role: "assistant".to_owned(),
        content: text.clone(),
        run_id: run.id.clone(),
        ..Default::default()
    };
    append(shared, session_id, epoch, vec![assistant_entry]).await?;
    Ok(Outcome {
        status: "completed",
        text,
        error: String::new(),
        model: model_name.to_owned(),
        usage,
    })
}

async fn append(
    shared: &Arc<Shared>,
    session_id: &str,
    epoch: i64,
    entries: Vec<Entry>,
) -> Result<(), MemoryCallError> {
    let request = AppendEntriesRequest {
        session_id: session_id.to_owned(),
        epoch,
        entries,
    };
    let memory = shared.memory.clone();
    with_retry("append_entries", || {
        let mut memory = memory.clone();
        let request = request.clone();
        async move { memory.append_entries(request).await }
    })
    .await
    .map(|_| ())
}

/// Publishes the final reply (or the error reply) before the run is marked finished, so a crash
/// in between re-runs into the same message id and the stream drops the duplicate.
async fn reply(
    shared: &Arc<Shared>,
    session_id: &str,
    run: &Run,
    command: &RunCommand,
    outcome: &Outcome,
) {
    let text = if outcome.status == "completed" {
        outcome.text.clone()
    } else {
        format!("Sorry, I could not answer: {}", outcome.error)
    };
    let message = OutboundMessage {
        run_id: run.id.clone(),
        session_key: command.session_key.clone(),
        channel: command.channel.clone(),
        recipient: command.sender_id.clone(),
        text,
        r#final: true,
        reply_to_id: command.message_id.clone(),
        session_id: session_id.to_owned(),
        error: if outcome.status == "completed" {
            String::new()
        } else {
            format!("{}: {}", outcome.status, outcome.error)
        },
        reply_subject: command.reply_subject.clone(),
        reply_encoding: command.reply_encoding.clone(),
        metadata: command.metadata.clone(),
        ts: Some(agentloop_proto::now()),
    };
    let subject = shared.bus.subjects().outbound(&command.channel);
    let msg_id = format!("{}:final", run.id);
    let mut delay = Duration::from_millis(100);
    for attempt in 1..=8 {
        match shared
            .bus
            .publish_durable(subject.clone(), &message, Some(&msg_id))
            .await
        {
            Ok(()) => return,
            Err(err) => {
                tracing::warn!(error = %agentloop_bus::error_chain(&err), attempt, "failed to publish the reply, retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
            }
        }
    }
    tracing::error!("gave up publishing the reply");
}

async fn finish(
    shared: &Arc<Shared>,
    session_id: &str,
    epoch: i64,
    run: &Run,
    item: &InboxItem,
    outcome: &Outcome,
) -> Result<(), MemoryCallError> {
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
    };
    let memory = shared.memory.clone();
    with_retry("finish_run", || {
        let mut memory = memory.clone();
        let request = request.clone();
        async move { memory.finish_run(request).await }
    })
    .await
    .map(|_| ())
}
