//! `agentloop all` as a process, the way the README starts it: a JSON message published with
//! plain core NATS (what `nats pub` does) is answered, SIGTERM stops it cleanly, and a real
//! Prometheus (Debian's package, installed by ./scripts/test.sh) scrapes it and PromQL finds
//! the run, its duration and the process series.

#![allow(clippy::unwrap_used)] // test helpers: a failure should panic the test

use std::time::Duration;

use agentloop_fake_model::{FakeModel, FakeModelConfig};
use agentloop_testkit::{NatsServer, TestDatabase};

#[path = "support/all_process.rs"]
mod all_process;
use all_process::{free_port, send_like_nats_pub, start_all, stop};

#[tokio::test]
async fn agentloop_all_answers_a_message_injected_like_the_nats_cli_with_openai_base_url() {
    let nats = NatsServer::start().unwrap();
    let db = TestDatabase::create().await.unwrap();
    let fake = FakeModel::start(FakeModelConfig::default()).await.unwrap();
    let process = start_all(
        &nats,
        &db,
        &[
            ("OPENAI_BASE_URL", fake.openai_base_url()),
            ("AGENTLOOP_MODEL", "openai/any-model".to_owned()),
        ],
    )
    .await;

    let reply = send_like_nats_pub(&nats, "cli:alice", "hi from the cli").await;

    assert_eq!(reply["text"], "echo: hi from the cli", "{reply}");
    assert_eq!(fake.requests().last().unwrap().body["model"], "any-model");
    stop(process).await;
}

#[tokio::test]
async fn agentloop_all_without_a_provider_says_so_and_uses_the_built_in_fake_model() {
    let nats = NatsServer::start().unwrap();
    let db = TestDatabase::create().await.unwrap();
    let process = start_all(&nats, &db, &[]).await;

    let reply = send_like_nats_pub(&nats, "cli:newcomer", "hello").await;

    assert_eq!(reply["text"], "echo: hello", "{reply}");
    let logs = stop(process).await;
    assert!(logs.contains("no model provider configured"), "{logs}");
}

#[tokio::test]
async fn sigterm_right_after_a_reply_stops_memory_last_so_every_run_command_is_acknowledged() {
    let nats = NatsServer::start().unwrap();
    let db = TestDatabase::create().await.unwrap();
    let process = start_all(&nats, &db, &[]).await;

    let reply = send_like_nats_pub(&nats, "cli:leaving", "bye").await;
    assert_eq!(reply["text"], "echo: bye", "{reply}");
    // At once: the runner acknowledges a command only after memory has confirmed its inbox row,
    // so memory must still be up while the runner drains.
    let logs = stop(process).await;

    assert!(!logs.contains("cannot confirm the inbox rows"), "{logs}");
    let jetstream = async_nats::jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    let mut runs = jetstream.get_stream("AGENTLOOP_RUNS").await.unwrap();
    let left = runs.info().await.unwrap().state.messages;
    assert_eq!(
        left, 0,
        "RUNS is a work queue: an acknowledged command is gone, one left waits for redelivery"
    );
}

