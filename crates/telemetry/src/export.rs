//! Where spans go: OTLP over gRPC or over HTTP (protobuf), as the standard `OTEL_EXPORTER_OTLP_*`
//! variables say, TLS for an `https` endpoint; and, in a process running several services
//! (`agentloop all`), each span sent under the `service.name` of the service that made it.

use opentelemetry::KeyValue;
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _, WithTonicConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanExporter};

use crate::TelemetryError;

/// How spans travel to the collector (`OTEL_EXPORTER_OTLP_PROTOCOL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Protocol {
    /// OTLP/gRPC (`grpc`, the default; port 4317).
    Grpc,
    /// OTLP/HTTP with protobuf bodies (`http/protobuf`; port 4318, path `/v1/traces`).
    HttpProtobuf,
}

impl Protocol {
    /// The protocol a variable's value names; an empty value is the default.
    pub(crate) fn parse(value: &str) -> Result<Self, TelemetryError> {
        match value.trim() {
            "" | "grpc" => Ok(Self::Grpc),
            "http/protobuf" => Ok(Self::HttpProtobuf),
            other => Err(TelemetryError::Protocol(other.to_owned())),
        }
    }
}

/// The first of `names` that is set and not empty.
fn env_first(names: &[&str]) -> Option<String> {
    names
        .iter()
        .filter_map(|name| std::env::var(name).ok())
        .find(|value| !value.trim().is_empty())
}

/// The OTLP span exporter the environment describes. The endpoint, headers and timeout are
/// read by the exporter itself; the protocol and the CA certificate here.
pub(crate) fn otlp_exporter() -> Result<opentelemetry_otlp::SpanExporter, TelemetryError> {
    let protocol = Protocol::parse(
        &env_first(&[
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ])
        .unwrap_or_default(),
    )?;
    let ca = match env_first(&[
        "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
        "OTEL_EXPORTER_OTLP_CERTIFICATE",
    ]) {
        Some(path) => Some(
            std::fs::read(&path).map_err(|source| TelemetryError::Certificate { path, source })?,
        ),
        None => None,
    };
    let built = match protocol {
        Protocol::Grpc => {
            let builder = opentelemetry_otlp::SpanExporter::builder().with_tonic();
            // The public roots always; the given CA too, for a collector with its own.
            let mut tls = tonic::transport::ClientTlsConfig::new().with_webpki_roots();
            if let Some(pem) = &ca {
                tls = tls.ca_certificate(tonic::transport::Certificate::from_pem(pem));
            }
            let builder = if endpoint_is_https() {
                builder.with_tls_config(tls)
            } else {
                builder
            };
            builder.build()
        }
        Protocol::HttpProtobuf => {
            // reqwest's rustls without a provider of its own: ring, as everywhere else.
            let _ = rustls::crypto::ring::default_provider().install_default();
            let mut client = reqwest_otlp::blocking::Client::builder();
            if let Some(pem) = &ca {
                let certificate = reqwest_otlp::Certificate::from_pem(pem).map_err(|source| {
                    TelemetryError::HttpClient(format!("the CA certificate is not PEM: {source}"))
                })?;
                client = client.add_root_certificate(certificate);
            }
            // The blocking client starts a runtime of its own, which may not be built on a
            // thread of tokio's: built on a plain thread.
            let client = std::thread::spawn(move || client.build())
                .join()
                .map_err(|_| TelemetryError::HttpClient("the client builder panicked".to_owned()))?
                .map_err(|err| TelemetryError::HttpClient(err.to_string()))?;
            opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_http_client(client)
                .build()
        }
    };
    built.map_err(TelemetryError::Exporter)
}

fn endpoint_is_https() -> bool {
    env_first(&[
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ])
    .is_some_and(|endpoint| endpoint.trim_start().starts_with("https://"))
}

/// The service a span of `agentloop all` belongs to, from the module that made it (the span's
/// `target`); `None` for a module of no service (the process's own name applies).
pub(crate) fn service_of(target: &str, span_name: &str) -> Option<&'static str> {
    let krate = target.split("::").next().unwrap_or(target);
    match krate {
        "agentloop_gateway" => Some("agentloop-gateway"),
        "agentloop_router" => Some("agentloop-router"),
        "agentloop_agent_runner" | "agentloop_model" | "agentloop_scanner" => {
            Some("agentloop-runner")
        }
        "agentloop_memory" => Some("agentloop-memory"),
        "agentloop_delivery" | "agentloop_channels" => Some("agentloop-delivery"),
        // The shared server spans: only memory serves gRPC in one process, only the gateway
        // serves HTTP.
        "agentloop_telemetry" => match span_name {
            "grpc" => Some("agentloop-memory"),
            "http_request" => Some("agentloop-gateway"),
            _ => None,
        },
        _ => None,
    }
}

