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

/// Opens plain TCP connections (`http://` endpoints) whose writes go out per turn of the
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
            if uri.scheme_str() != Some("http") {
                // No TLS is built in: a gRPC peer is reached over the cluster's network.
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("{uri}: only http:// gRPC endpoints are supported"),
                ));
            }
            let host = uri.host().ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("no host in {uri}"),
                )
            })?;
            // An IPv6 literal comes bracketed in the URI.
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let port = uri.port_u16().unwrap_or(80);
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
    let authorization = if secret.is_empty() {
        None
    } else {
        Some(
            format!("Bearer {secret}")
                .parse()
                .map_err(|_| ChannelError::Secret)?,
        )
    };
    let channel = tonic::transport::Endpoint::from_shared(url.to_owned())
        .map_err(ChannelError::Url)?
        .connect_timeout(std::time::Duration::from_secs(2))
        .http2_keep_alive_interval(std::time::Duration::from_secs(30))
        .connect_with_connector_lazy(CoalescingConnector);
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

#[cfg(test)]
mod tests {
    use super::*;
    use tower_service::Service as _;

    #[tokio::test]
    async fn the_connector_reaches_http_endpoints_and_refuses_others() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let uri: http::Uri = format!("http://127.0.0.1:{port}").parse().unwrap();
        let io = CoalescingConnector.call(uri).await.unwrap();
        let (_, peer) = listener.accept().await.unwrap();
        assert_eq!(io.inner().get_ref().local_addr().unwrap(), peer);
        assert!(io.inner().get_ref().nodelay().unwrap());

        let https: http::Uri = format!("https://127.0.0.1:{port}").parse().unwrap();
        let refused = CoalescingConnector.call(https).await.unwrap_err();
        assert!(refused.to_string().contains("only http://"), "{refused}");
    }
}
