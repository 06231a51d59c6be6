//! Sends a client's message into the system and follows its run: the one path behind WebSocket
//! `agent`/`chat.send` and `POST /v1/chat/completions`.
//!
//! A message becomes a dispatch record in memory keyed by (session key, idempotency key) before
//! it is published, so a repeated key on any replica (or after a restart) finds the record and
//! gets the first answer instead of starting a second run.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use futures::StreamExt as _;
use tokio::time::Instant;

use agentloop_bus::{Bus, Stored, error_chain};
use agentloop_proto::RunStatus;
use agentloop_proto::v1::{
    BeginDispatchRequest, Caller, CompleteDispatchRequest, Dispatch, GetDispatchRequest,
    InboundMessage, OutboundMessage, SystemEvent, session_service_client::SessionServiceClient,
};
use agentloop_telemetry::TracedChannel;

use crate::RequestError;
use crate::known::KnownSessions;

/// The memory client every gateway call shares (cheap to clone).
pub(crate) type Sessions = SessionServiceClient<TracedChannel>;

/// How often a caller that did not send the message itself looks at the record.
const POLL_INTERVAL: Duration = Duration::from_millis(200);
/// How long the lifecycle end may trail the final reply before the run is reported anyway.
const END_GRACE: Duration = Duration::from_secs(2);

/// A message to send.
#[derive(Debug, Clone, Default)]
pub(crate) struct Submission {
    pub(crate) session_key: String,
    pub(crate) text: String,
    /// Chosen by the gateway when the client gave none.
    pub(crate) idempotency_key: Option<String>,
    pub(crate) agent_id: String,
    pub(crate) channel: String,
    pub(crate) sender_id: String,
    pub(crate) queue_mode: String,
    pub(crate) metadata: HashMap<String, String>,
    pub(crate) timeout: Duration,
    /// Whom it is sent for: a new session belongs to it, another's session is not found.
    pub(crate) caller: Caller,
    /// When the message gets a dispatch record.
    pub(crate) record: Record,
}

/// When a message gets a dispatch record in memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Record {
    /// Always: the client may wait on the run handle it is given (`agent.wait`).
    #[default]
    Always,
    /// Only when the client gave an idempotency key, the one way it can come back to the
    /// message (the OpenAI API: its answer is the response; without a key there is nothing to
    /// repeat or wait on, so the record would be a Postgres write no one reads).
    WithKey,
}

impl Record {
    /// Whether a message whose client gave a key (`keyed`) gets a record.
    fn needed(self, keyed: bool) -> bool {
        match self {
            Self::Always => true,
            Self::WithKey => keyed,
        }
    }
}

/// How a followed run ended, from the client's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EndStatus {
    Ok,
    Error,
    Timeout,
}

impl EndStatus {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Error => "error",
            Self::Timeout => "timeout",
        }
    }
}

/// The end of a run as reported to the client.
#[derive(Debug, Clone)]
pub(crate) struct Finished {
    pub(crate) status: EndStatus,
    pub(crate) text: String,
    pub(crate) error: String,
    /// The run's id in the runs table, when known.
    pub(crate) agent_run_id: String,
}

/// A message that is in the system: what the client is told at once.
pub(crate) struct Accepted {
    pub(crate) run_handle: String,
    pub(crate) session_key: String,
    pub(crate) session_id: String,
    pub(crate) idempotency_key: String,
    /// True when the key was seen before: no new run was started.
    pub(crate) duplicate: bool,
    follow: Follow,
    sessions: Sessions,
    deadline: Instant,
    /// Whether memory holds a dispatch record of it (see [`Record`]).
    recorded: bool,
}

enum Follow {
    /// This call sent the message and listens for its reply, and for its events when the
    /// caller follows them.
    Sent {
        events: Option<async_nats::Subscriber>,
        replies: async_nats::Subscriber,
    },
    /// Another call sent it; its record is watched until the answer is stored.
    Repeat,
}

