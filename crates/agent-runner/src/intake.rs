//! Intake: each RunCommand goes into the session's inbox (deduplicated) and is acked once that
//! row is on disk; meanwhile the replica tries to take the session. A sweeper takes sessions
//! whose owner died.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use tracing::Instrument as _;

use agentloop_bus::DeadReason;

use agentloop_proto::v1::{
    ClaimSessionRequest, ControlMessage, EnqueueRequest, InboxRow, RunCommand,
};
use agentloop_proto::{ControlAction, Encoding, InboxKind, QueueMode};

use crate::error::MemoryCallError;
use crate::order::Turn;
use crate::owner;
use crate::replica::Replica;

/// The inbox kind of `command`: its own queue mode, else its session's (both set by the
/// router), else its agent's default; `user` when none has one.
fn inbox_kind(command: &RunCommand, agent_default: Option<QueueMode>) -> InboxKind {
    // Admission refused unknown modes before the command got here.
    match QueueMode::parse(&command.queue_mode).ok().flatten() {
        Some(mode) => mode.into(),
        None => agent_default.map_or(InboxKind::User, InboxKind::from),
    }
}

/// Stores `command` in its session's inbox once every earlier command of the session is there,
/// then claims or wakes the session's owner.
/// `prev`: the session's previous command, when this replica saw every one since
/// ([`crate::order::CommandOrder::arrived`]).
pub(crate) async fn take_in(
    replica: &Arc<Replica>,
    msg: jetstream::Message,
    command: RunCommand,
    prev: Option<u64>,
) {
    match replica.order.turn(&msg, prev).await {
        Turn::Now => enqueue(replica, msg, command).await,
        Turn::After(_) | Turn::Unknown => {
            // Out of the session's intake lane: the earlier command may come to this replica,
            // queued in that lane behind this one.
            let replica = replica.clone();
            let tracker = replica.tracker.clone();
            tracker.spawn(
                async move {
                    let started = std::time::Instant::now();
                    if !replica.order.wait_turn(&msg, &replica.stopping).await {
                        return;
                    }
                    tracing::info!(
                        waited_ms = started.elapsed().as_millis() as u64,
                        "run command waited for an earlier one of its session"
                    );
                    enqueue(&replica, msg, command).await;
                }
                .instrument(tracing::Span::current()),
            );
        }
    }
}

/// Stores `command` in its session's inbox, then claims or wakes the session's owner.
async fn enqueue(replica: &Arc<Replica>, msg: jetstream::Message, command: RunCommand) {
    let agent_id = if command.agent_id.is_empty() {
        "main"
    } else {
        command.agent_id.as_str()
    };
    let agent_default = replica.agents.get(agent_id).map(|agent| agent.queue_mode);
    let kind = inbox_kind(&command, agent_default);
    // Claimed in the same call, after the input is committed: a holder releasing meanwhile
    // either sees this input (and keeps going) or leaves the lease free for this claim.
    let request = EnqueueRequest {
        session_id: command.session_id.clone(),
        idempotency_key: command.idempotency_key.clone(),
        kind: kind.as_str().to_owned(),
        // The owner reads the inbox as protobuf: a command that came as JSON (a person's, or
        // `agentloop dlq retry --edit`) is stored re-encoded, or its run could never start.
        payload: match agentloop_bus::encoding(&msg) {
            Encoding::Proto => msg.payload.to_vec(),
            Encoding::Json => prost::Message::encode_to_vec(&command),
        },
        claim_owner: if replica.stopping.is_cancelled() {
            String::new()
        } else {
            replica.owner_id.clone()
        },
        claim_ttl_ms: replica.lease_ttl_ms(),
        take_when_claimed: true,
        history_limit: replica.settings.history_limit,
        history_after_seq: replica.after_seq(&command.session_id),
    };
    let enqueued = match replica.memory.enqueue(&request).await {
        Ok(response) => {
            if !response.inserted {
                tracing::debug!("run command already in the inbox, redelivery absorbed");
            }
            response
        }
        Err(MemoryCallError::Refused(reason)) => {
            replica
                .dead_letters
                .reject(&msg, DeadReason::Refused, &reason)
                .await;
            return;
        }
        Err(err) => {
            replica
                .dead_letters
                .retry_later(&msg, &format!("enqueue failed: {err}"))
                .await;
            return;
        }
    };
    if enqueued.queue_full {
        // Nothing of this command was stored; a claim made with it is still this replica's,
        // taken for the inputs already pending (the lease was free), so they are run below.
        crate::queue_full::refuse(replica, msg, &command, enqueued.inbox_max_pending).await;
    } else {
        // Acknowledged once the enqueue is on disk; meanwhile the run goes ahead.
        let row = InboxRow {
            seq: enqueued.seq,
            idempotency_key: command.idempotency_key.clone(),
        };
        replica.order.enqueued(&msg);
        let _ = replica.acks.send((msg, row));
    }
    if enqueued.claimed {
        let first = enqueued.taken.map(|next| owner::Taken {
            next: Box::new(next),
            after_seq: request.history_after_seq,
        });
        start_owner(replica, &command.session_id, enqueued.epoch, first);
        return;
    }
    if enqueued.queue_full || request.claim_owner.is_empty() {
        return;
    }
    let action = match kind {
        InboxKind::Interrupt => ControlAction::Interrupt,
        _ => ControlAction::Wake,
    };
    notify_owner(replica, &command.session_id, action, &enqueued.owner).await;
}

