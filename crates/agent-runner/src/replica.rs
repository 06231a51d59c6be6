//! What every task of one runner replica shares: its connections, its configuration, the
//! sessions it owns and the transcript windows it holds. Built once at start (`service.rs`);
//! runs, owners and intake borrow it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::Semaphore;
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use agentloop_bus::{Bus, DeadLetters};
use agentloop_lifecycle::Counter;
use agentloop_model::{ModelClient, ModelsConfig};
use agentloop_proto::v1::Entry;

use crate::acks::AckSender;
use crate::error::MemoryCallError;
use crate::history::{HistoryCache, HistoryEntry, Window};
use crate::hooks::Hooks;
use crate::memory::MemoryClient;
use crate::signals::SessionSignals;
use crate::tools::{Tool, ToolSets, remote::RemoteTools};
use crate::{AgentConfig, RunnerSettings};

/// The service's name in logs, dead letters and NATS users.
pub(crate) const SERVICE: &str = "runner";

/// What every task of this replica shares.
pub(crate) struct Replica {
    pub(crate) bus: Bus,
    pub(crate) memory: MemoryClient,
    pub(crate) models: ModelClient,
    /// Profiles, fallbacks, thinking level and context windows for the recovery chain.
    pub(crate) models_config: ModelsConfig,
    pub(crate) settings: RunnerSettings,
    /// How many memories go into a run's context, and how relevant they must be.
    pub(crate) recall: crate::context::Recall,
    /// Auto-learn, when `memory.learn_model` is set.
    pub(crate) learner: Option<Arc<crate::learner::Learner>>,
    pub(crate) owner_id: String,
    /// Sessions this replica holds the lease of, with the signals of their live run.
    owned: Mutex<HashMap<String, Arc<SessionSignals>>>,
    /// Agents by id; shared with each run rather than copied into it (instructions run long).
    pub(crate) agents: BTreeMap<String, Arc<AgentConfig>>,
    /// Built-in and in-process tools.
    pub(crate) local_tools: Vec<Arc<dyn Tool>>,
    /// Tools served by other processes.
    pub(crate) remote_tools: RemoteTools,
    /// Each agent's tool set, with the remote tools' generation it was built at.
    pub(crate) toolsets: ToolSets,
    pub(crate) hooks: Hooks,
    pub(crate) run_slots: Semaphore,
    pub(crate) model_slots: Semaphore,
    pub(crate) tracker: TaskTracker,
    /// Cancelled on shutdown: owners stop taking new inputs.
    pub(crate) stopping: CancellationToken,
    /// Cancelled when the drain time is over: owners drop their run unfinished and hand the
    /// session back, so another replica resumes it from its last persisted step.
    pub(crate) abandon: CancellationToken,
    pub(crate) metrics: Metrics,
    /// Run commands that cannot be run: stored with the reason, acknowledged, counted.
    pub(crate) dead_letters: DeadLetters,
    /// Acknowledges run commands once their inbox rows are on disk.
    pub(crate) acks: AckSender,
    /// Renews the leases this replica holds.
    pub(crate) leases: crate::leases::Leases,
    /// Keeps a session's commands in their RUNS order across replicas.
    pub(crate) order: Arc<crate::order::CommandOrder>,
    /// The transcript windows of recent sessions.
    histories: Mutex<HistoryCache>,
    /// The injection scanner for tool results (`None`: `scanner.enabled = false`).
    pub(crate) scanner: Option<agentloop_scanner::Scanner>,
    /// Its thresholds, per agent.
    pub(crate) scanner_config: agentloop_scanner::ScannerConfig,
    /// The second opinion on risky tool calls.
    pub(crate) guardian: crate::guardian::Guardian,
}

/// The runner's counters.
pub(crate) struct Metrics {
    pub(crate) runs_completed: Counter,
    pub(crate) runs_failed: Counter,
    pub(crate) claims: Counter,
    /// Runs ended, by agent and outcome.
    pub(crate) runs: agentloop_lifecycle::CounterFamily,
    /// How long runs took, by agent and outcome.
    pub(crate) run_seconds: agentloop_lifecycle::HistogramFamily,
    /// Runs live on this replica now.
    pub(crate) in_flight: agentloop_lifecycle::Gauge,
    /// Tokens the model read and wrote, by provider, model and direction.
    pub(crate) tokens: agentloop_lifecycle::CounterFamily,
    /// Model calls' duration, by provider, model and outcome (ok or the error class).
    pub(crate) model_seconds: agentloop_lifecycle::HistogramFamily,
    /// Time from a model call's start to its first text or tool call, by provider and model.
    pub(crate) first_token_seconds: agentloop_lifecycle::HistogramFamily,
    /// Tool calls, by tool and outcome (ok, error).
    pub(crate) tool_calls: agentloop_lifecycle::CounterFamily,
    /// How long tool calls took, by tool.
    pub(crate) tool_seconds: agentloop_lifecycle::HistogramFamily,
    /// The guard's decisions, by source and decision.
    pub(crate) security: agentloop_lifecycle::CounterFamily,
    /// Time from the gateway or router taking a message in to its run's start, by agent.
    pub(crate) queue_wait_seconds: agentloop_lifecycle::HistogramFamily,
    /// Runs started again after an earlier attempt did not finish (a takeover from a dead
    /// or paused owner, or this replica's own restart), by agent.
    pub(crate) resumed: agentloop_lifecycle::CounterFamily,
}

