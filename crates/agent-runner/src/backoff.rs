//! The runner's retry budgets; the policy itself (capped exponential backoff, a bounded number
//! of retries, nothing forever) is `agentloop_lifecycle::retry`, shared by every service.

use agentloop_lifecycle::Backoff;

/// Calls to the memory service: about 5 s in all, enough to ride out a memory restart.
pub(crate) const MEMORY: Backoff = Backoff::new(50, 1_000, 7);
/// Publishing a run's reply (or a dead letter) to the bus; each attempt already waits
/// `bus.publish_retry_ms` for a stream leader.
pub(crate) const PUBLISH: Backoff = Backoff::new(100, 2_000, 7);
/// An owner's steps that failed although each call already retried (memory down for longer):
/// after these the owner hands the session back instead of spinning on it.
pub(crate) const OWNER: Backoff = Backoff::new(500, 8_000, 5);
