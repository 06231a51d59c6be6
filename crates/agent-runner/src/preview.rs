//! `agentloop prompt`: what the model would receive for a session's next message, built by the
//! run path's own functions, part by part with token counts. It reads and changes nothing (no
//! skills snapshot is taken, no run is started).

use agentloop_model::{ChatMessage, ToolSpec};
use agentloop_proto::v1::{
    Caller, ListSessionsRequest, session_service_client::SessionServiceClient,
};

use crate::context::{self, Part, PartKind};
use crate::history::HistoryEntry;
use crate::memory::MemoryClient;
use crate::tools::ToolSet;
use crate::{AgentConfig, RunnerConfig, prompt};

/// What to preview.
#[derive(Debug, Clone, Default)]
pub struct PreviewRequest {
    /// The session's key.
    pub session_key: String,
    /// The next message; without it, the context as it stands.
    pub message: Option<String>,
    /// Its sender (memories are recalled for the sender when the session has no principal).
    pub sender_id: String,
    /// Its channel; empty uses the session's.
    pub channel: String,
}

/// The model's request as it would be sent.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Preview {
    /// The session's id.
    pub session_id: String,
    /// The agent that would answer.
    pub agent_id: String,
    /// The system prompt's parts in order, then the transcript's.
    pub parts: Vec<Part>,
    /// The system prompt.
    pub system: String,
    /// The tools offered (the runner's own; remote tools are announced to running runners).
    pub tools: Vec<ToolSpec>,
    /// The conversation, fitted to the model's window.
    pub messages: Vec<ChatMessage>,
    /// Estimated tokens of the whole request.
    pub total_tokens: usize,
}

/// Why a preview could not be built.
#[derive(Debug, thiserror::Error)]
pub enum PreviewError {
    /// `[memory]` cannot be used.
    #[error(transparent)]
    MemoryUrl(#[from] agentloop_lifecycle::MemoryEndpointError),
    /// Memory did not answer.
    #[error("memory: {0}")]
    Memory(String),
    /// No session has that key.
    #[error("no session {0:?}")]
    NoSession(String),
    /// `[models]` or `memory.embeddings_model` cannot be used.
    #[error(transparent)]
    Models(#[from] agentloop_model::ModelError),
}

/// Builds the request the model would get for `request`'s session.
///
/// # Errors
/// [`PreviewError`] when memory cannot be reached or the session does not exist.
pub async fn preview(
    config: &RunnerConfig,
    request: &PreviewRequest,
) -> Result<Preview, PreviewError> {
    let channel = config.memory.channel()?;
    let mut grpc = SessionServiceClient::new(channel.clone());
    let found = grpc
        .list_sessions(ListSessionsRequest {
            limit: 1,
            session_key: request.session_key.clone(),
            caller: Some(Caller {
                admin: true,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .map_err(|status| PreviewError::Memory(status.message().to_owned()))?
        .into_inner();
    let session = found
        .sessions
        .into_iter()
        .next()
        .ok_or_else(|| PreviewError::NoSession(request.session_key.clone()))?;
    // Recall embeds the message as a run would, so the preview shows the memories it recalls.
    let models = agentloop_model::ModelClient::new(&config.models)?;
    let memory = MemoryClient::new(channel).with_embedder(crate::memory::Embedder::new(
        &models,
        &config.memory.embeddings_model,
    )?);
    let history = memory
        .history(&session.id, config.runner.history_limit)
        .await
        .map_err(|err| PreviewError::Memory(err.to_string()))?;
    let entries: Vec<HistoryEntry> = history
        .entries
        .into_iter()
        .map(HistoryEntry::from)
        .collect();
    let mut messages = prompt::conversation(&entries, "");
    let text = request.message.clone().unwrap_or_default();
    if request.message.is_some() {
        messages.push(ChatMessage::user(text.clone()));
    }

    let agent_id = if session.agent_id.is_empty() {
        "main"
    } else {
        session.agent_id.as_str()
    };
    let agent = config.agents.get(agent_id).cloned().unwrap_or_default();
    let channel = if request.channel.is_empty() {
        &session.channel
    } else {
        &request.channel
    };
    let tools = offered_tools(&agent, &config.runner.skills_dir);
    let who = context::Who {
        agent_id,
        mode: agent.memory,
        session_id: &session.id,
        sender_id: &request.sender_id,
        channel,
    };
    let recall = context::Recall::of(&config.memory);
    let gathered = context::gather(
        &memory,
        &recall,
        &config.runner.skills_dir,
        &agent,
        &who,
        &text,
        context::Snapshot::Look,
    )
    .await;
    let instructions = if agent.instructions.is_empty() {
        config.runner.system_prompt.as_str()
    } else {
        agent.instructions.as_str()
    };
    let mut parts = context::parts(&context::Inputs {
        agent_id,
        identity: &agent.identity,
        instructions,
        tools: &tools,
        files: &gathered.files,
        skills: &gathered.skills,
        memories: &gathered.memories,
        session_key: &session.key,
        channel,
        sender_id: &request.sender_id,
        date: &context::today(),
        hook_context: None,
    });
    let system = context::system_prompt(&parts);
    let budget = agent
        .context_window_tokens
        .saturating_sub(agent.reserve_tokens)
        .max(1);
    let fitted = prompt::fit(&mut messages, &system, &tools, budget);
    let total_tokens = fitted.total_tokens;
    parts.push(Part {
        kind: PartKind::Transcript,
        text: String::new(),
        tokens: fitted.messages_tokens,
        truncated: false,
    });
    Ok(Preview {
        session_id: session.id,
        agent_id: agent_id.to_owned(),
        parts,
        system,
        tools,
        messages,
        total_tokens,
    })
}

/// The runner's own tools this agent is offered, as a run would offer them.
fn offered_tools(agent: &AgentConfig, skills_dir: &str) -> Vec<ToolSpec> {
    let deny = crate::tools::denied(agent, skills_dir);
    ToolSet::build(crate::tools::builtins(), &agent.tools_allow, &deny)
        .specs()
        .to_vec()
}
