//! The SessionService gRPC adapter: validates requests, calls the [`Store`] and maps
//! [`MemoryError`]s onto a deliberately small set of status codes.

mod convert;
mod cooldowns;
mod gateway;
mod guard;
mod inbox;
mod learn;
mod memories;
mod runs;
mod sessions;
mod usage;

use std::sync::{Arc, OnceLock};

use agentloop_lifecycle::{Counter, Health, Readiness};
use agentloop_proto::v1 as pb;
use agentloop_proto::v1::session_service_server::SessionService;
use tonic::{Request, Response, Status};

use crate::MemoryError;
use crate::error::Chain;
use crate::store::{self, Store};

impl From<MemoryError> for Status {
    fn from(err: MemoryError) -> Self {
        match &err {
            MemoryError::LeaseLost { .. } => Status::failed_precondition(err.to_string()),
            MemoryError::SessionNotFound(_)
            | MemoryError::RunNotFound { .. }
            | MemoryError::NotFound(_) => Status::not_found(err.to_string()),
            MemoryError::InvalidArgument(_) => Status::invalid_argument(err.to_string()),
            MemoryError::Aborted(_) => Status::aborted(err.to_string()),
            MemoryError::Starting | MemoryError::Stopping | MemoryError::Overloaded => {
                Status::unavailable(err.to_string())
            }
            // The cause (refused, pool timed out, server shutting down) tells an operator
            // reading the caller's logs where to look.
            MemoryError::Unavailable(_) => Status::unavailable(Chain(&err).to_string()),
            MemoryError::Database(_)
            | MemoryError::Credentials(_)
            | MemoryError::Internal(_)
            | MemoryError::DatabaseUrl(_)
            | MemoryError::Migrate(_)
            | MemoryError::Bind { .. }
            | MemoryError::TlsIncomplete { .. }
            | MemoryError::TlsFile { .. }
            | MemoryError::Tls { .. }
            | MemoryError::Serve(_) => Status::internal(err.to_string()),
        }
    }
}

/// The SessionService implementation, shared by every connection.
pub(crate) struct SessionApi {
    /// Set once Postgres is connected and migrated; empty until then.
    store: Arc<OnceLock<Store>>,
    readiness: Readiness,
    history_limit: u32,
    /// This replica's `memory.inbox_max_pending`, told to a caller refused by it.
    inbox_max_pending: u64,
    lease_lost: Counter,
    internal_errors: Counter,
}

impl SessionApi {
    pub(crate) fn new(
        store: Arc<OnceLock<Store>>,
        health: &Health,
        readiness: Readiness,
        history_limit: u32,
        inbox_max_pending: u64,
    ) -> Self {
        Self {
            store,
            readiness,
            history_limit,
            inbox_max_pending,
            lease_lost: health.counter(
                "agentloop_memory_lease_lost_total",
                "Fenced writes refused because the caller's epoch no longer held the lease.",
            ),
            internal_errors: health.counter(
                "agentloop_memory_internal_errors_total",
                "SessionService calls that failed with INTERNAL.",
            ),
        }
    }

    /// Most transcript entries one call returns: [`convert::MAX_HISTORY_ENTRIES`], or the
    /// configured default when that is higher (an operator's default is never cut).
    fn history_cap(&self) -> u32 {
        self.history_limit.max(convert::MAX_HISTORY_ENTRIES)
    }

    /// The store, once Postgres is connected and migrated.
    fn store(&self) -> Result<&Store, MemoryError> {
        self.store.get().ok_or(MemoryError::Starting)
    }

    /// Answers an RPC with `result`, its failure logged and counted by [`Self::fail`].
    fn reply<T>(
        &self,
        rpc: &'static str,
        result: Result<T, MemoryError>,
    ) -> Result<Response<T>, Status> {
        result.map(Response::new).map_err(|err| self.fail(rpc, err))
    }

