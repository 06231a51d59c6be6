//! The consume loop and the channel adapters.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use agentloop_bus::{
    Arrival, Arrivals, Arrived, Bus, DeadLetters, DeadReason, InOrder, InTurn, StreamKind,
    error_chain,
};
use agentloop_lifecycle::{Backoff, Counter, CounterFamily, Health, retry};
use agentloop_proto::{
    Encoding, InboxDirection,
    v1::{InboxEvent, OutboundMessage},
};

use crate::apps::Apps;
use crate::failure::Failure;
use crate::recent::{Recent, delivery_key};
use crate::{DeliveryConfig, DeliveryError};

const SERVICE: &str = "delivery";

/// What became of one attempt to deliver a reply, as counted in
/// `agentloop_delivery_attempts_total{outcome}`.
#[derive(Debug, Clone, Copy)]
enum Attempt {
    /// Delivered (or rightly not sent: a silent reply).
    Delivered,
    /// Failed in a way that may pass (each such attempt counts, the last one too).
    Retried,
    /// Still failing after the in-place retries: handed back to the server for later.
    HandedBack,
    /// Failed for good: dead-lettered.
    Failed,
}

impl Attempt {
    fn as_str(self) -> &'static str {
        match self {
            Self::Delivered => "delivered",
            Self::Retried => "retried",
            Self::HandedBack => "handed_back",
            Self::Failed => "failed",
        }
    }
}

impl Ctx {
    fn count(&self, outbound: &OutboundMessage, attempt: Attempt) {
        self.attempts
            .get_or_create(&vec![
                (
                    "channel",
                    agentloop_bus::channel_label(&outbound.channel).to_owned(),
                ),
                ("outcome", attempt.as_str().to_owned()),
            ])
            .inc();
    }
}

/// Delivering again in place after a failure: from 100 ms, doubling up to 1 s, for as long as
/// `bus.publish_retry_ms` allows.
const DELIVER_AGAIN: Backoff = Backoff::new(100, 1_000, u32::MAX);

struct Ctx {
    bus: Bus,
    /// Chat apps replies are posted to.
    apps: Apps,
    /// Runs whose final reply this replica delivered lately: a reply redelivered because its
    /// ack was lost (a NATS restart between publish and ack) is acked, not delivered twice.
    recent: std::sync::Mutex<Recent>,
    /// Per channel: whether a stream captures its deliveries (checked at most every 30 s).
    captured: std::sync::Mutex<std::collections::HashMap<String, (std::time::Instant, bool)>>,
    delivered: Counter,
    suppressed: Counter,
    /// Delivery attempts by channel and [`Attempt`].
    attempts: CounterFamily,
    dead_letters: DeadLetters,
    /// Acks of handled messages, sent in batches.
    acks: agentloop_bus::Acks,
    /// How a failed delivery is retried before the message is handed back to the server.
    retry_in_place: Backoff,
    /// How often a reply still being delivered is reported in progress (`bus.ack_wait_ms` / 3).
    progress_every: Duration,
    /// A session's replies in their stream order, whichever connection or replica got each.
    in_turn: Arc<InTurn>,
}

