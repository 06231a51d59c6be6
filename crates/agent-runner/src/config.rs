//! Runner settings: `[bus]`, `[memory]` (url), `[models]` and `[runner]`.

use agentloop_bus::BusConfig;
use agentloop_model::ModelsConfig;

/// Everything the runner reads from the merged configuration.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(default, from = "RawRunnerConfig")]
pub struct RunnerConfig {
    /// NATS connection and stream layout.
    pub bus: BusConfig,
    /// Where the memory service is.
    pub memory: agentloop_lifecycle::MemoryEndpoint,
    /// Model providers and the default model.
    pub models: ModelsConfig,
    /// `[models] allowlist`, enforced by the router and checked again at intake: when not
    /// empty, the only models (besides the default) a run command may name.
    pub model_allowlist: Vec<String>,
    /// Runner-only settings.
    pub runner: RunnerSettings,
    /// Agents by id (`[agents.<id>]`); an agent without a section uses the defaults.
    pub agents: std::collections::BTreeMap<String, AgentConfig>,
    /// MCP servers whose tools agents are offered (`[mcp.servers.<name>]`).
    pub mcp: crate::McpConfig,
    /// The injection scanner every tool result goes through.
    pub scanner: agentloop_scanner::ScannerConfig,
    /// The Guardian: a second opinion on the tools agents name in `guardian_tools`.
    pub guardian: crate::guardian::GuardianConfig,
}

/// The file's shape: `[models]` holds the provider settings and the router's allowlist, which
/// the runner keeps apart since the model client has no use for it.
#[derive(Default, serde::Deserialize)]
#[serde(default)]
struct RawRunnerConfig {
    bus: BusConfig,
    memory: agentloop_lifecycle::MemoryEndpoint,
    models: ModelsConfig,
    runner: RunnerSettings,
    agents: std::collections::BTreeMap<String, AgentConfig>,
    mcp: crate::McpConfig,
    scanner: agentloop_scanner::ScannerConfig,
    guardian: crate::guardian::GuardianConfig,
}

impl From<RawRunnerConfig> for RunnerConfig {
    fn from(mut raw: RawRunnerConfig) -> Self {
        let model_allowlist = std::mem::take(&mut raw.models.allowlist);
        Self {
            bus: raw.bus,
            memory: raw.memory,
            models: raw.models,
            model_allowlist,
            runner: raw.runner,
            agents: raw.agents,
            mcp: raw.mcp,
            scanner: raw.scanner,
            guardian: raw.guardian,
        }
    }
}

agentloop_lifecycle::config_schema!(RunnerConfig);

/// One agent (`[agents.<id>]`).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(default)]
pub struct AgentConfig {
    /// The agent's model (`provider/model`), applied by the router between a session's
    /// override and the global default.
    pub model: String,
    /// Who the agent is (first line of the system prompt); empty derives it from the id.
    pub identity: String,
    /// Standing instructions; empty uses `runner.system_prompt`.
    pub instructions: String,
    /// Tools offered to the model (`*` for every known tool).
    pub tools_allow: Vec<String>,
    /// Tools never offered, even when allowed.
    pub tools_deny: Vec<String>,
    /// Model turns per run; 0 uses `runner.max_turns`.
    pub max_turns: u32,
    /// Queue mode when neither the message nor the session sets one.
    pub queue_mode: agentloop_proto::QueueMode,
    /// The model's context window, in tokens.
    pub context_window_tokens: usize,
    /// Tokens kept free for the answer.
    pub reserve_tokens: usize,
    /// Run timeout; 0 uses `runner.run_timeout_ms`.
    pub run_timeout_ms: u64,
    /// Operator files put in the system prompt, in order (each capped; a missing one is logged
    /// and left out).
    pub context_files: Vec<std::path::PathBuf>,
    /// Skill folders of this agent's own, read after `runner.skills_dir` (a skill here wins
    /// over a global one of the same name).
    pub skills_dirs: Vec<std::path::PathBuf>,
    /// The skills offered, by name; empty or `*` offers every skill found.
    pub skills: Vec<String>,
    /// Long-term memory: `agent` (per agent and user), `shared` (per user, across agents) or
    /// `off` (no memory tools, nothing recalled).
    pub memory: MemoryMode,
    /// Tools whose calls the Guardian reviews before they run (`*` for all).
    pub guardian_tools: Vec<String>,
    /// What happens when the model calls a tool: `allow`, `ask` (an operator approves each
    /// call, `approvals.resolve`) or `deny`, by tool name; `*` for every tool not named.
    /// Tools named nowhere are allowed.
    pub tool_policy: std::collections::BTreeMap<String, agentloop_proto::ToolPolicy>,
}

impl AgentConfig {
    /// The policy of calls of `tool`: its own entry, else `*`, else allow.
    pub fn tool_policy_of(&self, tool: &str) -> agentloop_proto::ToolPolicy {
        self.tool_policy
            .get(tool)
            .or_else(|| self.tool_policy.get("*"))
            .copied()
            .unwrap_or(agentloop_proto::ToolPolicy::Allow)
    }
}

/// Whose long-term memory an agent reads and writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MemoryMode {
    /// Kept per agent and user.
    #[default]
    Agent,
    /// Kept per user, shared by every agent with this mode.
    Shared,
    /// No memory.
    Off,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            model: String::new(),
            identity: String::new(),
            instructions: String::new(),
            tools_allow: vec!["*".to_owned()],
            tools_deny: Vec::new(),
            max_turns: 0,
            queue_mode: agentloop_proto::QueueMode::Followup,
            context_window_tokens: 128_000,
            reserve_tokens: 16_384,
            run_timeout_ms: 0,
            context_files: Vec::new(),
            skills_dirs: Vec::new(),
            skills: Vec::new(),
            memory: MemoryMode::Agent,
            guardian_tools: Vec::new(),
            tool_policy: std::collections::BTreeMap::new(),
        }
    }
}

