//! The memory service as the runner calls it: one method per call, typed requests in and typed
//! answers out. Calls the owner loop cannot do without are retried by one policy (transient
//! failures with backoff, see [`backoff::MEMORY`]; a lost lease or a refused request never);
//! calls that are repeated anyway (lease renewal, the sweep, cooldown bookkeeping) are tried
//! once and their caller decides.

use agentloop_proto::InboxKind;
use agentloop_proto::v1::session_service_client::SessionServiceClient;
use agentloop_proto::v1::{
    AppendEntriesRequest, ClaimSessionRequest, ClaimSessionResponse, EnqueueRequest,
    EnqueueResponse, Entry, FinishRunRequest, FinishRunResponse, FlushRequest, FlushResponse,
    GetCooldownsRequest, GetHistoryRequest, GetHistoryResponse, HeldLease, InboxItem,
    ListClaimableRequest, ProfileCooldown, ReleaseSessionRequest, RenewLeaseRequest,
    RenewLeasesRequest, ReportProfileFailureRequest, ReportProfileSuccessRequest, TakeNextRequest,
    TakeNextResponse, TakeQueuedRequest,
};
use agentloop_proto::v1::{Approval, AuditRecord, GetApprovalRequest, RequestApprovalRequest};
use agentloop_proto::v1::{ClaimLearnJobRequest, FinishLearnJobRequest, LearnJob};
use agentloop_proto::v1::{
    Embedding, ForgetMemoriesRequest, GetSkillSnapshotRequest, MemoryRecord, MemoryScope,
    SaveMemoryRequest, SaveSkillSnapshotRequest, SearchMemoriesRequest, SkillSnapshot,
};
use agentloop_telemetry::TracedChannel;

use agentloop_model::{ModelClient, ModelError, ModelRef, Provider};

use crate::error::MemoryCallError;
use agentloop_lifecycle::retry;

use crate::backoff;
use tracing::Instrument as _;

type Grpc = SessionServiceClient<TracedChannel>;

/// The least score a memory search keeps, by the kind of score it gets: full-text ranks and
/// hybrid scores are on different scales.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct MinScore {
    /// For a full-text search (no embeddings model, or embedding the query failed).
    pub(crate) text: f64,
    /// For a hybrid search.
    pub(crate) hybrid: f64,
}

impl MinScore {
    /// Every match.
    pub(crate) const ANY: Self = Self {
        text: 0.0,
        hybrid: 0.0,
    };
}

/// `memory.embeddings_model` parsed: none when it is empty.
///
/// # Errors
/// Not a `provider/model` reference, or not an OpenAI-compatible one (embeddings are
/// `/v1/embeddings`).
pub(crate) fn embeddings_model(name: &str) -> Result<Option<ModelRef>, ModelError> {
    let name = name.trim();
    if name.is_empty() {
        return Ok(None);
    }
    let parsed = ModelRef::parse(name)?;
    if parsed.provider != Provider::OpenAi {
        return Err(ModelError::InvalidConfig(format!(
            "memory.embeddings_model must be an OpenAI-compatible model (openai/...), got {name}"
        )));
    }
    Ok(Some(parsed))
}

/// `memory.embeddings_model`: the vectors that make memory search hybrid.
pub(crate) struct Embedder {
    models: ModelClient,
    model: ModelRef,
    /// The model as stored beside each vector, so vectors of another model are never compared.
    name: String,
}

impl Embedder {
    /// An embedder for `model` (`openai/...`), or none when it is empty.
    ///
    /// # Errors
    /// As [`embeddings_model`].
    pub(crate) fn new(models: &ModelClient, model: &str) -> Result<Option<Self>, ModelError> {
        Ok(embeddings_model(model)?.map(|parsed| Self {
            models: models.clone(),
            model: parsed,
            name: model.trim().to_owned(),
        }))
    }

    /// The vector of `text`, or none when the embeddings endpoint fails: memory then stores
    /// and searches by words alone rather than not at all.
    async fn embed(&self, text: &str) -> Option<Embedding> {
        match self.models.embed(&self.model, &[text]).await {
            Ok(mut vectors) => vectors.pop().map(|values| Embedding {
                model: self.name.clone(),
                values,
            }),
            Err(err) => {
                tracing::warn!(error = %err, model = %self.name, kind = err.label(),
                    "embedding failed, memory falls back to full-text search");
                None
            }
        }
    }
}

