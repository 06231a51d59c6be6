//! One trace spans gateway → router → runner → memory → delivery, carried by `traceparent`.

use std::collections::BTreeSet;
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use serde_json::json;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

use crate::harness::Sandbox;

/// Installs this process's subscriber with an in-memory span exporter and returns the exporter.
/// Each test runs in its own process under nextest, so the global subscriber is this test's.
fn export_spans() -> InMemorySpanExporter {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("e2e")))
        .with(tracing_subscriber::EnvFilter::new("info"))
        .try_init()
        .unwrap();
    exporter
}

#[tokio::test]
async fn one_trace_spans_every_service_a_message_passes_through() {
    let exporter = export_spans();
    let sandbox = Sandbox::start().await.unwrap();
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(
        "traceparent",
        format!("00-{trace_id}-00f067aa0ba902b7-01").as_str(),
    );

    let reply = tokio::time::timeout(
        Duration::from_secs(20),
        sandbox.client.request_with_headers(
            sandbox.subject("ask"),
            headers,
            json!({"sessionKey": "traced", "text": "follow me [[tool:current_time]]"})
                .to_string()
                .into(),
        ),
    )
    .await
    .unwrap()
    .unwrap();
    let answer: serde_json::Value = serde_json::from_slice(&reply.payload).unwrap();
    assert!(
        answer["text"]
            .as_str()
            .unwrap()
            .starts_with("tool results: "),
        "{answer}"
    );

    // Every service, and inside the run each model call and the tool call.
    let wanted: BTreeSet<&str> = [
        "ask",
        "route",
        "intake",
        "run",
        "deliver",
        "grpc",
        "model_call",
        "tool_call",
        "memory_call",
    ]
    .into();
    let seen =
        agentloop_testkit::wait_until("spans of every service", Duration::from_secs(10), || {
            let spans = exporter.get_finished_spans().unwrap_or_default();
            let names: BTreeSet<String> = spans
                .iter()
                .filter(|s| s.span_context.trace_id().to_string() == trace_id)
                .map(|s| s.name.to_string())
                .collect();
            let done = wanted.iter().all(|w| names.contains(*w));
            async move { done.then_some(names) }
        })
        .await
        .unwrap();
    assert!(seen.contains("run"), "{seen:?}");
    let spans = exporter.get_finished_spans().unwrap_or_default();
    let attribute = |span: &opentelemetry_sdk::trace::SpanData, key: &str| {
        span.attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| kv.value.to_string())
    };
    let models: Vec<_> = spans.iter().filter(|s| s.name == "model_call").collect();
    assert_eq!(models.len(), 2, "one call for the tool, one for the answer");
    for model in &models {
        assert_eq!(attribute(model, "outcome").as_deref(), Some("ok"));
        assert_eq!(attribute(model, "provider").as_deref(), Some("openai"));
        assert!(attribute(model, "first_token_ms").is_some());
    }
    // The run's span names its trace, so every log line of the run does.
    let run = spans
        .iter()
        .find(|s| s.name == "run" && s.span_context.trace_id().to_string() == trace_id)
        .unwrap();
    assert_eq!(attribute(run, "trace_id").as_deref(), Some(trace_id));
    assert_eq!(
        attribute(run, "span_id"),
        Some(run.span_context.span_id().to_string())
    );
    // The runner's memory calls are in the trace: the claim (which takes the input and reads
    // the history in the same call) under the intake, the run's end under the run.
    let rpcs: BTreeSet<String> = spans
        .iter()
        .filter(|s| s.name == "memory_call" && s.span_context.trace_id().to_string() == trace_id)
        .filter_map(|s| attribute(s, "rpc"))
        .collect();
    assert!(rpcs.contains("enqueue"), "{rpcs:?}");
    assert!(
        rpcs.contains("finish_run") || rpcs.contains("append"),
        "{rpcs:?}"
    );
    let tool = spans.iter().find(|s| s.name == "tool_call").unwrap();
    assert_eq!(attribute(tool, "tool").as_deref(), Some("current_time"));
    assert_eq!(attribute(tool, "outcome").as_deref(), Some("ok"));
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_http_request_joins_its_callers_trace_and_each_websocket_request_has_its_own() {
    let exporter = export_spans();
    let sandbox = Sandbox::start().await.unwrap();
    let mut client = crate::gateway::Client::connected(&sandbox, None)
        .await
        .unwrap();
    let trace_id = "0af7651916cd43dd8448eb211c80319c";

    // Act: a /v1 request carrying the caller's traceparent, then two WebSocket requests
    let answer: serde_json::Value = reqwest::Client::new()
        .post(format!(
            "http://{}/v1/chat/completions",
            sandbox.gateway_addr
        ))
        .header("traceparent", format!("00-{trace_id}-b7ad6b7169203331-01"))
        .json(&json!({"model": "agentloop", "user": "oa:tracer",
                      "messages": [{"role": "user", "content": "trace me"}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["choices"][0]["message"]["content"], "echo: trace me");
    for _ in 0..2 {
        assert_eq!(client.call("health", json!({})).await.unwrap()["ok"], true);
    }

    // Assert: the gateway's request span and the run are in the caller's trace
    let names = agentloop_testkit::wait_until("the /v1 trace", Duration::from_secs(10), || {
        let names: BTreeSet<String> = exporter
            .get_finished_spans()
            .unwrap_or_default()
            .iter()
            .filter(|s| s.span_context.trace_id().to_string() == trace_id)
            .map(|s| s.name.to_string())
            .collect();
        let done = ["http_request", "route", "run", "model_call"]
            .iter()
            .all(|w| names.contains(*w));
        async move { done.then_some(names) }
    })
    .await
    .unwrap();
    assert!(names.contains("http_request"), "{names:?}");
    let spans = exporter.get_finished_spans().unwrap_or_default();
    let health: BTreeSet<String> = spans
        .iter()
        .filter(|s| s.name == "ws_request")
        .filter(|s| {
            s.attributes
                .iter()
                .any(|kv| kv.key.as_str() == "method" && kv.value.to_string() == "health")
        })
        .map(|s| s.span_context.trace_id().to_string())
        .collect();
    assert_eq!(health.len(), 2, "two requests, two traces");
    sandbox.shutdown().await.unwrap();
}
