//! W3C trace context through NATS headers and tonic metadata. Header names are lowercase
//! (`traceparent`, `tracestate`) because NATS header lookups are case-sensitive.

use crate::CoalescingIo;
use async_nats::HeaderMap;
use opentelemetry::global;
use opentelemetry::propagation::{Extractor, Injector};
use tracing_opentelemetry::OpenTelemetrySpanExt;

struct NatsInjector<'a>(&'a mut HeaderMap);

impl Injector for NatsInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key, value.as_str());
    }
}

struct NatsExtractor<'a>(&'a HeaderMap);

impl Extractor for NatsExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(|v| v.as_str())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(k, _)| k.as_ref()).collect()
    }
}

/// Writes the current span's context into NATS headers.
pub fn inject_nats(headers: &mut HeaderMap) {
    let cx = tracing::Span::current().context();
    global::get_text_map_propagator(|p| p.inject_context(&cx, &mut NatsInjector(headers)));
}

/// Makes `span` a child of the context carried in NATS headers, if any.
pub fn set_parent_from_nats(span: &tracing::Span, headers: Option<&HeaderMap>) {
    if let Some(headers) = headers
        && headers.get("traceparent").is_some()
    {
        let cx = global::get_text_map_propagator(|p| p.extract(&NatsExtractor(headers)));
        let _ = span.set_parent(cx);
    }
}

struct GrpcInjector<'a>(&'a mut tonic::metadata::MetadataMap);

impl Injector for GrpcInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(key), Ok(value)) = (
            tonic::metadata::MetadataKey::from_bytes(key.as_bytes()),
            tonic::metadata::MetadataValue::try_from(value.as_str()),
        ) {
            self.0.insert(key, value);
        }
    }
}

/// Writes the current span's context into gRPC request metadata.
pub fn inject_grpc(metadata: &mut tonic::metadata::MetadataMap) {
    let cx = tracing::Span::current().context();
    global::get_text_map_propagator(|p| p.inject_context(&cx, &mut GrpcInjector(metadata)));
}

/// A tonic interceptor that adds `traceparent` to every outgoing call.
#[derive(Debug, Clone, Default)]
pub struct GrpcTraceInjector {
    /// `Bearer <secret>` for a memory service that asks for its shared secret.
    authorization: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
}

impl tonic::service::Interceptor for GrpcTraceInjector {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        inject_grpc(request.metadata_mut());
        if let Some(authorization) = &self.authorization {
            request
                .metadata_mut()
                .insert("authorization", authorization.clone());
        }
        Ok(request)
    }
}

/// Why a channel to the memory service cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    /// The URL is not a valid URI.
    #[error("not a valid URI")]
    Url(#[source] tonic::transport::Error),
    /// The shared secret holds characters a gRPC header cannot carry.
    #[error("the shared secret must be visible ASCII")]
    Secret,
    /// The CA file that should verify the server cannot be read.
    #[error("cannot read the TLS CA file {path}")]
    CaFile {
        /// The configured path.
        path: String,
        /// Why reading failed.
        #[source]
        source: std::io::Error,
    },
    /// A CA file is set but the URL is not `https://`, so the channel would not use it.
    #[error("a TLS CA file is set, so the URL must start with https://")]
    TlsNeedsHttps,
    /// The URL is `https://` but no CA file says whom to trust.
    #[error("an https:// URL needs a TLS CA file to verify the server")]
    HttpsNeedsCa,
    /// tonic refused the TLS settings (a CA file holding no certificate, a bad domain).
    #[error("invalid TLS settings (CA file {path})")]
    Tls {
        /// The configured CA path.
        path: String,
        /// tonic's complaint.
        #[source]
        source: tonic::transport::Error,
    },
}

/// How a channel checks the server it reaches over TLS; an empty `ca_file` means plaintext.
#[derive(Debug, Clone, Copy, Default)]
pub struct ChannelTls<'a> {
    /// PEM file of the CA(s) the server's certificate must chain to.
    pub ca_file: &'a str,
    /// Name the certificate must carry, when not the URL's host; empty checks the host.
    pub domain: &'a str,
}

/// A gRPC channel that adds `traceparent` to every call.
pub type TracedChannel = tonic::service::interceptor::InterceptedService<
    WholeBody<tonic::transport::Channel>,
    GrpcTraceInjector,
>;

/// Hands each request to the channel with its body already encoded, as one chunk. tonic's own
/// request body only learns it has ended when polled once more, so HTTP/2 sent every unary
/// request as three writes: headers, the message, and an empty frame to end the stream. A body
/// known whole ends with its message. Every call here is unary, so nothing waits on a stream.
#[derive(Debug, Clone)]
pub struct WholeBody<S>(S);

