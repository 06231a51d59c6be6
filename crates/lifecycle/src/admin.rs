//! `/healthz`, `/readyz` and `/metrics` over HTTP.

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
        [("content-type", "text/plain; version=0.0.4")],
        health.render_metrics(),
    )
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
        let addr = if addr.is_empty() { "127.0.0.1:0" } else { addr };
        let listener = tokio::net::TcpListener::bind(addr).await?;
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