/// Resolves the session, records the dispatch and publishes the message (unless its key was
/// seen before). `with_events`: the caller follows the run's events, and is answered once the
/// run has ended; without them, as soon as the reply is there.
///
/// A session the caller is known to see (`known`) is published to while the dispatch is
/// recorded, so the record's round trip to Postgres is off the message's path; a session seen
/// for the first time is resolved and recorded first, since whether the caller may write to it
/// is only known then.
///
/// # Errors
/// [`RequestError::InvalidRequest`] for a message the contract refuses,
/// [`RequestError::NotFound`] for a session of another principal,
/// [`RequestError::Unavailable`] when memory or the bus cannot be reached.
pub(crate) async fn submit(
    bus: &Bus,
    sessions: &Sessions,
    known: &KnownSessions,
    submission: Submission,
    ttl: Duration,
    with_events: bool,
) -> Result<Accepted, RequestError> {
    let deadline = Instant::now() + submission.timeout;
    let given_key = submission.idempotency_key.clone().filter(|k| !k.is_empty());
    let keyed = given_key.is_some();
    let idempotency_key = given_key.unwrap_or_else(agentloop_bus::nuid);
    let mut inbound = InboundMessage {
        session_key: submission.session_key,
        channel: submission.channel,
        sender_id: submission.sender_id,
        text: submission.text,
        idempotency_key: idempotency_key.clone(),
        queue_mode: submission.queue_mode,
        agent_id: submission.agent_id,
        metadata: submission.metadata,
        received_at: Some(agentloop_proto::now()),
        ..Default::default()
    };
    agentloop_proto::validate_inbound(&mut inbound, "webchat")
        .map_err(|err| RequestError::InvalidRequest(err.to_string()))?;
    let caller = submission.caller;
    let principal = Some(caller.principal.as_str()).filter(|p| !p.is_empty());
    if !crate::main_key::may_send_to(&inbound.session_key, principal, caller.admin) {
        // The answer for another principal's session, so main keys cannot be probed either.
        return Err(RequestError::NotFound(format!(
            "no session {:?}",
            inbound.session_key
        )));
    }
    let mut request = BeginDispatchRequest {
        session_key: inbound.session_key.clone(),
        idempotency_key: idempotency_key.clone(),
        run_handle: uuid::Uuid::now_v7().to_string(),
        ttl_ms: u32::try_from(ttl.as_millis()).unwrap_or(u32::MAX),
        agent_id: inbound.agent_id.clone(),
        channel: inbound.channel.clone(),
        caller: Some(caller.clone()),
        ..Default::default()
    };
    let msg_id = agentloop_proto::inbound_msg_id(&inbound.session_key, &idempotency_key);
    let inbound_subject = bus.subjects().inbound(&inbound.channel);
    let accepted = |record: Dispatch, inbound: InboundMessage, follow: Follow| Accepted {
        duplicate: matches!(follow, Follow::Repeat),
        run_handle: record.run_handle,
        session_key: inbound.session_key,
        session_id: record.session_id,
        idempotency_key: idempotency_key.clone(),
        follow,
        sessions: sessions.clone(),
        deadline,
        recorded: true,
    };

    if let Some(session_id) = known.get(&inbound.session_key, &caller) {
        let (events, replies) = listen(bus, &session_id, with_events, &mut inbound).await?;
        if !submission.record.needed(keyed) {
            // The key is this call's own: no other call can send it again.
            publish(bus, inbound_subject, &inbound, &msg_id).await?;
            let record = Dispatch {
                run_handle: request.run_handle,
                session_id,
                created: true,
                ..Default::default()
            };
            return Ok(Accepted {
                recorded: false,
                ..accepted(record, inbound, Follow::Sent { events, replies })
            });
        }
        request.session_id.clone_from(&session_id);
        let ours = request.run_handle.clone();
        let (record, stored) = tokio::join!(
            begin(sessions, request),
            bus.publish_durable_checked(inbound_subject, &inbound, &msg_id)
        );
        let stored = stored.map_err(|err| RequestError::Unavailable(error_chain(&err)))?;
        let record = match record {
            Ok(record) => record,
            // The message is in the stream and this call listens for its reply: the client
            // gets its answer, only a repeat of its key will not find it stored.
            Err(err) if stored == Stored::New => {
                tracing::warn!(error = %err, "the dispatch was not recorded; following the run without a record");
                Dispatch {
                    run_handle: ours,
                    session_id,
                    created: true,
                    ..Default::default()
                }
            }
            Err(err) => return Err(err),
        };
        // Another call may have sent the same key first, and only the stored copy carries a
        // reply subject: this call follows the run only when both its record and its message
        // are the first, and otherwise watches the record like any repeat.
        let follow = if record.created && stored == Stored::New {
            Follow::Sent { events, replies }
        } else {
            stop_listening(events, replies).await;
            Follow::Repeat
        };
        return Ok(accepted(record, inbound, follow));
    }

    let record = begin(sessions, request).await?;
    known.remember(&inbound.session_key, &caller, &record.session_id);
    let follow = if record.created {
        let (events, replies) = listen(bus, &record.session_id, with_events, &mut inbound).await?;
        publish(bus, inbound_subject, &inbound, &msg_id).await?;
        Follow::Sent { events, replies }
    } else {
        if record.run_id.is_empty() && record.status == "accepted" {
            // The first caller may have died between recording and publishing; sending again
            // is harmless because the stream and the session inbox both drop the duplicate.
            publish(bus, inbound_subject, &inbound, &msg_id).await?;
        }
        Follow::Repeat
    };
    Ok(accepted(record, inbound, follow))
}

