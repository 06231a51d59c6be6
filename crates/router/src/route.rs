//! The consume loop: decode and validate on the dispatcher, then route messages of different
//! sessions at once and those of one session one after another, so they are never routed out of
//! order.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use agentloop_bus::{
    Arrival, Arrivals, Arrived, Bus, DeadLetters, DeadReason, InOrder, StreamKind, error_chain,
};
use agentloop_lifecycle::{Backoff, Health, retry};
use agentloop_proto::v1::{
    AuditRecord, InboundMessage, InboxEvent, ResolveSessionRequest, RunCommand, Session,
    session_service_client::SessionServiceClient,
};
use agentloop_proto::{AuditSource, EventPhase, InboxDirection, SenderAccess};
use agentloop_scanner::Decision;

use crate::ctx::Ctx;
use crate::direct;
use crate::error::RouteFailure;
use crate::pairing::{self, Gate};
use crate::screen::{mark, scan_record, security_event};

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
    let in_turn = Arc::new(crate::order::in_turn(&config, &bus, &health).await?);
    let ctx = Arc::new(Ctx {
        in_turn,
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
        paired: Mutex::default(),
        security: health.counter_family(
            "agentloop_security_decisions_total",
            "The guard's decisions (scanner, pairing), by source and decision.",
        ),
    });
    // Bounded: past `concurrency` sessions in flight the dispatcher waits, and the messages
    // queued behind a session's own are held by the consumer's `max_ack_pending`, so a slow
    // memory service pushes back instead of growing memory.
    let (route_ctx, route_stop) = (ctx.clone(), shutdown.clone());
    let mut routing = InOrder::new(config.router.concurrency, move |routed: Routed| {
        let (ctx, stop) = (route_ctx.clone(), route_stop.clone());
        async move {
            // An earlier message of the session handed back while this one queued behind it
            // comes again into this lane, behind this one: this one waits for it outside.
            if ctx
                .in_turn
                .still_first(&routed.msg, &routed.inbound.session_key)
            {
                let span = routed.span.clone();
                route_one(&ctx, routed).instrument(span).await;
            } else {
                let key = routed.inbound.session_key.clone();
                wait_then_route(ctx, routed, key, stop);
            }
        }
    });
    if config.router.depth_interval_ms > 0 {
        tokio::spawn(agentloop_bus::report_depths(
            bus.clone(),
            health.clone(),
            Duration::from_millis(config.router.depth_interval_ms),
            shutdown.clone(),
        ));
    }
    let received = health.counter_family(
        "agentloop_messages_in_total",
        "Inbound messages the router took in, by channel (unknown channel names as other).",
    );
    ready.set(true);
    tracing::info!(prefix = %config.bus.prefix, "router consuming inbound messages");
    let mut arrivals = Arrivals::new(ctx.in_turn.clone());
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            arrived = arrivals.next() => {
                let Arrived { msg, key, item: (inbound, span), arrival } = arrived;
                let routed = Routed { msg, inbound, span };
                match arrival {
                    // Waiting for a free slot must not hold up a stop: a message dropped here
                    // is not acknowledged, so JetStream hands it to a replica again.
                    Arrival::Lane => tokio::select! {
                        () = shutdown.cancelled() => break,
                        () = routing.push(&key, routed) => {}
                    },
                    // Out of the session's lane: the earlier message may come to this replica,
                    // queued in that lane behind this one.
                    Arrival::Wait => wait_then_route(ctx.clone(), routed, key, shutdown.clone()),
                    // The copy in hand is acked once routed; this one needs nothing.
                    Arrival::Duplicate => {
                        tracing::debug!(session_key = %key, "a second copy of a message being routed, left alone");
                    }
                }
            }
            msg = messages.next(), if arrivals.has_room() => {
                let span = tracing::info_span!("route", subject = %msg.subject, session_key = tracing::field::Empty);
                agentloop_telemetry::set_parent_from_nats(&span, msg.headers.as_ref());
                match decode_and_validate(&bus, &msg) {
                    Ok(inbound) => {
                        span.record("session_key", inbound.session_key.as_str());
                        let channel = bus.subjects().channel_of(&msg.subject);
                        received
                            .get_or_create(&vec![(
                                "channel",
                                agentloop_bus::channel_label(channel).to_owned(),
                            )])
                            .inc();
                        let key = inbound.session_key.clone();
                        arrivals.push(msg, key, (inbound, span));
                    }
                    Err(reason) => {
                        dead_letters
                            .reject(&msg, DeadReason::Invalid, &reason)
                            .instrument(span)
                            .await;
                    }
                }
            }
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

/// Routes `routed` once every earlier message of its session is routed, out of its lane.
fn wait_then_route(ctx: Arc<Ctx>, routed: Routed, key: String, stop: CancellationToken) {
    let span = routed.span.clone();
    tokio::spawn(
        async move {
            let started = std::time::Instant::now();
            if ctx.in_turn.wait_turn(&routed.msg, &key, &stop).await {
                tracing::info!(
                    waited_ms = started.elapsed().as_millis() as u64,
                    "inbound message waited for an earlier one of its session"
                );
                route_one(&ctx, routed).await;
            }
        }
        .instrument(span),
    );
}

