//! Calls to the memory service with the retry policy of the owner loop: transient failures are
//! retried a few times with backoff, a lost lease never is.

use std::future::Future;
use std::time::Duration;

use agentloop_proto::v1::session_service_client::SessionServiceClient;
use agentloop_telemetry::TracedChannel;

use crate::error::MemoryCallError;

/// The memory service's gRPC client.
pub(crate) type Memory = SessionServiceClient<TracedChannel>;

/// Calls `call` until it succeeds, fails for good, or transient failures persist for ~5 s.
pub(crate) async fn with_retry<T, F, Fut>(what: &str, mut call: F) -> Result<T, MemoryCallError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    let mut delay = Duration::from_millis(50);
    let mut attempt = 0;
    loop {
        match call().await {
            Ok(response) => return Ok(response.into_inner()),
            Err(status) => match MemoryCallError::from(status) {
                MemoryCallError::Unavailable(text) if attempt < 7 => {
                    attempt += 1;
                    tracing::warn!(call = what, error = %text, attempt, "memory call failed, retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(1));
                }
                other => return Err(other),
            },
        }
    }
}
