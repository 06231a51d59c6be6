//! A receiver of agentloop's signed webhook replies, standing in for a user's own program: it
//! checks each POST's `X-Agentloop-Signature` as that program would, records it, and answers
//! with scripted failures first.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use axum::{
    Router,
    body::Bytes,
    extract::State,
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Response},
    routing::post,
};
use hmac::{Hmac, KeyInit as _, Mac as _};
use serde_json::Value;
use sha2::Sha256;

/// A reply as received.
#[derive(Debug, Clone)]
pub struct Received {
    /// The JSON body.
    pub body: Value,
    /// Whether its signature matched the secret.
    pub signed: bool,
    /// Whether it was answered 2xx.
    pub accepted: bool,
}

#[derive(Default)]
struct Shared {
    failures: VecDeque<(u16, Option<u64>)>,
    received: Vec<Received>,
}

/// A running receiver; stops when dropped.
pub struct FakeReceiver {
    addr: SocketAddr,
    shared: Arc<Mutex<Shared>>,
    server: tokio::task::JoinHandle<()>,
}

impl FakeReceiver {
    /// Starts on a free loopback port, checking signatures against `secret`.
    ///
    /// # Panics
    /// When no port can be bound.
    pub async fn start(secret: &str) -> Self {
        let shared = Arc::new(Mutex::new(Shared::default()));
        let app = Router::new()
            .route("/replies", post(receive))
            .with_state((secret.to_owned(), shared.clone()));
        let (addr, server) = crate::serve(app).await;
        Self {
            addr,
            shared,
            server,
        }
    }

    /// The URL replies are POSTed to.
    pub fn url(&self) -> String {
        format!("http://{}/replies", self.addr)
    }

    /// Answers the next POSTs with these statuses (and `Retry-After` seconds), in order.
    pub fn fail_next(&self, failures: impl IntoIterator<Item = (u16, Option<u64>)>) {
        self.lock().failures.extend(failures);
    }

    /// Every POST received so far.
    pub fn received(&self) -> Vec<Received> {
        self.lock().received.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for FakeReceiver {
    fn drop(&mut self) {
        self.server.abort();
    }
}

type AppState = (String, Arc<Mutex<Shared>>);

async fn receive(
    State((secret, shared)): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let signed = signature_matches(
        &secret,
        &header("x-agentloop-timestamp"),
        &header("x-agentloop-signature"),
        &body,
    );
    let mut shared = shared.lock().unwrap_or_else(PoisonError::into_inner);
    let (status, retry_after) = match shared.failures.pop_front() {
        Some(failure) => failure,
        None if signed => (200, None),
        None => (401, None),
    };
    shared.received.push(Received {
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        signed,
        accepted: (200..300).contains(&status),
    });
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    match retry_after {
        Some(seconds) => (status, [(header::RETRY_AFTER, seconds.to_string())]).into_response(),
        None => status.into_response(),
    }
}

fn signature_matches(secret: &str, timestamp: &str, signature: &str, body: &[u8]) -> bool {
    let Some(given) = signature
        .strip_prefix("sha256=")
        .and_then(|hex| hex::decode(hex).ok())
    else {
        return false;
    };
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret.as_bytes()) else {
        return false;
    };
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    mac.verify_slice(&given).is_ok()
}