/// Starts the owner task of a session whose lease this replica just took.
fn start_owner(replica: &Arc<Replica>, session_id: &str, epoch: i64, first: Option<owner::Taken>) {
    let signals = replica.adopt(session_id);
    replica.metrics.claims.inc();
    let task_replica = replica.clone();
    let session_id = session_id.to_owned();
    replica.tracker.spawn(async move {
        owner::own(task_replica, session_id, epoch, signals, first).await;
    });
}

/// Tells the session's owner about new input (`wake`) or that it must stop its live run
/// (`interrupt`): directly when it runs here, over the control subject otherwise.
async fn notify_owner(replica: &Replica, session_id: &str, action: ControlAction, owner: &str) {
    if let Some(signals) = replica.signals_of(session_id) {
        signals.apply(action);
        return;
    }
    let wake = ControlMessage {
        session_id: session_id.to_owned(),
        action: action.as_str().to_owned(),
        reason: format!("input queued by {}", replica.owner_id),
    };
    tracing::debug!(owner, "session owned elsewhere, telling its owner");
    let subject = replica.bus.subjects().control(session_id);
    let _ = replica
        .bus
        .publish_fast(subject, &wake, agentloop_proto::Encoding::Proto)
        .await;
}

/// Claims a session found by the sweeper unless this replica already owns it.
async fn try_own(replica: &Arc<Replica>, session_id: &str) {
    // The owner keeps taking inputs until the inbox is empty.
    if replica.stopping.is_cancelled() || replica.signals_of(session_id).is_some() {
        return;
    }
    let request = ClaimSessionRequest {
        session_id: session_id.to_owned(),
        owner: replica.owner_id.clone(),
        ttl_ms: replica.lease_ttl_ms(),
    };
    match replica.memory.claim(&request).await {
        Ok(response) if response.claimed => start_owner(replica, session_id, response.epoch, None),
        Ok(_) => {}
        Err(err) => tracing::warn!(error = %err, "claim failed, the next sweep tries again"),
    }
}

/// Every `runner.sweep_interval_ms`, claims sessions with pending input and no live owner.
pub(crate) async fn sweep(replica: Arc<Replica>) {
    let interval = Duration::from_millis(replica.settings.sweep_interval_ms.max(100));
    loop {
        tokio::time::sleep(interval).await;
        match replica.memory.list_claimable(100).await {
            Ok(session_ids) => {
                for session_id in session_ids {
                    tracing::info!(session_id = %session_id, "sweeper found an unowned session with pending input");
                    try_own(&replica, &session_id).await;
                }
            }
            Err(err) => tracing::debug!(error = %err, "sweep failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_inbox_kind_is_the_commands_mode_else_the_agents_else_user() {
        let command = |mode: &str| RunCommand {
            queue_mode: mode.to_owned(),
            ..Default::default()
        };
        let cases = [
            ("steer", None, InboxKind::Steer),
            ("collect", Some(QueueMode::Steer), InboxKind::Collect),
            ("", Some(QueueMode::Interrupt), InboxKind::Interrupt),
            ("", Some(QueueMode::Followup), InboxKind::Followup),
            ("", None, InboxKind::User),
        ];
        for (mode, agent, kind) in cases {
            assert_eq!(
                inbox_kind(&command(mode), agent),
                kind,
                "{mode:?} {agent:?}"
            );
        }
    }
}