/// Publishes the message on its inbound subject under `msg_id`, once the stream has stored it.
async fn publish(
    bus: &Bus,
    subject: String,
    inbound: &InboundMessage,
    msg_id: &str,
) -> Result<(), RequestError> {
    bus.publish_durable(subject, inbound, Some(msg_id))
        .await
        .map_err(|err| RequestError::Unavailable(error_chain(&err)))
}

/// Records the dispatch (resolving the session when the request names none).
async fn begin(
    sessions: &Sessions,
    request: BeginDispatchRequest,
) -> Result<Dispatch, RequestError> {
    let session_key = request.session_key.clone();
    sessions
        .clone()
        .begin_dispatch(request)
        .await
        .map(tonic::Response::into_inner)
        .map_err(|status| match RequestError::from(status) {
            RequestError::NotFound(_) => {
                RequestError::NotFound(format!("no session {session_key:?}"))
            }
            other => other,
        })
}

/// Subscribes to the reply of `inbound` (setting its reply subject) and, with `with_events`,
/// to its session's events: before publishing, so neither a fast event nor a fast reply slips
/// past.
async fn listen(
    bus: &Bus,
    session_id: &str,
    with_events: bool,
    inbound: &mut InboundMessage,
) -> Result<(Option<async_nats::Subscriber>, async_nats::Subscriber), RequestError> {
    let events = if with_events {
        Some(subscribe(bus, bus.subjects().session_events(session_id)).await?)
    } else {
        None
    };
    let reply_subject = bus.subjects().reply(&agentloop_bus::nuid());
    let replies = subscribe(bus, reply_subject.clone()).await?;
    inbound.reply_subject = reply_subject;
    inbound.reply_encoding = agentloop_proto::Encoding::Proto.name().to_owned();
    // The first answer is taken and the subscription dropped: an early one from the runner
    // saves the outbound stream's hop, delivery's later copy goes nowhere.
    inbound.reply_early = true;
    Ok((events, replies))
}

async fn stop_listening(
    events: Option<async_nats::Subscriber>,
    mut replies: async_nats::Subscriber,
) {
    if let Some(mut events) = events {
        let _ = events.unsubscribe().await;
    }
    let _ = replies.unsubscribe().await;
}

async fn subscribe(bus: &Bus, subject: String) -> Result<async_nats::Subscriber, RequestError> {
    bus.client()
        .subscribe(subject)
        .await
        .map_err(|err| RequestError::Unavailable(format!("cannot subscribe: {err}")))
}

