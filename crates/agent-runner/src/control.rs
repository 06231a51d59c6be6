//! `<prefix>.control.<session_id>`: abort, wake and interrupt for the session's owner. Every
//! replica listens; only the one that owns the session acts.

use std::sync::Arc;

use futures::StreamExt as _;

use agentloop_proto::ControlAction;
use agentloop_proto::v1::ControlMessage;

use crate::RunnerError;
use crate::replica::{Replica, SERVICE};

/// Subscribes to every session's control subject and routes messages to local owners.
pub(crate) async fn listen(
    replica: Arc<Replica>,
) -> Result<tokio::task::JoinHandle<()>, RunnerError> {
    let subject = replica.bus.subjects().control("*");
    let mut messages = replica
        .bus
        .client()
        .subscribe(subject)
        .await
        .map_err(|e| RunnerError::Stream(Box::new(e)))?;
    Ok(tokio::spawn(async move {
        while let Some(msg) = messages.next().await {
            let decoded = agentloop_bus::decode::<ControlMessage>(&msg)
                .map_err(|err| agentloop_bus::error_chain(&err))
                .and_then(|(control, _)| {
                    let action = control.action.parse::<ControlAction>();
                    action
                        .map(|action| (control, action))
                        .map_err(|err| err.to_string())
                });
            let (control, action) = match decoded {
                Ok(decoded) => decoded,
                Err(reason) => {
                    refuse(&replica, &msg, &reason).await;
                    continue;
                }
            };
            let session_id = if control.session_id.is_empty() {
                msg.subject.as_str().rsplit('.').next().unwrap_or_default()
            } else {
                control.session_id.as_str()
            };
            if let Some(signals) = replica.signals_of(session_id) {
                tracing::debug!(session_id = %session_id, action = %action, reason = %control.reason, "control message");
                signals.apply(action);
            }
        }
    }))
}

/// Keeps a control message no replica can act on as a dead letter. Every replica receives it
/// and refuses it alike; the dead-letter stream keeps one letter of all their copies.
async fn refuse(replica: &Replica, msg: &async_nats::Message, reason: &str) {
    if let Err(err) = replica.bus.dead_letter_shared(SERVICE, msg, reason).await {
        tracing::error!(error = %agentloop_bus::error_chain(&err), subject = %msg.subject, reason, "a control message no replica can act on could not be kept as a dead letter");
    }
}