/// Sends each span with the resource of the service that made it: one inner exporter per
/// service, each under its own `service.name`, and one for the rest under the process's name.
#[derive(Debug)]
pub(crate) struct PerService<E> {
    /// `(service, exporter)`; the last one is the process's own.
    exporters: Vec<(&'static str, E)>,
}

/// The services `agentloop all` runs, as they name themselves when run alone.
const SERVICES: [&str; 5] = [
    "agentloop-gateway",
    "agentloop-router",
    "agentloop-runner",
    "agentloop-memory",
    "agentloop-delivery",
];

impl<E: SpanExporter> PerService<E> {
    /// One exporter per service and one for the process (`process`), each made by `make`.
    pub(crate) fn new(
        process: &'static str,
        mut make: impl FnMut() -> Result<E, TelemetryError>,
    ) -> Result<Self, TelemetryError> {
        let mut exporters = Vec::with_capacity(SERVICES.len() + 1);
        for service in SERVICES.into_iter().chain([process]) {
            exporters.push((service, make()?));
        }
        Ok(Self { exporters })
    }

    fn index_of(&self, span: &SpanData) -> usize {
        let target = span
            .attributes
            .iter()
            .find(|kv| kv.key.as_str() == "target")
            .map(|kv| kv.value.as_str());
        let service = target.and_then(|target| service_of(&target, &span.name));
        service
            .and_then(|service| self.exporters.iter().position(|(name, _)| *name == service))
            .unwrap_or(self.exporters.len() - 1)
    }
}

impl<E: SpanExporter> SpanExporter for PerService<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let mut groups: Vec<Vec<SpanData>> =
            (0..self.exporters.len()).map(|_| Vec::new()).collect();
        for span in batch {
            let index = self.index_of(&span);
            groups[index].push(span);
        }
        let mut result = Ok(());
        for (group, (_, exporter)) in groups.into_iter().zip(&self.exporters) {
            if !group.is_empty()
                && let Err(err) = exporter.export(group).await
            {
                result = Err(err);
            }
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: std::time::Duration) -> OTelSdkResult {
        let mut result = Ok(());
        for (_, exporter) in &self.exporters {
            if let Err(err) = exporter.shutdown_with_timeout(timeout) {
                result = Err(err);
            }
        }
        result
    }

    fn force_flush(&self) -> OTelSdkResult {
        let mut result = Ok(());
        for (_, exporter) in &self.exporters {
            if let Err(err) = exporter.force_flush() {
                result = Err(err);
            }
        }
        result
    }

    fn set_resource(&mut self, resource: &Resource) {
        for (service, exporter) in &mut self.exporters {
            let attributes = resource
                .iter()
                .filter(|(key, _)| key.as_str() != "service.name")
                .map(|(key, value)| KeyValue::new(key.clone(), value.clone()))
                .chain([KeyValue::new("service.name", *service)]);
            let own = Resource::builder_empty()
                .with_attributes(attributes)
                .build();
            exporter.set_resource(&own);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_belong_to_the_service_whose_module_made_them() {
        assert_eq!(
            service_of("agentloop_router::route", "route"),
            Some("agentloop-router")
        );
        assert_eq!(
            service_of("agentloop_agent_runner::run", "run"),
            Some("agentloop-runner")
        );
        assert_eq!(
            service_of("agentloop_telemetry::propagation", "grpc"),
            Some("agentloop-memory")
        );
        assert_eq!(
            service_of("agentloop_telemetry::propagation", "http_request"),
            Some("agentloop-gateway")
        );
        assert_eq!(service_of("agentloop::all", "start"), None);
        assert_eq!(service_of("hyper::client", "x"), None);
    }

    #[test]
    fn the_protocol_is_grpc_unless_http_protobuf_is_asked_and_others_are_refused() {
        assert_eq!(Protocol::parse("").unwrap(), Protocol::Grpc);
        assert_eq!(Protocol::parse("grpc").unwrap(), Protocol::Grpc);
        assert_eq!(
            Protocol::parse("http/protobuf").unwrap(),
            Protocol::HttpProtobuf
        );
        let refused = Protocol::parse("http/json").unwrap_err().to_string();
        assert!(refused.contains("http/json"), "{refused}");
    }
}