pub(crate) async fn serve(
    config: DeliveryConfig,
    health: Health,
    shutdown: CancellationToken,
) -> Result<(), DeliveryError> {
    config.channels.validate().map_err(DeliveryError::Config)?;
    let apps = Apps::new(&config.channels).map_err(|err| DeliveryError::Config(err.to_string()))?;
    let ready = health.component(SERVICE);
    let Some(bus) = Bus::connect_retrying(&config.bus, SERVICE, &shutdown).await? else {
        return Ok(());
    };
    let mut messages = bus
        .deliveries(StreamKind::Outbound, &config.delivery.consumer)
        .await?;
    // Ready means work arrives: not while the consumer's pull is down (a leader election).
    let consumer_ready = health.component(&format!("{SERVICE} consumer"));
    messages.report_flow(move |flowing| consumer_ready.set(flowing));
    let (acks, acks_sent) = agentloop_bus::Acks::start(config.bus.ack_gather());
    let in_turn = Arc::new(in_turn(&config, &bus, &health).await?);
    let ctx = Arc::new(Ctx {
        in_turn,
        apps,
        dead_letters: DeadLetters::new(bus.clone(), SERVICE, &health),
        bus,
        acks,
        recent: std::sync::Mutex::new(Recent::default()),
        captured: std::sync::Mutex::new(std::collections::HashMap::new()),
        retry_in_place: DELIVER_AGAIN.within(Duration::from_millis(config.bus.publish_retry_ms)),
        progress_every: config.bus.progress_every(),
        delivered: health.counter("agentloop_delivery_delivered_total", "Replies delivered."),
        suppressed: health.counter(
            "agentloop_delivery_suppressed_total",
            "Replies suppressed because the model answered NO_REPLY.",
        ),
        attempts: health.counter_family(
            "agentloop_delivery_attempts_total",
            "Attempts to deliver a reply, by channel and outcome (delivered, retried, handed_back, failed).",
        ),
    });
    // A session's replies go out in the order the runner published them, also when one of them
    // must wait for a stream leader: later replies of the session wait behind it.
    let (handler_ctx, handler_stop) = (ctx.clone(), shutdown.clone());
    let mut in_order = InOrder::new(
        config.delivery.concurrency,
        move |(msg, outbound): (jetstream::Message, OutboundMessage)| {
            let (ctx, stop) = (handler_ctx.clone(), handler_stop.clone());
            async move {
                // An earlier reply of the session handed back while this one queued behind it
                // comes again into this lane, behind this one: this one waits for it outside.
                if ctx.in_turn.still_first(&msg, session_of(&outbound)) {
                    deliver_one(&ctx, msg, outbound).await;
                } else {
                    let key = session_of(&outbound).to_owned();
                    wait_then_deliver(ctx, msg, outbound, key, stop);
                }
            }
        },
    );
    ready.set(true);
    tracing::info!("delivery consuming outbound messages");
    let mut arrivals = Arrivals::new(ctx.in_turn.clone());
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            arrived = arrivals.next() => {
                let Arrived { msg, key, item: outbound, arrival } = arrived;
                match arrival {
                    // Waiting for a free slot must not hold up a stop: an unacknowledged
                    // message comes again.
                    Arrival::Lane => tokio::select! {
                        () = shutdown.cancelled() => break,
                        () = in_order.push(&key, (msg, outbound)) => {}
                    },
                    // Out of the session's lane: the earlier reply may come to this replica,
                    // queued in that lane behind this one.
                    Arrival::Wait => wait_then_deliver(ctx.clone(), msg, outbound, key, shutdown.clone()),
                    // The copy in hand is acked when delivered; this one needs nothing.
                    Arrival::Duplicate => {
                        tracing::debug!(session = %key, "a second copy of a reply being delivered, left alone");
                    }
                }
            }
            msg = messages.next(), if arrivals.has_room() => {
                match agentloop_bus::decode::<OutboundMessage>(&msg) {
                    Ok((outbound, _)) => {
                        let key = session_of(&outbound).to_owned();
                        arrivals.push(msg, key, outbound);
                    }
                    Err(err) => {
                        ctx.dead_letters
                            .reject(&msg, DeadReason::Invalid, &error_chain(&err))
                            .await;
                    }
                }
            }
        }
    }
    ready.set(false);
    in_order.finish().await;
    // The last handle to the acks: the delivered messages' acks are sent before delivery stops.
    drop(ctx);
    let _ = acks_sent.await;
    Ok(())
}

/// Delivers `msg` once every earlier reply of its session is delivered, out of its lane.
fn wait_then_deliver(
    ctx: Arc<Ctx>,
    msg: jetstream::Message,
    outbound: OutboundMessage,
    key: String,
    stop: CancellationToken,
) {
    tokio::spawn(async move {
        let started = std::time::Instant::now();
        if ctx.in_turn.wait_turn(&msg, &key, &stop).await {
            tracing::info!(
                session = %key,
                waited_ms = started.elapsed().as_millis() as u64,
                "reply waited for an earlier one of its session"
            );
            deliver_one(&ctx, msg, outbound).await;
        }
    });
}

