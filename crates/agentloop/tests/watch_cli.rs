//! `agentloop events` and `agentloop replay` against a real nats-server: a session's events
//! printed as they are published, and a finished run's events read back from the EVENTS stream.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, BufReader};

use agentloop_bus::{Bus, BusConfig};
use agentloop_proto::v1::SystemEvent;

const SESSION: &str = "0193a0b1-0000-7000-8000-000000000001";
const RUN: &str = "0193a0b1-0000-7000-8000-0000000000aa";

fn event(seq: u32, stream: &str, phase: &str, delta: &str, data: &str) -> SystemEvent {
    SystemEvent {
        run_id: RUN.to_owned(),
        session_id: SESSION.to_owned(),
        session_key: "watched".to_owned(),
        seq,
        stream: stream.to_owned(),
        phase: phase.to_owned(),
        delta: delta.to_owned(),
        data: data.to_owned(),
        ..Default::default()
    }
}

fn agentloop(url: &str, args: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentloop"));
    command
        .args(args)
        .env("NATS_URL", url)
        .env("AGENTLOOP_BUS__PREFIX", "watchcli")
        .env_remove("AGENTLOOP_CONFIG")
        .kill_on_drop(true);
    command
}

#[tokio::test]
async fn a_sessions_events_are_printed_live_and_a_runs_events_replayed_in_order() {
    // Arrange
    let nats = agentloop_testkit::NatsServer::start().expect("nats");
    let config = BusConfig {
        url: nats.url().to_owned(),
        prefix: "watchcli".to_owned(),
        ..Default::default()
    };
    let bus = Bus::connect(&config, "test").await.expect("bus");
    let mut watcher = agentloop(nats.url(), &["events", SESSION])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("agentloop events");
    let mut said = BufReader::new(watcher.stderr.take().expect("stderr")).lines();
    let started = tokio::time::timeout(Duration::from_secs(20), said.next_line())
        .await
        .expect("agentloop events started")
        .expect("stderr");
    assert!(
        started.is_some_and(|l| l.contains("watching session")),
        "agentloop events did not start"
    );

    // Act
    bus.emit_event(&event(1, "lifecycle", "start", "", "{\"model\":\"fake\"}"))
        .await;
    bus.emit_event(&event(2, "assistant", "delta", "Hello", ""))
        .await;
    bus.emit_event(&event(
        3,
        "lifecycle",
        "end",
        "",
        "{\"reason\":\"completed\"}",
    ))
    .await;

    // Assert: live, one readable line per event
    let mut lines = BufReader::new(watcher.stdout.take().expect("stdout")).lines();
    let mut live = Vec::new();
    while live.len() < 3 {
        let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .expect("an event line")
            .expect("stdout")
            .expect("a line");
        live.push(line);
    }
    assert_eq!(
        live[0],
        "   1 run 0193a0b1 lifecycle/start {\"model\":\"fake\"}"
    );
    assert_eq!(live[1], "   2 run 0193a0b1 assistant/delta \"Hello\"");
    let _ = watcher.kill().await;

    // Replayed from the stream, in order, as JSON with --json
    let replayed = agentloop(nats.url(), &["replay", RUN, "--json"])
        .output()
        .await
        .expect("agentloop replay");
    assert!(replayed.status.success(), "{replayed:?}");
    let events: Vec<serde_json::Value> = String::from_utf8_lossy(&replayed.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON event"))
        .collect();
    let seqs: Vec<u64> = events
        .iter()
        .map(|e| e["seq"].as_u64().unwrap_or(0))
        .collect();
    assert_eq!(seqs, [1, 2, 3]);
    assert_eq!(events[2]["phase"], "end");
    let missing = agentloop(nats.url(), &["replay", "no-such-run"])
        .output()
        .await
        .expect("agentloop replay");
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no events of run no-such-run"));
}

#[tokio::test]
async fn with_json_events_a_plain_subscriber_reads_them_as_they_are_and_replay_still_works() {
    // Arrange: events written as JSON (`bus.events_encoding = "json"`)
    let nats = agentloop_testkit::NatsServer::start().expect("nats");
    let config = BusConfig {
        url: nats.url().to_owned(),
        prefix: "watchcli".to_owned(),
        events_encoding: agentloop_bus::EventsEncoding::Json,
        ..Default::default()
    };
    let bus = Bus::connect(&config, "test").await.expect("bus");
    let mut plain = bus
        .client()
        .subscribe("watchcli.events.>")
        .await
        .expect("subscribe");

    // Act
    bus.emit_event(&event(1, "assistant", "delta", "Hi", ""))
        .await;

    // Assert: what `nats sub` prints is the event itself
    let msg = tokio::time::timeout(
        Duration::from_secs(10),
        futures::StreamExt::next(&mut plain),
    )
    .await
    .expect("an event")
    .expect("a message");
    let json: serde_json::Value =
        serde_json::from_slice(&msg.payload).expect("the payload is JSON as it is");
    assert_eq!(json["delta"], "Hi", "{json}");
    assert_eq!(json["runId"], RUN, "{json}");
    let replayed = agentloop(nats.url(), &["replay", RUN])
        .output()
        .await
        .expect("agentloop replay");
    assert!(replayed.status.success(), "{replayed:?}");
    assert_eq!(
        String::from_utf8_lossy(&replayed.stdout).trim_end(),
        "   1 run 0193a0b1 assistant/delta \"Hi\""
    );
}
