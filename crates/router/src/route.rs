//! The consume loop: decode and validate on the dispatcher, then route messages of different
//! sessions at once and those of one session one after another, so they are never routed out of
//! order.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use agentloop_bus::{Bus, DeadLetters, InOrder, StreamKind, error_chain};
use agentloop_lifecycle::{Backoff, Counter, Health, retry};
use agentloop_proto::v1::{
    ControlMessage, InboundMessage, InboxEvent, OutboundMessage, ResolveSessionRequest, RunCommand,
    Session, session_service_client::SessionServiceClient,
};
use agentloop_proto::{EventPhase, InboxDirection};
use agentloop_scanner::{Decision, Scan, Scanner};

use crate::screen::{mark, security_event};
use agentloop_telemetry::TracedChannel;

use crate::{RouterConfig, RouterError};

const SERVICE: &str = "router";
/// Publishing a message's run command again after a failure (memory or a stream leader away):
/// eight retries from 100 ms, doubling up to 2 s.
const PUBLISH_RUN: Backoff = Backoff::new(100, 2_000, 8);

struct Routed {
    msg: jetstream::Message,
    inbound: InboundMessage,
    span: tracing::Span,
}

struct Ctx {
    bus: Bus,
    sessions: SessionServiceClient<TracedChannel>,
    config: RouterConfig,
    routed: Counter,
    retried: Counter,
    dead_letters: DeadLetters,
    /// Acks of routed messages, sent in batches.
    acks: agentloop_bus::Acks,
    /// Sessions resolved lately.
    cache: Mutex<std::collections::HashMap<String, (std::time::Instant, Session)>>,
    /// The injection scanner (`None`: `scanner.enabled = false`).
    scanner: Option<Scanner>,
}

/// Most sessions the cache remembers; past it the cache starts over.
const CACHE_CAPACITY: usize = 10_000;

pub(crate) async fn serve(
    config: RouterConfig,
    health: Health,
    shutdown: CancellationToken,
) -> Result<(), RouterError> {
    let ready = health.component(SERVICE);
    let Some(bus) = agentloop_bus::Bus::connect_retrying(&config.bus, SERVICE, &shutdown).await?
    else {
        return Ok(());
    };
    let channel = config.memory.channel()?;
    let scanner = config.scanner.build()?;
    let mut messages = bus
        .deliveries(StreamKind::Inbound, &config.router.consumer)
        .await?;
    // Ready means work arrives: not while the consumer's pull is down (a leader election).
    let consumer_ready = health.component(&format!("{SERVICE} consumer"));
    messages.report_flow(move |flowing| consumer_ready.set(flowing));
    let (acks, acks_sent) = agentloop_bus::Acks::start(config.bus.ack_gather());
    let dead_letters = DeadLetters::new(bus.clone(), SERVICE, &health);
    let ctx = Arc::new(Ctx {
        bus: bus.clone(),
        dead_letters: dead_letters.clone(),
        acks,
        sessions: SessionServiceClient::new(channel),
        routed: health.counter("agentloop_router_routed_total", "Run commands published."),
        cache: Mutex::default(),
        retried: health.counter(
            "agentloop_router_retries_total",
            "Inbound messages handed back for redelivery after a transient failure.",
        ),
        config: config.clone(),
        scanner,
    });
    // Bounded: past `concurrency` sessions in flight the dispatcher waits, and the messages
    // queued behind a session's own are held by the consumer's `max_ack_pending`, so a slow
    // memory service pushes back instead of growing memory.
    let route_ctx = ctx.clone();
    let mut routing = InOrder::new(config.router.concurrency, move |routed: Routed| {
        let ctx = route_ctx.clone();
        async move {
            let span = routed.span.clone();
            route_one(&ctx, routed).instrument(span).await;
        }
    });
    ready.set(true);
    tracing::info!(prefix = %config.bus.prefix, "router consuming inbound messages");
    loop {
        let msg = tokio::select! {
            () = shutdown.cancelled() => break,
            msg = messages.next() => msg,
        };
        let span = tracing::info_span!("route", subject = %msg.subject, session_key = tracing::field::Empty);
        agentloop_telemetry::set_parent_from_nats(&span, msg.headers.as_ref());
        let inbound = match decode_and_validate(&bus, &msg) {
            Ok(inbound) => inbound,
            Err(reason) => {
                dead_letters.reject(&msg, &reason).instrument(span).await;
                continue;
            }
        };
        span.record("session_key", inbound.session_key.as_str());
        let session_key = inbound.session_key.clone();
        // Waiting for a free slot must not hold up a stop: a message dropped here is not
        // acknowledged, so JetStream hands it to a replica again.
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = routing.push(&session_key, Routed { msg, inbound, span }) => {}
        }
    }
    ready.set(false);
    routing.finish().await;
    // The routing tasks' clones went with them; this one goes now, and the routed messages'
    // acks are sent before the router stops.
    drop(ctx);
    let _ = acks_sent.await;
    Ok(())
}

