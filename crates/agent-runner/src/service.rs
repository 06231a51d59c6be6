//! The runner as a service: connect, build the replica, consume run commands until shutdown,
//! then drain.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use agentloop_bus::{Bus, DeadLetters, DeadReason, InOrder, StreamKind, error_chain};
use agentloop_lifecycle::Health;
use agentloop_model::ModelClient;
use agentloop_proto::v1::RunCommand;

use crate::admission::Admission;
use crate::hooks::Hooks;
use crate::memory::MemoryClient;
use crate::replica::{Metrics, Parts, Replica, SERVICE};
use crate::tools::{Tool, remote::Admit};
use crate::{Extensions, RunnerConfig, RunnerError, control, intake};

/// Runs sessions until `shutdown`, reporting readiness into `health`.
pub(crate) async fn serve(
    config: RunnerConfig,
    health: Health,
    shutdown: CancellationToken,
    extensions: Extensions,
) -> Result<(), RunnerError> {
    let ready = health.component(SERVICE);
    let models = ModelClient::new(&config.models)?;
    let channel = config.memory.channel()?;
    let Some(bus) = Bus::connect_retrying(&config.bus, SERVICE, &shutdown).await? else {
        return Ok(());
    };
    let mut messages = bus
        .deliveries(StreamKind::Runs, &config.runner.consumer)
        .await?;
    // Ready means work arrives: not while the consumer's pull is down (a leader election).
    let consumer_ready = health.component(&format!("{SERVICE} consumer"));
    messages.report_flow(move |flowing| consumer_ready.set(flowing));
    let memory = MemoryClient::new(channel).with_embedder(crate::memory::Embedder::new(
        &models,
        &config.memory.embeddings_model,
    )?);
    let runs = bus
        .readable_stream(
            StreamKind::Runs,
            config.runner.keep_order,
            "runner.keep_order",
        )
        .await?;
    let order = Arc::new(crate::order::CommandOrder::new(
        runs,
        Duration::from_millis(config.bus.ack_wait_ms),
        u32::try_from(config.bus.max_deliver).unwrap_or(u32::MAX),
        health.counter(
            "agentloop_runner_order_reads_total",
            "Reads of RUNS for a session's earlier command before one was enqueued (runner.keep_order).",
        ),
    ));
    let ack_stop = CancellationToken::new();
    let (acks, acker) = crate::acks::start(memory.clone(), order.clone(), ack_stop.clone());
    let lease_ttl_ms = u32::try_from(config.runner.lease_ttl_ms).unwrap_or(u32::MAX);
    let (leases, renewer) = crate::leases::Leases::start(memory.clone(), lease_ttl_ms);
    let mut local_tools: Vec<Arc<dyn Tool>> = crate::tools::builtins();
    local_tools.extend(extensions.tools);
    local_tools.extend(crate::tools::mcp::connect_all(&config.mcp).await);
    let replica = Arc::new(Replica::new(
        &config,
        Parts {
            hooks: Hooks::new(extensions.hooks, &config.runner.hooks, bus.client()),
            bus: bus.clone(),
            memory,
            models,
            owner_id: owner_id(&config),
            local_tools,
            metrics: metrics(&health),
            dead_letters: DeadLetters::new(bus.clone(), SERVICE, &health),
            acks,
            leases,
            order,
            learner: crate::learner::Learner::new(&config.memory)?,
            scanner: config.scanner.build()?,
            guardian: guardian(&config)?,
        },
    ));
    if let Some(learner) = replica.learner.clone() {
        replica
            .tracker
            .spawn(crate::learn::work(replica.clone(), learner));
    }
    let intake_replica = replica.clone();
    let mut intake = InOrder::new(
        config.runner.intake_concurrency,
        move |(msg, command, prev): (jetstream::Message, RunCommand, Option<u64>)| {
            let replica = intake_replica.clone();
            async move {
                let span = tracing::info_span!("intake", session_id = %command.session_id, session_key = %command.session_key);
                agentloop_telemetry::set_parent_from_nats(&span, msg.headers.as_ref());
                intake::take_in(&replica, msg, command, prev)
                    .instrument(span)
                    .await;
            }
        },
    );
    let sweeper = tokio::spawn(intake::sweep(replica.clone()));
    let controls = control::listen(replica.clone()).await?;
    let admission = Admission::new(&config);
    let dead_letters = &replica.dead_letters;
    let discovered = replica
        .remote_tools
        .discover(
            &bus,
            Duration::from_millis(config.runner.tool_timeout_ms),
            Admit::new(&replica.local_tools, &config.runner.remote_tools_allow),
        )
        .await;
    if let Err(err) = discovered {
        tracing::warn!(error = %err, "remote tool discovery unavailable");
    }
    ready.set(true);
    tracing::info!(owner = %replica.owner_id, prefix = %config.bus.prefix, "runner consuming run commands");
    loop {
        let msg = tokio::select! {
            () = shutdown.cancelled() => break,
            msg = messages.next() => msg,
        };
        // Every delivery, in the consumer's order, also one refused below: a sequence this
        // replica did not see would be taken for another replica's.
        let prev = replica.order.arrived(&msg);
        let command = match agentloop_bus::decode::<RunCommand>(&msg) {
            Ok((command, _)) if command.session_id.is_empty() => {
                dead_letters
                    .reject(&msg, DeadReason::Invalid, "run command has no session_id")
                    .await;
                continue;
            }
            Ok((command, _)) if let Err(refusal) = admission.check(&command) => {
                dead_letters
                    .reject(&msg, DeadReason::Refused, &refusal.to_string())
                    .await;
                continue;
            }
            Ok((command, _)) => command,
            Err(err) => {
                dead_letters
                    .reject(&msg, DeadReason::Invalid, &error_chain(&err))
                    .await;
                continue;
            }
        };
        let session_id = command.session_id.clone();
        // Waiting for a free slot must not hold up a stop: a command dropped here is not
        // acknowledged, so JetStream hands it to a replica again.
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = intake.push(&session_id, (msg, command, prev)) => {}
        }
    }
    // Graceful stop: no new commands (unacked ones return to other replicas), owners finish the
    // run they are in and hand their sessions back; past the drain time runs are cut.
    // Stopping first: commands already taken go into their inboxes and are acked, but this
    // replica claims none of them; the other replicas' sweepers do.
    ready.set(false);
    replica.stopping.cancel();
    drop(messages);
    intake.finish().await;
    // Intake is over, so nothing more is handed to the acknowledger: it flushes and acks the rest.
    ack_stop.cancel();
    let _ = acker.await;
    sweeper.abort();
    controls.abort();
    replica.tracker.close();
    let drain = Duration::from_millis(replica.settings.drain_timeout_ms);
    if tokio::time::timeout(drain, replica.tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            drain_ms = drain.as_millis() as u64,
            "drain time over, cutting runs in flight"
        );
        replica.abandon.cancel();
        replica.tracker.wait().await;
    }
    // Every owner is gone, and with it every lease this replica renewed.
    renewer.abort();
    Ok(())
}