impl<S> tower_service::Service<http::Request<tonic::body::Body>> for WholeBody<S>
where
    S: tower_service::Service<http::Request<tonic::body::Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<tonic::codegen::StdError>,
{
    type Response = S::Response;
    type Error = tonic::codegen::StdError;
    type Future = futures::future::BoxFuture<'static, Result<S::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        // The instance polled ready is the one that may take the call.
        let fresh = self.0.clone();
        let mut ready = std::mem::replace(&mut self.0, fresh);
        Box::pin(async move {
            use http_body_util::BodyExt as _;
            let (parts, body) = request.into_parts();
            let encoded = body.collect().await?.to_bytes();
            let body = tonic::body::Body::new(http_body_util::Full::new(encoded));
            ready
                .call(http::Request::from_parts(parts, body))
                .await
                .map_err(Into::into)
        })
    }
}

/// Opens TCP connections (under TLS for `https://` endpoints) whose writes go out per turn of the
/// runtime (see [`CoalescingIo`]), without Nagle's delay.
#[derive(Debug, Clone, Copy)]
struct CoalescingConnector;

impl tower_service::Service<http::Uri> for CoalescingConnector {
    type Response = hyper_util::rt::TokioIo<CoalescingIo<tokio::net::TcpStream>>;
    type Error = std::io::Error;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        Box::pin(async move {
            // tonic wraps what this returns in TLS itself for an `https://` URI (its connector
            // runs the endpoint's `tls_config` around ours), so both schemes open plain TCP.
            let default_port = match uri.scheme_str() {
                Some("http") => 80,
                Some("https") => 443,
                _ => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        format!("{uri}: only http:// and https:// gRPC endpoints are supported"),
                    ));
                }
            };
            let host = uri.host().ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("no host in {uri}"),
                )
            })?;
            // An IPv6 literal comes bracketed in the URI.
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let port = uri.port_u16().unwrap_or(default_port);
            let stream = tokio::net::TcpStream::connect((host, port)).await?;
            stream.set_nodelay(true)?;
            Ok(hyper_util::rt::TokioIo::new(CoalescingIo::new(stream)))
        })
    }
}

/// The connections a gRPC server accepts on `listener`, without Nagle's delay and with their
/// writes sent per turn of the runtime (see [`CoalescingIo`]).
pub fn grpc_incoming(
    listener: tokio::net::TcpListener,
) -> impl futures::Stream<Item = std::io::Result<CoalescingIo<tokio::net::TcpStream>>> {
    use futures::StreamExt as _;
    tonic::transport::server::TcpIncoming::from(listener)
        .with_nodelay(Some(true))
        .map(|accepted| accepted.map(CoalescingIo::new))
}

/// Returns a lazily connecting, self-reconnecting channel to `url` that propagates traces and,
/// when `secret` is not empty, presents it as `authorization: Bearer <secret>` on every call.
///
/// # Errors
/// [`ChannelError`] when `url` is not a valid URI or `secret` cannot be a header.
pub fn traced_channel(url: &str, secret: &str) -> Result<TracedChannel, ChannelError> {
    traced_channel_tls(url, secret, ChannelTls::default())
}

/// [`traced_channel`], over TLS verified against `tls.ca_file` when that is set (the URL must
/// then be `https://`). The CA file is read here, once, so a bad path fails at start.
///
/// # Errors
/// [`ChannelError`] when `url` is not a valid URI, `secret` cannot be a header, the CA file
/// cannot be read or used, or the URL's scheme does not match whether TLS is configured.
pub fn traced_channel_tls(
    url: &str,
    secret: &str,
    tls: ChannelTls<'_>,
) -> Result<TracedChannel, ChannelError> {
    let authorization = if secret.is_empty() {
        None
    } else {
        Some(
            format!("Bearer {secret}")
                .parse()
                .map_err(|_| ChannelError::Secret)?,
        )
    };
    let mut endpoint = tonic::transport::Endpoint::from_shared(url.to_owned())
        .map_err(ChannelError::Url)?
        .connect_timeout(std::time::Duration::from_secs(2))
        .http2_keep_alive_interval(std::time::Duration::from_secs(30));
    let https = endpoint.uri().scheme_str() == Some("https");
    match (tls.ca_file.is_empty(), https) {
        (true, false) => {}
        // Either mismatch would otherwise show only at the first call, or worse, a CA set
        // next to an http:// URL would be ignored and the channel would stay plaintext.
        (false, false) => return Err(ChannelError::TlsNeedsHttps),
        (true, true) => return Err(ChannelError::HttpsNeedsCa),
        (false, true) => {
            let ca = std::fs::read(tls.ca_file).map_err(|source| ChannelError::CaFile {
                path: tls.ca_file.to_owned(),
                source,
            })?;
            let mut config = tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(ca));
            if !tls.domain.is_empty() {
                config = config.domain_name(tls.domain);
            }
            endpoint = endpoint
                .tls_config(config)
                .map_err(|source| ChannelError::Tls {
                    path: tls.ca_file.to_owned(),
                    source,
                })?;
        }
    }
    // The same connector for both: tonic runs its TLS handshake over the stream it returns.
    let channel = endpoint.connect_with_connector_lazy(CoalescingConnector);
    Ok(tonic::service::interceptor::InterceptedService::new(
        WholeBody(channel),
        GrpcTraceInjector { authorization },
    ))
}

