//! `<prefix>.ask`: request/reply over core NATS in a queue group shared by gateway replicas.

use std::time::Duration;

use futures::StreamExt as _;
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::Instrument as _;

use agentloop_bus::{Bus, error_chain};
use agentloop_lifecycle::Health;
use agentloop_proto::{
    Encoding,
    v1::{InboundMessage, OutboundMessage},
};

use crate::{GatewayConfig, GatewayError, SERVICE};

pub(crate) async fn serve(
    bus: Bus,
    config: GatewayConfig,
    health: Health,
    shutdown: CancellationToken,
) -> Result<(), GatewayError> {
    let ready = health.component(SERVICE);
    let subject = bus.subjects().ask();
    let mut requests = bus
        .client()
        .queue_subscribe(subject.clone(), config.gateway.ask_queue_group.clone())
        .await
        .map_err(|source| GatewayError::Subscribe {
            subject: subject.clone(),
            source,
        })?;
    let asked = health.counter("agentloop_gateway_ask_total", "agentloop.ask requests.");
    let timeout = Duration::from_millis(config.gateway.ask_timeout_ms);
    let tracker = TaskTracker::new();
    ready.set(true);
    tracing::info!(%subject, "gateway answering ask requests");
    loop {
        let request = tokio::select! {
            () = shutdown.cancelled() => break,
            next = requests.next() => match next {
                Some(request) => request,
                None => break,
            },
        };
        asked.inc();
        let bus = bus.clone();
        tracker.spawn(async move {
            let span = tracing::info_span!("ask", session_key = tracing::field::Empty);
            agentloop_telemetry::set_parent_from_nats(&span, request.headers.as_ref());
            answer(&bus, request, timeout).instrument(span).await;
        });
    }
    ready.set(false);
    let _ = requests.unsubscribe().await;
    tracker.close();
    tracker.wait().await;
    Ok(())
}

async fn answer(bus: &Bus, request: async_nats::Message, timeout: Duration) {
    let Some(reply_to) = request.reply.clone() else {
        tracing::warn!("ask request without a reply subject, nothing to answer");
        return;
    };
    let encoding = agentloop_proto::Encoding::detect(
        request
            .headers
            .as_ref()
            .and_then(|h| h.get("Content-Type"))
            .map(|v| v.as_str()),
        &request.payload,
    );
    let outbound = match ask(bus, &request, encoding, timeout).await {
        Ok(outbound) => outbound,
        Err(error) => OutboundMessage {
            text: format!("error: {error}"),
            error,
            r#final: true,
            ts: Some(agentloop_proto::now()),
            ..Default::default()
        },
    };
    if let Err(err) = bus
        .publish_fast(reply_to.to_string(), &outbound, encoding)
        .await
    {
        tracing::warn!(error = %error_chain(&err), "failed to answer ask request");
    }
}

async fn ask(
    bus: &Bus,
    request: &async_nats::Message,
    encoding: Encoding,
    timeout: Duration,
) -> Result<OutboundMessage, String> {
    let decoded = agentloop_bus::decode::<InboundMessage>(request);
    let mut inbound = match decoded {
        Ok((inbound, _)) => inbound,
        Err(err) => {
            let reason = error_chain(&err);
            keep_bad_request(bus, request, &reason).await;
            return Err(reason);
        }
    };
    if let Err(err) = agentloop_proto::validate_inbound(&mut inbound, "ask") {
        let reason = err.to_string();
        keep_bad_request(bus, request, &reason).await;
        return Err(reason);
    }
    tracing::Span::current().record("session_key", inbound.session_key.as_str());
    let reply_subject = bus.subjects().reply(&agentloop_bus::nuid());
    // Subscribe before publishing so a fast reply cannot slip past.
    let mut replies = bus
        .client()
        .subscribe(reply_subject.clone())
        .await
        .map_err(|e| format!("cannot subscribe for the reply: {e}"))?;
    inbound.reply_subject = reply_subject;
    inbound.reply_encoding = encoding.name().to_owned();
    // Only the first answer is read (an early one from the runner, else delivery's).
    inbound.reply_early = true;
    if inbound.received_at.is_none() {
        inbound.received_at = Some(agentloop_proto::now());
    }
    let msg_id = (!inbound.idempotency_key.is_empty())
        .then(|| agentloop_proto::inbound_msg_id(&inbound.session_key, &inbound.idempotency_key));
    bus.publish_durable(
        bus.subjects().inbound(&inbound.channel),
        &inbound,
        msg_id.as_deref(),
    )
    .await
    .map_err(|e| error_chain(&e))?;
    let reply = tokio::time::timeout(timeout, replies.next())
        .await
        .map_err(|_| format!("no reply within {} ms", timeout.as_millis()))?
        .ok_or_else(|| "reply subscription closed".to_owned())?;
    let (outbound, _) =
        agentloop_bus::decode::<OutboundMessage>(&reply).map_err(|e| error_chain(&e))?;
    Ok(outbound)
}

async fn keep_bad_request(bus: &Bus, request: &async_nats::Message, reason: &str) {
    if let Err(err) = bus.dead_letter_message(SERVICE, request, reason).await {
        tracing::error!(error = %error_chain(&err), "failed to dead-letter a bad ask request");
    }
}