async fn deliver_one(ctx: &Ctx, msg: jetstream::Message, outbound: OutboundMessage) {
    let span = tracing::info_span!("deliver", subject = %msg.subject, run_id = %outbound.run_id, session_key = %outbound.session_key);
    agentloop_telemetry::set_parent_from_nats(&span, msg.headers.as_ref());
    async {
        let key = delivery_key(&outbound);
        if let Some(key) = &key
            && ctx.recent.lock().is_ok_and(|recent| recent.contains(key))
        {
            tracing::info!("reply already delivered by this replica, redelivery absorbed");
            ctx.in_turn.settled(&msg, session_of(&outbound));
            ctx.acks.ack(msg);
            return;
        }
        // A chat app's `retry_after` or a slow post can outlast the ack wait: reported in
        // progress meanwhile, the reply is not handed to another replica and posted twice.
        let delivered =
            agentloop_bus::holding(&msg, ctx.progress_every, deliver_retrying(ctx, &outbound))
                .await;
        ctx.count(
            &outbound,
            match &delivered {
                Ok(()) => Attempt::Delivered,
                Err(Failure::Transient(_)) => Attempt::HandedBack,
                Err(Failure::Permanent(_)) => Attempt::Failed,
            },
        );
        match delivered {
            Ok(()) => {
                // Delivered means confirmed by the server (see `deliver`), so only now does the
                // reply count as delivered for absorbing a redelivery.
                if let Some(key) = key
                    && let Ok(mut recent) = ctx.recent.lock()
                {
                    recent.insert(key);
                }
                ctx.in_turn.settled(&msg, session_of(&outbound));
                ctx.acks.ack(msg);
                if outbound.r#final && !agentloop_proto::is_no_reply(&outbound.text) {
                    ctx.bus.emit_inbox(&inbox_event(outbound)).await;
                }
            }
            // Never acked when not delivered: the server hands it out again.
            Err(Failure::Transient(reason)) => {
                ctx.in_turn.handed_back(&msg, session_of(&outbound));
                ctx.dead_letters.retry_later(&msg, &reason).await;
            }
            Err(Failure::Permanent(reason)) => {
                ctx.dead_letters
                    .reject(&msg, DeadReason::Refused, &reason)
                    .await;
                ctx.in_turn.settled(&msg, session_of(&outbound));
            }
        }
    }
    .instrument(span)
    .await;
}

/// The session a reply's order is kept in (its lane key).
fn session_of(outbound: &OutboundMessage) -> &str {
    if outbound.session_id.is_empty() {
        &outbound.session_key
    } else {
        &outbound.session_id
    }
}

/// The order of `delivery.keep_order`, keyed by session.
async fn in_turn(
    config: &DeliveryConfig,
    bus: &Bus,
    health: &Health,
) -> Result<InTurn, DeliveryError> {
    let reads = health.counter(
        "agentloop_delivery_order_reads_total",
        "Reads of OUTBOUND for replies that went elsewhere (delivery.keep_order).",
    );
    let key_of = Box::new(|stored: &jetstream::message::StreamMessage| {
        let (outbound, _) = agentloop_bus::decode_stored::<OutboundMessage>(stored).ok()?;
        Some(session_of(&outbound).to_owned())
    });
    Ok(bus
        .in_turn(
            StreamKind::Outbound,
            ("delivery.keep_order", config.delivery.keep_order),
            reads,
            key_of,
        )
        .await?)
}

/// Delivers, trying again in place while the failure looks passing (a stream electing a
/// leader answers nothing for seconds), so the session's later replies keep waiting behind
/// this one instead of overtaking it.
async fn deliver_retrying(ctx: &Ctx, outbound: &OutboundMessage) -> Result<(), Failure> {
    retry("deliver", ctx.retry_in_place, Failure::passes, || async {
        let delivered = deliver(ctx, outbound).await;
        if let Err(failure) = &delivered
            && failure.passes()
        {
            ctx.count(outbound, Attempt::Retried);
        }
        delivered
    })
    .await
}