struct MapInjector<'a>(&'a mut std::collections::HashMap<String, String>);

impl Injector for MapInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key.to_owned(), value);
    }
}

struct MapExtractor<'a>(&'a std::collections::HashMap<String, String>);

impl Extractor for MapExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

/// Writes the current span's context into a string map (a message's metadata), for work that
/// is picked up later, outside the span that queued it.
pub fn inject_map(map: &mut std::collections::HashMap<String, String>) {
    let cx = tracing::Span::current().context();
    global::get_text_map_propagator(|p| p.inject_context(&cx, &mut MapInjector(map)));
}

/// Makes `span` a child of the context carried in a string map, if any.
pub fn set_parent_from_map(span: &tracing::Span, map: &std::collections::HashMap<String, String>) {
    if map.contains_key("traceparent") {
        let cx = global::get_text_map_propagator(|p| p.extract(&MapExtractor(map)));
        let _ = span.set_parent(cx);
    }
}

struct HttpExtractor<'a>(&'a tonic::codegen::http::HeaderMap);

impl Extractor for HttpExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// Returns the span of one incoming gRPC call, a child of the caller's `traceparent` (for
/// tonic's `Server::trace_fn`).
pub fn grpc_server_span(request: &tonic::codegen::http::Request<()>) -> tracing::Span {
    let span = tracing::info_span!("grpc", path = %request.uri().path());
    if request.headers().contains_key("traceparent") {
        let cx = global::get_text_map_propagator(|p| p.extract(&HttpExtractor(request.headers())));
        let _ = span.set_parent(cx);
    }
    span
}

/// Writes the OpenTelemetry trace and span ids of `span` into its `trace_id` and `span_id`
/// fields, so every log line inside it names the trace to look up. Nothing when no trace is
/// exported (no OTLP endpoint): the ids would lead nowhere.
pub fn record_trace_ids(span: &tracing::Span) {
    let cx = span.context();
    let otel = opentelemetry::trace::TraceContextExt::span(&cx);
    let ids = otel.span_context();
    if ids.is_valid() {
        span.record("trace_id", ids.trace_id().to_string());
        span.record("span_id", ids.span_id().to_string());
    }
}

/// Returns the span of one incoming HTTP request, a child of the caller's `traceparent` when it
/// sends one (a root otherwise).
pub fn http_server_span(
    method: &str,
    path: &str,
    headers: &tonic::codegen::http::HeaderMap,
) -> tracing::Span {
    let span = tracing::info_span!(parent: None, "http_request", method, path, status = tracing::field::Empty);
    if headers.contains_key("traceparent") {
        let cx = global::get_text_map_propagator(|p| p.extract(&HttpExtractor(headers)));
        let _ = span.set_parent(cx);
    }
    span
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower_service::Service as _;

    #[tokio::test]
    async fn the_connector_reaches_http_and_https_endpoints_and_refuses_others() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let uri: http::Uri = format!("http://127.0.0.1:{port}").parse().unwrap();
        let io = CoalescingConnector.call(uri).await.unwrap();
        let (_, peer) = listener.accept().await.unwrap();
        assert_eq!(io.inner().get_ref().local_addr().unwrap(), peer);
        assert!(io.inner().get_ref().nodelay().unwrap());

        let https: http::Uri = format!("https://127.0.0.1:{port}").parse().unwrap();
        let io = CoalescingConnector.call(https).await.unwrap();
        let (_, peer) = listener.accept().await.unwrap();
        assert_eq!(io.inner().get_ref().local_addr().unwrap(), peer);

        let unix: http::Uri = "unix://127.0.0.1/x".parse().unwrap();
        let refused = CoalescingConnector.call(unix).await.unwrap_err();
        assert!(refused.to_string().contains("only http://"), "{refused}");
    }

    #[test]
    fn tls_settings_and_the_scheme_must_agree() {
        let https = traced_channel_tls("https://127.0.0.1:1", "", ChannelTls::default());
        assert!(
            matches!(https, Err(ChannelError::HttpsNeedsCa)),
            "{https:?}"
        );
        let ca = ChannelTls {
            ca_file: "/nonexistent/ca.pem",
            domain: "",
        };
        let plain = traced_channel_tls("http://127.0.0.1:1", "", ca);
        assert!(
            matches!(plain, Err(ChannelError::TlsNeedsHttps)),
            "{plain:?}"
        );
        let missing = traced_channel_tls("https://127.0.0.1:1", "", ca).unwrap_err();
        assert!(
            missing.to_string().contains("/nonexistent/ca.pem"),
            "{missing}"
        );
    }
}