/// A handle on the memory service (cheap to clone: one HTTP/2 channel underneath).
#[derive(Clone)]
pub(crate) struct MemoryClient {
    grpc: Grpc,
    /// Users with nothing to recall, shared by every clone.
    recalled: std::sync::Arc<crate::recall_cache::RecallCache>,
    /// Embeds memories and queries, when `memory.embeddings_model` is set.
    embedder: Option<std::sync::Arc<Embedder>>,
}

impl MemoryClient {
    /// A client on `channel`.
    pub(crate) fn new(channel: TracedChannel) -> Self {
        Self {
            grpc: SessionServiceClient::new(channel),
            recalled: std::sync::Arc::default(),
            embedder: None,
        }
    }

    /// This client, storing and searching memories with `embedder`'s vectors as well.
    pub(crate) fn with_embedder(mut self, embedder: Option<Embedder>) -> Self {
        self.embedder = embedder.map(std::sync::Arc::new);
        self
    }

    async fn embed(&self, text: &str) -> Option<Embedding> {
        match &self.embedder {
            Some(embedder) => embedder.embed(text).await,
            None => None,
        }
    }

    /// Sends `request` with `rpc` until it succeeds, fails for good or transient failures last
    /// past the policy; the one place that clones the client and the request per attempt.
    async fn retried<Req, T>(
        &self,
        what: &str,
        request: &Req,
        rpc: impl AsyncFn(&mut Grpc, Req) -> Result<tonic::Response<T>, tonic::Status>,
    ) -> Result<T, MemoryCallError>
    where
        Req: Clone,
    {
        let rpc = &rpc;
        // A span per call, retries inside it: the claim, the history read and the run's
        // writes show in the trace of whatever asked for them (the intake, the run).
        let span = tracing::info_span!("memory_call", rpc = what);
        retry(what, backoff::MEMORY, MemoryCallError::is_transient, || {
            let mut grpc = self.grpc.clone();
            let request = request.clone();
            async move {
                rpc(&mut grpc, request)
                    .await
                    .map(tonic::Response::into_inner)
                    .map_err(MemoryCallError::from)
            }
        })
        .instrument(span)
        .await
    }

    /// Sends `request` once.
    async fn once<Req, T>(
        &self,
        request: Req,
        rpc: impl AsyncFn(&mut Grpc, Req) -> Result<tonic::Response<T>, tonic::Status>,
    ) -> Result<T, MemoryCallError> {
        let mut grpc = self.grpc.clone();
        rpc(&mut grpc, request)
            .await
            .map(tonic::Response::into_inner)
            .map_err(MemoryCallError::from)
    }

    /// Stores an input in its session's inbox, claiming the session in the same call if asked.
    pub(crate) async fn enqueue(
        &self,
        request: &EnqueueRequest,
    ) -> Result<EnqueueResponse, MemoryCallError> {
        self.retried("enqueue", request, async |m, r| m.enqueue(r).await)
            .await
    }

    /// Confirms inbox rows are on disk; returns those that are.
    pub(crate) async fn flush(
        &self,
        request: &FlushRequest,
    ) -> Result<FlushResponse, MemoryCallError> {
        self.retried("flush", request, async |m, r| m.flush(r).await)
            .await
    }

    /// Tries to take the lease of a session found with pending input.
    pub(crate) async fn claim(
        &self,
        request: &ClaimSessionRequest,
    ) -> Result<ClaimSessionResponse, MemoryCallError> {
        self.retried("claim", request, async |m, r| m.claim_session(r).await)
            .await
    }

    /// Takes the session's next input (and its run and history) under the lease.
    pub(crate) async fn take_next(
        &self,
        request: &TakeNextRequest,
    ) -> Result<TakeNextResponse, MemoryCallError> {
        self.retried("take_next", request, async |m, r| m.take_next(r).await)
            .await
    }

