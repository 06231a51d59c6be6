//! The owner of one session: runs its inbox empty, one input at a time, while the replica's
//! renewer (`leases.rs`) keeps its lease.
//!
//! The owner's task lives as long as the session is owned, for every session in flight, so its
//! memory calls are awaited boxed: held inline, they made the task 7.5 KiB for the whole run,
//! against 3.4 KiB boxed (see `run/mod.rs` for the run's own future).

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use agentloop_proto::v1::{TakeNextRequest, TakeNextResponse};

use crate::backoff;
use crate::error::MemoryCallError;
use crate::replica::Replica;
use crate::run;
use crate::signals::SessionSignals;

/// Runs the session's inputs while this replica holds the lease of `epoch`.
pub(crate) async fn own(
    replica: Arc<Replica>,
    session_id: String,
    epoch: i64,
    signals: Arc<SessionSignals>,
    first: Option<Taken>,
) {
    let span = tracing::info_span!("own", session_id = %session_id, epoch);
    async {
        let lease_lost = CancellationToken::new();
        let lease = replica.leases.hold(&session_id, epoch, lease_lost.clone());
        owner_loop(&replica, &session_id, epoch, &lease_lost, &signals, first).await;
        drop(lease);
        if replica.abandon.is_cancelled() && !lease_lost.is_cancelled() {
            // The drain time ran out mid-run: what the run persisted stays, and the next owner
            // resumes from there, so the lease goes back now instead of when it expires.
            hand_back(&replica, &session_id, epoch).await;
        }
        replica.forget(&session_id, &signals);
    }
    .instrument(span)
    .await;
}

/// An input the claim already took, with the history it came with: boxed, because the owner's
/// task holds room for it (and its copies) for as long as the session is owned.
pub(crate) struct Taken {
    /// What memory answered.
    pub(crate) next: Box<TakeNextResponse>,
    /// The history position the request asked from.
    pub(crate) after_seq: i64,
}

