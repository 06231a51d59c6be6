//! One renewer for every lease this replica holds. Each third of a lease it extends them all
//! with one memory call per 2,000 sessions (one statement each), where a task per session made
//! a call and a commit per session: with 10,000 runs in flight and a 30 s lease, 1,000 calls a
//! second. A session whose lease memory no longer gives to its epoch, or that went a whole
//! lease without a renewal, is told through the `lease_lost` token it was held with.

use std::collections::HashMap;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::memory::MemoryClient;

/// Most leases renewed by one call (a request of about 100 KB).
const PER_CALL: usize = 2_000;

/// What an owner tells the renewer.
enum Change {
    Hold {
        session_id: String,
        epoch: i64,
        lost: CancellationToken,
        /// When the owner registered it, right after the claim: the renewer may read this late.
        since: Instant,
    },
    Drop {
        session_id: String,
        epoch: i64,
    },
}

/// Where owners register the leases they hold.
#[derive(Clone, Debug)]
pub(crate) struct Leases {
    changes: mpsc::UnboundedSender<Change>,
}

/// A lease being renewed; dropping it stops the renewals.
pub(crate) struct Held {
    changes: mpsc::UnboundedSender<Change>,
    session_id: String,
    epoch: i64,
}

impl Drop for Held {
    fn drop(&mut self) {
        let _ = self.changes.send(Change::Drop {
            session_id: std::mem::take(&mut self.session_id),
            epoch: self.epoch,
        });
    }
}

impl Leases {
    /// Starts the renewer of leases granted for `ttl_ms`; it ends once every [`Leases`] and
    /// [`Held`] is gone.
    pub(crate) fn start(memory: MemoryClient, ttl_ms: u32) -> (Self, JoinHandle<()>) {
        let (changes, rx) = mpsc::unbounded_channel();
        (
            Self { changes },
            tokio::spawn(renew_all(memory, ttl_ms, rx)),
        )
    }

    /// Renews the lease of `epoch` until the returned [`Held`] is dropped; cancels `lost` when
    /// the lease is no longer this epoch's, or may have run out unrenewed.
    pub(crate) fn hold(&self, session_id: &str, epoch: i64, lost: CancellationToken) -> Held {
        let _ = self.changes.send(Change::Hold {
            session_id: session_id.to_owned(),
            epoch,
            lost,
            since: Instant::now(),
        });
        Held {
            changes: self.changes.clone(),
            session_id: session_id.to_owned(),
            epoch,
        }
    }
}

/// A lease held, as the renewer knows it.
struct Lease {
    epoch: i64,
    lost: CancellationToken,
    /// When the call that last renewed it was sent (memory counts the TTL from no earlier).
    renewed_at: Instant,
}

async fn renew_all(
    memory: MemoryClient,
    ttl_ms: u32,
    mut changes: mpsc::UnboundedReceiver<Change>,
) {
    let ttl_ms = ttl_ms.max(30);
    let ttl = Duration::from_millis(u64::from(ttl_ms));
    let mut tick = tokio::time::interval(ttl / 3);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is at once; a lease just claimed needs no renewal yet.
    tick.tick().await;
    let mut held: HashMap<String, Lease> = HashMap::new();
    loop {
        tokio::select! {
            change = changes.recv() => match change {
                Some(change) => apply(&mut held, change),
                None => return,
            },
            _ = tick.tick() => {
                // Changes sent before the tick count for it.
                while let Ok(change) = changes.try_recv() {
                    apply(&mut held, change);
                }
                renew(&memory, &mut held, ttl_ms, ttl).await;
            }
        }
    }
}

fn apply(held: &mut HashMap<String, Lease>, change: Change) {
    match change {
        Change::Hold {
            session_id,
            epoch,
            lost,
            since,
        } => {
            // Granted by the claim a moment before `since`; counted from there the TTL ends
            // late by that call's time, small against the TTL.
            held.insert(
                session_id,
                Lease {
                    epoch,
                    lost,
                    renewed_at: since,
                },
            );
        }
        // Only the epoch's own entry: the session may be held again under a newer one.
        Change::Drop { session_id, epoch } => {
            if held.get(&session_id).is_some_and(|l| l.epoch == epoch) {
                held.remove(&session_id);
            }
        }
    }
}

