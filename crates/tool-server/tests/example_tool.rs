//! The example tool binary, as a separate process: it announces itself and answers calls.
#![allow(clippy::unwrap_used)] // test helpers: a failure should panic the test

use std::process::Stdio;
use std::time::Duration;

use futures::StreamExt as _;
use tokio::io::AsyncBufReadExt as _;

#[tokio::test]
async fn the_example_tool_announces_itself_and_counts_words() {
    let nats = agentloop_testkit::NatsServer::start().unwrap();
    let client = async_nats::connect(nats.url()).await.unwrap();
    let mut announcements = client.subscribe("ex.tool._announce").await.unwrap();
    agentloop_testkit::round_trip(&client).await.unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentloop-example-tool"))
        .env("NATS_URL", nats.url())
        .env("AGENTLOOP_BUS__PREFIX", "ex")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let ready = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(ready.starts_with("ready"), "{ready}");

    let first = tokio::time::timeout(Duration::from_secs(5), announcements.next())
        .await
        .unwrap()
        .unwrap();
    let announced: serde_json::Value = serde_json::from_slice(&first.payload).unwrap();
    assert_eq!(announced["name"], "word_count");
    assert_eq!(announced["parallelSafe"], true);

    let reply = client
        .request(
            "ex.tool.word_count",
            r#"{"arguments":{"text":"one two three"}}"#.into(),
        )
        .await
        .unwrap();
    let body: serde_json::Value = serde_json::from_slice(&reply.payload).unwrap();
    assert_eq!(body["result"], "3");
    let reply = client
        .request("ex.tool.word_count", r#"{"arguments":{}}"#.into())
        .await
        .unwrap();
    let body: serde_json::Value = serde_json::from_slice(&reply.payload).unwrap();
    assert_eq!(body["error"], "text is required");
}
