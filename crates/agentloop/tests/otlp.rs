//! Spans leave `agentloop all` over OTLP as an operator configures it with the standard
//! variables: gRPC to a collector behind TLS with a private CA, and HTTP with protobuf bodies;
//! either way each span arrives under the `service.name` of the service that made it.

#![allow(clippy::unwrap_used)] // test helpers: a failure should panic the test

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message as _;

use agentloop_testkit::{NatsServer, TestDatabase};

#[path = "support/all_process.rs"]
mod all_process;
use all_process::{free_port, send_like_nats_pub, start_all, stop};

/// What a collector received: `(service.name, span name)` pairs.
#[derive(Clone, Default)]
struct Received(Arc<Mutex<BTreeSet<(String, String)>>>);

impl Received {
    fn take(&self, request: &ExportTraceServiceRequest) {
        let mut seen = self.0.lock().unwrap();
        for resource_spans in &request.resource_spans {
            let service = resource_spans
                .resource
                .as_ref()
                .and_then(|r| r.attributes.iter().find(|kv| kv.key == "service.name"))
                .and_then(|kv| kv.value.as_ref())
                .and_then(|v| match &v.value {
                    Some(Value::StringValue(s)) => Some(s.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            for scope in &resource_spans.scope_spans {
                for span in &scope.spans {
                    seen.insert((service.clone(), span.name.clone()));
                }
            }
        }
    }

    /// Waits until every `(service, span)` in `wanted` arrived.
    async fn wait_for(&self, wanted: &[(&str, &str)]) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let seen = self.0.lock().unwrap().clone();
            let missing: Vec<_> = wanted
                .iter()
                .filter(|(service, span)| {
                    !seen.contains(&((*service).to_owned(), (*span).to_owned()))
                })
                .collect();
            if missing.is_empty() {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "spans missing after 30 s: {missing:?}; received {seen:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[tonic::async_trait]
impl TraceService for Received {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.take(request.get_ref());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// The spans of one message, each under its own service.
const EVERY_SERVICE: [(&str, &str); 4] = [
    ("agentloop-router", "route"),
    ("agentloop-runner", "run"),
    ("agentloop-memory", "grpc"),
    ("agentloop-delivery", "deliver"),
];

#[tokio::test]
async fn spans_reach_a_tls_grpc_collector_with_a_private_ca_under_each_services_name() {
    // Arrange: a collector serving OTLP/gRPC over TLS with a certificate of a private CA.
    let dir = std::env::temp_dir().join(format!("agentloop-otlp-grpc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    agentloop_testkit::certs::make_ca(&dir, "ca");
    agentloop_testkit::certs::make_server_certificate(&dir);
    let identity = tonic::transport::Identity::from_pem(
        std::fs::read(dir.join("server.pem")).unwrap(),
        std::fs::read(dir.join("server.key")).unwrap(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let received = Received::default();
    let server = tonic::transport::Server::builder()
        .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))
        .unwrap()
        .add_service(TraceServiceServer::new(received.clone()))
        .serve_with_incoming(tokio_stream_of(listener));
    let collector = tokio::spawn(server);

    // Act
    let nats = NatsServer::start().unwrap();
    let db = TestDatabase::create().await.unwrap();
    let env = [
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("https://localhost:{port}"),
        ),
        (
            "OTEL_EXPORTER_OTLP_CERTIFICATE",
            dir.join("ca.pem").display().to_string(),
        ),
        ("OTEL_BSP_SCHEDULE_DELAY", "100".to_owned()),
    ];
    let agentloop = start_all(&nats, &db, &env).await;
    let reply = send_like_nats_pub(&nats, "otlp-grpc", "trace me").await;
    assert_eq!(reply["text"], "echo: trace me", "{reply}");

    // Assert
    received.wait_for(&EVERY_SERVICE).await;
    stop(agentloop).await;
    collector.abort();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn spans_reach_an_http_protobuf_collector_under_each_services_name() {
    // Arrange: a collector taking OTLP/HTTP protobuf bodies on /v1/traces.
    let received = Received::default();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post({
            let received = received.clone();
            move |body: axum::body::Bytes| async move {
                let request = ExportTraceServiceRequest::decode(body).unwrap();
                received.take(&request);
                (
                    [("content-type", "application/x-protobuf")],
                    ExportTraceServiceResponse::default().encode_to_vec(),
                )
            }
        }),
    );
    let port = free_port();
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    let collector = tokio::spawn(async move { axum::serve(listener, app).await });

    // Act
    let nats = NatsServer::start().unwrap();
    let db = TestDatabase::create().await.unwrap();
    let env = [
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://127.0.0.1:{port}"),
        ),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf".to_owned()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100".to_owned()),
    ];
    let agentloop = start_all(&nats, &db, &env).await;
    let reply = send_like_nats_pub(&nats, "otlp-http", "trace me").await;
    assert_eq!(reply["text"], "echo: trace me", "{reply}");

    // Assert
    received.wait_for(&EVERY_SERVICE).await;
    stop(agentloop).await;
    collector.abort();
}

/// The accepted connections of `listener`, as tonic's server takes them.
fn tokio_stream_of(
    listener: tokio::net::TcpListener,
) -> impl futures::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    futures::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await.map(|(stream, _)| stream);
        Some((accepted, listener))
    })
}