async fn route_one(ctx: &Ctx, routed: Routed) {
    let Routed { msg, inbound, .. } = routed;
    // Retried here rather than handed back: a message handed back would lose its place behind
    // the next messages of its session, which must stay in order.
    let published = retry("route", PUBLISH_RUN, RouteFailure::passes, || async {
        let published = publish_run(ctx, &msg, inbound.clone()).await;
        if published.is_err() {
            // The wait before the next try must not let the message's ack deadline pass.
            let _ = msg.ack_with(AckKind::Progress).await;
        }
        published
    })
    .await;
    match published {
        Ok(()) => {
            ctx.routed.inc();
            ctx.in_turn.settled(&msg, &inbound.session_key);
            // A redelivery after a crash before this ack is deduplicated by the RunCommand's
            // message id and by the inbox's idempotency key.
            ctx.acks.ack(msg);
        }
        Err(RouteFailure::Transient(reason)) => {
            ctx.retried.inc();
            ctx.in_turn.handed_back(&msg, &inbound.session_key);
            ctx.dead_letters.retry_later(&msg, &reason).await;
        }
        Err(RouteFailure::Permanent(reason)) => {
            ctx.dead_letters
                .reject(&msg, DeadReason::Refused, &reason)
                .await;
            ctx.in_turn.settled(&msg, &inbound.session_key);
        }
    }
}

async fn publish_run(
    ctx: &Ctx,
    msg: &jetstream::Message,
    inbound: InboundMessage,
) -> Result<(), RouteFailure> {
    // A message without a client key is keyed by its stream position, which a redelivery keeps.
    let idempotency_key = if inbound.idempotency_key.is_empty() {
        let seq = msg.info().map(|i| i.stream_sequence).unwrap_or(0);
        agentloop_proto::stream_idempotency_key(seq)
    } else {
        inbound.idempotency_key.clone()
    };
    let Some(inbound) = admit(ctx, inbound, &idempotency_key).await? else {
        return Ok(());
    };
    let session = resolve(ctx, &inbound).await?;
    if inbound.text.trim() == "/stop" {
        return direct::stop(ctx, &session.id, inbound).await;
    }
    let agent_id = if inbound.agent_id.is_empty() {
        session.agent_id.as_str()
    } else {
        inbound.agent_id.as_str()
    };
    let run_id = agentloop_proto::run_id(&session.id, &idempotency_key);
    let flagged = match ctx.scanner.as_ref().map(|s| s.scan(&inbound.text)) {
        Some(scan) => match ctx.config.scanner.decide(agent_id, scan.level) {
            Decision::Block => {
                return direct::block(ctx, &session.id, &run_id, inbound, &scan).await;
            }
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
        .await?;
    if let Some(scan) = &flagged {
        direct::audit(
            ctx,
            scan_record(scan, "flagged", &command.session_id, &run_id),
        )
        .await?;
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

/// The direct-message gate (`dm_policy`): the message back when its sender may write, `None`
/// when it was answered with a pairing code or refused.
async fn admit(
    ctx: &Ctx,
    inbound: InboundMessage,
    idempotency_key: &str,
) -> Result<Option<InboundMessage>, RouteFailure> {
    let request = match pairing::gate(ctx.config.channels.access(&inbound.channel), &inbound) {
        Gate::Pass => return Ok(Some(inbound)),
        Gate::Refuse(reason) => {
            tracing::warn!(channel = %inbound.channel, sender = %inbound.sender_id, reason, "direct message refused");
            let record = AuditRecord {
                source: AuditSource::Pairing.as_str().to_owned(),
                decision: "refused".to_owned(),
                subject: format!("{}:{}", inbound.channel, inbound.sender_id),
                actor: "dm_policy".to_owned(),
                reason: reason.to_owned(),
                dedupe_key: format!("pairing:{}:{idempotency_key}", inbound.channel),
                ..Default::default()
            };
            direct::audit(ctx, record).await?;
            return Ok(None);
        }
        Gate::Ask(request) => request,
    };
    let ttl = Duration::from_millis(ctx.config.router.session_cache_ttl_ms);
    let key = format!("{}\u{0}{}", inbound.channel, inbound.sender_id);
    let known = |paired: &std::collections::HashMap<String, std::time::Instant>| {
        paired.get(&key).is_some_and(|at| at.elapsed() < ttl)
    };
    if known(&ctx.paired.lock().unwrap_or_else(PoisonError::into_inner)) {
        return Ok(Some(inbound));
    }
    let checked = ctx
        .sessions
        .clone()
        .check_sender(request)
        .await
        .map_err(|status| RouteFailure::memory("check sender", &status))?
        .into_inner();
    let outcome: SenderAccess = checked
        .outcome
        .parse()
        // A word this router does not know yet: a newer memory, which it will know once
        // upgraded too.
        .map_err(|e| RouteFailure::Transient(format!("memory (check sender): {e}")))?;
    if outcome != SenderAccess::Allowed {
        direct::count(ctx, AuditSource::Pairing.as_str(), outcome.as_str());
    }
    match pairing::answer(outcome, &checked.code) {
        None => {
            if !ttl.is_zero() {
                let mut paired = ctx.paired.lock().unwrap_or_else(PoisonError::into_inner);
                if paired.len() >= CACHE_CAPACITY {
                    paired.clear();
                }
                paired.insert(key, std::time::Instant::now());
            }
            Ok(Some(inbound))
        }
        Some(None) => {
            tracing::info!(channel = %inbound.channel, sender = %inbound.sender_id, %outcome, "direct message from an unpaired sender dropped");
            Ok(None)
        }
        Some(Some(text)) => {
            tracing::info!(channel = %inbound.channel, sender = %inbound.sender_id, code = %checked.code, created = checked.created, "unpaired sender answered with its pairing code");
            let msg_id = format!("pairing-{}-{idempotency_key}", inbound.channel);
            direct::reply_directly(ctx, "", "", inbound, text, Some(&msg_id)).await?;
            Ok(None)
        }
    }
}

/// Resolves the session, from the cache when it was resolved in the last
/// `session_cache_ttl_ms` (a session's id never changes; its overrides may lag that long).
async fn resolve(ctx: &Ctx, inbound: &InboundMessage) -> Result<Session, RouteFailure> {
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
        .map_err(|status| RouteFailure::memory("resolve session", &status))?
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
