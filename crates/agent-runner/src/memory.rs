//! Calls to the memory service with the retry policy of the owner loop: transient failures are
//! retried a few times with backoff (see [`Backoff::MEMORY`]), a lost lease or a refused request
//! never is.

use std::future::Future;

use agentloop_proto::v1::session_service_client::SessionServiceClient;
use agentloop_telemetry::TracedChannel;

use crate::error::MemoryCallError;
use crate::retry::{Backoff, retry};

/// The memory service's gRPC client.
pub(crate) type Memory = SessionServiceClient<TracedChannel>;

/// Calls `call` until it succeeds, fails for good, or transient failures persist for ~5 s.
pub(crate) async fn with_retry<T, F, Fut>(what: &str, mut call: F) -> Result<T, MemoryCallError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    retry(what, Backoff::MEMORY, MemoryCallError::is_transient, || {
        let called = call();
        async move {
            called
                .await
                .map(tonic::Response::into_inner)
                .map_err(MemoryCallError::from)
        }
    })
    .await
}

/// Sends `request` with `rpc` on a clone of `memory`, retried as [`with_retry`] does: the one
/// place that clones the client and the request for each attempt.
pub(crate) async fn call<Req, T>(
    memory: &Memory,
    what: &str,
    request: &Req,
    rpc: impl AsyncFn(&mut Memory, Req) -> Result<tonic::Response<T>, tonic::Status>,
) -> Result<T, MemoryCallError>
where
    Req: Clone,
{
    let rpc = &rpc;
    with_retry(what, || {
        let mut memory = memory.clone();
        let request = request.clone();
        async move { rpc(&mut memory, request).await }
    })
    .await
}
