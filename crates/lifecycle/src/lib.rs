//! Process lifecycle shared by every service: layered configuration (defaults < TOML file <
//! environment), shutdown on SIGINT/SIGTERM, the health, readiness and metrics endpoints with a
//! service run behind them ([`run_with_admin`]), and the one retry policy ([`retry`]).

mod admin;
mod config;
mod config_check;
mod config_env;
mod config_schema;
mod health;
mod process;
mod retry;

pub use admin::{AdminError, AdminServer, admin_routes, run_with_admin};
pub use config::{
    ConfigError, DEFAULT_MODEL, MemoryEndpoint, MemoryEndpointError, config_path_from_args,
    list_or_commas, load_config, load_config_from, split_commas,
};
pub use config_check::{UnknownName, UnknownNames};
pub use config_schema::Schema;
pub use health::{Counter, CounterFamily, GaugeFamily, Health, HistogramFamily, Labels, Readiness};
/// The metric types services use beside [`Counter`].
pub use prometheus_client::metrics::gauge::Gauge;
pub use retry::{Backoff, retry};

/// For [`config_schema!`]: the registry it submits to, so that callers need no dependency of
/// their own.
#[doc(hidden)]
pub use inventory as __inventory;

use tokio_util::sync::CancellationToken;

/// Returns a token cancelled on the first SIGINT or SIGTERM; a second signal exits at once.
pub fn shutdown_on_signals() -> CancellationToken {
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutdown requested, draining (send the signal again to exit at once)");
        cancel.cancel();
        wait_for_signal().await;
        tracing::warn!("second signal, exiting now");
        std::process::exit(130);
    });
    token
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = match signal(SignalKind::terminate()) {
            Ok(term) => term,
            Err(err) => {
                tracing::error!(error = %err, "cannot listen for SIGTERM, only Ctrl-C stops this process");
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
