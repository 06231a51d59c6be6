//! The guard's operator methods (admin scope): `pairing.list|approve|revoke`,
//! `approvals.list|resolve|subscribe` (with OpenClaw's `exec.approval.resolve` name) and
//! `audit.list`. Memory holds the state and writes each decision to the audit; an answered
//! approval is also announced to the session's owner on its control subject, so the waiting
//! call goes on at once.

use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use agentloop_proto::v1::{
    Approval, ApprovePairingRequest, ControlMessage, ListApprovalsRequest, ListAuditRequest,
    ListPairingRequest, ResolveApprovalRequest, RevokePairingRequest, SystemEvent,
};
use agentloop_proto::{ApprovalDecision, ControlAction, EventPhase, EventStream};

use crate::RequestError;
use crate::feed::Feed;
use crate::frames::Outgoing;
use crate::params::{no_nul, parse};
use crate::principal::Principal;
use crate::state::AppState;

fn millis(t: Option<&pbjson_types::Timestamp>) -> i64 {
    t.map_or(0, crate::status::timestamp_ms)
}

/// Who an answer is recorded as: the connection's principal, or the local operator.
fn operator(who: &Principal) -> String {
    let name = who.caller().principal;
    if name.is_empty() {
        "operator".to_owned()
    } else {
        name
    }
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct PairingParams {
    #[serde(default)]
    channel: Option<String>,
    #[serde(default)]
    code: Option<String>,
    #[serde(default, alias = "sender_id")]
    sender_id: Option<String>,
}

/// `pairing.list {channel?}`
pub(crate) async fn pairing_list(state: &AppState, params: Value) -> Result<Value, RequestError> {
    let p: PairingParams = parse("pairing.list", params)?;
    let channel = p.channel.unwrap_or_default();
    no_nul("channel", &channel)?;
    let listed = state
        .sessions
        .clone()
        .list_pairing(ListPairingRequest { channel })
        .await?
        .into_inner();
    let pending: Vec<Value> = listed
        .pending
        .iter()
        .map(|c| json!({"code": c.code, "channel": c.channel, "senderId": c.sender_id,
                        "createdAtMs": millis(c.created_at.as_ref()), "expiresAtMs": millis(c.expires_at.as_ref())}))
        .collect();
    let paired: Vec<Value> = listed
        .paired
        .iter()
        .map(|s| json!({"channel": s.channel, "senderId": s.sender_id,
                        "approvedAtMs": millis(s.approved_at.as_ref()), "approvedBy": s.approved_by}))
        .collect();
    Ok(json!({"pending": pending, "paired": paired}))
}

/// `pairing.approve {code}`
pub(crate) async fn pairing_approve(
    state: &AppState,
    who: &Principal,
    params: Value,
) -> Result<Value, RequestError> {
    let p: PairingParams = parse("pairing.approve", params)?;
    let code = p.code.unwrap_or_default();
    no_nul("code", &code)?;
    if code.trim().is_empty() {
        return Err(RequestError::InvalidRequest("code is required".into()));
    }
    let paired = state
        .sessions
        .clone()
        .approve_pairing(ApprovePairingRequest {
            code,
            by: operator(who),
        })
        .await?
        .into_inner();
    Ok(json!({"ok": true, "channel": paired.channel, "senderId": paired.sender_id}))
}

/// `pairing.revoke {channel, senderId}`
pub(crate) async fn pairing_revoke(
    state: &AppState,
    who: &Principal,
    params: Value,
) -> Result<Value, RequestError> {
    let p: PairingParams = parse("pairing.revoke", params)?;
    let (channel, sender_id) = (
        p.channel.unwrap_or_default(),
        p.sender_id.unwrap_or_default(),
    );
    no_nul("channel", &channel)?;
    no_nul("senderId", &sender_id)?;
    if channel.is_empty() || sender_id.is_empty() {
        return Err(RequestError::InvalidRequest(
            "channel and senderId are required".into(),
        ));
    }
    let revoked = state
        .sessions
        .clone()
        .revoke_pairing(RevokePairingRequest {
            channel,
            sender_id,
            by: operator(who),
        })
        .await?
        .into_inner()
        .revoked;
    Ok(json!({"ok": true, "revoked": revoked}))
}

/// An approval request as operators read it.
fn approval(a: &Approval) -> Value {
    json!({"id": a.id, "status": a.status, "tool": a.tool, "arguments": a.arguments,
           "sessionKey": a.session_key, "sessionId": a.session_id, "agentId": a.agent_id,
           "runId": a.run_id, "toolCallId": a.tool_call_id, "always": a.always,
           "resolvedBy": a.resolved_by, "createdAtMs": millis(a.created_at.as_ref()),
           "expiresAtMs": millis(a.expires_at.as_ref())})
}

/// `approvals.list`: requests waiting for an operator, oldest first.
pub(crate) async fn approvals_list(state: &AppState) -> Result<Value, RequestError> {
    let listed = state
        .sessions
        .clone()
        .list_approvals(ListApprovalsRequest {})
        .await?
        .into_inner();
    let approvals: Vec<Value> = listed.approvals.iter().map(approval).collect();
    Ok(json!({"approvals": approvals}))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ResolveParams {
    id: String,
    decision: String,
}

/// `approvals.resolve {id, decision: allow-once | allow-always | deny}`
pub(crate) async fn approvals_resolve(
    state: &AppState,
    who: &Principal,
    method: &str,
    params: Value,
) -> Result<Value, RequestError> {
    let p: ResolveParams = parse(method, params)?;
    no_nul("id", &p.id)?;
    let decision: ApprovalDecision = p
        .decision
        .parse()
        .map_err(|e: agentloop_proto::UnknownWord| RequestError::InvalidRequest(e.to_string()))?;
    let answered = state
        .sessions
        .clone()
        .resolve_approval(ResolveApprovalRequest {
            id: p.id,
            decision: decision.as_str().to_owned(),
            by: operator(who),
        })
        .await?
        .into_inner();
    let expected = match decision {
        ApprovalDecision::Deny => "denied",
        ApprovalDecision::AllowOnce | ApprovalDecision::AllowAlways => "approved",
    };
    if answered.status != expected || answered.resolved_by != operator(who) {
        return Err(RequestError::InvalidRequest(format!(
            "approval {} is already {} (by {})",
            answered.id, answered.status, answered.resolved_by
        )));
    }
    // The owner reads the request again on its own within a second; this makes it now.
    let bus = state.bus()?;
    let wake = ControlMessage {
        session_id: answered.session_id.clone(),
        action: ControlAction::Approval.as_str().to_owned(),
        reason: answered.id.clone(),
    };
    if let Err(error) = bus
        .publish_fast(
            bus.subjects().control(&answered.session_id),
            &wake,
            agentloop_proto::Encoding::Proto,
        )
        .await
    {
        tracing::warn!(error = %agentloop_bus::error_chain(&error), approval = %answered.id, "approval answered; waking its run failed (it polls)");
    }
    Ok(json!({"ok": true, "approval": approval(&answered)}))
}

/// `approvals.subscribe`: answers at once, then sends `exec.approval.requested` and
/// `exec.approval.resolved` events until the connection closes.
pub(crate) async fn approvals_subscribe(
    state: &AppState,
    id: &Value,
    out_tx: &mpsc::Sender<Outgoing>,
    closed: CancellationToken,
) {
    let Some(mut feed) =
        Feed::open(state, id, out_tx, |bus| bus.subjects().approvals(), closed).await
    else {
        return;
    };
    while let Some(msg) = feed.next().await {
        let Ok((event, _)) = agentloop_bus::decode::<SystemEvent>(&msg) else {
            continue;
        };
        let name = if event.is(EventStream::Approval, EventPhase::Requested) {
            "exec.approval.requested"
        } else if event.is(EventStream::Approval, EventPhase::Resolved) {
            "exec.approval.resolved"
        } else {
            continue;
        };
        let mut payload: Value = serde_json::from_str(&event.data).unwrap_or(Value::Null);
        if let Value::Object(map) = &mut payload {
            map.insert("runId".into(), json!(event.run_id));
            map.insert("toolCallId".into(), json!(event.tool_call_id));
        }
        if out_tx
            .send(Outgoing::Event {
                event: name,
                payload,
            })
            .await
            .is_err()
        {
            break;
        }
    }
    feed.close().await;
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct AuditParams {
    #[serde(default)]
    limit: Option<u32>,
    #[serde(default)]
    source: Option<String>,
}

/// `audit.list {limit?, source?}`: the latest security decisions, newest first.
pub(crate) async fn audit_list(state: &AppState, params: Value) -> Result<Value, RequestError> {
    let p: AuditParams = parse("audit.list", params)?;
    let source = p.source.unwrap_or_default();
    no_nul("source", &source)?;
    let listed = state
        .sessions
        .clone()
        .list_audit(ListAuditRequest {
            limit: p.limit.unwrap_or(100).clamp(1, 1000),
            source,
        })
        .await?
        .into_inner();
    let records: Vec<Value> = listed
        .records
        .iter()
        .map(|r| {
            json!({"id": r.id, "atMs": millis(r.at.as_ref()), "source": r.source,
                        "decision": r.decision, "level": r.level, "subject": r.subject,
                        "sessionId": r.session_id, "runId": r.run_id, "actor": r.actor,
                        "reason": r.reason})
        })
        .collect();
    Ok(json!({"records": records}))
}
