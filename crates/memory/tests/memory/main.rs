//! Tests of the memory service against a real Postgres (`DATABASE_URL`): the store directly,
//! and the gRPC server started for real on port 0.

mod gauges;
mod grpc;
mod inbox_cap;
mod ownership;
mod postgres_tls;
mod store;
mod vectors;

use std::future::Future;
use std::time::Duration;

/// Polls `check` until it yields `Some`, failing the test after `timeout`.
async fn wait_until<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
