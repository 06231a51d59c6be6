//! SessionService calls of the guard: the security audit, pairing and tool approvals.

use agentloop_proto::v1 as pb;
use agentloop_proto::{ApprovalDecision, AuditSource};

use super::SessionApi;
use super::convert::{parse_id, require, timestamp};
use crate::MemoryError;
use crate::store::{ApprovalAsk, ApprovalRow, AuditRow, PairedSender};

/// Longest a pairing code or an approval request may live: a day.
const MAX_TTL_MS: u64 = 86_400_000;

fn invalid(message: impl Into<String>) -> MemoryError {
    MemoryError::InvalidArgument(message.into())
}

/// `RecordAudit`
pub(super) async fn record(
    api: &SessionApi,
    req: pb::AuditRecord,
) -> Result<pb::RecordAuditResponse, MemoryError> {
    req.source
        .parse::<AuditSource>()
        .map_err(|e| invalid(e.to_string()))?;
    require("decision", &req.decision)?;
    let row = AuditRow {
        source: req.source,
        decision: req.decision,
        level: req.level,
        subject: req.subject,
        session_id: req.session_id,
        run_id: req.run_id,
        actor: req.actor,
        reason: req.reason,
        ..Default::default()
    };
    api.store()?.record_audit(&row, &req.dedupe_key).await?;
    Ok(pb::RecordAuditResponse {})
}

/// `ListAudit`
pub(super) async fn list(
    api: &SessionApi,
    req: pb::ListAuditRequest,
) -> Result<pb::ListAuditResponse, MemoryError> {
    if !req.source.is_empty() {
        req.source
            .parse::<AuditSource>()
            .map_err(|e| invalid(e.to_string()))?;
    }
    let limit = if req.limit == 0 {
        100
    } else {
        req.limit.min(1000)
    };
    let rows = api.store()?.list_audit(limit, &req.source).await?;
    Ok(pb::ListAuditResponse {
        records: rows
            .into_iter()
            .map(|r| pb::AuditRecord {
                id: r.id,
                source: r.source,
                decision: r.decision,
                level: r.level,
                subject: r.subject,
                session_id: r.session_id,
                run_id: r.run_id,
                actor: r.actor,
                reason: r.reason,
                dedupe_key: String::new(),
                at: r.at.map(timestamp),
            })
            .collect(),
    })
}

/// `CheckSender`
pub(super) async fn check_sender(
    api: &SessionApi,
    req: pb::CheckSenderRequest,
) -> Result<pb::CheckSenderResponse, MemoryError> {
    require("channel", &req.channel)?;
    require("sender_id", &req.sender_id)?;
    if req.may_pair {
        require("code", &req.code)?;
        if req.max_pending == 0 || req.code_ttl_ms == 0 || req.code_ttl_ms > MAX_TTL_MS {
            return Err(invalid(
                "max_pending must be positive and code_ttl_ms between 1 and a day",
            ));
        }
    }
    let checked = api
        .store()?
        .check_sender(
            &req.channel,
            &req.sender_id,
            req.may_pair,
            &req.code.to_uppercase(),
            i32::try_from(req.max_pending).unwrap_or(i32::MAX),
            i64::try_from(req.code_ttl_ms).unwrap_or(i64::MAX),
        )
        .await?;
    Ok(pb::CheckSenderResponse {
        outcome: checked.outcome,
        code: checked.code,
        created: checked.created,
        expires_at: checked.expires_at.map(timestamp),
    })
}

fn paired(row: PairedSender) -> pb::PairedSender {
    pb::PairedSender {
        channel: row.channel,
        sender_id: row.sender_id,
        approved_at: Some(timestamp(row.approved_at)),
        approved_by: row.approved_by,
    }
}

/// `ListPairing`
pub(super) async fn list_pairing(
    api: &SessionApi,
    req: pb::ListPairingRequest,
) -> Result<pb::ListPairingResponse, MemoryError> {
    let (pending, senders) = api.store()?.list_pairing(&req.channel).await?;
    Ok(pb::ListPairingResponse {
        pending: pending
            .into_iter()
            .map(|c| pb::PairingCode {
                code: c.code,
                channel: c.channel,
                sender_id: c.sender_id,
                created_at: Some(timestamp(c.created_at)),
                expires_at: Some(timestamp(c.expires_at)),
            })
            .collect(),
        paired: senders.into_iter().map(paired).collect(),
    })
}

