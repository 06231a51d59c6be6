//! The gateway under attack from web pages: each test performs one attack against a running
//! gateway (and the stack behind it where the attack needs one) and shows it refused. Gateways
//! with settings of their own join a sandbox's bus and memory (shared with
//! `gateway_exhaustion`).

use std::net::SocketAddr;

use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::{self, client::IntoClientRequest as _};

use agentloop_testkit::ServiceHandle;

use crate::gateway::{Client, runs_of};
use crate::harness::Sandbox;

/// A second gateway of a sandbox, with `[gateway]` settings given as JSON (the way a config file
/// gives them, so a setting this gateway does not know is ignored rather than a build error).
pub(crate) struct Gateway {
    pub(crate) addr: SocketAddr,
    handle: ServiceHandle<agentloop_gateway::GatewayError>,
}

impl Gateway {
    pub(crate) async fn start(sandbox: &Sandbox, mut settings: Value) -> anyhow::Result<Self> {
        settings["listen"] = json!("127.0.0.1:0");
        let mut config = agentloop_gateway::GatewayConfig {
            gateway: serde_json::from_value(settings)?,
            ..Default::default()
        };
        config.bus.url = sandbox.nats.url().to_owned();
        config.bus.prefix = sandbox.prefix.clone();
        config.memory.url = sandbox.memory_url.clone();
        config.models.default_model = "openai/fake-echo".to_owned();
        let gateway =
            agentloop_gateway::Gateway::bind(config, agentloop_lifecycle::Health::new()).await?;
        let addr = gateway.local_addr()?;
        let handle = agentloop_testkit::spawn("gateway", move |t| gateway.serve(t));
        Ok(Self { addr, handle })
    }

    pub(crate) async fn stop(self) -> anyhow::Result<()> {
        self.handle.shutdown().await
    }
}