/// The parts of a replica made before it (connections, counters, extensions).
pub(crate) struct Parts {
    pub(crate) bus: Bus,
    pub(crate) memory: MemoryClient,
    pub(crate) models: ModelClient,
    pub(crate) owner_id: String,
    pub(crate) local_tools: Vec<Arc<dyn Tool>>,
    pub(crate) hooks: Hooks,
    pub(crate) metrics: Metrics,
    pub(crate) dead_letters: DeadLetters,
    pub(crate) acks: AckSender,
    pub(crate) leases: crate::leases::Leases,
    pub(crate) order: Arc<crate::order::CommandOrder>,
    pub(crate) learner: Option<Arc<crate::learner::Learner>>,
    pub(crate) scanner: Option<agentloop_scanner::Scanner>,
    pub(crate) guardian: crate::guardian::Guardian,
}

/// Locks `mutex`, also after a panic elsewhere: the maps it guards are left consistent by
/// every holder (single inserts and removes), so their content stays valid.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Replica {
    /// A replica of `config` on `parts`.
    pub(crate) fn new(config: &crate::RunnerConfig, parts: Parts) -> Self {
        Self {
            bus: parts.bus,
            memory: parts.memory,
            models: parts.models,
            models_config: config.models.clone(),
            settings: config.runner.clone(),
            recall: crate::context::Recall::of(&config.memory),
            learner: parts.learner,
            owner_id: parts.owner_id,
            owned: Mutex::new(HashMap::new()),
            agents: config
                .agents
                .iter()
                .map(|(id, agent)| (id.clone(), Arc::new(agent.clone())))
                .collect(),
            local_tools: parts.local_tools,
            remote_tools: RemoteTools::default(),
            toolsets: ToolSets::default(),
            hooks: parts.hooks,
            run_slots: Semaphore::new(config.runner.max_concurrent_runs.max(1)),
            model_slots: Semaphore::new(config.runner.max_concurrent_model_calls.max(1)),
            tracker: TaskTracker::new(),
            stopping: CancellationToken::new(),
            abandon: CancellationToken::new(),
            metrics: parts.metrics,
            dead_letters: parts.dead_letters,
            acks: parts.acks,
            leases: parts.leases,
            order: parts.order,
            histories: Mutex::new(HistoryCache::new(
                config.runner.history_cache_entries,
                config.runner.history_limit,
            )),
            scanner: parts.scanner,
            scanner_config: config.scanner.clone(),
            guardian: parts.guardian,
        }
    }

    /// The model a run uses when its command names none.
    pub(crate) fn default_model(&self) -> &str {
        &self.models_config.default_model
    }

    /// The lease length asked for on every claim and renewal.
    pub(crate) fn lease_ttl_ms(&self) -> u32 {
        u32::try_from(self.settings.lease_ttl_ms).unwrap_or(u32::MAX)
    }

    /// Records that this replica now owns `session_id`, with fresh signals. A previous owner task
    /// of this replica may still be exiting: it only ever removes the entry that is its own.
    pub(crate) fn adopt(&self, session_id: &str) -> Arc<SessionSignals> {
        let signals = Arc::new(SessionSignals::default());
        lock(&self.owned).insert(session_id.to_owned(), signals.clone());
        signals
    }

    /// Puts `signals` back as the session's owner entry unless a newer owner took its place.
    pub(crate) fn keep(&self, session_id: &str, signals: &Arc<SessionSignals>) {
        lock(&self.owned)
            .entry(session_id.to_owned())
            .or_insert_with(|| signals.clone());
    }

    /// Removes this owner's entry from the owned set, unless a newer owner of the session on
    /// this replica already replaced it.
    pub(crate) fn forget(&self, session_id: &str, signals: &Arc<SessionSignals>) {
        let mut owned = lock(&self.owned);
        if owned
            .get(session_id)
            .is_some_and(|current| Arc::ptr_eq(current, signals))
        {
            owned.remove(session_id);
        }
    }

    /// The signals of the session's owner when it runs on this replica.
    pub(crate) fn signals_of(&self, session_id: &str) -> Option<Arc<SessionSignals>> {
        lock(&self.owned).get(session_id).cloned()
    }

    /// The seq to send as `history_after_seq` for a session.
    pub(crate) fn after_seq(&self, session_id: &str) -> i64 {
        lock(&self.histories).after_seq(session_id)
    }

    /// The whole window for a run, from what memory sent along with its input.
    pub(crate) async fn window(
        &self,
        session_id: &str,
        after_seq: i64,
        fetched: Vec<Entry>,
        delta: bool,
    ) -> Result<Window, MemoryCallError> {
        // Converted before the lock is taken: other sessions' runs wait on it.
        let fetched = fetched.into_iter().map(HistoryEntry::from).collect();
        let merged = lock(&self.histories).merge(session_id, after_seq, fetched, delta);
        if let Some(entries) = merged {
            return Ok(entries);
        }
        // The held copy moved on meanwhile: read the whole window.
        let full = self
            .memory
            .history(session_id, self.settings.history_limit)
            .await?;
        let full: Vec<HistoryEntry> = full.entries.into_iter().map(Into::into).collect();
        let entries = lock(&self.histories).merge(session_id, 0, full.clone(), false);
        Ok(entries.unwrap_or_else(|| Arc::new(full)))
    }
}
