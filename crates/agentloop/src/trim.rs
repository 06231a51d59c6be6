//! Hands memory freed after a burst of work back to the system.
//!
//! mimalloc returns freed pages to the system a second after they were freed, but only from
//! within a later call into the allocator; a service that goes quiet makes none, and kept what
//! its last load needed. Three seconds after 1000 sessions at once (`bench.sh --soak 2
//! --sessions 1000`), the runner still held 38-42 MiB and memory up to 25 MiB; with this,
//! 26-27 and 18, at the same CPU per run (`bench/HISTORY.md`).

use std::time::Duration;

/// How often freed memory is collected.
const INTERVAL: Duration = Duration::from_secs(1);

/// Collects what the worker it runs on has freed, once per [`INTERVAL`], for good.
pub(crate) async fn run() {
    let mut tick = tokio::time::interval(INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        collect();
    }
}

#[allow(unsafe_code)]
fn collect() {
    // SAFETY: `mi_collect` takes no pointers and is safe to call from any thread at any time;
    // it only walks mimalloc's own structures.
    unsafe { libmimalloc_sys::mi_collect(false) };
}
