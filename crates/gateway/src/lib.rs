//! Gateway: the front door. Owns the client protocols: the WebSocket RPC on `/ws` (and on `/`,
//! where OpenClaw's clients connect), the OpenAI-compatible `/v1/chat/completions` and
//! `/v1/models`, the web chat page on `/`, and the `<prefix>.ask` request/reply responder.
//! Consumes client frames; produces InboundMessages on `<prefix>.inbound.<channel>` and streams
//! each run's SystemEvents and final reply back to the client that sent it. Idempotency records
//! live in memory, so every replica sees them.

mod ask;
mod config;
mod device;
mod dispatch;
mod error;
mod feed;
mod frames;
mod guard;
mod handshake;
mod history;
mod http;
mod inbox;
mod known;
mod limits;
mod main_key;
mod memories;
mod methods;
mod openai;
mod operator;
mod params;
mod principal;
mod sessions;
mod state;
mod status;
mod telegram_poll;
mod usage;
mod watch;
mod webhooks;
mod ws;

pub use agentloop_lifecycle::MemoryEndpoint;
pub use config::{GatewayConfig, GatewaySettings, ModelPolicy, PLACEHOLDER_TOKENS, Price};
pub use device::DeviceError;
pub use error::{GatewayError, RequestError};
pub use principal::{Scope, Secret, TokenGrant};

/// A fuzzing entry, not an API: one client frame through what the gateway reads of it before
/// a client is authenticated (the frame's JSON, `connect`'s params, the protocol range, the
/// token and a device's signed proof). `fuzz/fuzz_targets/gateway_frame.rs` drives it.
#[doc(hidden)]
pub fn fuzz_frame(text: &str) {
    let Ok(frame) = serde_json::from_str::<serde_json::Value>(text) else {
        return;
    };
    let _ = frame.get("method").and_then(serde_json::Value::as_str);
    let params = frame
        .get("params")
        .cloned()
        .unwrap_or(serde_json::Value::Null);
    if let Ok(connect) = handshake::ConnectParams::parse(params) {
        let _ = connect.protocol();
        let _ = connect.token();
        let _ = connect.device_id("fuzz-nonce", 1_700_000_000_000);
    }
}

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use agentloop_bus::Bus;
use agentloop_lifecycle::Health;
use tokio_util::sync::CancellationToken;

use crate::dispatch::Sessions;
use crate::guard::Guard;

const SERVICE: &str = "gateway";
/// The largest memory answer the gateway reads. tonic's default (4 MiB) is less than a long
/// transcript; `chat.history` pages are cut far below this (see `history`).
const MEMORY_MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// A gateway whose HTTP listener is bound.
pub struct Gateway {
    listener: tokio::net::TcpListener,
    config: GatewayConfig,
    guard: Guard,
    health: Health,
    sessions: Sessions,
}

impl Gateway {
    /// Binds the HTTP address; `health` is what `/readyz` and `/metrics` report (the whole
    /// process in `agentloop all`).
    ///
    /// # Errors
    /// [`GatewayError::Bind`], [`GatewayError::MemoryUrl`] for a malformed `[memory] url`,
    /// [`GatewayError::PlaceholderToken`] for a placeholder token outside dev mode,
    /// [`GatewayError::InvalidToken`], [`GatewayError::InvalidSetting`], or
    /// [`GatewayError::InvalidChannels`].
    pub async fn bind(config: GatewayConfig, health: Health) -> Result<Self, GatewayError> {
        if let Some(token) = config.gateway.placeholder_token() {
            return Err(GatewayError::PlaceholderToken {
                token: token.to_owned(),
            });
        }
        if let Some((principal, reason)) = config.gateway.token_problem() {
            return Err(GatewayError::InvalidToken { principal, reason });
        }
        config
            .channels
            .validate()
            .map_err(GatewayError::InvalidChannels)?;
        let guard = Guard::new(&config.gateway)?;
        let channel = config.memory.channel()?;
        let addr = config.gateway.listen.clone();
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .map_err(|source| GatewayError::Bind { addr, source })?;
        Ok(Self {
            listener,
            config,
            guard,
            health,
            sessions: Sessions::new(channel).max_decoding_message_size(MEMORY_MAX_MESSAGE_BYTES),
        })
    }

    /// Returns the bound HTTP address.
    ///
    /// # Errors
    /// The socket error.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves HTTP, WebSocket and `ask` until `shutdown`.
    ///
    /// # Errors
    /// Startup failures of the bus side.
    pub async fn serve(self, shutdown: CancellationToken) -> Result<(), GatewayError> {
        let Self {
            listener,
            config,
            guard,
            health,
            sessions,
        } = self;
        if let Ok(addr) = listener.local_addr() {
            tracing::info!(%addr, "gateway listening (/, /ws, /v1/chat/completions)");
        }
        let bus_cell: Arc<OnceLock<Bus>> = Arc::new(OnceLock::new());
        let state = state::AppState {
            bus: bus_cell.clone(),
            sessions,
            known_sessions: Arc::default(),
            config: Arc::new(config.clone()),
            guard: Arc::new(guard),
            limits: limits::Limits::new(&config.gateway),
            shutdown: shutdown.clone(),
            health: health.clone(),
            started: std::time::Instant::now(),
        };
        let guard = state.guard.clone();
        let app = agentloop_lifecycle::admin_routes(health.clone())
            .merge(http::routes(state))
            .layer(axum::middleware::from_fn(move |request, next| {
                guard::check_headers(guard.clone(), request, next)
            }));
        let http_shutdown = shutdown.clone();
        let http = tokio::spawn(async move {
            // Small frames (a streamed word, a `res`) must leave at once, not wait for Nagle.
            let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
                if let Err(err) = tcp.set_nodelay(true) {
                    tracing::debug!(error = %err, "cannot set TCP_NODELAY");
                }
            });
            let served = axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .with_graceful_shutdown(async move { http_shutdown.cancelled().await })
            .await;
            if let Err(err) = served {
                tracing::error!(error = %err, "gateway http server failed");
            }
        });
        let result = async {
            let Some(bus) = Bus::connect_retrying(&config.bus, SERVICE, &shutdown).await? else {
                return Ok(());
            };
            let _ = bus_cell.set(bus.clone());
            let poller = config.channels.telegram.polls().then(|| {
                tokio::spawn(telegram_poll::run(
                    bus.clone(),
                    config.channels.telegram.clone(),
                    shutdown.clone(),
                ))
            });
            let served = ask::serve(bus, config, health, shutdown.clone()).await;
            if let Some(poller) = poller {
                if served.is_err() {
                    poller.abort();
                }
                let _ = poller.await;
            }
            served
        }
        .await;
        if result.is_err() {
            // Without a bus the HTTP side cannot serve clients either.
            shutdown.cancel();
        }
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