    /// Asks an operator to approve a tool call (or finds its request again).
    pub(crate) async fn request_approval(
        &self,
        request: &RequestApprovalRequest,
    ) -> Result<Approval, MemoryCallError> {
        self.retried("request_approval", request, async |m, r| {
            m.request_approval(r).await
        })
        .await
    }

    /// An approval request as it stands.
    pub(crate) async fn get_approval(&self, id: &str) -> Result<Approval, MemoryCallError> {
        let request = GetApprovalRequest { id: id.to_owned() };
        self.retried("get_approval", &request, async |m, r| {
            m.get_approval(r).await
        })
        .await
    }

    /// Appends a security decision to the audit.
    pub(crate) async fn record_audit(&self, record: &AuditRecord) -> Result<(), MemoryCallError> {
        self.retried("record_audit", record, async |m, r| m.record_audit(r).await)
            .await
            .map(|_| ())
    }

    /// Takes the session's queued inputs of `kind` into the live run `run_id`.
    pub(crate) async fn take_queued(
        &self,
        session_id: &str,
        epoch: i64,
        run_id: &str,
        kind: InboxKind,
    ) -> Result<Vec<InboxItem>, MemoryCallError> {
        let request = TakeQueuedRequest {
            session_id: session_id.to_owned(),
            epoch,
            run_id: run_id.to_owned(),
            kinds: vec![kind.as_str().to_owned()],
        };
        let taken = self
            .retried("take_queued", &request, async |m, r| m.take_queued(r).await)
            .await?;
        Ok(taken.items)
    }

    /// Writes transcript entries, fenced by the lease's epoch.
    pub(crate) async fn append(
        &self,
        session_id: &str,
        epoch: i64,
        entries: Vec<Entry>,
    ) -> Result<(), MemoryCallError> {
        let request = AppendEntriesRequest {
            session_id: session_id.to_owned(),
            epoch,
            entries,
        };
        self.retried("append_entries", &request, async |m, r| {
            m.append_entries(r).await
        })
        .await
        .map(|_| ())
    }

    /// Finishes a run (and writes its last entries); the lease may go back with it.
    pub(crate) async fn finish_run(
        &self,
        request: &FinishRunRequest,
    ) -> Result<FinishRunResponse, MemoryCallError> {
        self.retried("finish_run", request, async |m, r| m.finish_run(r).await)
            .await
    }

    /// Gives the lease back if the inbox is empty; returns whether it went back.
    pub(crate) async fn release(
        &self,
        session_id: &str,
        epoch: i64,
    ) -> Result<bool, MemoryCallError> {
        let request = ReleaseSessionRequest {
            session_id: session_id.to_owned(),
            epoch,
        };
        self.retried("release", &request, async |m, r| m.release_session(r).await)
            .await
            .map(|response| response.released)
    }

    /// Renews the lease for `ttl_ms` once; `false` when it is no longer this epoch's. The
    /// renewer calls it again well before the lease runs out, so a failure is not retried here.
    pub(crate) async fn renew(
        &self,
        session_id: &str,
        epoch: i64,
        ttl_ms: u32,
    ) -> Result<bool, MemoryCallError> {
        let request = RenewLeaseRequest {
            session_id: session_id.to_owned(),
            epoch,
            ttl_ms,
        };
        self.once(request, async |m, r| m.renew_lease(r).await)
            .await
            .map(|response| response.ok)
    }

    /// Renews the leases of `leases` (session, epoch) for `ttl_ms` in one call; returns the
    /// sessions renewed. Tried once: the renewer calls again well before a lease runs out.
    pub(crate) async fn renew_many(
        &self,
        leases: &[(String, i64)],
        ttl_ms: u32,
    ) -> Result<std::collections::HashSet<String>, MemoryCallError> {
        let request = RenewLeasesRequest {
            leases: leases
                .iter()
                .map(|(session_id, epoch)| HeldLease {
                    session_id: session_id.clone(),
                    epoch: *epoch,
                })
                .collect(),
            ttl_ms,
        };
        self.once(request, async |m, r| m.renew_leases(r).await)
            .await
            .map(|response| response.renewed.into_iter().collect())
    }

