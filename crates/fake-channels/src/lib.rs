//! Fake chat-app servers for tests, speaking each app's real wire format: request paths, JSON
//! shapes and error answers (Telegram's `{"ok":false,"error_code":429,...,"parameters":
//! {"retry_after":N}}`, Slack's 429 with `Retry-After` and `{"ok":false,"error":...}`). They record what they were sent and fail on request.

pub mod slack;
pub mod telegram;
pub mod webhook;

/// Serves `app` on a free loopback port; returns its address and the server task.
///
/// # Panics
/// When no port can be bound.
async fn serve(app: axum::Router) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a free loopback port");
    let addr = listener.local_addr().expect("a bound address");
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, server)
}
