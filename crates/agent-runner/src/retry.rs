//! The one retry policy of the runner: transient failures are retried with capped exponential
//! backoff, a bounded number of times; anything else, and the last transient failure, is given
//! back to the caller. Nothing here retries forever.

use std::future::Future;
use std::time::Duration;

/// Capped exponential backoff: the delay doubles from `first` up to `max_delay`, for at most
/// `max_retries` retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Backoff {
    first: Duration,
    max_delay: Duration,
    max_retries: u32,
}

impl Backoff {
    /// Calls to the memory service: about 5 s in all, enough to ride out a memory restart.
    pub(crate) const MEMORY: Backoff = Backoff::new(50, 1_000, 7);
    /// Publishing a run's reply to the bus.
    pub(crate) const PUBLISH: Backoff = Backoff::new(100, 2_000, 7);
    /// An owner's steps that failed although each call already retried (memory down for
    /// longer): after these the owner hands the session back instead of spinning on it.
    pub(crate) const OWNER: Backoff = Backoff::new(500, 8_000, 5);

    /// A policy starting at `first_ms`, growing to `max_ms`, for `max_retries` retries.
    pub(crate) const fn new(first_ms: u64, max_ms: u64, max_retries: u32) -> Self {
        Self {
            first: Duration::from_millis(first_ms),
            max_delay: Duration::from_millis(max_ms),
            max_retries,
        }
    }

    /// How long to wait before retry number `retry` (0 for the first retry), or `None` when the
    /// retries are used up.
    pub(crate) fn delay(self, retry: u32) -> Option<Duration> {
        if retry >= self.max_retries {
            return None;
        }
        // 2^retry overflows nothing: the shift is capped well below the width of u32.
        let factor = 1u32 << retry.min(16);
        Some(self.first.saturating_mul(factor).min(self.max_delay))
    }
}

/// Calls `call` until it succeeds, fails in a way `is_transient` says retrying cannot fix, or
/// `policy` runs out; returns the last error then.
pub(crate) async fn retry<T, E, F, Fut>(
    what: &str,
    policy: Backoff,
    is_transient: impl Fn(&E) -> bool,
    mut call: F,
) -> Result<T, E>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut retries = 0;
    loop {
        match call().await {
            Ok(value) => return Ok(value),
            Err(err) if is_transient(&err) => match policy.delay(retries) {
                Some(delay) => {
                    retries += 1;
                    tracing::warn!(call = what, error = %err, attempt = retries, "transient failure, retrying");
                    tokio::time::sleep(delay).await;
                }
                None => {
                    tracing::warn!(call = what, error = %err, retries, "transient failure persists, giving up");
                    return Err(err);
                }
            },
            Err(err) => return Err(err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap_then_stop() {
        let policy = Backoff::new(50, 300, 5);
        let delays: Vec<Option<u64>> = (0..6)
            .map(|n| policy.delay(n).map(|d| d.as_millis() as u64))
            .collect();
        assert_eq!(
            delays,
            vec![Some(50), Some(100), Some(200), Some(300), Some(300), None]
        );
    }

    #[test]
    fn a_huge_retry_number_neither_overflows_nor_retries() {
        assert_eq!(
            Backoff::new(1, u64::MAX, u32::MAX).delay(40),
            Some(Duration::from_millis(65_536))
        );
        assert_eq!(Backoff::MEMORY.delay(u32::MAX), None);
    }

    #[tokio::test]
    async fn transient_failures_are_retried_up_to_the_cap() {
        let mut calls = 0;
        let result: Result<(), String> = retry(
            "test",
            Backoff::new(1, 1, 3),
            |_| true,
            || {
                calls += 1;
                async { Err("down".to_owned()) }
            },
        )
        .await;
        assert_eq!(result, Err("down".to_owned()));
        assert_eq!(calls, 4, "one call and three retries");
    }

    #[tokio::test]
    async fn a_permanent_failure_is_not_retried() {
        let mut calls = 0;
        let result: Result<(), String> = retry(
            "test",
            Backoff::MEMORY,
            |err: &String| err != "invalid",
            || {
                calls += 1;
                async { Err("invalid".to_owned()) }
            },
        )
        .await;
        assert_eq!(result, Err("invalid".to_owned()));
        assert_eq!(calls, 1);
    }

    #[tokio::test]
    async fn a_success_after_failures_is_returned() {
        let mut calls = 0;
        let result: Result<u32, String> = retry(
            "test",
            Backoff::new(1, 1, 5),
            |_| true,
            || {
                calls += 1;
                let n = calls;
                async move { if n < 3 { Err("down".to_owned()) } else { Ok(n) } }
            },
        )
        .await;
        assert_eq!(result, Ok(3));
    }
}