    /// The session's newest `limit` transcript entries.
    pub(crate) async fn history(
        &self,
        session_id: &str,
        limit: u32,
    ) -> Result<GetHistoryResponse, MemoryCallError> {
        let request = GetHistoryRequest {
            session_id: session_id.to_owned(),
            limit,
        };
        self.retried("get_history", &request, async |m, r| m.get_history(r).await)
            .await
    }

    /// Sessions with pending input and no live lease (asked once: the next sweep asks again).
    pub(crate) async fn list_claimable(&self, limit: u32) -> Result<Vec<String>, MemoryCallError> {
        self.once(ListClaimableRequest { limit }, async |m, r| {
            m.list_claimable(r).await
        })
        .await
        .map(|response| response.session_ids)
    }

    /// Auth profiles of `provider` cooling down now.
    pub(crate) async fn cooldowns(&self, provider: &str) -> Result<Vec<String>, MemoryCallError> {
        let request = GetCooldownsRequest {
            provider: provider.to_owned(),
        };
        self.once(request, async |m, r| m.get_cooldowns(r).await)
            .await
            .map(|response| response.cooldowns.into_iter().map(|c| c.profile).collect())
    }

    /// Records a failure of an auth profile (it cools down, longer each time).
    pub(crate) async fn profile_failed(
        &self,
        request: ReportProfileFailureRequest,
    ) -> Result<ProfileCooldown, MemoryCallError> {
        self.once(request, async |m, r| m.report_profile_failure(r).await)
            .await
    }

    /// Records a success of an auth profile (its failures are forgotten).
    pub(crate) async fn profile_succeeded(&self, provider: &str, profile: &str) {
        let request = ReportProfileSuccessRequest {
            provider: provider.to_owned(),
            profile: profile.to_owned(),
        };
        if let Err(err) = self
            .once(request, async |m, r| m.report_profile_success(r).await)
            .await
        {
            tracing::debug!(error = %err, "could not record the profile's success");
        }
    }

    /// Stores a memory for the scope's user (asked once: the tool reports a failure).
    pub(crate) async fn save_memory(
        &self,
        scope: MemoryScope,
        text: &str,
    ) -> Result<MemoryRecord, MemoryCallError> {
        self.store_memory(scope, text, "tool", "").await
    }

    /// Stores a memory from `source`, or with `replace_id` gives that memory the text.
    pub(crate) async fn store_memory(
        &self,
        scope: MemoryScope,
        text: &str,
        source: &str,
        replace_id: &str,
    ) -> Result<MemoryRecord, MemoryCallError> {
        let request = SaveMemoryRequest {
            scope: Some(scope),
            text: text.to_owned(),
            source: source.to_owned(),
            replace_id: replace_id.to_owned(),
            embedding: self.embed(text).await,
        };
        let saved = self
            .once(request, async |m, r| m.save_memory(r).await)
            .await;
        self.recalled.saved();
        saved
    }

    /// What to recall for `query`: [`Self::search_memories`], unless the scope recalled
    /// nothing moments ago (see `recall_cache`).
    pub(crate) async fn recall_memories(
        &self,
        scope: MemoryScope,
        query: &str,
        limit: u32,
        min_score: MinScore,
    ) -> Result<Vec<MemoryRecord>, MemoryCallError> {
        let key = crate::recall_cache::RecallCache::key(&scope);
        if self.recalled.known_empty(&key, std::time::Instant::now()) {
            return Ok(Vec::new());
        }
        let found = self.search(scope, query, limit, min_score).await?;
        self.recalled
            .record(key, !found.none_stored, std::time::Instant::now());
        Ok(found.memories)
    }

    /// The scope's memories matching `query` best.
    pub(crate) async fn search_memories(
        &self,
        scope: MemoryScope,
        query: &str,
        limit: u32,
        min_score: MinScore,
    ) -> Result<Vec<MemoryRecord>, MemoryCallError> {
        self.search(scope, query, limit, min_score)
            .await
            .map(|response| response.memories)
    }