/// Opens `/ws` at `addr` with extra request headers; the HTTP status when the upgrade is refused.
pub(crate) async fn upgrade(addr: SocketAddr, headers: &[(&str, &str)]) -> Result<Client, u16> {
    let mut request = format!("ws://{addr}/ws").into_client_request().unwrap();
    for (name, value) in headers {
        request.headers_mut().insert(
            tungstenite::http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
    }
    match tokio_tungstenite::connect_async(request).await {
        Ok((ws, _)) => Ok(Client {
            ws,
            next_id: 1,
            events: Vec::new(),
        }),
        Err(tungstenite::Error::Http(response)) => Err(response.status().as_u16()),
        Err(other) => panic!("upgrade failed without an HTTP answer: {other}"),
    }
}

/// Reads frames until the server closes; returns the close code.
pub(crate) async fn closed(client: &mut Client) -> u16 {
    loop {
        match client.frame().await.unwrap() {
            Ok(_) => continue,
            Err((code, _)) => return code,
        }
    }
}

#[tokio::test]
async fn a_cross_origin_websocket_upgrade_is_refused_and_a_same_origin_one_served() {
    // Arrange: a token-less gateway on loopback, which a browser on this host would reach.
    let sandbox = Sandbox::start().await.unwrap();
    let addr = sandbox.gateway_addr;
    let own = format!("http://{addr}");

    // Act: a page of another site opens the WebSocket, as its script would.
    let foreign = upgrade(addr, &[("Origin", "http://evil.example")]).await;
    let sandboxed = upgrade(addr, &[("Origin", "null")]).await;
    let same = upgrade(addr, &[("Origin", own.as_str())]).await;

    // Assert
    assert_eq!(foreign.err(), Some(403));
    assert_eq!(sandboxed.err(), Some(403));
    let mut same = same.unwrap_or_else(|status| panic!("own page refused with {status}"));
    let hello = same.call("connect", json!({})).await.unwrap();
    assert_eq!(hello["ok"], true, "{hello}");
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_text_plain_post_to_chat_completions_is_refused_and_starts_no_run() {
    // Arrange
    let sandbox = Sandbox::start().await.unwrap();
    Client::connected(&sandbox, None).await.unwrap(); // memory ready
    let url = format!("http://{}/v1/chat/completions", sandbox.gateway_addr);
    let body = json!({"model": "agentloop", "user": "victim:plain",
                      "messages": [{"role": "user", "content": "injected"}]})
    .to_string();
    let http = reqwest::Client::new();

    // Act: the "simple" request a cross-site form or fetch sends without a preflight.
    let plain = http
        .post(&url)
        .header("content-type", "text/plain")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    let form = http
        .post(&url)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    let json_body = http
        .post(&url)
        .header("content-type", "application/json; charset=utf-8")
        .body(body.replace("victim:plain", "client:json"))
        .send()
        .await
        .unwrap();

    // Assert
    assert_eq!(plain.status().as_u16(), 415);
    let error: Value = plain.json().await.unwrap();
    assert_eq!(error["error"]["code"], "unsupported_media_type", "{error}");
    assert_eq!(form.status().as_u16(), 415);
    assert_eq!(json_body.status().as_u16(), 200);
    assert_eq!(runs_of(&sandbox, "victim:plain").await.unwrap(), 0);
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_foreign_host_is_refused_on_every_route() {
    // Arrange: DNS rebinding points evil.example at 127.0.0.1; the browser then sends
    // `Host: evil.example:<port>` and treats the answers as evil.example's own.
    let sandbox = Sandbox::start().await.unwrap();
    let addr = sandbox.gateway_addr;
    let foreign = format!("evil.example:{}", addr.port());
    let http = reqwest::Client::new();

    // Act
    let page = http
        .get(format!("http://{addr}/"))
        .header("host", &foreign)
        .send()
        .await
        .unwrap();
    let models = http
        .get(format!("http://{addr}/v1/models"))
        .header("host", &foreign)
        .send()
        .await
        .unwrap();
    let ws = upgrade(addr, &[("Host", foreign.as_str())]).await;
    let local = http
        .get(format!("http://{addr}/v1/models"))
        .header("host", format!("localhost:{}", addr.port()))
        .send()
        .await
        .unwrap();

    // Assert
    assert_eq!(page.status().as_u16(), 403);
    assert_eq!(models.status().as_u16(), 403);
    assert_eq!(ws.err(), Some(403));
    assert_eq!(local.status().as_u16(), 200);
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_web_chat_page_carries_a_content_security_policy_and_refuses_framing() {
    // Arrange
    let sandbox = Sandbox::start().await.unwrap();
    let http = reqwest::Client::new();

    // Act
    let page = http
        .get(format!("http://{}/", sandbox.gateway_addr))
        .send()
        .await
        .unwrap();

    // Assert
    let header = |name: &str| {
        page.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default()
    };
    let csp = header("content-security-policy");
    assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
    assert!(csp.contains("script-src 'self'"), "{csp}");
    assert!(!csp.contains("unsafe-inline"), "{csp}");
    assert_eq!(header("x-frame-options"), "DENY");
    assert_eq!(header("x-content-type-options"), "nosniff");
    let html = page.text().await.unwrap();
    assert!(
        !html.contains("<script>"),
        "inline script would need 'unsafe-inline'"
    );
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_trusted_proxy_forwards_its_clients_address_and_an_untrusted_peer_cannot() {
    // Arrange: no tokens, so only loopback clients are served. One gateway sits behind a proxy
    // on 127.0.0.1; the other trusts a proxy elsewhere, so its loopback peers forge the header.
    let sandbox = Sandbox::start().await.unwrap();
    Client::connected(&sandbox, None).await.unwrap(); // memory ready
    let behind_proxy = Gateway::start(&sandbox, json!({"trusted_proxies": ["127.0.0.1"]}))
        .await
        .unwrap();
    let elsewhere = Gateway::start(
        &sandbox,
        json!({"trusted_proxies": ["10.0.0.0/8"], "max_connections_per_client": 1}),
    )
    .await
    .unwrap();
    let http = reqwest::Client::new();
    let models = |addr: SocketAddr, forwarded: &str| {
        http.get(format!("http://{addr}/v1/models"))
            .header("x-forwarded-for", forwarded.to_owned())
            .send()
    };

    // Act: a remote client through the proxy; the proxy's own loopback address must not make
    // it loopback.
    let remote = models(behind_proxy.addr, "203.0.113.9").await.unwrap();
    let local = models(behind_proxy.addr, "127.0.0.1").await.unwrap();
    // An untrusted peer names other clients, to dodge its per-address connection cap.
    let first = upgrade(elsewhere.addr, &[("X-Forwarded-For", "198.51.100.1")]).await;
    let second = upgrade(elsewhere.addr, &[("X-Forwarded-For", "198.51.100.2")]).await;
    let forged = models(elsewhere.addr, "203.0.113.9").await.unwrap();

    // Assert
    assert_eq!(remote.status().as_u16(), 401);
    assert_eq!(local.status().as_u16(), 200);
    assert!(first.is_ok());
    assert_eq!(second.err(), Some(429));
    assert_eq!(forged.status().as_u16(), 200, "the header was not ignored");
    drop(first);
    behind_proxy.stop().await.unwrap();
    elsewhere.stop().await.unwrap();
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_key_pair_spelled_like_another_sessions_does_not_swallow_its_message() {
    // Arrange: session keys hold `:`, so ("agent", "main:x:k") once made the same stream
    // message id as ("agent:main:x", "k"), and the stream dropped the second as a duplicate.
    let sandbox = Sandbox::start().await.unwrap();
    Client::connected(&sandbox, None).await.unwrap(); // memory ready
    let url = format!("http://{}/v1/chat/completions", sandbox.gateway_addr);
    let http = reqwest::Client::new();
    let send = |session: &'static str, key: &'static str, text: &'static str| {
        let request = http
            .post(&url)
            .header("x-session-key", session)
            .header("idempotency-key", key)
            .json(&json!({"model": "agentloop",
                          "messages": [{"role": "user", "content": text}]}))
            .timeout(std::time::Duration::from_secs(20));
        async move {
            let answer: Value = request.send().await.unwrap().json().await.unwrap();
            answer["choices"][0]["message"]["content"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        }
    };

    // Act: the attacker's message first, the victim's within the stream's duplicate window.
    let planted = send("agent", "main:x:k", "planted").await;
    let victim = send("agent:main:x", "k", "the victim's").await;

    // Assert: each session got its own message answered.
    assert_eq!(planted, "echo: planted");
    assert_eq!(victim, "echo: the victim's");
    sandbox.shutdown().await.unwrap();
}
