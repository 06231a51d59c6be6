//! `<prefix>.control.<session_id>`: abort, wake and interrupt for the session's owner. Every
//! replica listens; only the one that owns the session acts.

use std::sync::Arc;

use futures::StreamExt as _;

use agentloop_proto::ControlAction;
use agentloop_proto::v1::ControlMessage;

use crate::RunnerError;
use crate::replica::Replica;

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
            let control = match agentloop_bus::decode::<ControlMessage>(&msg) {
                Ok((control, _)) => control,
                Err(err) => {
                    tracing::warn!(error = %agentloop_bus::error_chain(&err), subject = %msg.subject, "ignoring an undecodable control message");
                    continue;
                }
            };
            let action = match control.action.parse::<ControlAction>() {
                Ok(action) => action,
                Err(err) => {
                    // Core NATS, no stream to dead-letter from: the sender's mistake is logged.
                    tracing::warn!(error = %err, subject = %msg.subject, "ignoring a control message with an unknown action");
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
