//! What reaches the owner of a session from outside its loop: new input is waiting, or the live
//! run must stop. Set by intake (input landing on this replica) and by control messages (input
//! landing on another replica, `/stop`); read by the run at its safe points.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use tokio_util::sync::CancellationToken;

use agentloop_proto::ControlAction;

/// Signals for the owner of one session.
#[derive(Default)]
pub(crate) struct SessionSignals {
    /// New input waits in the inbox (steering is checked at the next safe point).
    input_pending: AtomicBool,
    /// Cancels the live run.
    live_run: Mutex<Option<CancellationToken>>,
    /// Wakes the run's calls waiting for an operator's approval.
    approval: tokio::sync::Notify,
}

impl SessionSignals {
    /// Acts on a control action.
    pub(crate) fn apply(&self, action: ControlAction) {
        match action {
            ControlAction::Abort | ControlAction::Stop => self.abort(),
            ControlAction::Interrupt => {
                self.input_pending.store(true, Ordering::SeqCst);
                self.abort();
            }
            ControlAction::Wake => self.input_pending.store(true, Ordering::SeqCst),
            ControlAction::Approval => self.approval.notify_waiters(),
        }
    }

    /// Resolves when an operator answers an approval request of this session (registered
    /// before the request is read again, so an answer in between is not missed).
    pub(crate) fn approval_answered(&self) -> tokio::sync::futures::Notified<'_> {
        self.approval.notified()
    }

    fn abort(&self) {
        // A poisoned lock still holds a valid token: the panic was elsewhere.
        let live = self.live_run.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(token) = live.as_ref() {
            token.cancel();
        }
    }

    /// Returns a token cancelled when the run about to start is aborted.
    pub(crate) fn start_run(&self) -> CancellationToken {
        let token = CancellationToken::new();
        *self.live_run.lock().unwrap_or_else(PoisonError::into_inner) = Some(token.clone());
        token
    }

    /// Forgets the live run.
    pub(crate) fn end_run(&self) {
        *self.live_run.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// Returns and clears whether input arrived since the last check.
    pub(crate) fn take_input_pending(&self) -> bool {
        self.input_pending.swap(false, Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_action_does_what_it_names() {
        // (action, input pending after, live run cancelled)
        let cases = [
            (ControlAction::Wake, true, false),
            (ControlAction::Abort, false, true),
            (ControlAction::Stop, false, true),
            (ControlAction::Interrupt, true, true),
        ];
        for (action, pending, cancelled) in cases {
            let signals = SessionSignals::default();
            let run = signals.start_run();
            signals.apply(action);
            assert_eq!(signals.take_input_pending(), pending, "{action}");
            assert_eq!(run.is_cancelled(), cancelled, "{action}");
            assert!(
                !signals.take_input_pending(),
                "the flag is cleared once read"
            );
        }
    }

    #[test]
    fn an_abort_after_the_run_ended_cancels_nothing_later() {
        let signals = SessionSignals::default();
        let first = signals.start_run();
        signals.end_run();
        signals.apply(ControlAction::Abort);
        assert!(!first.is_cancelled());
        assert!(!signals.start_run().is_cancelled());
    }
}