async fn deliver(ctx: &Ctx, outbound: &OutboundMessage) -> Result<(), Failure> {
    let silent = outbound.error.is_empty() && agentloop_proto::is_no_reply(&outbound.text);
    // Said already by the messaging tool, or stopped by a message_sending hook: the caller of
    // a request/reply still gets its answer, the channel gets nothing more.
    let handled = outbound.metadata.contains_key("deliveredByTool")
        || outbound.metadata.contains_key("suppressed");
    // A request/reply caller always gets an answer, even an empty one, so it never hangs.
    let reply_subject = &outbound.reply_subject;
    if !reply_subject.is_empty() && !ctx.bus.config().allows_reply_subject(reply_subject) {
        // A forged reply subject (an inbound or another user's) gets nothing: answering there
        // would feed the reply back in as input or hand it to someone else.
        tracing::warn!(reply_subject = %reply_subject, "reply subject is not a private reply subject, not answered on");
    } else if outbound.r#final && !reply_subject.is_empty() {
        let answer = agentloop_proto::caller_answer(outbound);
        let encoding = Encoding::from_name(&outbound.reply_encoding);
        ctx.bus
            .publish_fast(outbound.reply_subject.clone(), &answer, encoding)
            .await
            .map_err(|e| error_chain(&e))?;
    }
    if silent || handled {
        ctx.suppressed.inc();
        tracing::debug!(silent, handled, "nothing delivered to the channel");
        return Ok(());
    }
    if let Some(posted) = ctx.apps.deliver(outbound, &ctx.recent).await {
        posted?;
        ctx.delivered.inc();
        return Ok(());
    }
    // Every other channel (cli, nats, and a chat app not configured here) is published on the
    // bus, so nothing is lost.
    let subject = ctx
        .bus
        .subjects()
        .deliver(&outbound.channel, &outbound.session_id);
    // Confirmed by the server, so a reply lost with a dying connection is redelivered rather
    // than counted as delivered (and a stream capturing the channel has it stored).
    if captured(ctx, &outbound.channel).await? {
        // A stream keeps this channel's deliveries: stored means delivered, and a retry after
        // a lost confirmation carries the same id, so the stream keeps one copy.
        let msg_id = delivery_key(outbound);
        ctx.bus
            .publish_confirmed(subject, outbound, Encoding::Json, msg_id.as_deref())
            .await
            .map_err(|e| error_chain(&e))?;
    } else {
        // Plain subscribers: the server having it (a flush) is all that can be confirmed.
        ctx.bus
            .publish_fast(subject, outbound, Encoding::Json)
            .await
            .map_err(|e| error_chain(&e))?;
        ctx.bus
            .client()
            .flush()
            .await
            .map_err(|e| format!("flush after delivery failed: {e}"))?;
    }
    ctx.delivered.inc();
    Ok(())
}

/// Returns whether a JetStream stream captures the channel's delivery subjects, as the
/// streams' configuration says. A server that cannot answer is an error, never "no stream":
/// delivering as a plain message then would count a reply as delivered that no stream kept.
async fn captured(ctx: &Ctx, channel: &str) -> Result<bool, String> {
    const RECHECK: std::time::Duration = std::time::Duration::from_secs(30);
    if let Ok(cache) = ctx.captured.lock()
        && let Some((at, captured)) = cache.get(channel)
        && at.elapsed() < RECHECK
    {
        return Ok(*captured);
    }
    let probe = ctx.bus.subjects().deliver(channel, "probe");
    let captured = ctx
        .bus
        .capturing_stream(&probe)
        .await
        .map_err(|e| {
            format!(
                "cannot tell whether a stream keeps {channel} deliveries: {}",
                error_chain(&e)
            )
        })?
        .is_some();
    if let Ok(mut cache) = ctx.captured.lock() {
        cache.insert(channel.to_owned(), (std::time::Instant::now(), captured));
    }
    Ok(captured)
}

/// The inbox's view of a delivered reply.
fn inbox_event(outbound: OutboundMessage) -> InboxEvent {
    InboxEvent {
        direction: InboxDirection::Out.as_str().to_owned(),
        channel: outbound.channel,
        session_key: outbound.session_key,
        session_id: outbound.session_id,
        peer: outbound.recipient,
        text: outbound.text,
        run_id: outbound.run_id,
        ts: outbound.ts,
    }
}
