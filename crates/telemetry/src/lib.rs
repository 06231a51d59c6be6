//! Tracing and OpenTelemetry for every agentloop process: a `tracing` subscriber (text or JSON
//! logs, `RUST_LOG` filter), OTLP span export when `OTEL_EXPORTER_OTLP_ENDPOINT` is set, and W3C
//! `traceparent` propagation over NATS headers and gRPC metadata, and the gRPC connections those
//! calls ride on (a traced channel for clients, accepted connections for servers).

mod coalesce;
mod export;
mod log_format;
mod propagation;

pub use coalesce::CoalescingIo;
pub use log_format::{LogFormat, UnknownLogFormat};

pub use propagation::{
    ChannelError, ChannelTls, GrpcTraceInjector, TracedChannel, grpc_incoming, grpc_server_span,
    http_server_span, inject_grpc, inject_map, inject_nats, record_trace_ids, set_parent_from_map,
    set_parent_from_nats, traced_channel, traced_channel_tls,
};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::{EnvFilter, layer::SubscriberExt, util::SubscriberInitExt};

/// Logging and tracing settings (`[telemetry]`).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(default)]
pub struct TelemetryConfig {
    /// `text` (default) or `json`.
    pub log_format: LogFormat,
    /// Filter used when `RUST_LOG` is unset.
    pub log_level: String,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            log_format: LogFormat::Text,
            log_level: "info".to_owned(),
        }
    }
}

/// Why telemetry could not start.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The OTLP exporter could not be built.
    #[error("failed to build the OTLP span exporter")]
    Exporter(#[source] opentelemetry_otlp::ExporterBuildError),
    /// `OTEL_EXPORTER_OTLP_PROTOCOL` names a protocol agentloop does not speak.
    #[error("OTEL_EXPORTER_OTLP_PROTOCOL={0:?} is not supported: use grpc or http/protobuf")]
    Protocol(String),
    /// `OTEL_EXPORTER_OTLP_CERTIFICATE` names a file that cannot be read.
    #[error("cannot read the OTLP CA certificate {path}")]
    Certificate {
        /// The file named.
        path: String,
        /// Why it cannot be read.
        #[source]
        source: std::io::Error,
    },
    /// The HTTP client for OTLP/HTTP could not be built.
    #[error("cannot build the OTLP/HTTP client: {0}")]
    HttpClient(String),
    /// A global subscriber was already installed.
    #[error("a tracing subscriber is already installed")]
    AlreadyInstalled(#[source] tracing_subscriber::util::TryInitError),
}

/// Flushes and shuts the span exporter down when dropped.
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            // shutdown() blocks on the export; doing it on a plain thread keeps it off the runtime.
            let handle = std::thread::spawn(move || provider.shutdown());
            if let Ok(Err(err)) = handle.join() {
                eprintln!("telemetry: failed to flush spans: {err}");
            }
        }
    }
}

/// The service name of a process running every service (`agentloop all`): its spans are sent
/// under the name of the service that made each one.
pub const ALL_SERVICES: &str = "agentloop-all";

/// Installs the global subscriber and, when `OTEL_EXPORTER_OTLP_ENDPOINT` is set, OTLP export
/// over gRPC or HTTP (`OTEL_EXPORTER_OTLP_PROTOCOL`), with TLS for an `https` endpoint (a
/// private CA in `OTEL_EXPORTER_OTLP_CERTIFICATE`).
/// Must be called inside a tokio runtime (the exporter's gRPC client needs it).
///
/// # Errors
/// [`TelemetryError`] when the exporter cannot be built or a subscriber already exists.
pub fn init(service: &str, config: &TelemetryConfig) -> Result<TelemetryGuard, TelemetryError> {
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(config.log_level.clone()));
    let otlp_endpoint = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT")
        .ok()
        .filter(|v| !v.trim().is_empty());
    let provider = match otlp_endpoint {
        Some(_) => {
            let resource = opentelemetry_sdk::Resource::builder()
                .with_service_name(service.to_owned())
                .build();
            let builder = SdkTracerProvider::builder().with_resource(resource);
            // One process running every service still reports each span under its service.
            let builder = if service == ALL_SERVICES {
                builder.with_batch_exporter(export::PerService::new(
                    ALL_SERVICES,
                    export::otlp_exporter,
                )?)
            } else {
                builder.with_batch_exporter(export::otlp_exporter()?)
            };
            let provider = builder.build();
            opentelemetry::global::set_tracer_provider(provider.clone());
            Some(provider)
        }
        None => None,
    };
    let otel_layer = provider.as_ref().map(|provider| {
        tracing_opentelemetry::layer().with_tracer(provider.tracer(service.to_owned()))
    });
    let registry = tracing_subscriber::registry().with(filter).with(otel_layer);
    let result = if config.log_format == LogFormat::Json {
        registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_current_span(true)
                    // The same stream as the text lines: one place to collect either.
                    .with_writer(std::io::stderr),
            )
            .try_init()
    } else {
        registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_target(false)
                    // Colour codes only for a person at a terminal, not in files and collectors.
                    .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                    .with_writer(std::io::stderr),
            )
            .try_init()
    };
    result.map_err(TelemetryError::AlreadyInstalled)?;
    Ok(TelemetryGuard { provider })
}

/// Installs a text subscriber for tests when `TEST_LOG` is set; safe to call many times.
pub fn init_for_tests() {
    if std::env::var_os("TEST_LOG").is_none() {
        return;
    }
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(tracing_subscriber::fmt::layer().with_test_writer())
        .try_init();
}