/// The value of the first series `query` returns, once Prometheus has one.
async fn first_value(prometheus: &str, query: &str) -> (serde_json::Value, f64) {
    let client = reqwest::Client::new();
    agentloop_testkit::wait_until(query, Duration::from_secs(30), || {
        let client = client.clone();
        async move {
            let body: serde_json::Value = client
                .get(format!("http://{prometheus}/api/v1/query"))
                .query(&[("query", query)])
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            let first = body["data"]["result"].as_array()?.first()?.clone();
            let value: f64 = first["value"][1].as_str()?.parse().ok()?;
            Some((first["metric"].clone(), value))
        }
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn a_real_prometheus_scrapes_agentloop_all_and_promql_finds_the_run() {
    // Arrange: agentloop all, one message answered
    let nats = NatsServer::start().unwrap();
    let db = TestDatabase::create().await.unwrap();
    let fast_gauges = [
        ("AGENTLOOP_ROUTER__DEPTH_INTERVAL_MS", "300".to_owned()),
        ("AGENTLOOP_MEMORY__GAUGES_INTERVAL_MS", "300".to_owned()),
    ];
    let agentloop = start_all(&nats, &db, &fast_gauges).await;
    let gateway = agentloop.gateway.clone();
    let reply = send_like_nats_pub(&nats, "prom", "count me").await;
    assert_eq!(reply["text"], "echo: count me", "{reply}");

    // Act: Prometheus scrapes the process every second
    let dir = std::env::temp_dir().join(format!("agentloop-prom-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: agentloop\n    static_configs:\n      - targets: ['{gateway}']\n"
        ),
    )
    .unwrap();
    let web = format!("127.0.0.1:{}", free_port());
    let mut prometheus = tokio::process::Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address={web}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("prometheus is installed (./scripts/test.sh installs Debian's package)");

    // Assert: the target is up, and the run, its duration and the process are queryable
    let (_, up) = first_value(&web, "up{job=\"agentloop\"}").await;
    assert_eq!(up, 1.0);
    let (labels, runs) = first_value(&web, "agentloop_runner_runs_total").await;
    assert_eq!(runs, 1.0);
    assert_eq!(labels["outcome"], "completed", "{labels}");
    assert_eq!(labels["agent"], "default", "{labels}");
    let (_, p99) = first_value(
        &web,
        "histogram_quantile(0.99, sum by (le) (agentloop_runner_run_duration_seconds_bucket))",
    )
    .await;
    assert!(p99 > 0.0 && p99 < 5.0, "run p99 {p99}");
    let (labels, calls) = first_value(
        &web,
        "sum by (provider, outcome) (agentloop_runner_model_call_duration_seconds_count)",
    )
    .await;
    assert_eq!(calls, 1.0);
    assert_eq!(labels["outcome"], "ok", "{labels}");
    let (_, first) = first_value(
        &web,
        "sum(agentloop_runner_model_first_token_seconds_count)",
    )
    .await;
    assert_eq!(first, 1.0);
    let (_, rss) = first_value(&web, "process_resident_memory_bytes").await;
    assert!(rss > 1_000_000.0, "rss {rss}");
    let (_, ready) = first_value(&web, "agentloop_ready").await;
    assert_eq!(ready, 1.0);
    // The message's way through: taken in on its channel, waited, delivered once.
    let (labels, taken_in) = first_value(&web, "agentloop_messages_in_total").await;
    assert_eq!((labels["channel"].as_str(), taken_in), (Some("cli"), 1.0));
    let (_, waited) = first_value(&web, "agentloop_runner_queue_wait_seconds_count").await;
    assert_eq!(waited, 1.0);
    let (_, delivered) = first_value(
        &web,
        "sum(agentloop_delivery_attempts_total{outcome=\"delivered\"})",
    )
    .await;
    assert_eq!(delivered, 1.0);
    // The gauges read from NATS and Postgres: nothing waits once the run is answered.
    let (_, backlog) = first_value(
        &web,
        "agentloop_consumer_pending{stream=\"AGENTLOOP_RUNS\",consumer=\"runner\"}",
    )
    .await;
    assert_eq!(backlog, 0.0);
    let (_, dead) = first_value(&web, "agentloop_stream_messages{stream=\"AGENTLOOP_DLQ\"}").await;
    assert_eq!(dead, 0.0);
    let (_, stuck) = first_value(&web, "agentloop_sessions_stuck").await;
    assert_eq!(stuck, 0.0);
    let (_, queued) = first_value(&web, "sum(agentloop_inbox_pending)").await;
    assert_eq!(queued, 0.0, "the answered input is consumed");

    // Every query of the shipped dashboard is valid PromQL for this Prometheus.
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../deploy/grafana/agentloop.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let http = reqwest::Client::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            let answer: serde_json::Value = http
                .get(format!("http://{web}/api/v1/query"))
                .query(&[("query", expr)])
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            assert_eq!(answer["status"], "success", "{expr}: {answer}");
        }
    }

    let _ = prometheus.kill().await;
    stop(agentloop).await;
    let _ = std::fs::remove_dir_all(&dir);
}