fn metrics(health: &Health) -> Metrics {
    Metrics {
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
        runs: health.counter_family(
            "agentloop_runner_runs_total",
            "Runs ended, by agent and outcome (completed, max_turns, aborted, timeout, failed, ...).",
        ),
        run_seconds: health.histogram_family(
            "agentloop_runner_run_duration_seconds",
            "Time from a run's start to its end on this replica, by agent and outcome.",
        ),
        in_flight: health.gauge(
            "agentloop_runner_runs_in_flight",
            "Runs live on this replica now.",
        ),
        tokens: health.counter_family(
            "agentloop_runner_tokens_total",
            "Tokens models read (input) and wrote (output), by provider and model.",
        ),
        model_seconds: health.histogram_family(
            "agentloop_runner_model_call_duration_seconds",
            "Model calls from request to the stream's end, by provider, model and outcome (ok or the error class).",
        ),
        first_token_seconds: health.histogram_family(
            "agentloop_runner_model_first_token_seconds",
            "Time from a model call's start to its first text or tool call, by provider and model.",
        ),
        tool_calls: health.counter_family(
            "agentloop_runner_tool_calls_total",
            "Tool calls, by tool and outcome (ok, error).",
        ),
        tool_seconds: health.histogram_family(
            "agentloop_runner_tool_duration_seconds",
            "How long tool calls took, by tool.",
        ),
        security: health.counter_family(
            "agentloop_security_decisions_total",
            "The guard's decisions (scanner, guardian, approval, policy), by source and decision.",
        ),
        queue_wait_seconds: health.histogram_family(
            "agentloop_runner_queue_wait_seconds",
            "Time from a message's arrival (gateway or router) to the start of its run, by agent; first attempts only.",
        ),
        resumed: health.counter_family(
            "agentloop_runner_runs_resumed_total",
            "Runs started again after an earlier attempt did not finish (a lease taken over from a dead or paused owner), by agent.",
        ),
    }
}

/// `runner.owner_id`, or one unique to this process.
fn owner_id(config: &RunnerConfig) -> String {
    if !config.runner.owner_id.is_empty() {
        return config.runner.owner_id.clone();
    }
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

/// The Guardian of `config`; says at startup when local rules decide instead of a model.
fn guardian(config: &crate::RunnerConfig) -> Result<crate::guardian::Guardian, crate::RunnerError> {
    let guardian = crate::guardian::Guardian::new(&config.guardian)?;
    let guarded = config
        .agents
        .values()
        .any(|agent| !agent.guardian_tools.is_empty());
    if guarded && !guardian.has_model() {
        tracing::info!(
            "guardian.model is empty: the scanner's local rules review guarded tool calls"
        );
    }
    Ok(guardian)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_ids_differ_between_replicas_of_one_host() {
        let config = RunnerConfig::default();
        assert_ne!(owner_id(&config), owner_id(&config));
    }
}
