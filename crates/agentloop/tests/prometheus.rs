//! A real Prometheus (Debian's package, installed by ./scripts/test.sh) scrapes `agentloop all`
//! after it answered a message, and PromQL finds the run, its duration and the process series.

#![allow(clippy::unwrap_used)] // test helpers: a failure should panic the test

use std::time::Duration;

use futures::StreamExt as _;

use agentloop_testkit::{NatsServer, TestDatabase};

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
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
    let memory_port = free_port();
    let gateway = format!("127.0.0.1:{}", free_port());
    let mut agentloop = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentloop"))
        .arg("all")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("NATS_URL", nats.url())
        .env("DATABASE_URL", db.url())
        .env(
            "AGENTLOOP_MEMORY__LISTEN",
            format!("127.0.0.1:{memory_port}"),
        )
        .env(
            "AGENTLOOP_MEMORY__URL",
            format!("http://127.0.0.1:{memory_port}"),
        )
        .env("AGENTLOOP_GATEWAY__LISTEN", &gateway)
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let client = async_nats::connect(nats.url()).await.unwrap();
    let mut replies = client.subscribe("agentloop.deliver.cli.>").await.unwrap();
    agentloop_testkit::wait_until("agentloop all ready", Duration::from_secs(30), || async {
        let ready = reqwest::get(format!("http://{gateway}/readyz"))
            .await
            .ok()?;
        ready.status().is_success().then_some(())
    })
    .await
    .unwrap();
    client
        .publish(
            "agentloop.inbound.cli",
            r#"{"sessionKey":"prom","text":"count me"}"#.into(),
        )
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(20), replies.next())
        .await
        .unwrap()
        .unwrap();

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
    let _ = agentloop.kill().await;
    let _ = std::fs::remove_dir_all(&dir);
}
