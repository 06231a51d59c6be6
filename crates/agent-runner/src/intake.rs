//! Intake: each RunCommand goes into the session's inbox (deduplicated) and is acked once that
//! row is on disk; meanwhile the replica tries to take the session. A sweeper takes sessions
//! whose owner died.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use tokio::sync::Semaphore;
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::Instrument as _;

use agentloop_bus::{Bus, InOrder, StreamKind, error_chain};
use agentloop_lifecycle::{Counter, Health};
use agentloop_model::ModelClient;
use agentloop_proto::v1::{
    ClaimSessionRequest, ControlMessage, EnqueueRequest, ListClaimableRequest, RunCommand,
    session_service_client::SessionServiceClient,
};

use crate::control::{self, SessionSignals};
use crate::error::MemoryCallError;
use crate::hooks::Hooks;
use crate::memory::Memory;
use crate::tools::{CurrentTime, SendMessage, SessionHistory, Tool, remote::RemoteTools};
use crate::{AgentConfig, Extensions, RunnerConfig, RunnerError, RunnerSettings, owner};

pub(crate) const SERVICE: &str = "runner";

/// What every task of this replica shares.
pub(crate) struct Shared {
    pub(crate) bus: Bus,
    pub(crate) memory: Memory,
    pub(crate) models: ModelClient,
    /// Profiles, fallbacks, thinking level and context windows for the recovery chain.
    pub(crate) models_config: agentloop_model::ModelsConfig,
    pub(crate) settings: RunnerSettings,
    pub(crate) default_model: String,
    pub(crate) owner_id: String,
    /// Sessions this replica holds the lease of, with the signals of their live run.
    pub(crate) owned: Mutex<HashMap<String, Arc<SessionSignals>>>,
    /// Agents by id; shared with each run rather than copied into it (instructions run long).
    pub(crate) agents: std::collections::BTreeMap<String, Arc<AgentConfig>>,
    /// Built-in and in-process tools.
    pub(crate) local_tools: Vec<Arc<dyn Tool>>,
    /// Tools served by other processes.
    pub(crate) remote_tools: RemoteTools,
    /// Each agent's tool set, with the remote tools' generation it was built at.
    pub(crate) toolsets: crate::tools::ToolSets,
    pub(crate) hooks: Hooks,
    pub(crate) run_slots: Semaphore,
    pub(crate) model_slots: Semaphore,
    pub(crate) tracker: TaskTracker,
    /// Cancelled on shutdown: owners stop taking new inputs.
    pub(crate) stopping: CancellationToken,
    /// Cancelled when the drain time is over: runs in flight are cut.
    /// Cancelled when the drain time is over: owners drop their run unfinished and hand the
    /// session back, so another replica resumes it from its last persisted step.
    pub(crate) abandon: CancellationToken,
    pub(crate) metrics: Metrics,
    /// Acknowledges run commands once their inbox rows are on disk.
    pub(crate) acks: crate::acks::AckSender,
    /// The transcript windows of recent sessions.
    pub(crate) histories: Mutex<crate::history::HistoryCache>,
}

pub(crate) struct Metrics {
    pub(crate) runs_completed: Counter,
    pub(crate) runs_failed: Counter,
    pub(crate) claims: Counter,
}