/// `ApprovePairing`
pub(super) async fn approve_pairing(
    api: &SessionApi,
    req: pb::ApprovePairingRequest,
) -> Result<pb::PairedSender, MemoryError> {
    require("code", &req.code)?;
    require("by", &req.by)?;
    api.store()?
        .approve_pairing(req.code.trim(), &req.by)
        .await?
        .map(paired)
        .ok_or_else(|| MemoryError::NotFound(format!("no live pairing code {:?}", req.code)))
}

/// `RevokePairing`
pub(super) async fn revoke_pairing(
    api: &SessionApi,
    req: pb::RevokePairingRequest,
) -> Result<pb::RevokePairingResponse, MemoryError> {
    require("channel", &req.channel)?;
    require("sender_id", &req.sender_id)?;
    require("by", &req.by)?;
    let revoked = api
        .store()?
        .revoke_pairing(&req.channel, &req.sender_id, &req.by)
        .await?;
    Ok(pb::RevokePairingResponse { revoked })
}

fn approval(row: ApprovalRow) -> pb::Approval {
    pb::Approval {
        id: row.id.to_string(),
        session_id: row.session_id.to_string(),
        session_key: row.session_key,
        agent_id: row.agent_id,
        run_id: row.run_id,
        tool_call_id: row.tool_call_id,
        tool: row.tool,
        arguments: row.arguments,
        status: row.status,
        always: row.always,
        created_at: Some(timestamp(row.created_at)),
        expires_at: Some(timestamp(row.expires_at)),
        resolved_by: row.resolved_by,
    }
}

/// `RequestApproval`
pub(super) async fn request_approval(
    api: &SessionApi,
    req: pb::RequestApprovalRequest,
) -> Result<pb::Approval, MemoryError> {
    let session_id = parse_id("session_id", &req.session_id)?;
    require("run_id", &req.run_id)?;
    require("tool_call_id", &req.tool_call_id)?;
    require("tool", &req.tool)?;
    if req.timeout_ms == 0 || req.timeout_ms > MAX_TTL_MS {
        return Err(invalid("timeout_ms must be between 1 and a day"));
    }
    let ask = ApprovalAsk {
        session_id,
        session_key: &req.session_key,
        agent_id: &req.agent_id,
        run_id: &req.run_id,
        tool_call_id: &req.tool_call_id,
        tool: &req.tool,
        arguments: &req.arguments,
        timeout_ms: i64::try_from(req.timeout_ms).unwrap_or(i64::MAX),
    };
    Ok(approval(api.store()?.request_approval(&ask).await?))
}

/// `GetApproval`
pub(super) async fn get_approval(
    api: &SessionApi,
    req: pb::GetApprovalRequest,
) -> Result<pb::Approval, MemoryError> {
    let id = parse_id("id", &req.id)?;
    api.store()?
        .get_approval(id)
        .await?
        .map(approval)
        .ok_or_else(|| MemoryError::NotFound(format!("no approval request {id}")))
}

/// `ResolveApproval`
pub(super) async fn resolve_approval(
    api: &SessionApi,
    req: pb::ResolveApprovalRequest,
) -> Result<pb::Approval, MemoryError> {
    let id = parse_id("id", &req.id)?;
    require("by", &req.by)?;
    let decision = req
        .decision
        .parse::<ApprovalDecision>()
        .map_err(|e| invalid(e.to_string()))?;
    let (approve, always) = match decision {
        ApprovalDecision::AllowOnce => (true, false),
        ApprovalDecision::AllowAlways => (true, true),
        ApprovalDecision::Deny => (false, false),
    };
    api.store()?
        .resolve_approval(id, approve, always, &req.by)
        .await?
        .map(approval)
        .ok_or_else(|| MemoryError::NotFound(format!("no approval request {id}")))
}

/// `ListApprovals`
pub(super) async fn list_approvals(
    api: &SessionApi,
    _req: pb::ListApprovalsRequest,
) -> Result<pb::ListApprovalsResponse, MemoryError> {
    let rows = api.store()?.list_approvals().await?;
    Ok(pb::ListApprovalsResponse {
        approvals: rows.into_iter().map(approval).collect(),
    })
}
