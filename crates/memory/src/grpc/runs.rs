//! SessionService calls on a session's lease and its runs: claim, renew and release the lease,
//! take the next input as a run, finish it, and list sessions waiting for an owner.

use agentloop_proto::v1 as pb;

use super::SessionApi;
use super::convert::{
    MAX_CLAIMABLE_SESSIONS, bounded_limit, new_entries, parse_id, parse_tokens, parse_ttl, require,
    take_response,
};
use crate::MemoryError;
use crate::store::{self, RunOutcome, RunStatus, non_empty};

/// `ListClaimable` returns at most this many ids when the request says 0.
const DEFAULT_CLAIMABLE_LIMIT: u32 = 100;

impl SessionApi {
    /// `ClaimSession`: the session's lease for `owner`, unless another owner holds it.
    pub(super) async fn claim_session(
        &self,
        req: pb::ClaimSessionRequest,
    ) -> Result<pb::ClaimSessionResponse, MemoryError> {
        let session_id = parse_id("session_id", &req.session_id)?;
        require("owner", &req.owner)?;
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

    /// `RenewLease`: extends the lease the epoch still holds.
    pub(super) async fn renew_lease(
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

    /// `RenewLeases`: extends every listed lease its epoch still holds.
    pub(super) async fn renew_leases(
        &self,
        req: pb::RenewLeasesRequest,
    ) -> Result<pb::RenewLeasesResponse, MemoryError> {
        let ttl = parse_ttl(req.ttl_ms)?;
        let leases = req
            .leases
            .iter()
            .map(|lease| Ok((parse_id("session_id", &lease.session_id)?, lease.epoch)))
            .collect::<Result<Vec<_>, MemoryError>>()?;
        let renewed = self.store()?.renew_leases(&leases, ttl).await?;
        Ok(pb::RenewLeasesResponse {
            renewed: renewed.iter().map(uuid::Uuid::to_string).collect(),
        })
    }

    /// `TakeNext`: the oldest pending input as a run, with the history asked for (at most
    /// [`Self::history_cap`] entries).
    pub(super) async fn take_next(
        &self,
        req: pb::TakeNextRequest,
    ) -> Result<pb::TakeNextResponse, MemoryError> {
        let session_id = parse_id("session_id", &req.session_id)?;
        require("owner", &req.owner)?;
        let Some(taken) = self
            .store()?
            .take_next(session_id, req.epoch, &req.owner)
            .await?
        else {
            return Ok(pb::TakeNextResponse::default());
        };
        let history = if req.history_limit > 0 {
            let ask = store::HistoryAsk {
                limit: bounded_limit(req.history_limit, 0, self.history_cap()),
                after_seq: req.history_after_seq,
            };
            self.store()?.history_window(session_id, ask).await?
        } else {
            (false, Vec::new())
        };
        Ok(take_response(taken, history))
    }

    /// `FinishRun`: the run's end and final entries, releasing the lease when asked and idle.
    pub(super) async fn finish_run(
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
            prompt_report: prompt_report(&req.prompt_report, &req.run_id),
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

    /// `ReleaseSession`: hands the lease back.
    pub(super) async fn release_session(
        &self,
        req: pb::ReleaseSessionRequest,
    ) -> Result<pb::ReleaseSessionResponse, MemoryError> {
        let session_id = parse_id("session_id", &req.session_id)?;
        let released = self.store()?.release_session(session_id, req.epoch).await?;
        Ok(pb::ReleaseSessionResponse { released })
    }

    /// `ListClaimable`: sessions with pending input and no live lease, at most
    /// [`MAX_CLAIMABLE_SESSIONS`].
    pub(super) async fn list_claimable(
        &self,
        req: pb::ListClaimableRequest,
    ) -> Result<pb::ListClaimableResponse, MemoryError> {
        let limit = bounded_limit(req.limit, DEFAULT_CLAIMABLE_LIMIT, MAX_CLAIMABLE_SESSIONS);
        let ids = self.store()?.list_claimable(limit).await?;
        Ok(pb::ListClaimableResponse {
            session_ids: ids.into_iter().map(|id| id.to_string()).collect(),
        })
    }
}

/// The longest prompt report kept.
const MAX_PROMPT_REPORT_BYTES: usize = 64 * 1024;

/// A run's prompt report as stored: JSON of at most [`MAX_PROMPT_REPORT_BYTES`]. One that is
/// not is left out with a warning rather than failing the run's end over a diagnostic.
fn prompt_report(report: &str, run_id: &str) -> Option<String> {
    if report.is_empty() {
        return None;
    }
    let usable = report.len() <= MAX_PROMPT_REPORT_BYTES
        && serde_json::from_str::<serde::de::IgnoredAny>(report).is_ok();
    if !usable {
        tracing::warn!(
            run_id,
            bytes = report.len(),
            "prompt report is not JSON of at most 64 KiB; the run ends without it"
        );
        return None;
    }
    Some(report.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prompt_report_is_kept_only_as_json_of_bounded_size() {
        assert_eq!(prompt_report("", "r"), None);
        assert_eq!(
            prompt_report(r#"{"parts":[]}"#, "r").as_deref(),
            Some(r#"{"parts":[]}"#)
        );
        assert_eq!(prompt_report("{not json", "r"), None);
        let huge = format!("\"{}\"", "x".repeat(MAX_PROMPT_REPORT_BYTES));
        assert_eq!(prompt_report(&huge, "r"), None);
    }
}