impl Accepted {
    /// Follows the run to its end, handing each of its events to `on_event`, and stores the
    /// answer as the one every repeat of the key gets.
    pub(crate) async fn finish<F, Fut>(self, on_event: F) -> Finished
    where
        F: FnMut(SystemEvent) -> Fut,
        Fut: Future<Output = ()>,
    {
        let Self {
            run_handle,
            session_id,
            idempotency_key,
            follow,
            sessions,
            deadline,
            recorded,
            ..
        } = self;
        match follow {
            Follow::Sent { events, replies } => {
                // The id of the run that processes this message derives from the message.
                let ours = agentloop_proto::run_id(&session_id, &idempotency_key);
                let (finished, kept_by_run) =
                    follow_sent(events, replies, &ours, deadline, on_event).await;
                // An answer the run records as its own is not stored a second time: a repeat
                // reads it from the run (one memory call and one Postgres write less per
                // message). Any other answer is stored before the caller gets it, so the
                // caller's own repeat finds it rather than the run's text.
                if recorded && finished.status != EndStatus::Timeout && !kept_by_run {
                    let request = CompleteDispatchRequest {
                        run_handle,
                        status: finished.status.as_str().to_owned(),
                        text: finished.text.clone(),
                        error: finished.error.clone(),
                    };
                    if let Err(status) = sessions.clone().complete_dispatch(request).await {
                        tracing::warn!(error = %status.message(), "failed to store the answer of a dispatch");
                    }
                }
                finished
            }
            Follow::Repeat => wait_for_record(&sessions, &run_handle, deadline).await,
        }
    }
}

/// Follows the run `ours` (the one that processes the message) to its reply and, with events
/// followed, to its end. Events of other runs of the session are left out. Also returns whether
/// the answer is the one run `ours` records ([`agentloop_proto::answer_is_the_runs`]).
async fn follow_sent<F, Fut>(
    mut events: Option<async_nats::Subscriber>,
    mut replies: async_nats::Subscriber,
    ours: &str,
    deadline: Instant,
    mut on_event: F,
) -> (Finished, bool)
where
    F: FnMut(SystemEvent) -> Fut,
    Fut: Future<Output = ()>,
{
    // Whether our run has shown up (an event, or a reply that names it).
    let mut seen = false;
    let mut reply: Option<OutboundMessage> = None;
    let mut ended = false;
    let mut stop_at = deadline;
    loop {
        // With events followed, the reply is held until the run's end event, so every event
        // reaches the caller before the answer. A reply from another run (the message joined
        // a run already going) has no end event of ours to wait for.
        if reply.is_some() && (ended || !seen || events.is_none()) {
            break;
        }
        tokio::select! {
            () = tokio::time::sleep_until(stop_at) => break,
            next = next_event(events.as_mut()) => {
                let Some(msg) = next else { break };
                let Ok((event, _)) = agentloop_bus::decode::<SystemEvent>(&msg) else { continue };
                if event.run_id != ours {
                    continue;
                }
                seen = true;
                ended = event.ends_run();
                on_event(event).await;
            }
            next = replies.next() => {
                let Some(msg) = next else { break };
                match agentloop_bus::decode::<OutboundMessage>(&msg) {
                    Ok((outbound, _)) => {
                        seen |= outbound.run_id == ours;
                        reply = Some(outbound);
                        stop_at = stop_at.min(Instant::now() + END_GRACE);
                    }
                    Err(err) => tracing::warn!(error = %error_chain(&err), "undecodable reply"),
                }
            }
        }
    }
    stop_listening(events, replies).await;
    let kept_by_run = reply
        .as_ref()
        .is_some_and(|outbound| agentloop_proto::answer_is_the_runs(outbound, ours));
    let finished = match reply {
        Some(outbound) => Finished {
            status: if outbound.error.is_empty() {
                EndStatus::Ok
            } else {
                EndStatus::Error
            },
            text: outbound.text,
            error: outbound.error,
            agent_run_id: outbound.run_id,
        },
        None => Finished {
            status: EndStatus::Timeout,
            text: String::new(),
            error: "the run did not end in time".to_owned(),
            agent_run_id: if seen { ours.to_owned() } else { String::new() },
        },
    };
    (finished, kept_by_run)
}

/// The next event, or never when the caller does not follow events.
async fn next_event(events: Option<&mut async_nats::Subscriber>) -> Option<async_nats::Message> {
    match events {
        Some(events) => events.next().await,
        None => std::future::pending().await,
    }
}

/// Watches a dispatch record (by run handle or run id) until it has an answer or `deadline`.
///
/// # Errors
/// [`RequestError::NotFound`] when there is no live record under `run_id` of a session
/// `caller` sees.
pub(crate) async fn wait(
    sessions: &Sessions,
    caller: Caller,
    run_id: &str,
    deadline: Instant,
) -> Result<Finished, RequestError> {
    let record = sessions
        .clone()
        .get_dispatch(GetDispatchRequest {
            run_id: run_id.to_owned(),
            caller: Some(caller),
            ..Default::default()
        })
        .await?
        .into_inner();
    if record.run_handle.is_empty() {
        return Err(RequestError::NotFound(format!("no run {run_id}")));
    }
    Ok(wait_for_record(sessions, &record.run_handle, deadline).await)
}

