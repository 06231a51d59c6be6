//! The guard from the command line: `agentloop pairing list|approve CODE|revoke CHANNEL SENDER`,
//! `agentloop approvals list|resolve ID DECISION` and `agentloop audit`. They talk to memory's
//! gRPC API (as the gateway's operator methods do), so they work with the gateway down.

use anyhow::bail;

use agentloop_proto::ApprovalDecision;
use agentloop_proto::v1::session_service_client::SessionServiceClient;
use agentloop_proto::v1::{
    ApprovePairingRequest, ListApprovalsRequest, ListAuditRequest, ListPairingRequest,
    ResolveApprovalRequest, RevokePairingRequest,
};
use agentloop_telemetry::TracedChannel;

use crate::knowledge::{Args, config};

/// Who a decision made here is recorded as: `AGENTLOOP_OPERATOR`, else the login name.
fn operator() -> String {
    ["AGENTLOOP_OPERATOR", "USER"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|s| !s.is_empty()))
        .map_or_else(|| "cli".to_owned(), |name| format!("cli:{name}"))
}

fn memory() -> anyhow::Result<SessionServiceClient<TracedChannel>> {
    Ok(SessionServiceClient::new(config()?.memory.channel()?))
}

fn failed(status: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("memory: {}", status.message())
}

fn time(t: Option<&pbjson_types::Timestamp>) -> String {
    t.and_then(|t| chrono::DateTime::from_timestamp(t.seconds, 0))
        .map_or_else(String::new, |at| at.format("%Y-%m-%d %H:%M:%S").to_string())
}

/// `agentloop pairing list [--channel NAME] | approve CODE | revoke CHANNEL SENDER`
pub(crate) async fn pairing(args: &[String]) -> anyhow::Result<()> {
    const USAGE: &str = "usage: agentloop pairing list [--channel NAME] [--json] | approve CODE | revoke CHANNEL SENDER";
    let args = Args::parse(args)?;
    let words: Vec<&str> = args.words.iter().skip(1).map(String::as_str).collect();
    let mut grpc = memory()?;
    match words.as_slice() {
        ["list"] => {
            let channel = args.flag("--channel").unwrap_or_default().to_owned();
            let listed = grpc
                .list_pairing(ListPairingRequest { channel })
                .await
                .map_err(failed)?
                .into_inner();
            if args.json {
                let pending: Vec<_> = listed.pending.iter().map(|c| serde_json::json!({"code": c.code, "channel": c.channel, "senderId": c.sender_id, "expiresAt": time(c.expires_at.as_ref())})).collect();
                let paired: Vec<_> = listed.paired.iter().map(|s| serde_json::json!({"channel": s.channel, "senderId": s.sender_id, "approvedAt": time(s.approved_at.as_ref()), "approvedBy": s.approved_by})).collect();
                println!(
                    "{}",
                    serde_json::to_string_pretty(
                        &serde_json::json!({"pending": pending, "paired": paired})
                    )?
                );
                return Ok(());
            }
            println!("{} pending codes", listed.pending.len());
            for c in &listed.pending {
                println!(
                    "{}\t{}\t{}\texpires {}",
                    c.code,
                    c.channel,
                    c.sender_id,
                    time(c.expires_at.as_ref())
                );
            }
            println!("{} paired senders", listed.paired.len());
            for s in &listed.paired {
                println!(
                    "{}\t{}\tapproved {} by {}",
                    s.channel,
                    s.sender_id,
                    time(s.approved_at.as_ref()),
                    s.approved_by
                );
            }
        }
        ["approve", code] => {
            let paired = grpc
                .approve_pairing(ApprovePairingRequest {
                    code: (*code).to_owned(),
                    by: operator(),
                })
                .await
                .map_err(failed)?
                .into_inner();
            println!("paired {} on {}", paired.sender_id, paired.channel);
        }
        ["revoke", channel, sender] => {
            let revoked = grpc
                .revoke_pairing(RevokePairingRequest {
                    channel: (*channel).to_owned(),
                    sender_id: (*sender).to_owned(),
                    by: operator(),
                })
                .await
                .map_err(failed)?
                .into_inner()
                .revoked;
            if revoked {
                println!("unpaired {sender} on {channel}");
            } else {
                println!("{sender} was not paired on {channel}");
            }
        }
        _ => bail!(USAGE),
    }
    Ok(())
}

/// `agentloop approvals list | resolve ID allow-once|allow-always|deny`
pub(crate) async fn approvals(args: &[String]) -> anyhow::Result<()> {
    const USAGE: &str =
        "usage: agentloop approvals list [--json] | resolve ID allow-once|allow-always|deny";
    let args = Args::parse(args)?;
    let words: Vec<&str> = args.words.iter().skip(1).map(String::as_str).collect();
    let mut grpc = memory()?;
    match words.as_slice() {
        ["list"] => {
            let listed = grpc
                .list_approvals(ListApprovalsRequest {})
                .await
                .map_err(failed)?
                .into_inner();
            if args.json {
                let rows: Vec<_> = listed.approvals.iter().map(|a| serde_json::json!({"id": a.id, "tool": a.tool, "arguments": a.arguments, "sessionKey": a.session_key, "agentId": a.agent_id, "expiresAt": time(a.expires_at.as_ref())})).collect();
                println!("{}", serde_json::to_string_pretty(&rows)?);
                return Ok(());
            }
            println!("{} pending approvals", listed.approvals.len());
            for a in &listed.approvals {
                println!(
                    "{}\t{}\t{}\t{}\texpires {}",
                    a.id,
                    a.tool,
                    a.session_key,
                    a.arguments,
                    time(a.expires_at.as_ref())
                );
            }
        }
        ["resolve", id, decision] => {
            let decision: ApprovalDecision = decision.parse()?;
            let answered = grpc
                .resolve_approval(ResolveApprovalRequest {
                    id: (*id).to_owned(),
                    decision: decision.as_str().to_owned(),
                    by: operator(),
                })
                .await
                .map_err(failed)?
                .into_inner();
            // The waiting run reads its request again within a second.
            println!(
                "approval {} is {} (by {})",
                answered.id, answered.status, answered.resolved_by
            );
        }
        _ => bail!(USAGE),
    }
    Ok(())
}

/// `agentloop audit [--limit N] [--source scanner|guardian|pairing|approval|policy] [--json]`
pub(crate) async fn audit(args: &[String]) -> anyhow::Result<()> {
    let args = Args::parse(args)?;
    let limit = match args.flag("--limit") {
        Some(n) => n.parse()?,
        None => 50,
    };
    let source = args.flag("--source").unwrap_or_default().to_owned();
    let listed = memory()?
        .list_audit(ListAuditRequest { limit, source })
        .await
        .map_err(failed)?
        .into_inner();
    if args.json {
        let rows: Vec<_> = listed.records.iter().map(|r| serde_json::json!({"id": r.id, "at": time(r.at.as_ref()), "source": r.source, "decision": r.decision, "level": r.level, "subject": r.subject, "sessionId": r.session_id, "runId": r.run_id, "actor": r.actor, "reason": r.reason})).collect();
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    for r in &listed.records {
        println!(
            "{}\t{}\t{}\t{}\t{}\t{}\tby {}\t{}",
            r.id,
            time(r.at.as_ref()),
            r.source,
            r.decision,
            r.level,
            r.subject,
            r.actor,
            r.reason
        );
    }
    Ok(())
}
