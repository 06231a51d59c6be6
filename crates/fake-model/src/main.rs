//! `agentloop-fake-model --listen 127.0.0.1:18181`: the fake model server as a process.

use anyhow::Context as _;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

// One thread: it stands in for a remote model on the same cores as the stack it serves, and a
// second worker only added wakeups to what the bench measures around it.
#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    use agentloop_fake_model::{FakeModelConfig, FakeModelState, serve};
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt().with_env_filter(filter).init();
    let listen_env = std::env::var("FAKE_MODEL_LISTEN").ok();
    let config = FakeModelConfig::from_args(std::env::args().skip(1), listen_env)?;
    // Install the handlers before binding, so a signal sent once the address is printed is caught.
    let mut terminate = signal(SignalKind::terminate()).context("failed to install SIGTERM")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("failed to install SIGINT")?;
    let listener = tokio::net::TcpListener::bind(&config.listen)
        .await
        .with_context(|| format!("failed to bind {}", config.listen))?;
    let addr = listener
        .local_addr()
        .context("failed to read the bound address")?;
    tracing::info!(%addr, "fake model listening");
    println!("listening on http://{addr}");
    let shutdown = CancellationToken::new();
    let on_signal = shutdown.clone();
    tokio::spawn(async move {
        tokio::select! { _ = terminate.recv() => {}, _ = interrupt.recv() => {} }
        on_signal.cancel();
    });
    let state = FakeModelState::new(&config);
    serve(listener, state, shutdown)
        .await
        .context("fake model server failed")
}