async fn wait_for_record(sessions: &Sessions, run_handle: &str, deadline: Instant) -> Finished {
    let mut run_ended_at: Option<Instant> = None;
    let mut last: Option<Dispatch> = None;
    loop {
        let fetched = sessions
            .clone()
            .get_dispatch(GetDispatchRequest {
                run_id: run_handle.to_owned(),
                // The caller was checked when it was given this handle (submit or `wait`).
                caller: Some(Caller {
                    admin: true,
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await;
        if let Ok(record) = fetched.map(tonic::Response::into_inner)
            && !record.run_handle.is_empty()
        {
            if let Some(finished) = stored_answer(&record) {
                return finished;
            }
            match record.run_status.parse::<RunStatus>() {
                // A completed run's own answer is not stored apart (see `finish`); one a hook
                // changed is stored before its first caller is answered.
                Ok(RunStatus::Completed) => return answer_from_run(&record),
                Ok(_) => {
                    // The run failed and no gateway stored its reply yet; give the one that
                    // follows it a moment, then answer from the run itself.
                    let since = *run_ended_at.get_or_insert_with(Instant::now);
                    if since.elapsed() >= END_GRACE {
                        return answer_from_run(&record);
                    }
                }
                Err(_) => {}
            }
            last = Some(record);
        }
        if Instant::now() + POLL_INTERVAL > deadline {
            return Finished {
                status: EndStatus::Timeout,
                text: String::new(),
                error: "the run did not end in time".to_owned(),
                agent_run_id: last.map(|r| r.run_id).unwrap_or_default(),
            };
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

fn stored_answer(record: &Dispatch) -> Option<Finished> {
    let status = match record.status.as_str() {
        "ok" => EndStatus::Ok,
        "error" => EndStatus::Error,
        _ => return None,
    };
    Some(Finished {
        status,
        text: record.text.clone(),
        error: record.error.clone(),
        agent_run_id: record.run_id.clone(),
    })
}

fn answer_from_run(record: &Dispatch) -> Finished {
    let ok = record.run_status.parse() == Ok(RunStatus::Completed);
    Finished {
        status: if ok { EndStatus::Ok } else { EndStatus::Error },
        text: if ok {
            agentloop_proto::answer_from_run_text(&record.run_answer)
        } else {
            record.run_answer.clone()
        },
        error: if ok {
            String::new()
        } else {
            format!("{}: {}", record.run_status, record.run_error)
        },
        agent_run_id: record.run_id.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(status: &str, run_status: &str) -> Dispatch {
        Dispatch {
            run_handle: "h".into(),
            status: status.into(),
            text: "stored".into(),
            run_id: "r".into(),
            run_status: run_status.into(),
            run_error: "boom".into(),
            run_answer: "from run".into(),
            ..Default::default()
        }
    }

    #[test]
    fn only_a_keyed_message_of_the_openai_api_gets_a_record() {
        assert!(Record::Always.needed(false));
        assert!(Record::Always.needed(true));
        assert!(Record::WithKey.needed(true));
        assert!(!Record::WithKey.needed(false));
    }

    #[test]
    fn a_stored_answer_wins_over_the_run_state() {
        let finished = stored_answer(&record("ok", "completed")).unwrap();
        assert_eq!(finished.status, EndStatus::Ok);
        assert_eq!(finished.text, "stored");
        assert!(stored_answer(&record("accepted", "completed")).is_none());
    }

    #[test]
    fn a_failed_run_without_stored_answer_reports_its_status_and_error() {
        let finished = answer_from_run(&record("accepted", "timeout"));
        assert_eq!(finished.status, EndStatus::Error);
        assert_eq!(finished.error, "timeout: boom");
        let finished = answer_from_run(&record("accepted", "completed"));
        assert_eq!(finished.status, EndStatus::Ok);
        assert_eq!(finished.text, "from run");
    }
}