    /// Hybrid when the query could be embedded, else full text, with the least score of
    /// that kind.
    async fn search(
        &self,
        scope: MemoryScope,
        query: &str,
        limit: u32,
        min_score: MinScore,
    ) -> Result<agentloop_proto::v1::SearchMemoriesResponse, MemoryCallError> {
        let query_embedding = self.embed(query).await;
        let min_score = if query_embedding.is_some() {
            min_score.hybrid
        } else {
            min_score.text
        };
        let request = SearchMemoriesRequest {
            scope: Some(scope),
            query: query.to_owned(),
            limit,
            min_score,
            query_embedding,
        };
        self.once(request, async |m, r| m.search_memories(r).await)
            .await
    }

    /// Deletes the scope's memory `id`, or those `query` matches; returns the ids deleted.
    /// By words alone: a forget by vector similarity could take memories the user never meant.
    pub(crate) async fn forget_memories(
        &self,
        scope: MemoryScope,
        id: &str,
        query: &str,
        min_score: f64,
    ) -> Result<Vec<String>, MemoryCallError> {
        let request = ForgetMemoriesRequest {
            scope: Some(scope),
            id: id.to_owned(),
            query: query.to_owned(),
            min_score,
        };
        self.once(request, async |m, r| m.forget_memories(r).await)
            .await
            .map(|response| response.ids)
    }

    /// Queues a run's exchange for the learn model.
    pub(crate) async fn enqueue_learn_job(&self, job: LearnJob) -> Result<bool, MemoryCallError> {
        self.once(job, async |m, r| m.enqueue_learn_job(r).await)
            .await
            .map(|response| response.created)
    }

    /// Leases the next learn job for `owner`, if one waits.
    pub(crate) async fn claim_learn_job(
        &self,
        owner: &str,
        ttl_ms: u32,
    ) -> Result<Option<LearnJob>, MemoryCallError> {
        let request = ClaimLearnJobRequest {
            owner: owner.to_owned(),
            ttl_ms,
        };
        self.once(request, async |m, r| m.claim_learn_job(r).await)
            .await
            .map(|job| (!job.id.is_empty()).then_some(job))
    }

    /// Ends a leased learn job; false when the lease was lost.
    pub(crate) async fn finish_learn_job(
        &self,
        request: FinishLearnJobRequest,
    ) -> Result<bool, MemoryCallError> {
        self.once(request, async |m, r| m.finish_learn_job(r).await)
            .await
            .map(|response| response.held)
    }

    /// The session's current skills snapshot (version 0: none).
    pub(crate) async fn skill_snapshot(
        &self,
        session_id: &str,
    ) -> Result<SkillSnapshot, MemoryCallError> {
        let request = GetSkillSnapshotRequest {
            session_id: session_id.to_owned(),
        };
        self.once(request, async |m, r| m.get_skill_snapshot(r).await)
            .await
    }

    /// Takes a snapshot unless the session has a current one; returns the current one.
    pub(crate) async fn save_skill_snapshot(
        &self,
        session_id: &str,
        digest: String,
        skills_json: String,
    ) -> Result<SkillSnapshot, MemoryCallError> {
        let request = SaveSkillSnapshotRequest {
            session_id: session_id.to_owned(),
            digest,
            skills_json,
        };
        self.once(request, async |m, r| m.save_skill_snapshot(r).await)
            .await
    }
}

/// Whose memories a run's calls touch: memory derives the user from the session (its gateway
/// principal, else the sender on the channel, else the session key), so the runner never names
/// a user itself. `None` when the agent keeps no memory.
pub(crate) fn memory_scope(
    agent_id: &str,
    mode: crate::config::MemoryMode,
    session_id: &str,
    sender_id: &str,
    channel: &str,
) -> Option<MemoryScope> {
    use crate::config::MemoryMode;
    let shared = match mode {
        MemoryMode::Off => return None,
        MemoryMode::Agent => false,
        MemoryMode::Shared => true,
    };
    Some(MemoryScope {
        agent_id: agent_id.to_owned(),
        session_id: session_id.to_owned(),
        sender_id: sender_id.to_owned(),
        channel: channel.to_owned(),
        shared_across_agents: shared,
        ..Default::default()
    })
}
