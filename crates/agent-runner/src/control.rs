//! `<prefix>.control.<session_id>`: abort, wake and interrupt for the session's owner. Every
//! replica listens; only the one that owns the session acts.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use futures::StreamExt as _;
use tokio_util::sync::CancellationToken;

use agentloop_proto::v1::ControlMessage;

use crate::RunnerError;
use crate::intake::Shared;

/// Signals for the owner of one session.
#[derive(Default)]
pub(crate) struct SessionSignals {
    /// New input waits in the inbox (steering is checked at the next safe point).
    input_pending: AtomicBool,
    /// Cancels the live run.
    live_run: Mutex<Option<CancellationToken>>,
}

impl SessionSignals {
    /// Acts on a control action.
    pub(crate) fn apply(&self, action: &str) {
        match action {
            "abort" | "stop" => self.abort(),
            "interrupt" => {
                self.input_pending.store(true, Ordering::SeqCst);
                self.abort();
            }
            _ => self.input_pending.store(true, Ordering::SeqCst),
        }
    }

    fn abort(&self) {
        if let Ok(live) = self.live_run.lock()
            && let Some(token) = live.as_ref()
        {
            token.cancel();
        }
    }

    /// Returns a token cancelled when the run about to start is aborted.
    pub(crate) fn start_run(&self) -> CancellationToken {
        let token = CancellationToken::new();
        if let Ok(mut live) = self.live_run.lock() {
            *live = Some(token.clone());
        }
        token
    }

    /// Forgets the live run.
    pub(crate) fn end_run(&self) {
        if let Ok(mut live) = self.live_run.lock() {
            *live = None;
        }
    }

    /// Returns and clears whether input arrived since the last check.
    pub(crate) fn take_input_pending(&self) -> bool {
        self.input_pending.swap(false, Ordering::SeqCst)
    }
}

/// Subscribes to every session's control subject and routes messages to local owners.
pub(crate) async fn listen(
    shared: Arc<Shared>,
) -> Result<tokio::task::JoinHandle<()>, RunnerError> {
    let subject = format!("{}.control.*", shared.bus.subjects().prefix());
    let mut messages = shared
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
            let session_id = if control.session_id.is_empty() {
                msg.subject
                    .as_str()
                    .rsplit('.')
                    .next()
                    .unwrap_or_default()
                    .to_owned()
            } else {
                control.session_id.clone()
            };
            let signals = shared
                .owned
                .lock()
                .ok()
                .and_then(|owned| owned.get(&session_id).cloned());
            if let Some(signals) = signals {
                tracing::debug!(session_id = %session_id, action = %control.action, reason = %control.reason, "control message");
                signals.apply(&control.action);
            }
        }
    }))
}