/// Gives up the leases run out, renews the others, then gives up those lost or run out by now.
/// `ttl` is `ttl_ms` as a duration.
async fn renew(
    memory: &MemoryClient,
    held: &mut HashMap<String, Lease>,
    ttl_ms: u32,
    ttl: Duration,
) {
    // First, so that no call waits only as long as a lease already gone could.
    give_up_run_out(held, ttl);
    let listed: Vec<(String, i64)> = held
        .iter()
        .map(|(session_id, lease)| (session_id.clone(), lease.epoch))
        .collect();
    for chunk in listed.chunks(PER_CALL) {
        // Waited for only while every lease in it could still be held: across a cut link a
        // call hangs until TCP gives up, minutes later. A slow link's late answer still counts.
        let Some(deadline) = chunk
            .iter()
            .filter_map(|(session_id, _)| held.get(session_id))
            .map(|lease| lease.renewed_at + ttl)
            .min()
        else {
            continue;
        };
        let sent = Instant::now();
        match tokio::time::timeout_at(deadline, memory.renew_many(chunk, ttl_ms)).await {
            Ok(Ok(renewed)) => {
                for (session_id, _) in chunk {
                    let Some(lease) = held.get_mut(session_id) else {
                        continue;
                    };
                    if renewed.contains(session_id) {
                        lease.renewed_at = sent;
                    } else {
                        tracing::warn!(session_id = %session_id, epoch = lease.epoch, "lease no longer this replica's");
                        lease.lost.cancel();
                        held.remove(session_id);
                    }
                }
            }
            // One failed renewal is not a lost lease; the next tick tries again well before
            // the lease runs out.
            Ok(Err(err)) => {
                tracing::warn!(error = %err, leases = chunk.len(), "lease renewal failed");
            }
            Err(_) => {
                tracing::warn!(leases = chunk.len(), "lease renewal unanswered");
            }
        }
    }
    give_up_run_out(held, ttl);
}

/// Cancels and forgets the leases that may have run out unrenewed.
fn give_up_run_out(held: &mut HashMap<String, Lease>, ttl: Duration) {
    let now = Instant::now();
    held.retain(|session_id, lease| {
        if !lease_may_have_run_out(lease.renewed_at, now, ttl) {
            return true;
        }
        // Memory may have given the session to another replica by now. Its writes would be
        // refused, but a tool call or a model call would not: stop them here.
        tracing::warn!(
            session_id = %session_id,
            unrenewed_ms = now.saturating_duration_since(lease.renewed_at).as_millis() as u64,
            "lease not renewed for its whole TTL, giving the session up"
        );
        lease.lost.cancel();
        false
    });
}

/// Whether a lease last renewed by a call sent at `renewed_at` may have run out at `now`:
/// memory counts the TTL from when it got the call, which is no earlier than the send.
fn lease_may_have_run_out(renewed_at: Instant, now: Instant, ttl: Duration) -> bool {
    now.saturating_duration_since(renewed_at) >= ttl
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_counts_as_run_out_a_whole_ttl_after_the_last_renewal_was_sent() {
        let sent = Instant::now();
        let ttl = Duration::from_millis(1200);
        assert!(!lease_may_have_run_out(sent, sent, ttl));
        assert!(!lease_may_have_run_out(
            sent,
            sent + Duration::from_millis(1199),
            ttl
        ));
        assert!(lease_may_have_run_out(sent, sent + ttl, ttl));
        // A clock read before the send (another thread's) is not a negative age.
        assert!(!lease_may_have_run_out(sent + ttl, sent, ttl));
    }

    #[test]
    fn a_drop_removes_only_its_own_epochs_lease() {
        let mut held = HashMap::new();
        let hold = |epoch| Change::Hold {
            session_id: "s".to_owned(),
            epoch,
            lost: CancellationToken::new(),
            since: Instant::now(),
        };
        let drop = |epoch| Change::Drop {
            session_id: "s".to_owned(),
            epoch,
        };
        apply(&mut held, hold(1));
        // Held again under a newer epoch before the old owner's drop arrived.
        apply(&mut held, hold(2));
        apply(&mut held, drop(1));
        assert_eq!(held.get("s").map(|l| l.epoch), Some(2));
        apply(&mut held, drop(2));
        assert!(held.is_empty());
    }
}
