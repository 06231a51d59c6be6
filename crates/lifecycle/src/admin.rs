//! `/healthz`, `/readyz` and `/metrics` over HTTP, and a service run behind them.

use std::future::Future;
use std::net::SocketAddr;

use axum::{Router, extract::State, http::StatusCode, response::IntoResponse, routing::get};
use tokio_util::sync::CancellationToken;

use crate::Health;

/// Returns the admin routes for a health registry, to serve alone or merge into another router.
pub fn admin_routes(health: Health) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(health)
}

async fn readyz(State(health): State<Health>) -> impl IntoResponse {
    match health.readiness() {
        (true, _) => (StatusCode::OK, "ready\n".to_owned()),
        (false, waiting) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {}\n", waiting.join(", ")),
        ),
    }
}

async fn metrics(State(health): State<Health>) -> impl IntoResponse {
    (
        [(
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        health.render_metrics(),
    )
}

/// The admin server's address could not be bound.
#[derive(Debug, thiserror::Error)]
#[error("failed to bind admin address {addr}")]
pub struct AdminError {
    /// The address tried.
    pub addr: String,
    /// The bind error.
    #[source]
    pub source: std::io::Error,
}

/// Runs a service behind its own admin server: binds `admin_listen` (empty: an ephemeral
/// loopback port, logged), serves `/healthz`, `/readyz` and `/metrics` for the [`Health`] it
/// hands to `serve`, and stops serving them when `serve` returns or `shutdown` is cancelled.
///
/// # Errors
/// [`AdminError`] (through `E: From<AdminError>`) when the address cannot be bound, else what
/// `serve` returns, as soon as it returns.
pub async fn run_with_admin<E, Fut>(
    service: &str,
    admin_listen: &str,
    shutdown: CancellationToken,
    serve: impl FnOnce(Health, CancellationToken) -> Fut,
) -> Result<(), E>
where
    Fut: Future<Output = Result<(), E>>,
    E: From<AdminError>,
{
    let health = Health::new();
    let bind_error = |source| AdminError {
        addr: effective_addr(admin_listen).to_owned(),
        source,
    };
    let admin = AdminServer::bind(admin_listen, health.clone())
        .await
        .map_err(bind_error)?;
    let local = admin.local_addr().map_err(bind_error)?;
    tracing::info!(service, admin = %local, "admin endpoints listening (/healthz, /readyz, /metrics)");
    // Stopped with the service, also when it fails to start: a process that cannot work must
    // exit with its error, not answer `/healthz` until someone sends it a signal.
    let admin_stop = shutdown.child_token();
    let admin_served = admin.serve(admin_stop.clone());
    let service_served = async {
        let served = serve(health, shutdown).await;
        admin_stop.cancel();
        served
    };
    let ((), served) = tokio::join!(admin_served, service_served);
    served
}

/// An empty admin address means an ephemeral loopback port.
fn effective_addr(addr: &str) -> &str {
    if addr.is_empty() { "127.0.0.1:0" } else { addr }
}

/// A bound admin HTTP server.
pub struct AdminServer {
    listener: tokio::net::TcpListener,
    health: Health,
}

impl AdminServer {
    /// Binds the admin address; an empty address means an ephemeral loopback port.
    ///
    /// # Errors
    /// The bind error.
    pub async fn bind(addr: &str, health: Health) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(effective_addr(addr)).await?;
        Ok(Self { listener, health })
    }

    /// Returns the bound address.
    ///
    /// # Errors
    /// The socket error.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` is cancelled.
    pub async fn serve(self, shutdown: CancellationToken) {
        let app = admin_routes(self.health);
        let result = axum::serve(self.listener, app)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
        if let Err(err) = result {
            tracing::warn!(error = %err, "admin server stopped");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    enum TestError {
        #[error(transparent)]
        Admin(#[from] AdminError),
        #[error("cannot start")]
        Startup,
    }

    /// A loopback address free a moment ago.
    async fn free_addr() -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        listener.local_addr().unwrap().to_string()
    }

    async fn answers(addr: &str) -> bool {
        tokio::net::TcpStream::connect(addr).await.is_ok()
    }

    async fn status(addr: &str, path: &str) -> String {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_owned()
    }

    #[tokio::test]
    async fn a_service_that_fails_to_start_returns_its_error_and_takes_the_admin_server_down() {
        let addr = free_addr().await;
        let result: Result<(), TestError> =
            run_with_admin("test", &addr, CancellationToken::new(), |_, _| async {
                assert!(
                    answers(&addr).await,
                    "admin answers while the service starts"
                );
                Err(TestError::Startup)
            })
            .await;
        assert!(matches!(result, Err(TestError::Startup)), "{result:?}");
        assert!(!answers(&addr).await, "admin is gone with the service");
    }

    #[tokio::test]
    async fn the_service_gets_the_health_the_admin_server_reports() {
        let addr = free_addr().await;
        let result: Result<(), TestError> = run_with_admin(
            "test",
            &addr,
            CancellationToken::new(),
            |health: Health, _| {
                let ready = health.component("test");
                let addr = &addr;
                async move {
                    assert_eq!(status(addr, "/readyz").await, "503");
                    ready.set(true);
                    assert_eq!(status(addr, "/readyz").await, "200");
                    Ok(())
                }
            },
        )
        .await;
        assert!(result.is_ok(), "{result:?}");
    }

    #[tokio::test]
    async fn an_address_in_use_is_an_admin_error_naming_it() {
        let taken = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = taken.local_addr().unwrap().to_string();
        let result: Result<(), TestError> =
            run_with_admin("test", &addr, CancellationToken::new(), |_, _| async {
                panic!("the service must not start without its admin server")
            })
            .await;
        match result {
            Err(TestError::Admin(err)) => assert_eq!(err.addr, addr),
            other => panic!("expected an admin error, got {other:?}"),
        }
    }
}
