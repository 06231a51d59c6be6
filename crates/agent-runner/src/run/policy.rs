//! An agent's tool policy (`agents.<id>.tool_policy`): a call runs, is refused, or waits for an
//! operator's approval. The request lives in memory (one per call of a run), so a run resumed
//! on another replica after a crash waits on the same request and finds its answer.

use std::time::Duration;

use serde_json::json;

use agentloop_proto::v1::{Approval, AuditRecord, RequestApprovalRequest};
use agentloop_proto::{ApprovalStatus, AuditSource, EventPhase, ToolPolicy};

use super::{RunCtx, agent_id};

/// How often a waiting call reads its request again when no control message woke it (an
/// answer given with `agentloop approvals` or on another gateway reaches it this way).
const POLL: Duration = Duration::from_secs(1);

/// What the model is told about a call that did not run, by how its request ended.
pub(crate) fn refusal(tool: &str, status: ApprovalStatus, by: &str) -> Option<String> {
    match status {
        ApprovalStatus::Approved => None,
        ApprovalStatus::Pending => Some(format!(
            "the call of {tool} was not approved: the request is still pending"
        )),
        ApprovalStatus::Denied => Some(format!(
            "an operator ({by}) denied this call of {tool}; do not retry it, tell the user"
        )),
        ApprovalStatus::Expired => Some(format!(
            "no operator approved this call of {tool} in time, so it did not run; tell the user"
        )),
    }
}

impl RunCtx<'_> {
    /// Applies the agent's tool policy to a call: `Err(why)` when it must not run (the model
    /// gets `why` as the tool's error).
    pub(super) async fn policy(
        &self,
        tool: &str,
        call_id: &str,
        arguments: &serde_json::Value,
    ) -> Result<(), String> {
        match self.agent.tool_policy_of(tool) {
            ToolPolicy::Allow => Ok(()),
            ToolPolicy::Deny => {
                tracing::warn!(tool, "tool call refused by the agent's tool policy");
                self.audit(AuditSource::Policy, "denied", tool, "tool_policy", "deny")
                    .await;
                Err(format!(
                    "the tool {tool} is not allowed for this assistant; do not retry it"
                ))
            }
            ToolPolicy::Ask => self.approval(tool, call_id, arguments).await,
        }
    }

    /// Asks an operator and waits for the answer (or the request's expiry).
    async fn approval(
        &self,
        tool: &str,
        call_id: &str,
        arguments: &serde_json::Value,
    ) -> Result<(), String> {
        let replica = self.replica;
        let request = RequestApprovalRequest {
            session_id: self.session_id.to_owned(),
            session_key: self.command.session_key.clone(),
            agent_id: agent_id(self.command).to_owned(),
            run_id: self.run.id.clone(),
            tool_call_id: call_id.to_owned(),
            tool: tool.to_owned(),
            arguments: self.events.cap(&arguments.to_string()),
            timeout_ms: replica.settings.approval_timeout_ms.max(1),
        };
        let mut approval = replica
            .memory
            .request_approval(&request)
            .await
            .map_err(|e| format!("the approval request could not be stored: {e}"))?;
        if status(&approval) == ApprovalStatus::Pending {
            tracing::info!(tool, approval = %approval.id, "tool call waits for an operator's approval");
            self.events
                .approval(
                    EventPhase::Requested,
                    tool,
                    call_id,
                    requested(&approval).to_string(),
                )
                .await;
        }
        while status(&approval) == ApprovalStatus::Pending {
            // Registered before the read, so an answer landing in between still wakes it.
            let answered = self.signals.approval_answered();
            tokio::select! {
                () = answered => {}
                () = tokio::time::sleep(POLL) => {}
            }
            approval = replica
                .memory
                .get_approval(&approval.id)
                .await
                .map_err(|e| format!("the approval request could not be read: {e}"))?;
        }
        let status = status(&approval);
        tracing::info!(tool, approval = %approval.id, %status, by = %approval.resolved_by, "approval request answered");
        self.events
            .approval(
                EventPhase::Resolved,
                tool,
                call_id,
                json!({ "id": approval.id, "tool": tool, "status": status.as_str(), "always": approval.always, "by": approval.resolved_by }).to_string(),
            )
            .await;
        match refusal(tool, status, &approval.resolved_by) {
            None => Ok(()),
            Some(why) => Err(why),
        }
    }

    /// Appends a decision of this run to the security audit; a failure is logged, not fatal
    /// (the decision itself is already in force and in the run's events).
    pub(super) async fn audit(
        &self,
        source: AuditSource,
        decision: &str,
        subject: &str,
        actor: &str,
        reason: &str,
    ) {
        self.replica
            .metrics
            .security
            .get_or_create(&vec![
                ("source", source.as_str().to_owned()),
                ("decision", decision.to_owned()),
            ])
            .inc();
        let record = AuditRecord {
            source: source.as_str().to_owned(),
            decision: decision.to_owned(),
            subject: subject.to_owned(),
            session_id: self.session_id.to_owned(),
            run_id: self.run.id.clone(),
            actor: actor.to_owned(),
            reason: reason.to_owned(),
            ..Default::default()
        };
        if let Err(err) = self.replica.memory.record_audit(&record).await {
            tracing::error!(error = %err, source = %source, decision, subject, "security decision not written to the audit");
        }
    }
}

fn status(approval: &Approval) -> ApprovalStatus {
    // Memory writes only these words (a CHECK constraint); anything else is treated as denied.
    approval.status.parse().unwrap_or(ApprovalStatus::Denied)
}

/// The `requested` event's data: what an operator needs to decide.
fn requested(approval: &Approval) -> serde_json::Value {
    let expires_ms = approval
        .expires_at
        .as_ref()
        .map_or(0, |t| t.seconds * 1000 + i64::from(t.nanos / 1_000_000));
    json!({
        "id": approval.id,
        "tool": approval.tool,
        "arguments": approval.arguments,
        "sessionKey": approval.session_key,
        "agentId": approval.agent_id,
        "expiresAtMs": expires_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_approved_call_runs_and_the_model_is_told_why_the_others_did_not() {
        assert_eq!(refusal("exec", ApprovalStatus::Approved, "ops"), None);
        assert!(
            refusal("exec", ApprovalStatus::Denied, "ops")
                .unwrap()
                .contains("denied")
        );
        assert!(
            refusal("exec", ApprovalStatus::Expired, "timeout")
                .unwrap()
                .contains("in time")
        );
        assert!(refusal("exec", ApprovalStatus::Pending, "").is_some());
    }

    #[test]
    fn a_tool_named_in_the_policy_wins_over_the_star_and_unnamed_tools_are_allowed() {
        let mut agent = crate::AgentConfig::default();
        assert_eq!(agent.tool_policy_of("exec"), ToolPolicy::Allow);
        agent.tool_policy.insert("*".into(), ToolPolicy::Ask);
        agent.tool_policy.insert("read".into(), ToolPolicy::Allow);
        agent.tool_policy.insert("rm".into(), ToolPolicy::Deny);
        assert_eq!(agent.tool_policy_of("exec"), ToolPolicy::Ask);
        assert_eq!(agent.tool_policy_of("read"), ToolPolicy::Allow);
        assert_eq!(agent.tool_policy_of("rm"), ToolPolicy::Deny);
    }
}