    /// The status of a failed RPC, after the log line and counters its kind of failure needs.
    fn fail(&self, rpc: &'static str, err: MemoryError) -> Status {
        match &err {
            MemoryError::Unavailable(source) => {
                if store::error::is_outage(source) {
                    // The health check turns readiness back on once a query succeeds again.
                    self.readiness.set(false);
                }
                tracing::debug!(rpc, error = %Chain(&err), "database unavailable");
            }
            MemoryError::LeaseLost { .. } => {
                self.lease_lost.inc();
                tracing::debug!(rpc, error = %err, "fenced write refused");
            }
            MemoryError::Starting
            | MemoryError::Stopping
            | MemoryError::Overloaded
            | MemoryError::SessionNotFound(_)
            | MemoryError::RunNotFound { .. }
            | MemoryError::NotFound(_)
            | MemoryError::InvalidArgument(_)
            | MemoryError::Aborted(_) => {
                tracing::debug!(rpc, error = %err, "rpc refused");
            }
            MemoryError::Database(_)
            | MemoryError::Credentials(_)
            | MemoryError::Internal(_)
            | MemoryError::DatabaseUrl(_)
            | MemoryError::Migrate(_)
            | MemoryError::Bind { .. }
            | MemoryError::TlsIncomplete { .. }
            | MemoryError::TlsFile { .. }
            | MemoryError::Tls { .. }
            | MemoryError::Serve(_) => {
                self.internal_errors.inc();
                tracing::error!(rpc, error = %Chain(&err), "rpc failed");
            }
        }
        Status::from(err)
    }
}

/// Implements SessionService: every RPC hands its request to its handler and answers through
/// [`SessionApi::reply`], so each is logged, counted and mapped onto a status the same way.
macro_rules! session_service {
    ($($rpc:ident($request:ty) -> $response:ty = $name:literal => $handler:path;)+) => {
        #[tonic::async_trait]
        impl SessionService for SessionApi {
            $(
                async fn $rpc(
                    &self,
                    request: Request<$request>,
                ) -> Result<Response<$response>, Status> {
                    let result = $handler(self, request.into_inner()).await;
                    self.reply($name, result)
                }
            )+
        }
    };
}