fn decode_and_validate(bus: &Bus, msg: &jetstream::Message) -> Result<InboundMessage, String> {
    let (mut inbound, encoding) =
        agentloop_bus::decode::<InboundMessage>(msg).map_err(|e| error_chain(&e))?;
    let channel = bus.subjects().channel_of(&msg.subject).to_owned();
    agentloop_proto::validate_inbound(&mut inbound, &channel).map_err(|e| e.to_string())?;
    // Stripped, not refused: the message itself is fine and is answered on its channel; only
    // the forged destination goes (an inbound subject there would loop the answer back in).
    if !inbound.reply_subject.is_empty()
        && !bus.config().allows_reply_subject(&inbound.reply_subject)
    {
        tracing::warn!(
            reply_subject = %inbound.reply_subject,
            "ignoring a replySubject outside <prefix>.reply.> and _INBOX.>"
        );
        inbound.reply_subject.clear();
    }
    if inbound.reply_encoding.is_empty() {
        inbound.reply_encoding = encoding.name().to_owned();
    }
    Ok(inbound)
}

async fn route_one(ctx: &Ctx, routed: Routed) {
    let Routed { msg, inbound, .. } = routed;
    // Retried here rather than handed back: a message handed back would lose its place behind
    // the next messages of its session, which must stay in order.
    let published = retry(
        "route",
        PUBLISH_RUN,
        |_| true,
        || async {
            let published = publish_run(ctx, &msg, inbound.clone()).await;
            if published.is_err() {
                // The wait before the next try must not let the message's ack deadline pass.
                let _ = msg.ack_with(AckKind::Progress).await;
            }
            published
        },
    )
    .await;
    match published {
        Ok(()) => {
            ctx.routed.inc();
            // A redelivery after a crash before this ack is deduplicated by the RunCommand's
            // message id and by the inbox's idempotency key.
            ctx.acks.ack(msg);
        }
        Err(err) => {
            ctx.retried.inc();
            ctx.dead_letters.retry_later(&msg, &err).await;
        }
    }
}

async fn publish_run(
    ctx: &Ctx,
    msg: &jetstream::Message,
    inbound: InboundMessage,
) -> Result<(), String> {
    let session = resolve(ctx, &inbound).await?;
    // A message without a client key is keyed by its stream position, which a redelivery keeps.
    let idempotency_key = if inbound.idempotency_key.is_empty() {
        let seq = msg.info().map(|i| i.stream_sequence).unwrap_or(0);
        agentloop_proto::stream_idempotency_key(seq)
    } else {
        inbound.idempotency_key.clone()
    };
    if inbound.text.trim() == "/stop" {
        return stop(ctx, &session.id, inbound).await;
    }
    let agent_id = if inbound.agent_id.is_empty() {
        session.agent_id.as_str()
    } else {
        inbound.agent_id.as_str()
    };
    let run_id = agentloop_proto::run_id(&session.id, &idempotency_key);
    let flagged = match ctx.scanner.as_ref().map(|s| s.scan(&inbound.text)) {
        Some(scan) => match ctx.config.scanner.decide(agent_id, scan.level) {
            Decision::Block => return block(ctx, &session.id, &run_id, inbound, &scan).await,
            Decision::Wrap => Some(scan),
            Decision::Pass => None,
        },
        None => None,
    };
    let agent_model = ctx
        .config
        .agents
        .get(agent_id)
        .map(|agent| agent.model.clone())
        .unwrap_or_default();
    let model = resolve_model(&ctx.config, &session.model_override, &agent_model);
    let command = RunCommand {
        session_id: session.id.clone(),
        session_key: inbound.session_key,
        agent_id: if inbound.agent_id.is_empty() {
            session.agent_id
        } else {
            inbound.agent_id
        },
        channel: inbound.channel,
        sender_id: inbound.sender_id,
        text: inbound.text,
        idempotency_key: idempotency_key.clone(),
        queue_mode: if inbound.queue_mode.is_empty() {
            session.queue_mode
        } else {
            inbound.queue_mode
        },
        model,
        reply_subject: inbound.reply_subject,
        reply_encoding: inbound.reply_encoding,
        reply_early: inbound.reply_early,
        metadata: {
            // The run starts later, on whichever replica owns the session: the trace goes
            // along in the command itself.
            let mut metadata = inbound.metadata;
            agentloop_telemetry::inject_map(&mut metadata);
            if let Some(scan) = &flagged {
                mark(&mut metadata, scan);
            }
            metadata
        },
        received_at: inbound.received_at.or_else(|| Some(agentloop_proto::now())),
        message_id: agentloop_proto::run_command_msg_id(&session.id, &idempotency_key),
    };
    let msg_id = command.message_id.clone();
    ctx.bus
        .publish_durable(ctx.bus.subjects().run(&session.id), &command, Some(&msg_id))
        .await
        .map_err(|e| error_chain(&e))?;
    if let Some(scan) = &flagged {
        let event = security_event(
            &command.session_id,
            &command.session_key,
            &run_id,
            EventPhase::Flagged,
            scan,
        );
        ctx.bus.emit_event(&event).await;
    }
    ctx.bus
        .emit_inbox(&InboxEvent {
            direction: InboxDirection::In.as_str().to_owned(),
            channel: command.channel,
            session_key: command.session_key,
            session_id: command.session_id,
            peer: command.sender_id,
            text: command.text,
            run_id: String::new(),
            ts: command.received_at,
        })
        .await;
    Ok(())
}

