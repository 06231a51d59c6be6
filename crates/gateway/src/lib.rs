//! Gateway: the front door. Serves HTTP (`/healthz`, `/readyz`, `/metrics`) and answers
//! `<prefix>.ask` requests: an InboundMessage in, published on `<prefix>.inbound.<channel>`, and
//! the final OutboundMessage back to the caller once delivery hands it over.

mod ask;
mod config;

pub use config::{GatewayConfig, GatewaySettings};

use std::net::SocketAddr;

use agentloop_lifecycle::Health;
use tokio_util::sync::CancellationToken;

/// What stops the gateway.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The bus could not be set up.
    #[error("bus setup failed")]
    Bus(#[from] agentloop_bus::BusError),
    /// The HTTP address could not be bound.
    #[error("failed to bind {addr}")]
    Bind {
        /// The address configured.
        addr: String,
        /// The bind error.
        #[source]
        source: std::io::Error,
    },
    /// The `ask` subject could not be subscribed.
    #[error("failed to subscribe to {subject}")]
    Subscribe {
        /// The subject.
        subject: String,
        /// The client's error.
        #[source]
        source: async_nats::SubscribeError,
    },
}

/// A gateway whose HTTP listener is bound.
pub struct Gateway {
    listener: tokio::net::TcpListener,
    config: GatewayConfig,
    health: Health,
}

impl Gateway {
    /// Binds the HTTP address; `health` is what `/readyz` and `/metrics` report (the whole
    /// process in `agentloop all`).
    ///
    /// # Errors
    /// [`GatewayError::Bind`].
    pub async fn bind(config: GatewayConfig, health: Health) -> Result<Self, GatewayError> {
        let addr = config.gateway.listen.clone();
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .map_err(|source| GatewayError::Bind { addr, source })?;
        Ok(Self {
            listener,
            config,
            health,
        })
    }

    /// Returns the bound HTTP address.
    ///
    /// # Errors
    /// The socket error.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves HTTP and `ask` until `shutdown`.
    ///
    /// # Errors
    /// Startup failures of the bus side.
    pub async fn serve(self, shutdown: CancellationToken) -> Result<(), GatewayError> {
        let Self {
            listener,
            config,
            health,
        } = self;
        if let Ok(addr) = listener.local_addr() {
            tracing::info!(%addr, "gateway listening");
        }
        let app = agentloop_lifecycle::admin_routes(health.clone());
        let http_shutdown = shutdown.clone();
        let http = tokio::spawn(async move {
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(async move { http_shutdown.cancelled().await })
                .await;
            if let Err(err) = served {
                tracing::error!(error = %err, "gateway http server failed");
            }
        });
        let result = ask::serve(config, health, shutdown).await;
        let _ = http.await;
        result
    }
}

/// Binds and serves the gateway until `shutdown`.
///
/// # Errors
/// Startup failures.
pub async fn run(config: GatewayConfig, shutdown: CancellationToken) -> Result<(), GatewayError> {
    Gateway::bind(config, Health::new())
        .await?
        .serve(shutdown)
        .await
}
