//! The SessionService gRPC adapter: validates requests, calls the [`Store`] and maps
//! [`MemoryError`]s onto a deliberately small set of status codes.

mod cooldowns;
mod gateway;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use agentloop_lifecycle::{Counter, Health, Readiness};
use agentloop_proto::v1 as pb;
use agentloop_proto::v1::session_service_server::SessionService;
use chrono::{DateTime, Utc};
use tonic::{Request, Response, Status};
use uuid::Uuid;

use crate::MemoryError;
use crate::error::Chain;
use crate::store::{self, InboxKind, NewEntry, RunOutcome, RunStatus, Store, non_empty};

/// `ListClaimable` returns at most this many ids when the request says 0.
const DEFAULT_CLAIMABLE_LIMIT: u32 = 100;

impl From<MemoryError> for Status {
    fn from(err: MemoryError) -> Self {
        match &err {
            MemoryError::LeaseLost { .. } => Status::failed_precondition(err.to_string()),
            MemoryError::SessionNotFound(_) | MemoryError::RunNotFound { .. } => {
                Status::not_found(err.to_string())
            }
            MemoryError::InvalidArgument(_) => Status::invalid_argument(err.to_string()),
            MemoryError::Starting | MemoryError::Stopping | MemoryError::Overloaded => {
                Status::unavailable(err.to_string())
            }
            // The cause (refused, pool timed out, server shutting down) tells an operator
            // reading the caller's logs where to look.
            MemoryError::Unavailable(_) => Status::unavailable(Chain(&err).to_string()),
            MemoryError::Database(_)
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

    /// The inbox cap to tell a caller, only when it refused the caller's input.
    fn cap_when(&self, queue_full: bool) -> u64 {
        if queue_full {
            self.inbox_max_pending
        } else {
            0
        }
    }

    fn store(&self) -> Result<&Store, MemoryError> {
        self.store.get().ok_or(MemoryError::Starting)
    }

    fn reply<T>(
        &self,
        rpc: &'static str,
        result: Result<T, MemoryError>,
    ) -> Result<Response<T>, Status> {
        result.map(Response::new).map_err(|err| self.fail(rpc, err))
    }

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
            | MemoryError::InvalidArgument(_) => {
                tracing::debug!(rpc, error = %err, "rpc refused");
            }
            MemoryError::Database(_)
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

    async fn resolve_session(
        &self,
        req: pb::ResolveSessionRequest,
    ) -> Result<pb::Session, MemoryError> {
        if req.session_key.is_empty() {
            return Err(MemoryError::InvalidArgument(
                "session_key is required".to_owned(),
            ));
        }
        let session = self
            .resolve(&req.session_key, &req.agent_id, &req.channel)
            .await?;
        Ok(pb::Session {
            id: session.id.to_string(),
            key: session.key,
            agent_id: session.agent_id,
            channel: session.channel.unwrap_or_default(),
            model_override: session.model_override.unwrap_or_default(),
            queue_mode: session.queue_mode.unwrap_or_default(),
            created_at: Some(timestamp(session.created_at)),
            created: session.created,
        })
    }

    /// The session of `key`, created on first sight; an empty agent is `main`, an empty
    /// channel none.
    async fn resolve(
        &self,
        key: &str,
        agent_id: &str,
        channel: &str,
    ) -> Result<crate::store::Session, MemoryError> {
        let agent_id = if agent_id.is_empty() {
            "main"
        } else {
            agent_id
        };
        let channel = (!channel.is_empty()).then_some(channel);
        self.store()?.resolve_session(key, agent_id, channel).await
    }

    async fn get_history(
        &self,
        req: pb::GetHistoryRequest,
    ) -> Result<pb::GetHistoryResponse, MemoryError> {
        let session_id = parse_id("session_id", &req.session_id)?;
        let limit = if req.limit == 0 {
            self.history_limit
        } else {
            req.limit
        };
        let entries = self.store()?.get_history(session_id, limit).await?;
        let entries = entries.into_iter().map(entry_message).collect();
        Ok(pb::GetHistoryResponse { entries })
    }

    async fn append_entries(
        &self,
        req: pb::AppendEntriesRequest,
    ) -> Result<pb::AppendEntriesResponse, MemoryError> {
        let session_id = parse_id("session_id", &req.session_id)?;
        let entries = new_entries(req.entries)?;
        let appended = self
            .store()?
            .append_entries(session_id, req.epoch, &entries)
            .await?;
        Ok(pb::AppendEntriesResponse { appended })
    }

    async fn enqueue(&self, req: pb::EnqueueRequest) -> Result<pb::EnqueueResponse, MemoryError> {
        let session_id = parse_id("session_id", &req.session_id)?;
        if req.idempotency_key.is_empty() {
            return Err(MemoryError::InvalidArgument(
                "idempotency_key is required".to_owned(),
            ));
        }
        let kind: InboxKind = req.kind.parse()?;
        let store = self.store()?;
        if req.claim_owner.is_empty() {
            let enqueued = store
                .enqueue(session_id, &req.idempotency_key, kind, &req.payload)
                .await?;
            return Ok(pb::EnqueueResponse {
                inserted: enqueued.inserted,
                seq: enqueued.seq,
                queue_full: enqueued.queue_full,
                inbox_max_pending: self.cap_when(enqueued.queue_full),
                ..Default::default()
            });
        }
        // The new owner's first call would be TakeNext: answering it here, in the same
        // transaction, saves a round trip and a commit.
        let (enqueued, claim, taken) = store
            .enqueue_claim_take(
                session_id,
                &req.idempotency_key,
                kind,
                &req.payload,
                &req.claim_owner,
                parse_ttl(req.claim_ttl_ms)?,
                req.take_when_claimed.then_some(store::HistoryAsk {
                    limit: req.history_limit,
                    after_seq: req.history_after_seq,
                }),
            )
            .await?;
        let taken = taken.map(|(taken, history)| match taken {
            Some(taken) => take_response(taken, history),
            None => pb::TakeNextResponse::default(),
        });
        Ok(pb::EnqueueResponse {
            inserted: enqueued.inserted,
            seq: enqueued.seq,
            claimed: claim.claimed,
            epoch: claim.epoch,
            owner: claim.owner.unwrap_or_default(),
            taken,
            queue_full: enqueued.queue_full,
            inbox_max_pending: self.cap_when(enqueued.queue_full),
        })
    }

    async fn flush(&self, req: pb::FlushRequest) -> Result<pb::FlushResponse, MemoryError> {
        let rows: Vec<(i64, String)> = req
            .rows
            .into_iter()
            .map(|row| (row.seq, row.idempotency_key))
            .collect();
        let durable = self.store()?.flush(&rows).await?;
        Ok(pb::FlushResponse {
            durable: durable
                .into_iter()
                .map(|(seq, idempotency_key)| pb::InboxRow {
                    seq,
                    idempotency_key,
                })
                .collect(),
        })
    }

    async fn claim_session(
        &self,
        req: pb::ClaimSessionRequest,
    ) -> Result<pb::ClaimSessionResponse, MemoryError> {
        let session_id = parse_id("session_id", &req.session_id)?;
        if req.owner.is_empty() {
            return Err(MemoryError::InvalidArgument("owner is required".to_owned()));
        }
        let ttl = parse_ttl(req.ttl_ms)?;
        let claim = self
            .store()?
            .claim_session(session_id, &req.owner, ttl)
            .await?;
        Ok(pb::ClaimSessionResponse {
            claimed: claim.claimed,
            epoch: claim.epoch,
            owner: claim.owner.unwrap_or_default(),
        })
    }

    async fn renew_lease(
        &self,
        req: pb::RenewLeaseRequest,
    ) -> Result<pb::RenewLeaseResponse, MemoryError> {
        let session_id = parse_id("session_id", &req.session_id)?;
        let ttl = parse_ttl(req.ttl_ms)?;
        let ok = self
            .store()?
            .renew_lease(session_id, req.epoch, ttl)
            .await?;
        Ok(pb::RenewLeaseResponse { ok })
    }

    async fn take_next(
        &self,
        req: pb::TakeNextRequest,
    ) -> Result<pb::TakeNextResponse, MemoryError> {
        let session_id = parse_id("session_id", &req.session_id)?;
        if req.owner.is_empty() {
            return Err(MemoryError::InvalidArgument("owner is required".to_owned()));
        }
        let Some(taken) = self
            .store()?
            .take_next(session_id, req.epoch, &req.owner)
            .await?
        else {
            return Ok(pb::TakeNextResponse::default());
        };
        let history = if req.history_limit > 0 {
            let ask = store::HistoryAsk {
                limit: req.history_limit,
                after_seq: req.history_after_seq,
            };
            self.store()?.history_window(session_id, ask).await?
        } else {
            (false, Vec::new())
        };
        Ok(take_response(taken, history))
    }

    async fn finish_run(
        &self,
        req: pb::FinishRunRequest,
    ) -> Result<pb::FinishRunResponse, MemoryError> {
        let session_id = parse_id("session_id", &req.session_id)?;
        let outcome = RunOutcome {
            run_id: parse_id("run_id", &req.run_id)?,
            inbox_seq: req.inbox_seq,
            status: req.status.parse::<RunStatus>()?,
            error: non_empty(&req.error),
            model: non_empty(&req.model),
            input_tokens: parse_tokens("input_tokens", req.input_tokens)?,
            output_tokens: parse_tokens("output_tokens", req.output_tokens)?,
            provider: non_empty(&req.provider),
            profile: non_empty(&req.profile),
        };
        let entries = new_entries(req.entries)?;
        let finished = self
            .store()?
            .finish_run_and_release(session_id, req.epoch, outcome, entries, req.release_if_idle)
            .await?;
        Ok(pb::FinishRunResponse {
            released: finished.released,
        })
    }

    async fn release_session(
        &self,
        req: pb::ReleaseSessionRequest,
    ) -> Result<pb::ReleaseSessionResponse, MemoryError> {
        let session_id = parse_id("session_id", &req.session_id)?;
        let released = self.store()?.release_session(session_id, req.epoch).await?;
        Ok(pb::ReleaseSessionResponse { released })
    }

    async fn list_claimable(
        &self,
        req: pb::ListClaimableRequest,
    ) -> Result<pb::ListClaimableResponse, MemoryError> {
        let limit = if req.limit == 0 {
            DEFAULT_CLAIMABLE_LIMIT
        } else {
            req.limit
        };
        let ids = self.store()?.list_claimable(limit).await?;
        Ok(pb::ListClaimableResponse {
            session_ids: ids.into_iter().map(|id| id.to_string()).collect(),
        })
    }
}

#[tonic::async_trait]
impl SessionService for SessionApi {
    async fn resolve_session(
        &self,
        request: Request<pb::ResolveSessionRequest>,
    ) -> Result<Response<pb::Session>, Status> {
        let result = SessionApi::resolve_session(self, request.into_inner()).await;
        self.reply("ResolveSession", result)
    }

    async fn get_history(
        &self,
        request: Request<pb::GetHistoryRequest>,
    ) -> Result<Response<pb::GetHistoryResponse>, Status> {
        let result = SessionApi::get_history(self, request.into_inner()).await;
        self.reply("GetHistory", result)
    }

    async fn append_entries(
        &self,
        request: Request<pb::AppendEntriesRequest>,
    ) -> Result<Response<pb::AppendEntriesResponse>, Status> {
        let result = SessionApi::append_entries(self, request.into_inner()).await;
        self.reply("AppendEntries", result)
    }

    async fn enqueue(
        &self,
        request: Request<pb::EnqueueRequest>,
    ) -> Result<Response<pb::EnqueueResponse>, Status> {
        let result = SessionApi::enqueue(self, request.into_inner()).await;
        self.reply("Enqueue", result)
    }

    async fn flush(
        &self,
        request: Request<pb::FlushRequest>,
    ) -> Result<Response<pb::FlushResponse>, Status> {
        let result = SessionApi::flush(self, request.into_inner()).await;
        self.reply("Flush", result)
    }

    async fn claim_session(
        &self,
        request: Request<pb::ClaimSessionRequest>,
    ) -> Result<Response<pb::ClaimSessionResponse>, Status> {
        let result = SessionApi::claim_session(self, request.into_inner()).await;
        self.reply("ClaimSession", result)
    }

    async fn renew_lease(
        &self,
        request: Request<pb::RenewLeaseRequest>,
    ) -> Result<Response<pb::RenewLeaseResponse>, Status> {
        let result = SessionApi::renew_lease(self, request.into_inner()).await;
        self.reply("RenewLease", result)
    }

    async fn take_next(
        &self,
        request: Request<pb::TakeNextRequest>,
    ) -> Result<Response<pb::TakeNextResponse>, Status> {
        let result = SessionApi::take_next(self, request.into_inner()).await;
        self.reply("TakeNext", result)
    }

    async fn finish_run(
        &self,
        request: Request<pb::FinishRunRequest>,
    ) -> Result<Response<pb::FinishRunResponse>, Status> {
        let result = SessionApi::finish_run(self, request.into_inner()).await;
        self.reply("FinishRun", result)
    }

    async fn release_session(
        &self,
        request: Request<pb::ReleaseSessionRequest>,
    ) -> Result<Response<pb::ReleaseSessionResponse>, Status> {
        let result = SessionApi::release_session(self, request.into_inner()).await;
        self.reply("ReleaseSession", result)
    }

    async fn list_claimable(
        &self,
        request: Request<pb::ListClaimableRequest>,
    ) -> Result<Response<pb::ListClaimableResponse>, Status> {
        let result = SessionApi::list_claimable(self, request.into_inner()).await;
        self.reply("ListClaimable", result)
    }

    async fn list_sessions(
        &self,
        request: Request<pb::ListSessionsRequest>,
    ) -> Result<Response<pb::ListSessionsResponse>, Status> {
        let result = self.list_sessions_rpc(request.into_inner()).await;
        self.reply("ListSessions", result)
    }

    async fn reset_session(
        &self,
        request: Request<pb::ResetSessionRequest>,
    ) -> Result<Response<pb::SessionInfo>, Status> {
        let result = self.reset_session_rpc(request.into_inner()).await;
        self.reply("ResetSession", result)
    }

    async fn patch_session(
        &self,
        request: Request<pb::PatchSessionRequest>,
    ) -> Result<Response<pb::SessionInfo>, Status> {
        let result = self.patch_session_rpc(request.into_inner()).await;
        self.reply("PatchSession", result)
    }

    async fn begin_dispatch(
        &self,
        request: Request<pb::BeginDispatchRequest>,
    ) -> Result<Response<pb::Dispatch>, Status> {
        let result = self.begin_dispatch_rpc(request.into_inner()).await;
        self.reply("BeginDispatch", result)
    }

    async fn get_dispatch(
        &self,
        request: Request<pb::GetDispatchRequest>,
    ) -> Result<Response<pb::Dispatch>, Status> {
        let result = self.get_dispatch_rpc(request.into_inner()).await;
        self.reply("GetDispatch", result)
    }

    async fn complete_dispatch(
        &self,
        request: Request<pb::CompleteDispatchRequest>,
    ) -> Result<Response<pb::Dispatch>, Status> {
        let result = self.complete_dispatch_rpc(request.into_inner()).await;
        self.reply("CompleteDispatch", result)
    }

    async fn take_queued(
        &self,
        request: Request<pb::TakeQueuedRequest>,
    ) -> Result<Response<pb::TakeQueuedResponse>, Status> {
        let req = request.into_inner();
        let result = async {
            let session_id = parse_id("session_id", &req.session_id)?;
            let run_id = parse_id("run_id", &req.run_id)?;
            let items = self
                .store()?
                .take_queued(session_id, req.epoch, run_id, &req.kinds)
                .await?;
            Ok(pb::TakeQueuedResponse {
                items: items
                    .into_iter()
                    .map(|item| pb::InboxItem {
                        seq: item.seq,
                        idempotency_key: item.idempotency_key,
                        kind: item.kind,
                        payload: item.payload,
                    })
                    .collect(),
            })
        }
        .await;
        self.reply("TakeQueued", result)
    }

    async fn get_cooldowns(
        &self,
        request: Request<pb::GetCooldownsRequest>,
    ) -> Result<Response<pb::GetCooldownsResponse>, Status> {
        let result = cooldowns::get(self, request.into_inner()).await;
        self.reply("GetCooldowns", result)
    }

    async fn report_profile_failure(
        &self,
        request: Request<pb::ReportProfileFailureRequest>,
    ) -> Result<Response<pb::ProfileCooldown>, Status> {
        let result = cooldowns::failure(self, request.into_inner()).await;
        self.reply("ReportProfileFailure", result)
    }

    async fn report_profile_success(
        &self,
        request: Request<pb::ReportProfileSuccessRequest>,
    ) -> Result<Response<pb::ReportProfileSuccessResponse>, Status> {
        let result = cooldowns::success(self, request.into_inner()).await;
        self.reply("ReportProfileSuccess", result)
    }
}

fn entry_message(entry: crate::store::Entry) -> pb::Entry {
    pb::Entry {
        seq: entry.seq,
        key: entry.key,
        role: entry.role,
        content: entry.content,
        run_id: entry.run_id.map(|id| id.to_string()).unwrap_or_default(),
        tool_call_id: entry.tool_call_id.unwrap_or_default(),
        tool_name: entry.tool_name.unwrap_or_default(),
        data: entry.data.unwrap_or_default(),
        created_at: Some(timestamp(entry.created_at)),
    }
}

fn new_entries(entries: Vec<pb::Entry>) -> Result<Vec<NewEntry>, MemoryError> {
    let mut out = Vec::with_capacity(entries.len());
    for entry in entries {
        if entry.key.is_empty() {
            return Err(MemoryError::InvalidArgument(
                "every entry needs a key".to_owned(),
            ));
        }
        let run_id = match entry.run_id.as_str() {
            "" => None,
            run_id => Some(parse_id("entry run_id", run_id)?),
        };
        out.push(NewEntry {
            tool_call_id: non_empty(&entry.tool_call_id),
            tool_name: non_empty(&entry.tool_name),
            data: non_empty(&entry.data),
            key: entry.key,
            role: entry.role,
            content: entry.content,
            run_id,
        });
    }
    Ok(out)
}

fn parse_id(field: &str, value: &str) -> Result<Uuid, MemoryError> {
    if value.is_empty() {
        return Err(MemoryError::InvalidArgument(format!("{field} is required")));
    }
    Uuid::parse_str(value)
        .map_err(|_| MemoryError::InvalidArgument(format!("{field} {value:?} is not a uuid")))
}

fn parse_ttl(ttl_ms: u32) -> Result<Duration, MemoryError> {
    if ttl_ms == 0 {
        // A zero TTL would hand out a lease that is expired before the caller sees it.
        return Err(MemoryError::InvalidArgument(
            "ttl_ms must be positive".to_owned(),
        ));
    }
    Ok(Duration::from_millis(u64::from(ttl_ms)))
}

fn parse_tokens(field: &str, tokens: u64) -> Result<i64, MemoryError> {
    i64::try_from(tokens)
        .map_err(|_| MemoryError::InvalidArgument(format!("{field} {tokens} is out of range")))
}

/// A taken input with its run and history (`(is a delta, entries)`) on the wire.
fn take_response(
    taken: store::Taken,
    (history_is_delta, history): (bool, Vec<store::Entry>),
) -> pb::TakeNextResponse {
    pb::TakeNextResponse {
        item: Some(pb::InboxItem {
            seq: taken.item.seq,
            idempotency_key: taken.item.idempotency_key,
            kind: taken.item.kind,
            payload: taken.item.payload,
        }),
        run: Some(run_message(taken.run)),
        history: history.into_iter().map(entry_message).collect(),
        history_is_delta,
    }
}

fn run_message(run: store::Run) -> pb::Run {
    pb::Run {
        id: run.id.to_string(),
        session_id: run.session_id.to_string(),
        inbox_seq: run.inbox_seq,
        status: run.status,
        attempts: run.attempts,
        started_at: Some(timestamp(run.started_at)),
        finished_at: run.finished_at.map(timestamp),
    }
}

fn timestamp(at: DateTime<Utc>) -> pbjson_types::Timestamp {
    pbjson_types::Timestamp {
        seconds: at.timestamp(),
        nanos: i32::try_from(at.timestamp_subsec_nanos()).unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
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
    }

    #[test]
    fn malformed_ids_and_ttls_are_invalid_arguments() {
        assert!(matches!(
            parse_id("session_id", ""),
            Err(MemoryError::InvalidArgument(_))
        ));
        assert!(matches!(
            parse_id("session_id", "nope"),
            Err(MemoryError::InvalidArgument(_))
        ));
        assert!(parse_id("session_id", &Uuid::now_v7().to_string()).is_ok());
        assert!(matches!(parse_ttl(0), Err(MemoryError::InvalidArgument(_))));
        assert!(matches!(
            parse_tokens("input_tokens", u64::MAX),
            Err(MemoryError::InvalidArgument(_))
        ));
    }
}