/// Resolves the session, from the cache when it was resolved in the last
/// `session_cache_ttl_ms` (a session's id never changes; its overrides may lag that long).
async fn resolve(ctx: &Ctx, inbound: &InboundMessage) -> Result<Session, String> {
    let ttl = Duration::from_millis(ctx.config.router.session_cache_ttl_ms);
    let cache_key = format!("{}\u{0}{}", inbound.agent_id, inbound.session_key);
    if !ttl.is_zero()
        && let Some(session) = ctx
            .cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&cache_key)
            .filter(|(at, _)| at.elapsed() < ttl)
            .map(|(_, session)| session.clone())
    {
        return Ok(session);
    }
    let session = ctx
        .sessions
        .clone()
        .resolve_session(ResolveSessionRequest {
            session_key: inbound.session_key.clone(),
            agent_id: inbound.agent_id.clone(),
            channel: inbound.channel.clone(),
        })
        .await
        .map_err(|status| format!("memory: {}", status.message()))?
        .into_inner();
    if !ttl.is_zero() {
        let mut cache = ctx.cache.lock().unwrap_or_else(PoisonError::into_inner);
        if cache.len() >= CACHE_CAPACITY {
            cache.clear();
        }
        cache.insert(cache_key, (std::time::Instant::now(), session.clone()));
    }
    Ok(session)
}

/// `/stop`: aborts the session's live run (its owner answers it with "Stopped.") and confirms.
async fn stop(ctx: &Ctx, session_id: &str, inbound: InboundMessage) -> Result<(), String> {
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
        .await
        .map_err(|e| error_chain(&e))?;
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

/// The router's own answer to a message that starts no run (`/stop`, a blocked message),
/// sent on the message's channel (and reply subject) like any reply.
async fn reply_directly(
    ctx: &Ctx,
    session_id: &str,
    run_id: &str,
    inbound: InboundMessage,
    text: String,
    msg_id: Option<&str>,
) -> Result<(), String> {
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
        ts: Some(agentloop_proto::now()),
        ..Default::default()
    };
    ctx.bus
        .publish_durable(
            ctx.bus.subjects().outbound(&inbound.channel),
            &reply,
            msg_id,
        )
        .await
        .map_err(|e| error_chain(&e))
}

/// A message the scanner blocks: nothing of it goes on (no run, no transcript entry); the
/// sender is told why, and a `security` event reports it.
async fn block(
    ctx: &Ctx,
    session_id: &str,
    run_id: &str,
    inbound: InboundMessage,
    scan: &Scan,
) -> Result<(), String> {
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

/// Session override > agent config > global default, each only within the allowlist when one
/// is set.
fn resolve_model(config: &RouterConfig, session_override: &str, agent_model: &str) -> String {
    let allowed = |m: &str| {
        config.models.allowlist.is_empty() || config.models.allowlist.iter().any(|a| a == m)
    };
    for candidate in [session_override, agent_model] {
        if !candidate.is_empty() && allowed(candidate) {
            return candidate.to_owned();
        }
    }
    config.models.default_model.clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_override_wins_only_inside_the_allowlist() {
        let mut config = RouterConfig::default();
        config.models.default_model = "openai/a".into();
        assert_eq!(resolve_model(&config, "anthropic/b", ""), "anthropic/b");
        assert_eq!(resolve_model(&config, "", "openai/agent"), "openai/agent");
        assert_eq!(
            resolve_model(&config, "anthropic/b", "openai/agent"),
            "anthropic/b"
        );
        config.models.allowlist = vec!["openai/a".into()];
        assert_eq!(
            resolve_model(&config, "anthropic/b", "openai/x"),
            "openai/a"
        );
        assert_eq!(resolve_model(&config, "", ""), "openai/a");
    }
}