async fn owner_loop(
    replica: &Arc<Replica>,
    session_id: &str,
    epoch: i64,
    lease_lost: &CancellationToken,
    signals: &Arc<SessionSignals>,
    mut first: Option<Taken>,
) {
    // Steps in a row that failed although each memory call already retried.
    let mut failures: u32 = 0;
    loop {
        if lease_lost.is_cancelled() {
            tracing::warn!("lease lost, giving the session up");
            return;
        }
        if replica.stopping.is_cancelled() {
            // Hand back what is left: release succeeds only with an empty inbox; otherwise the
            // lease is made to expire now, so another replica's sweeper takes the session at
            // its next sweep rather than after a whole lease TTL.
            if release(replica, session_id, epoch).await != Some(true) {
                hand_back(replica, session_id, epoch).await;
            }
            return;
        }
        // The claim may have taken the first input already.
        let (taken, after_seq) = match first.take() {
            Some(Taken { next, after_seq }) => (Ok(next), after_seq),
            None => {
                let after_seq = replica.after_seq(session_id);
                let request = TakeNextRequest {
                    session_id: session_id.to_owned(),
                    epoch,
                    owner: replica.owner_id.clone(),
                    // The context comes with the input: one call instead of two.
                    history_limit: replica.settings.history_limit,
                    history_after_seq: after_seq,
                };
                (
                    Box::pin(replica.memory.take_next(&request))
                        .await
                        .map(Box::new),
                    after_seq,
                )
            }
        };
        match taken {
            Ok(mut next) if next.item.is_some() && next.run.is_some() => {
                let Ok(_slot) = replica.run_slots.acquire().await else {
                    return;
                };
                let history = match Box::pin(replica.window(
                    session_id,
                    after_seq,
                    std::mem::take(&mut next.history),
                    next.history_is_delta,
                ))
                .await
                {
                    Ok(history) => history,
                    Err(err) => {
                        tracing::warn!(error = %err, "cannot read the session's history");
                        if !pause(&mut failures).await {
                            give_back(replica, session_id, epoch).await;
                            return;
                        }
                        continue;
                    }
                };
                let (Some(item), Some(run)) = (next.item.take(), next.run.take()) else {
                    unreachable!("checked above");
                };
                drop(next);
                // Boxed: a run's future is large, and held inline it made this task's
                // future large too, copied whole when the task is spawned (once per claim).
                let run = Box::pin(run::execute(
                    replica,
                    run::Owner {
                        session_id,
                        epoch,
                        lease_lost,
                        signals,
                    },
                    item,
                    run,
                    history,
                ));
                let executed = tokio::select! {
                    // Checked first: once the drain time is over the run is dropped where
                    // it stands (every write so far is keyed and fenced, so nothing is
                    // half-done) and its session resumes on another replica, instead of
                    // being answered as aborted.
                    biased;
                    () = replica.abandon.cancelled() => return,
                    executed = run => executed,
                };
                match executed {
                    // The run's last write gave the lease back: nothing else was pending.
                    Ok(true) => return,
                    Ok(false) => failures = 0,
                    Err(MemoryCallError::LeaseLost(reason)) => {
                        tracing::warn!(reason, "lease lost during a run; its new owner resumes it");
                        return;
                    }
                    Err(MemoryCallError::Refused(reason)) => {
                        // Even setting the input aside was refused: trying again at once
                        // would spin; the session goes back and the sweeper retries it.
                        tracing::error!(
                            reason,
                            "run could not be finished, giving the session back"
                        );
                        hand_back(replica, session_id, epoch).await;
                        return;
                    }
                    Err(err) => {
                        // The next take retries the run (one more attempt, capped).
                        tracing::warn!(error = %err, "run could not be recorded");
                        if !pause(&mut failures).await {
                            give_back(replica, session_id, epoch).await;
                            return;
                        }
                    }
                }
            }
            Ok(_) => {
                // Empty inbox. Leave the owned set first so new input claims or wakes
                // correctly; a release refused because input just arrived takes it back.
                replica.forget(session_id, signals);
                match release(replica, session_id, epoch).await {
                    Some(true) => return,
                    Some(false) | None => replica.keep(session_id, signals),
                }
            }
            Err(MemoryCallError::LeaseLost(reason)) => {
                tracing::warn!(reason, "lease lost");
                return;
            }
            Err(err) => {
                tracing::warn!(error = %err, "cannot take the next input");
                if !pause(&mut failures).await {
                    give_back(replica, session_id, epoch).await;
                    return;
                }
            }
        }
    }
}

/// Waits before the owner's next try after a failed step; `false` once the failures have
/// lasted too long to keep holding the session.
async fn pause(failures: &mut u32) -> bool {
    match backoff::OWNER.delay(*failures) {
        Some(delay) => {
            *failures += 1;
            tokio::time::sleep(delay).await;
            true
        }
        None => false,
    }
}

/// Gives up a session this owner cannot make progress on: the lease expires now, so any
/// replica's sweeper (this one's included) claims it again later, not this loop at once.
async fn give_back(replica: &Arc<Replica>, session_id: &str, epoch: i64) {
    tracing::error!("memory keeps failing, giving the session back");
    hand_back(replica, session_id, epoch).await;
}

/// Returns whether the lease was given back (`None` when memory could not be asked).
async fn release(replica: &Arc<Replica>, session_id: &str, epoch: i64) -> Option<bool> {
    match Box::pin(replica.memory.release(session_id, epoch)).await {
        Ok(released) => Some(released),
        Err(MemoryCallError::LeaseLost(_)) => Some(true),
        Err(err) => {
            tracing::warn!(error = %err, "release failed");
            None
        }
    }
}

/// Lets the lease expire at once (its epoch stays, so a write still in flight is not refused,
/// but any replica may claim the session from now on).
async fn hand_back(replica: &Arc<Replica>, session_id: &str, epoch: i64) {
    // The shortest lease memory grants: one millisecond.
    match Box::pin(replica.memory.renew(session_id, epoch, 1)).await {
        Ok(_) => tracing::info!("lease handed back"),
        Err(err) => {
            tracing::warn!(error = %err, "hand-back failed; the lease expires by itself");
        }
    }
}