pub(crate) async fn serve(
    config: RunnerConfig,
    health: Health,
    shutdown: CancellationToken,
    extensions: Extensions,
) -> Result<(), RunnerError> {
    let ready = health.component(SERVICE);
    let dead_lettered = health.counter(
        "agentloop_runner_dead_letters_total",
        "Run commands dead-lettered.",
    );
    let models = ModelClient::new(&config.models)?;
    let channel = config
        .memory
        .channel()
        .map_err(|source| RunnerError::MemoryUrl {
            url: config.memory.url.clone(),
            source,
        })?;
    let Some(bus) = Bus::connect_retrying(&config.bus, SERVICE, &shutdown).await? else {
        return Ok(());
    };
    let mut messages = bus
        .deliveries(StreamKind::Runs, &config.runner.consumer)
        .await?;
    // Ready means work arrives: not while the consumer's pull is down (a leader election).
    let consumer_ready = health.component(&format!("{SERVICE} consumer"));
    messages.report_flow(move |flowing| consumer_ready.set(flowing));
    let owner_id = if config.runner.owner_id.is_empty() {
        default_owner_id()
    } else {
        config.runner.owner_id.clone()
    };
    let memory = SessionServiceClient::new(channel);
    let ack_stop = CancellationToken::new();
    let (acks, acker) = crate::acks::start(memory.clone(), ack_stop.clone());
    let shared = Arc::new(Shared {
        bus: bus.clone(),
        memory,
        acks,
        histories: Mutex::new(crate::history::HistoryCache::new(
            config.runner.history_cache_entries,
            config.runner.history_limit,
        )),
        models,
        models_config: config.models.clone(),
        settings: config.runner.clone(),
        default_model: config.models.default_model.clone(),
        owner_id: owner_id.clone(),
        owned: Mutex::new(HashMap::new()),
        agents: config
            .agents
            .iter()
            .map(|(id, agent)| (id.clone(), Arc::new(agent.clone())))
            .collect(),
        local_tools: {
            let mut tools: Vec<Arc<dyn Tool>> = vec![
                Arc::new(CurrentTime),
                Arc::new(SessionHistory),
                Arc::new(SendMessage),
            ];
            tools.extend(extensions.tools);
            tools
        },
        remote_tools: RemoteTools::default(),
        toolsets: crate::tools::ToolSets::default(),
        hooks: Hooks::new(extensions.hooks, &config.runner.hooks, bus.client()),
        run_slots: Semaphore::new(config.runner.max_concurrent_runs.max(1)),
        model_slots: Semaphore::new(config.runner.max_concurrent_model_calls.max(1)),
        tracker: TaskTracker::new(),
        stopping: CancellationToken::new(),
        abandon: CancellationToken::new(),
        metrics: Metrics {
            runs_completed: health.counter(
                "agentloop_runner_runs_completed_total",
                "Runs that ended with a final answer.",
            ),
            runs_failed: health.counter(
                "agentloop_runner_runs_failed_total",
                "Runs that ended with an error, timeout or abort.",
            ),
            claims: health.counter(
                "agentloop_runner_session_claims_total",
                "Session leases taken by this replica.",
            ),
        },
    });
    let intake_shared = shared.clone();
    let mut intake = InOrder::new(
        config.runner.intake_concurrency,
        move |(msg, command): (jetstream::Message, RunCommand)| {
            let shared = intake_shared.clone();
            async move {
                let span = tracing::info_span!("intake", session_id = %command.session_id, session_key = %command.session_key);
                agentloop_telemetry::set_parent_from_nats(&span, msg.headers.as_ref());
                take_in(&shared, msg, command).instrument(span).await;
            }
        },
    );
    let sweeper = tokio::spawn(sweep(shared.clone()));
    let controls = control::listen(shared.clone()).await?;
    let admission = crate::admission::Admission::new(&config);
    if let Err(err) = shared
        .remote_tools
        .discover(
            &bus,
            Duration::from_millis(config.runner.tool_timeout_ms),
            crate::tools::remote::Admit::new(
                &shared.local_tools,
                &config.runner.remote_tools_allow,
            ),
        )
        .await
    {
        tracing::warn!(error = %err, "remote tool discovery unavailable");
    }
    ready.set(true);
    tracing::info!(owner = %owner_id, prefix = %config.bus.prefix, "runner consuming run commands");
    loop {
        let msg = tokio::select! {
            () = shutdown.cancelled() => break,
            msg = messages.next() => msg,
        };
        let command = match agentloop_bus::decode::<RunCommand>(&msg) {
            Ok((command, _)) if command.session_id.is_empty() => {
                dead_lettered.inc();
                reject(&bus, &msg, "run command has no session_id").await;
                continue;
            }
            Ok((command, _)) if let Err(refusal) = admission.check(&command) => {
                dead_lettered.inc();
                reject(&bus, &msg, &refusal.to_string()).await;
                continue;
            }
            Ok((command, _)) => command,
            Err(err) => {
                dead_lettered.inc();
                reject(&bus, &msg, &error_chain(&err)).await;
                continue;
            }
        };
        let session_id = command.session_id.clone();
        // Waiting for a free slot must not hold up a stop: a command dropped here is not
        // acknowledged, so JetStream hands it to a replica again.
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = intake.push(&session_id, (msg, command)) => {}
        }
    }
    // Graceful stop: no new commands (unacked ones return to other replicas), owners finish the
    // run they are in and hand their sessions back; past the drain time runs are cut.
    // Stopping first: commands already taken go into their inboxes and are acked, but this
    // replica claims none of them; the other replicas' sweepers do.
    ready.set(false);
    shared.stopping.cancel();
    drop(messages);
    intake.finish().await;
    // Intake is over, so nothing more is handed to the acknowledger: it flushes and acks the rest.
    ack_stop.cancel();
    let _ = acker.await;
    sweeper.abort();
    controls.abort();
    shared.tracker.close();
    let drain = Duration::from_millis(shared.settings.drain_timeout_ms);
    if tokio::time::timeout(drain, shared.tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            drain_ms = drain.as_millis() as u64,
            "drain time over, cutting runs in flight"
        );
        shared.abandon.cancel();
        shared.tracker.wait().await;
    }
    Ok(())
}

