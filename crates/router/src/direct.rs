//! The router's own answers to messages that start no run (`/stop`, a blocked message, a
//! pairing code) and its records in the security audit.

use agentloop_proto::EventPhase;
use agentloop_proto::v1::{AuditRecord, ControlMessage, InboundMessage, OutboundMessage};
use agentloop_scanner::Scan;

use crate::ctx::Ctx;
use crate::error::RouteFailure;
use crate::screen::{scan_record, security_event};

/// Counts one of the guard's decisions in `agentloop_security_decisions_total`.
pub(crate) fn count(ctx: &Ctx, source: &str, decision: &str) {
    ctx.security
        .get_or_create(&vec![
            ("source", source.to_owned()),
            ("decision", decision.to_owned()),
        ])
        .inc();
}

/// Appends `record` to the security audit (memory dedupes a redelivered message's record).
pub(crate) async fn audit(ctx: &Ctx, record: AuditRecord) -> Result<(), RouteFailure> {
    count(ctx, &record.source, &record.decision);
    ctx.sessions
        .clone()
        .record_audit(record)
        .await
        .map(|_| ())
        .map_err(|status| RouteFailure::memory("audit", &status))
}

/// `/stop`: aborts the session's live run (its owner answers it with "Stopped.") and confirms.
pub(crate) async fn stop(
    ctx: &Ctx,
    session_id: &str,
    inbound: InboundMessage,
) -> Result<(), RouteFailure> {
    let abort = ControlMessage {
        session_id: session_id.to_owned(),
        action: agentloop_proto::ControlAction::Abort.as_str().to_owned(),
        reason: "/stop".to_owned(),
    };
    ctx.bus
        .publish_fast(
            ctx.bus.subjects().control(session_id),
            &abort,
            agentloop_proto::Encoding::Proto,
        )
        .await?;
    reply_directly(
        ctx,
        session_id,
        "",
        inbound,
        "Stopping the current run.".to_owned(),
        None,
    )
    .await
}

/// The router's own answer to a message that starts no run, sent on the message's channel
/// (and reply subject) like any reply, with the metadata a chat app's reply needs.
pub(crate) async fn reply_directly(
    ctx: &Ctx,
    session_id: &str,
    run_id: &str,
    inbound: InboundMessage,
    text: String,
    msg_id: Option<&str>,
) -> Result<(), RouteFailure> {
    let reply = OutboundMessage {
        session_key: inbound.session_key,
        session_id: session_id.to_owned(),
        run_id: run_id.to_owned(),
        channel: inbound.channel.clone(),
        recipient: inbound.sender_id,
        text,
        r#final: true,
        reply_subject: inbound.reply_subject,
        reply_encoding: inbound.reply_encoding,
        metadata: inbound.metadata,
        ts: Some(agentloop_proto::now()),
        ..Default::default()
    };
    ctx.bus
        .publish_durable(
            ctx.bus.subjects().outbound(&inbound.channel),
            &reply,
            msg_id,
        )
        .await?;
    Ok(())
}

/// A message the scanner blocks: nothing of it goes on (no run, no transcript entry); the
/// sender is told why, and a `security` event reports it.
pub(crate) async fn block(
    ctx: &Ctx,
    session_id: &str,
    run_id: &str,
    inbound: InboundMessage,
    scan: &Scan,
) -> Result<(), RouteFailure> {
    let top = scan.top();
    tracing::warn!(
        session_key = %inbound.session_key,
        channel = %inbound.channel,
        level = %scan.level,
        family = top.map_or("", |h| h.family.as_str()),
        rule = top.map_or("", |h| h.rule.as_str()),
        "inbound message blocked by the injection scanner"
    );
    let event = security_event(
        session_id,
        &inbound.session_key,
        run_id,
        EventPhase::Blocked,
        scan,
    );
    audit(ctx, scan_record(scan, "blocked", session_id, run_id)).await?;
    // The refusal is stored before the event, so a client that ends on the event finds it.
    let text = agentloop_scanner::refusal(scan);
    reply_directly(
        ctx,
        session_id,
        run_id,
        inbound,
        text,
        Some(&format!("blocked-{run_id}")),
    )
    .await?;
    ctx.bus.emit_event(&event).await;
    Ok(())
}
