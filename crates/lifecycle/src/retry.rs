//! The one retry policy of the services: transient failures are retried with capped exponential
//! backoff, a bounded number of times or for a bounded time; anything else, and the last
//! transient failure, is given back to the caller. Nothing here retries forever unless the
//! caller asks for it and can stop it (a startup waiting for a dependency, cancelled on
//! shutdown).

use std::future::Future;
use std::time::Duration;

/// Capped exponential backoff: the delay doubles from `first` up to `max_delay`, for at most
/// `max_retries` retries and, when a budget is set, only while the next wait ends within it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    first: Duration,
    max_delay: Duration,
    max_retries: u32,
    budget: Option<Duration>,
}

impl Backoff {
    /// A policy starting at `first_ms`, growing to `max_ms`, for `max_retries` retries.
    pub const fn new(first_ms: u64, max_ms: u64, max_retries: u32) -> Self {
        Self {
            first: Duration::from_millis(first_ms),
            max_delay: Duration::from_millis(max_ms),
            max_retries,
            budget: None,
        }
    }

    /// Returns the same policy that also gives up once the next wait would end `budget` or
    /// more after the first call (the time the calls take counts too).
    pub const fn within(self, budget: Duration) -> Self {
        Self {
            budget: Some(budget),
            ..self
        }
    }

    /// Returns how long to wait before retry number `retry` (0 for the first retry), or `None`
    /// when the retries are used up.
    pub fn delay(self, retry: u32) -> Option<Duration> {
        if retry >= self.max_retries {
            return None;
        }
        // 2^retry overflows nothing: the shift is capped well below the width of u32.
        let factor = 1u32 << retry.min(16);
        Some(self.first.saturating_mul(factor).min(self.max_delay))
    }

    /// Like [`Backoff::delay`], also `None` when the wait would end past the budget, `elapsed`
    /// after the first call.
    pub fn delay_after(self, retry: u32, elapsed: Duration) -> Option<Duration> {
        let delay = self.delay(retry)?;
        match self.budget {
            Some(budget) if elapsed.saturating_add(delay) >= budget => None,
            _ => Some(delay),
        }
    }
}

/// Calls `call` until it succeeds, fails in a way `is_transient` says retrying cannot fix, or
/// `policy` runs out; returns the last error then. Each retry is logged with `what`.
///
/// # Errors
/// The first permanent error, or the last transient one.
pub async fn retry<T, E, F, Fut>(
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
    let started = tokio::time::Instant::now();
    let mut retries = 0;
    loop {
        match call().await {
            Ok(value) => return Ok(value),
            Err(err) if is_transient(&err) => {
                match policy.delay_after(retries, started.elapsed()) {
                    Some(delay) => {
                        retries += 1;
                        tracing::warn!(call = what, error = %err, attempt = retries, retry_in_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX), "transient failure, retrying");
                        tokio::time::sleep(delay).await;
                    }
                    None => {
                        tracing::warn!(call = what, error = %err, retries, "transient failure persists, giving up");
                        return Err(err);
                    }
                }
            }
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
        assert_eq!(Backoff::new(50, 1_000, 7).delay(u32::MAX), None);
    }

    #[test]
    fn a_budget_stops_the_retries_whose_wait_would_end_past_it() {
        let policy = Backoff::new(100, 1_000, u32::MAX).within(Duration::from_secs(1));
        let at = |ms| Duration::from_millis(ms);
        assert_eq!(policy.delay_after(0, at(0)), Some(at(100)));
        assert_eq!(policy.delay_after(3, at(150)), Some(at(800)));
        assert_eq!(
            policy.delay_after(3, at(200)),
            None,
            "800 ms from 200 ms is 1 s"
        );
        assert_eq!(
            Backoff::new(100, 1_000, 2)
                .within(at(60_000))
                .delay_after(2, at(0)),
            None,
            "the count still applies"
        );
        assert_eq!(
            Backoff::new(100, 1_000, 2).delay_after(1, at(3_600_000)),
            Some(at(200)),
            "no budget, no time limit"
        );
    }

    /// Runs `retry` on a call that fails with `error` until its `succeed_on`th call (if any);
    /// returns the outcome and the number of calls.
    async fn calls_until(
        policy: Backoff,
        is_transient: impl Fn(&String) -> bool,
        error: &str,
        succeed_on: Option<u32>,
    ) -> (Result<u32, String>, u32) {
        let mut calls = 0;
        let result = retry("test", policy, is_transient, || {
            calls += 1;
            let outcome = match succeed_on {
                Some(n) if calls >= n => Ok(calls),
                _ => Err(error.to_owned()),
            };
            async move { outcome }
        })
        .await;
        (result, calls)
    }

    #[tokio::test]
    async fn transient_failures_are_retried_up_to_the_cap() {
        let outcome = calls_until(Backoff::new(1, 1, 3), |_| true, "down", None).await;
        assert_eq!(
            outcome,
            (Err("down".to_owned()), 4),
            "one call and three retries"
        );
    }

    #[tokio::test]
    async fn retry_stops_at_the_budget_too() {
        let policy = Backoff::new(1, 1, u32::MAX).within(Duration::ZERO);
        let outcome = calls_until(policy, |_| true, "down", None).await;
        assert_eq!(
            outcome,
            (Err("down".to_owned()), 1),
            "no wait ends within an empty budget"
        );
    }

    #[tokio::test]
    async fn a_permanent_failure_is_not_retried() {
        let policy = Backoff::new(50, 1_000, 7);
        let outcome = calls_until(policy, |err| err != "invalid", "invalid", None).await;
        assert_eq!(outcome, (Err("invalid".to_owned()), 1));
    }

    #[tokio::test]
    async fn a_success_after_failures_is_returned() {
        let outcome = calls_until(Backoff::new(1, 1, 5), |_| true, "down", Some(3)).await;
        assert_eq!(outcome, (Ok(3), 3));
    }
}