fn default_owner_id() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .unwrap_or_else(|| "runner".to_owned());
    let suffix = agentloop_bus::nuid();
    format!(
        "{host}-{}-{}",
        std::process::id(),
        &suffix[suffix.len() - 6..]
    )
}

/// Dead-letters a command with the reason and acks it; naks it when the dead-letter failed.
pub(crate) async fn reject(bus: &Bus, msg: &jetstream::Message, reason: &str) {
    match bus
        .dead_letter(
            SERVICE,
            &msg.subject,
            msg.headers.as_ref(),
            msg.payload.clone(),
            reason,
        )
        .await
    {
        Ok(()) => {
            let _ = msg.ack().await;
        }
        Err(err) => {
            tracing::error!(error = %error_chain(&err), "failed to dead-letter, will retry");
            let _ = msg
                .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
                .await;
        }
    }
}

async fn take_in(shared: &Arc<Shared>, msg: jetstream::Message, command: RunCommand) {
    // The message's mode, else the session's (both set by the router), else the agent's default.
    let agent_id = if command.agent_id.is_empty() {
        "main"
    } else {
        command.agent_id.as_str()
    };
    let mode = if command.queue_mode.is_empty() {
        shared
            .agents
            .get(agent_id)
            .map(|agent| agent.queue_mode.clone())
            .unwrap_or_default()
    } else {
        command.queue_mode.clone()
    };
    let kind = match mode.as_str() {
        "steer" | "collect" | "interrupt" | "followup" => mode.clone(),
        _ => "user".to_owned(),
    };
    // Claimed in the same call, after the input is committed: a holder releasing meanwhile
    // either sees this input (and keeps going) or leaves the lease free for this claim.
    let request = EnqueueRequest {
        session_id: command.session_id.clone(),
        idempotency_key: command.idempotency_key.clone(),
        kind: kind.clone(),
        payload: msg.payload.to_vec(),
        claim_owner: if shared.stopping.is_cancelled() {
            String::new()
        } else {
            shared.owner_id.clone()
        },
        claim_ttl_ms: u32::try_from(shared.settings.lease_ttl_ms).unwrap_or(u32::MAX),
        take_when_claimed: true,
        history_limit: shared.settings.history_limit,
        history_after_seq: crate::history::after_seq(shared, &command.session_id),
    };
    let enqueued = crate::memory::call(&shared.memory, "enqueue", &request, async |m, r| {
        m.enqueue(r).await
    })
    .await;
    let enqueued = match enqueued {
        Ok(response) => {
            if !response.inserted {
                tracing::debug!("run command already in the inbox, redelivery absorbed");
            }
            response
        }
        Err(MemoryCallError::Refused(reason)) => {
            reject(&shared.bus, &msg, &reason).await;
            return;
        }
        Err(err) => {
            tracing::warn!(error = %err, "enqueue failed, command handed back for redelivery");
            let _ = msg
                .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
                .await;
            return;
        }
    };
    if enqueued.queue_full {
        // Nothing of this command was stored; a claim made with it is still this replica's,
        // taken for the inputs already pending (the lease was free), so they are run below.
        crate::queue_full::refuse(shared, msg, &command, enqueued.inbox_max_pending).await;
    } else {
        // Acknowledged once the enqueue is on disk; meanwhile the run goes ahead.
        let row = agentloop_proto::v1::InboxRow {
            seq: enqueued.seq,
            idempotency_key: command.idempotency_key.clone(),
        };
        let _ = shared.acks.send((msg, row));
    }
    if enqueued.claimed {
        let first = enqueued
            .taken
            .map(|taken| (taken, request.history_after_seq));
        start_owner(shared, &command.session_id, enqueued.epoch, first);
        return;
    }
    if enqueued.queue_full {
        return;
    }
    if request.claim_owner.is_empty() {
        return;
    }
    let action = match kind.as_str() {
        "interrupt" => "interrupt",
        _ => "wake",
    };
    notify_owner(shared, &command.session_id, action, &enqueued.owner).await;
}

