//! The gateway under attack: each test performs one attack against a running gateway (and the
//! stack behind it where the attack needs one) and shows it refused, and the gateway still
//! serving afterwards. Gateways with settings of their own join a sandbox's bus and memory.

use std::net::SocketAddr;

use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::{self, client::IntoClientRequest as _};

use agentloop_testkit::ServiceHandle;

use crate::gateway::{Client, runs_of};
use crate::harness::Sandbox;

/// A second gateway of a sandbox, with `[gateway]` settings given as JSON (the way a config file
/// gives them, so a setting this gateway does not know is ignored rather than a build error).
struct Gateway {
    addr: SocketAddr,
    handle: ServiceHandle<agentloop_gateway::GatewayError>,
}

impl Gateway {
    async fn start(sandbox: &Sandbox, mut settings: Value) -> anyhow::Result<Self> {
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

    async fn stop(self) -> anyhow::Result<()> {
        self.handle.shutdown().await
    }
}

/// Opens `/ws` at `addr` with extra request headers; the HTTP status when the upgrade is refused.
async fn upgrade(addr: SocketAddr, headers: &[(&str, &str)]) -> Result<Client, u16> {
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
async fn closed(client: &mut Client) -> u16 {
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
async fn a_socket_that_never_sends_connect_is_closed() {
    // Arrange
    let sandbox = Sandbox::start().await.unwrap();
    let gateway = Gateway::start(&sandbox, json!({"connect_timeout_ms": 300}))
        .await
        .unwrap();

    // Act: open the socket and say nothing.
    let mut idle = Client::open_at(gateway.addr).await.unwrap();
    let code = closed(&mut idle).await;

    // Assert: closed by the gateway (policy), and a client that connects is still served.
    assert_eq!(code, 1008);
    let mut ok = Client::connected_at(gateway.addr, None).await.unwrap();
    let list = ok.call("sessions.list", json!({})).await.unwrap();
    assert_eq!(list["ok"], true, "{list}");
    gateway.stop().await.unwrap();
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn sockets_waiting_for_connect_and_sockets_per_address_are_capped() {
    // Arrange
    let sandbox = Sandbox::start().await.unwrap();
    let gateway = Gateway::start(
        &sandbox,
        json!({"max_unauthenticated": 2, "max_connections_per_client": 3}),
    )
    .await
    .unwrap();

    // Act: two silent sockets fill the unauthenticated places.
    let silent_a = upgrade(gateway.addr, &[]).await.unwrap();
    let mut b = upgrade(gateway.addr, &[]).await.unwrap();
    let third_waiting = upgrade(gateway.addr, &[]).await;
    // One connects, which frees its place; the address now holds its three.
    let hello = b.call("connect", json!({})).await.unwrap();
    let mut c = upgrade(gateway.addr, &[]).await.unwrap();
    let fourth = upgrade(gateway.addr, &[]).await;

    // Assert
    assert_eq!(third_waiting.err(), Some(503));
    assert_eq!(hello["ok"], true, "{hello}");
    assert_eq!(fourth.err(), Some(429));
    let hello = c.call("connect", json!({})).await.unwrap();
    assert_eq!(hello["ok"], true, "{hello}");
    drop(silent_a);
    gateway.stop().await.unwrap();
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn failed_authentications_are_throttled_per_address() {
    // Arrange
    let sandbox = Sandbox::start().await.unwrap();
    let gateway = Gateway::start(
        &sandbox,
        json!({"tokens": ["s3cret"], "auth_failures_allowed": 2}),
    )
    .await
    .unwrap();
    let guess = |token: &'static str| async move {
        let mut client = Client::open_at(gateway.addr).await.unwrap();
        client
            .call("connect", json!({"auth": {"token": token}}))
            .await
            .unwrap()
    };

    // Act: guess tokens until the gateway stops looking, then try the right one.
    let first = guess("guess-1").await;
    let second = guess("guess-2").await;
    let third = guess("guess-3").await;
    let throttled = guess("guess-4").await;
    let right = guess("s3cret").await;
    let http = reqwest::Client::new()
        .get(format!("http://{}/v1/models", gateway.addr))
        .bearer_auth("s3cret")
        .send()
        .await
        .unwrap();

    // Assert
    for denied in [&first, &second, &third] {
        assert_eq!(denied["error"]["code"], "UNAUTHORIZED", "{denied}");
    }
    assert_eq!(throttled["error"]["code"], "RATE_LIMITED", "{throttled}");
    assert_eq!(throttled["error"]["retryable"], true, "{throttled}");
    assert_eq!(right["error"]["code"], "RATE_LIMITED", "{right}");
    assert_eq!(http.status().as_u16(), 429);
    gateway.stop().await.unwrap();
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_huge_timeout_is_cut_to_the_maximum_a_negative_one_refused_and_the_gateway_serves_on() {
    // Arrange
    let sandbox = Sandbox::start().await.unwrap();
    let mut client = Client::connected(&sandbox, None).await.unwrap();

    // Act
    let negative = client
        .call(
            "agent",
            json!({"message": "hi", "sessionKey": "t:neg", "timeout": -1}),
        )
        .await
        .unwrap();
    let huge = client
        .send(
            "agent",
            json!({"message": "huge seconds", "sessionKey": "t:huge", "timeout": 1e300}),
        )
        .await
        .unwrap();
    let accepted = client.response(&huge).await.unwrap();
    let done = client.response(&huge).await.unwrap();
    let huge_ms = client
        .send(
            "agent",
            json!({"message": "huge millis", "sessionKey": "t:huge",
                   "timeoutMs": u64::MAX}),
        )
        .await
        .unwrap();
    let accepted_ms = client.response(&huge_ms).await.unwrap();
    let done_ms = client.response(&huge_ms).await.unwrap();
    let wait = client
        .call(
            "agent.wait",
            json!({"runId": accepted_ms["payload"]["runId"], "timeoutMs": u64::MAX}),
        )
        .await
        .unwrap();

    // Assert
    assert_eq!(negative["error"]["code"], "INVALID_REQUEST", "{negative}");
    assert_eq!(accepted["payload"]["status"], "accepted", "{accepted}");
    assert_eq!(done["payload"]["status"], "ok", "{done}");
    assert_eq!(
        accepted_ms["payload"]["status"], "accepted",
        "{accepted_ms}"
    );
    assert_eq!(done_ms["payload"]["status"], "ok", "{done_ms}");
    assert_eq!(wait["payload"]["status"], "ok", "{wait}");
    let list = client.call("sessions.list", json!({})).await.unwrap();
    assert_eq!(list["ok"], true, "{list}");
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_nul_in_a_session_key_is_an_invalid_request_not_a_retryable_failure() {
    // Arrange
    let sandbox = Sandbox::start().await.unwrap();
    let mut client = Client::connected(&sandbox, None).await.unwrap();
    let key = "web:a\u{0}b";

    // Act
    let history = client
        .call("chat.history", json!({"sessionKey": key}))
        .await
        .unwrap();
    let agent = client
        .call("agent", json!({"message": "hi", "sessionKey": key}))
        .await
        .unwrap();
    let reset = client
        .call("sessions.reset", json!({"sessionKey": key}))
        .await
        .unwrap();
    let completion = reqwest::Client::new()
        .post(format!(
            "http://{}/v1/chat/completions",
            sandbox.gateway_addr
        ))
        .json(&json!({"user": key, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();

    // Assert
    for refused in [&history, &agent, &reset] {
        assert_eq!(refused["error"]["code"], "INVALID_REQUEST", "{refused}");
        assert_eq!(refused["error"]["retryable"], false, "{refused}");
    }
    assert_eq!(completion.status().as_u16(), 400);
    let after = client.call("sessions.list", json!({})).await.unwrap();
    assert_eq!(after["ok"], true, "{after}");
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_five_megabyte_transcript_is_read_page_by_page_and_the_limit_is_capped() {
    // Arrange: a session with 1,100 short entries and then 60 of 90 kB (5.4 MB), more than
    // one gRPC message of memory's may carry by default.
    let sandbox = Sandbox::start().await.unwrap();
    let mut client = Client::connected(&sandbox, None).await.unwrap();
    let id = client
        .send("agent", json!({"message": "start", "sessionKey": "t:big"}))
        .await
        .unwrap();
    let accepted = client.response(&id).await.unwrap();
    let done = client.response(&id).await.unwrap();
    assert_eq!(done["payload"]["status"], "ok", "{done}");
    let pool = sandbox.finished_runs(1).await.unwrap();
    let session_id =
        uuid::Uuid::parse_str(accepted["payload"]["sessionId"].as_str().unwrap()).unwrap();
    let before: i64 =
        sqlx::query_scalar("SELECT count(*) FROM transcript_entries WHERE session_id = $1")
            .bind(session_id)
            .fetch_one(&pool)
            .await
            .unwrap();
    sqlx::query(
        "INSERT INTO transcript_entries (session_id, entry_key, role, content) \
         SELECT $1, 'small-' || g, 'user', 'line ' || g FROM generate_series(1, 1100) g",
    )
    .bind(session_id)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO transcript_entries (session_id, entry_key, role, content) \
         SELECT $1, 'big-' || g, 'assistant', repeat('x', 90000) FROM generate_series(1, 60) g",
    )
    .bind(session_id)
    .execute(&pool)
    .await
    .unwrap();
    let total = usize::try_from(before).unwrap() + 1160;

    // Act: ask for everything at once, then page back to the start.
    let mut pages = Vec::new();
    let mut cursor = Value::Null;
    loop {
        let mut params = json!({"sessionKey": "t:big", "limit": 100_000});
        if !cursor.is_null() {
            params["before"] = cursor.clone();
        }
        let page = client.call("chat.history", params).await.unwrap();
        assert_eq!(page["ok"], true, "{}", page["error"]);
        cursor = page["payload"]["nextBefore"].clone();
        let more = page["payload"]["hasMore"] == true;
        pages.push(page["payload"]["messages"].as_array().unwrap().clone());
        assert!(pages.len() < 50, "paging does not end");
        if !more {
            break;
        }
    }

    // Assert: every page within the caps, every entry once, oldest first overall.
    for page in &pages {
        assert!(page.len() <= 1000, "a page of {} entries", page.len());
        let bytes: usize = page
            .iter()
            .map(|m| m["content"].as_str().unwrap_or_default().len())
            .sum();
        assert!(
            bytes <= 1024 * 1024 || page.len() == 1,
            "a page of {bytes} bytes"
        );
    }
    let seqs: Vec<i64> = pages
        .iter()
        .rev()
        .flatten()
        .map(|m| m["seq"].as_i64().unwrap())
        .collect();
    assert_eq!(seqs.len(), total);
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "entries repeated or out of order"
    );
    let big = pages
        .iter()
        .flatten()
        .filter(|m| m["content"].as_str().is_some_and(|c| c.len() == 90_000))
        .count();
    assert_eq!(big, 60);
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_placeholder_token_keeps_the_gateway_from_starting_outside_dev_mode() {
    // Arrange
    let mut config = agentloop_gateway::GatewayConfig::default();
    config.gateway.listen = "127.0.0.1:0".to_owned();

    for token in ["CHANGE_ME", "agentloop-dev-token"] {
        // Act
        config.gateway.tokens = vec!["a-real-one".into(), token.into()];
        let refused =
            agentloop_gateway::Gateway::bind(config.clone(), agentloop_lifecycle::Health::new())
                .await;
        let mut dev = config.clone();
        dev.gateway = serde_json::from_value(json!({
            "listen": "127.0.0.1:0", "tokens": [token], "dev_mode": true,
        }))
        .unwrap();
        let allowed =
            agentloop_gateway::Gateway::bind(dev, agentloop_lifecycle::Health::new()).await;

        // Assert
        let error = refused.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(error.contains(token), "started with {token}: {error:?}");
        assert!(allowed.is_ok());
    }
}
