//! Watching runs from the command line: `agentloop events SESSION` prints a session's events as
//! they happen, `agentloop replay RUN` prints a finished run's events from the EVENTS stream.
//! One readable line per event, or the event as JSON with `--json`.

use std::time::Duration;

use anyhow::{Context as _, bail};
use async_nats::jetstream::consumer::{DeliverPolicy, pull};
use futures::StreamExt as _;

use agentloop_bus::{Bus, StreamKind, stream_name};
use agentloop_proto::v1::session_service_client::SessionServiceClient;
use agentloop_proto::v1::{Caller, ListSessionsRequest, SystemEvent};
use agentloop_proto::{EventPhase, EventStream};

use crate::knowledge::{Args, config};

/// How long `replay` waits for one more event before it decides the run's events are all read.
const REPLAY_IDLE: Duration = Duration::from_secs(1);

/// One event as a person reads it: `seq stream/phase what`.
pub(crate) fn line(event: &SystemEvent) -> String {
    let run = event.run_id.get(..8).unwrap_or(&event.run_id);
    let what = if event.is(EventStream::Assistant, EventPhase::Delta) {
        format!("{:?}", event.delta)
    } else if event.stream == EventStream::Tool.as_str() {
        format!("{} {}", event.tool_name, event.data)
    } else {
        event.data.clone()
    };
    format!(
        "{:>4} run {run} {}/{} {what}",
        event.seq, event.stream, event.phase
    )
}

fn print(event: &SystemEvent, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(event)?);
    } else {
        println!("{}", line(event));
    }
    Ok(())
}

/// A session's id from its id or its key (looked up in memory, which creates nothing).
async fn session_id(session: &str) -> anyhow::Result<String> {
    if session.len() == 36 && session.chars().filter(|c| *c == '-').count() == 4 {
        return Ok(session.to_owned());
    }
    let mut memory = SessionServiceClient::new(config()?.memory.channel()?);
    let found = memory
        .list_sessions(ListSessionsRequest {
            limit: 1,
            session_key: session.to_owned(),
            caller: Some(Caller {
                principal: String::new(),
                admin: true,
            }),
            ..Default::default()
        })
        .await
        .map_err(|s| anyhow::anyhow!("memory: {}", s.message()))?
        .into_inner();
    match found.sessions.first() {
        Some(info) => Ok(info.id.clone()),
        None => bail!("no session with the key {session:?}"),
    }
}

/// `agentloop events SESSION [--json]`
pub(crate) async fn events(args: &[String]) -> anyhow::Result<()> {
    let args = Args::parse(args)?;
    let Some(session) = args.words.get(1) else {
        bail!("usage: agentloop events SESSION_ID_OR_KEY [--json]");
    };
    let id = session_id(session).await?;
    let bus = Bus::connect(&config()?.bus, "cli")
        .await
        .context("cannot reach NATS")?;
    // A consumer on the EVENTS stream, not a plain subscription: once it is created the server
    // keeps every later event for it, so nothing published after "watching" is missed, and a
    // reconnect resumes where it stopped.
    let filter = bus.subjects().session_events(&id);
    let mut events = read_events(&bus, filter, DeliverPolicy::New).await?;
    eprintln!("watching session {id} (Ctrl-C stops)");
    while let Some(msg) = events.next().await {
        let msg = match msg {
            Ok(msg) => msg,
            Err(err) => {
                eprintln!("reading the EVENTS stream: {err}");
                continue;
            }
        };
        match agentloop_bus::decode::<SystemEvent>(&msg) {
            Ok((event, _)) => print(&event, args.json)?,
            Err(err) => eprintln!("an event that does not decode: {err}"),
        }
    }
    Ok(())
}

/// The EVENTS stream's messages on `filter`, in order, from `from`.
async fn read_events(
    bus: &Bus,
    filter: String,
    from: DeliverPolicy,
) -> anyhow::Result<pull::Ordered> {
    let stream = bus
        .jetstream()
        .get_stream(stream_name(bus.subjects().prefix(), StreamKind::Events))
        .await
        .context("cannot open the EVENTS stream")?;
    let consumer = stream
        .create_consumer(pull::OrderedConfig {
            filter_subject: filter,
            deliver_policy: from,
            ..Default::default()
        })
        .await
        .context("cannot read the EVENTS stream")?;
    consumer
        .messages()
        .await
        .context("cannot read the EVENTS stream")
}

/// `agentloop replay RUN [--json]`
pub(crate) async fn replay(args: &[String]) -> anyhow::Result<()> {
    let args = Args::parse(args)?;
    let Some(run) = args.words.get(1) else {
        bail!("usage: agentloop replay RUN_ID [--json]");
    };
    let bus = Bus::connect(&config()?.bus, "cli")
        .await
        .context("cannot reach NATS")?;
    let filter = format!("{}.events.*.{run}", bus.subjects().prefix());
    let mut messages = read_events(&bus, filter, DeliverPolicy::All).await?;
    let mut count = 0;
    while let Ok(Some(msg)) = tokio::time::timeout(REPLAY_IDLE, messages.next()).await {
        let msg = msg.context("reading the EVENTS stream")?;
        if let Ok((event, _)) = agentloop_bus::decode::<SystemEvent>(&msg) {
            print(&event, args.json)?;
            count += 1;
        }
    }
    if count == 0 {
        bail!(
            "no events of run {run} in the EVENTS stream (gone past bus.events_max_age_secs, or never run)"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_reads_as_one_line_with_what_matters_for_its_stream() {
        let delta = SystemEvent {
            run_id: "0193abcd-ef".into(),
            seq: 3,
            stream: "assistant".into(),
            phase: "delta".into(),
            delta: "Hel".into(),
            ..Default::default()
        };
        assert_eq!(line(&delta), "   3 run 0193abcd assistant/delta \"Hel\"");
        let tool = SystemEvent {
            seq: 4,
            stream: "tool".into(),
            phase: "start".into(),
            tool_name: "search".into(),
            data: "{\"q\":1}".into(),
            ..Default::default()
        };
        assert_eq!(line(&tool), "   4 run  tool/start search {\"q\":1}");
    }
}