/// Starts the owner task of a session whose lease this replica just took.
fn start_owner(
    shared: &Arc<Shared>,
    session_id: &str,
    epoch: i64,
    first: Option<(agentloop_proto::v1::TakeNextResponse, i64)>,
) {
    // A previous owner of this replica may still be exiting; the new signals replace its own,
    // and it only ever removes the entry that is its own.
    if let Ok(mut owned) = shared.owned.lock() {
        owned.insert(session_id.to_owned(), Arc::new(SessionSignals::default()));
    }
    shared.metrics.claims.inc();
    let shared2 = shared.clone();
    let session_id = session_id.to_owned();
    shared.tracker.spawn(async move {
        owner::own(shared2, session_id, epoch, first).await;
    });
}

/// Tells the session's owner about new input (`wake`) or that it must stop its live run
/// (`interrupt`): directly when it runs here, over the control subject otherwise.
async fn notify_owner(shared: &Arc<Shared>, session_id: &str, action: &str, owner: &str) {
    let local = shared
        .owned
        .lock()
        .ok()
        .and_then(|owned| owned.get(session_id).cloned());
    if let Some(signals) = local {
        signals.apply(action);
        return;
    }
    let wake = ControlMessage {
        session_id: session_id.to_owned(),
        action: action.to_owned(),
        reason: format!("input queued by {}", shared.owner_id),
    };
    tracing::debug!(owner, "session owned elsewhere, telling its owner");
    let subject = shared.bus.subjects().control(session_id);
    let _ = shared
        .bus
        .publish_fast(subject, &wake, agentloop_proto::Encoding::Proto)
        .await;
}

/// Claims a session found by the sweeper unless this replica already owns it.
pub(crate) async fn try_own(shared: &Arc<Shared>, session_id: &str) {
    if shared.stopping.is_cancelled() {
        return;
    }
    let local = shared
        .owned
        .lock()
        .map(|owned| owned.contains_key(session_id))
        .unwrap_or(false);
    if local {
        // The owner keeps taking inputs until the inbox is empty.
        return;
    }
    let request = ClaimSessionRequest {
        session_id: session_id.to_owned(),
        owner: shared.owner_id.clone(),
        ttl_ms: u32::try_from(shared.settings.lease_ttl_ms).unwrap_or(u32::MAX),
    };
    let claimed = crate::memory::call(&shared.memory, "claim", &request, async |m, r| {
        m.claim_session(r).await
    })
    .await;
    match claimed {
        Ok(response) if response.claimed => start_owner(shared, session_id, response.epoch, None),
        Ok(_) => {}
        Err(err) => tracing::warn!(error = %err, "claim failed, the next sweep tries again"),
    }
}

async fn sweep(shared: Arc<Shared>) {
    let interval = Duration::from_millis(shared.settings.sweep_interval_ms.max(100));
    loop {
        tokio::time::sleep(interval).await;
        let mut memory = shared.memory.clone();
        let listed = memory
            .list_claimable(ListClaimableRequest { limit: 100 })
            .await;
        match listed {
            Ok(response) => {
                for session_id in response.into_inner().session_ids {
                    tracing::info!(session_id = %session_id, "sweeper found an unowned session with pending input");
                    try_own(&shared, &session_id).await;
                }
            }
            Err(status) => {
                tracing::debug!(error = %status.message(), "sweep failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_ids_differ_between_replicas_of_one_host() {
        assert_ne!(default_owner_id(), default_owner_id());
    }
}