/// `[runner]`
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(default)]
pub struct RunnerSettings {
    /// Admin HTTP address (`/healthz`, `/readyz`, `/metrics`); empty means an ephemeral port.
    pub admin_listen: String,
    /// Durable consumer name shared by runner replicas.
    pub consumer: String,
    /// This replica's lease owner name; empty means `<hostname>-<pid>-<random>`.
    pub owner_id: String,
    /// How long a session lease lasts without renewal; renewed every third of it.
    pub lease_ttl_ms: u64,
    /// How often this replica looks for sessions whose owner died.
    pub sweep_interval_ms: u64,
    /// Runs executing at once on this replica (sessions beyond it wait their turn).
    pub max_concurrent_runs: usize,
    /// Model calls in flight at once on this replica (the global lane).
    pub max_concurrent_model_calls: usize,
    /// Transcript entries given to the model as context.
    pub history_limit: u32,
    /// Transcript entries kept in memory across sessions, so a session's next run fetches only
    /// what is new; the least recently used sessions are dropped first. 0 turns it off.
    pub history_cache_entries: usize,
    /// System prompt of the default agent.
    pub system_prompt: String,
    /// A run is cut after this long.
    pub run_timeout_ms: u64,
    /// Sessions whose run commands are enqueued at once; each session's commands go one after
    /// another, in order.
    pub intake_concurrency: usize,
    /// Enqueue a session's commands in their RUNS order whichever replica pulled each: a
    /// command waits while an earlier one of its session is still in RUNS and not in the
    /// inbox (a stream read, skipped when this replica saw every command since the session's
    /// previous one). Off, a faster replica can enqueue a later one first.
    pub keep_order: bool,
    /// Time given to in-flight runs on shutdown before they are cut.
    pub drain_timeout_ms: u64,
    /// Model turns per run unless the agent sets its own.
    pub max_turns: u32,
    /// How long a tool call may take unless the tool sets its own.
    pub tool_timeout_ms: u64,
    /// How long a call an agent's `tool_policy` sends to an operator waits for an answer
    /// before it is denied (keep it under the run timeout).
    pub approval_timeout_ms: u64,
    /// Arguments and results in tool events are cut to this many bytes.
    pub tool_event_max_bytes: usize,
    /// A running tool emits an `update` event this often.
    pub tool_update_interval_ms: u64,
    /// External hooks (`[[runner.hooks]]`: point, subject, timeout_ms, fail_open).
    pub hooks: Vec<crate::hooks::ExternalHookConfig>,
    /// Names of the remote tools this runner accepts (`*` matches any run of characters).
    /// `["*"]` suits development; in production list the tools you deploy, so that whoever
    /// can announce on `<prefix>.tool._announce` cannot offer the model a tool of their own.
    /// A remote tool can never take a built-in's name, whatever this says.
    #[serde(deserialize_with = "agentloop_lifecycle::list_or_commas")]
    pub remote_tools_allow: Vec<String>,
    /// A folder of skills (one folder per skill holding a `SKILL.md`) every agent sees;
    /// empty for none.
    pub skills_dir: String,
}

impl Default for RunnerSettings {
    fn default() -> Self {
        Self {
            admin_listen: String::new(),
            consumer: "runner".to_owned(),
            owner_id: String::new(),
            lease_ttl_ms: 30_000,
            sweep_interval_ms: 5_000,
            max_concurrent_runs: 256,
            max_concurrent_model_calls: 64,
            history_limit: 200,
            history_cache_entries: 20_000,
            system_prompt: "You are a helpful assistant.".to_owned(),
            run_timeout_ms: 600_000,
            intake_concurrency: 256,
            keep_order: true,
            drain_timeout_ms: 25_000,
            max_turns: 24,
            tool_timeout_ms: 60_000,
            approval_timeout_ms: 120_000,
            tool_event_max_bytes: 4_096,
            tool_update_interval_ms: 5_000,
            hooks: Vec::new(),
            remote_tools_allow: vec!["*".to_owned()],
            skills_dir: String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_allowlist_is_read_next_to_the_provider_settings() {
        let config: RunnerConfig = agentloop_lifecycle::load_config_from(
            None,
            [
                (
                    "AGENTLOOP_MODELS__DEFAULT_MODEL".to_owned(),
                    "openai/a".to_owned(),
                ),
                (
                    "AGENTLOOP_MODELS__REQUEST_TIMEOUT_MS".to_owned(),
                    "1234".to_owned(),
                ),
                ("AGENTLOOP_RUNNER__MAX_TURNS".to_owned(), "3".to_owned()),
            ],
        )
        .unwrap();
        assert_eq!(config.models.default_model, "openai/a");
        assert_eq!(config.models.request_timeout_ms, 1234);
        assert_eq!(config.runner.max_turns, 3);
        assert!(config.model_allowlist.is_empty());
        assert_eq!(config.runner.remote_tools_allow, vec!["*"]);
        let config: RunnerConfig = agentloop_lifecycle::load_config_from(
            None,
            [
                (
                    "AGENTLOOP_MODELS__ALLOWLIST".to_owned(),
                    "openai/a, openai/b".to_owned(),
                ),
                (
                    "AGENTLOOP_RUNNER__REMOTE_TOOLS_ALLOW".to_owned(),
                    "word_count,web_*".to_owned(),
                ),
            ],
        )
        .unwrap();
        assert_eq!(config.model_allowlist, vec!["openai/a", "openai/b"]);
        assert_eq!(
            config.runner.remote_tools_allow,
            vec!["word_count", "web_*"]
        );
    }
}