session_service! {
    resolve_session(pb::ResolveSessionRequest) -> pb::Session
        = "ResolveSession" => SessionApi::resolve_session;
    get_history(pb::GetHistoryRequest) -> pb::GetHistoryResponse
        = "GetHistory" => SessionApi::get_history;
    append_entries(pb::AppendEntriesRequest) -> pb::AppendEntriesResponse
        = "AppendEntries" => SessionApi::append_entries;
    enqueue(pb::EnqueueRequest) -> pb::EnqueueResponse
        = "Enqueue" => SessionApi::enqueue;
    flush(pb::FlushRequest) -> pb::FlushResponse
        = "Flush" => SessionApi::flush;
    claim_session(pb::ClaimSessionRequest) -> pb::ClaimSessionResponse
        = "ClaimSession" => SessionApi::claim_session;
    renew_lease(pb::RenewLeaseRequest) -> pb::RenewLeaseResponse
        = "RenewLease" => SessionApi::renew_lease;
    renew_leases(pb::RenewLeasesRequest) -> pb::RenewLeasesResponse
        = "RenewLeases" => SessionApi::renew_leases;
    take_next(pb::TakeNextRequest) -> pb::TakeNextResponse
        = "TakeNext" => SessionApi::take_next;
    finish_run(pb::FinishRunRequest) -> pb::FinishRunResponse
        = "FinishRun" => SessionApi::finish_run;
    release_session(pb::ReleaseSessionRequest) -> pb::ReleaseSessionResponse
        = "ReleaseSession" => SessionApi::release_session;
    list_claimable(pb::ListClaimableRequest) -> pb::ListClaimableResponse
        = "ListClaimable" => SessionApi::list_claimable;
    list_sessions(pb::ListSessionsRequest) -> pb::ListSessionsResponse
        = "ListSessions" => SessionApi::list_sessions_rpc;
    reset_session(pb::ResetSessionRequest) -> pb::SessionInfo
        = "ResetSession" => SessionApi::reset_session_rpc;
    patch_session(pb::PatchSessionRequest) -> pb::SessionInfo
        = "PatchSession" => SessionApi::patch_session_rpc;
    begin_dispatch(pb::BeginDispatchRequest) -> pb::Dispatch
        = "BeginDispatch" => SessionApi::begin_dispatch_rpc;
    get_dispatch(pb::GetDispatchRequest) -> pb::Dispatch
        = "GetDispatch" => SessionApi::get_dispatch_rpc;
    complete_dispatch(pb::CompleteDispatchRequest) -> pb::Dispatch
        = "CompleteDispatch" => SessionApi::complete_dispatch_rpc;
    take_queued(pb::TakeQueuedRequest) -> pb::TakeQueuedResponse
        = "TakeQueued" => SessionApi::take_queued;
    get_cooldowns(pb::GetCooldownsRequest) -> pb::GetCooldownsResponse
        = "GetCooldowns" => cooldowns::get;
    report_profile_failure(pb::ReportProfileFailureRequest) -> pb::ProfileCooldown
        = "ReportProfileFailure" => cooldowns::failure;
    report_profile_success(pb::ReportProfileSuccessRequest) -> pb::ReportProfileSuccessResponse
        = "ReportProfileSuccess" => cooldowns::success;
    save_memory(pb::SaveMemoryRequest) -> pb::MemoryRecord
        = "SaveMemory" => memories::save;
    search_memories(pb::SearchMemoriesRequest) -> pb::SearchMemoriesResponse
        = "SearchMemories" => memories::search;
    forget_memories(pb::ForgetMemoriesRequest) -> pb::ForgetMemoriesResponse
        = "ForgetMemories" => memories::forget;
    list_memories(pb::ListMemoriesRequest) -> pb::ListMemoriesResponse
        = "ListMemories" => memories::list;
    list_memories_to_embed(pb::ListMemoriesToEmbedRequest) -> pb::ListMemoriesResponse
        = "ListMemoriesToEmbed" => memories::to_embed;
    set_memory_embedding(pb::SetMemoryEmbeddingRequest) -> pb::SetMemoryEmbeddingResponse
        = "SetMemoryEmbedding" => memories::set_embedding;
    get_skill_snapshot(pb::GetSkillSnapshotRequest) -> pb::SkillSnapshot
        = "GetSkillSnapshot" => memories::get_skills;
    save_skill_snapshot(pb::SaveSkillSnapshotRequest) -> pb::SkillSnapshot
        = "SaveSkillSnapshot" => memories::save_skills;
    enqueue_learn_job(pb::LearnJob) -> pb::EnqueueLearnJobResponse
        = "EnqueueLearnJob" => learn::enqueue;
    claim_learn_job(pb::ClaimLearnJobRequest) -> pb::LearnJob
        = "ClaimLearnJob" => learn::claim;
    finish_learn_job(pb::FinishLearnJobRequest) -> pb::FinishLearnJobResponse
        = "FinishLearnJob" => learn::finish;
    get_usage(pb::GetUsageRequest) -> pb::GetUsageResponse
        = "GetUsage" => usage::get;
    record_audit(pb::AuditRecord) -> pb::RecordAuditResponse
        = "RecordAudit" => guard::record;
    list_audit(pb::ListAuditRequest) -> pb::ListAuditResponse
        = "ListAudit" => guard::list;
    check_sender(pb::CheckSenderRequest) -> pb::CheckSenderResponse
        = "CheckSender" => guard::check_sender;
    list_pairing(pb::ListPairingRequest) -> pb::ListPairingResponse
        = "ListPairing" => guard::list_pairing;
    approve_pairing(pb::ApprovePairingRequest) -> pb::PairedSender
        = "ApprovePairing" => guard::approve_pairing;
    revoke_pairing(pb::RevokePairingRequest) -> pb::RevokePairingResponse
        = "RevokePairing" => guard::revoke_pairing;
    request_approval(pb::RequestApprovalRequest) -> pb::Approval
        = "RequestApproval" => guard::request_approval;
    get_approval(pb::GetApprovalRequest) -> pb::Approval
        = "GetApproval" => guard::get_approval;
    resolve_approval(pb::ResolveApprovalRequest) -> pb::Approval
        = "ResolveApproval" => guard::resolve_approval;
    list_approvals(pb::ListApprovalsRequest) -> pb::ListApprovalsResponse
        = "ListApprovals" => guard::list_approvals;
}

#[cfg(test)]
mod tests {
    use uuid::Uuid;

    use super::*;

    #[test]
    fn errors_map_onto_the_small_code_set() {
        let lost = Status::from(MemoryError::LeaseLost {
            session_id: Uuid::nil(),
            epoch: 3,
        });
        assert_eq!(lost.code(), tonic::Code::FailedPrecondition);
        assert!(
            lost.message().starts_with("lease lost"),
            "{}",
            lost.message()
        );
        let missing = Status::from(MemoryError::SessionNotFound(Uuid::nil()));
        assert_eq!(missing.code(), tonic::Code::NotFound);
        let starting = Status::from(MemoryError::Starting);
        assert_eq!(starting.code(), tonic::Code::Unavailable);
        assert_eq!(starting.message(), "memory is starting: database not ready");
        let down = Status::from(MemoryError::Unavailable(sqlx::Error::PoolTimedOut));
        assert_eq!(down.code(), tonic::Code::Unavailable);
        let broken = Status::from(MemoryError::Database(sqlx::Error::RowNotFound));
        assert_eq!(broken.code(), tonic::Code::Internal);
        let raced = Status::from(MemoryError::Aborted("record expired".to_owned()));
        assert_eq!(
            raced.code(),
            tonic::Code::Aborted,
            "retryable, not a bad request"
        );
    }
}
