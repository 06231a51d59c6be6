//! The gateway under cheap exhaustion and bad input: silent sockets, many sockets, guessed
//! tokens, absurd timeouts, NUL keys, a transcript larger than one memory answer, placeholder
//! tokens. Each test performs the attack and shows it refused and the gateway still serving.

use serde_json::{Value, json};

use crate::gateway::Client;
use crate::gateway_attacks::{Gateway, closed, upgrade};
use crate::harness::Sandbox;

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

    // (`CHANGE_ME` is refused in any key by the config loader, dev mode or not.)
    for token in ["agentloop-dev-token"] {
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

#[tokio::test]
async fn a_socket_that_floods_without_reading_loses_its_place_at_the_connect_deadline() {
    // Arrange: one place for sockets waiting for `connect`.
    use futures::SinkExt as _;
    use tokio_tungstenite::tungstenite::Message;
    let sandbox = Sandbox::start().await.unwrap();
    let gateway = Gateway::start(
        &sandbox,
        json!({"max_unauthenticated": 1, "connect_timeout_ms": 500}),
    )
    .await
    .unwrap();
    // A socket that takes almost nothing in, so the gateway's answers back up at once.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let stream = socket.connect(gateway.addr).await.unwrap();
    let (ws, _) = tokio_tungstenite::client_async(format!("ws://{}/ws", gateway.addr), stream)
        .await
        .unwrap();
    let (mut sink, _never_read) = futures::StreamExt::split(ws);

    // Act: frames whose error answers echo a large id, sent until the gateway stops reading.
    let frame = json!({"type": "req", "id": "x".repeat(16 * 1024), "method": "health"}).to_string();
    for _ in 0..2000 {
        let sent = tokio::time::timeout(
            std::time::Duration::from_secs(1),
            sink.send(Message::Text(frame.clone().into())),
        )
        .await;
        if !matches!(sent, Ok(Ok(()))) {
            break;
        }
    }
    // Past the deadline, another socket gets the place.
    let newcomer = agentloop_testkit::wait_until(
        "a place for a new socket",
        std::time::Duration::from_secs(10),
        || async { upgrade(gateway.addr, &[]).await.ok() },
    )
    .await;

    // Assert
    let mut newcomer = newcomer.expect("the flooding socket kept its place");
    let hello = newcomer.call("connect", json!({})).await.unwrap();
    assert_eq!(hello["ok"], true, "{hello}");
    drop(sink);
    gateway.stop().await.unwrap();
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_socket_cannot_open_subscriptions_without_end() {
    // Each subscription holds a task and a NATS subscription to every event until the socket
    // closes; a client asking for one after another, within its request rate, would hold them
    // all.
    let sandbox = Sandbox::start().await.unwrap();
    let gateway = Gateway::start(&sandbox, json!({"max_requests_in_flight": 4}))
        .await
        .unwrap();
    // A subscription needs the gateway's NATS connection, made after it starts listening.
    agentloop_testkit::wait_until(
        "the gateway on NATS",
        std::time::Duration::from_secs(20),
        || async {
            let mut probe = Client::connected_at(gateway.addr, None).await.ok()?;
            let answer = probe.call("sessions.subscribe", json!({})).await.ok()?;
            (answer["ok"] == true).then_some(())
        },
    )
    .await
    .unwrap();
    let mut greedy = Client::connected_at(gateway.addr, None).await.unwrap();

    // Act
    let mut answers = Vec::new();
    for _ in 0..6 {
        answers.push(greedy.call("sessions.subscribe", json!({})).await.unwrap());
    }
    let other = greedy.call("sessions.list", json!({})).await.unwrap();

    // Assert: four held, the rest refused as retryable, naming the cap.
    for answer in &answers[..4] {
        assert_eq!(answer["ok"], true, "{answer}");
    }
    for answer in &answers[4..] {
        assert_eq!(answer["error"]["code"], "RATE_LIMITED", "{answer}");
        assert_eq!(answer["error"]["retryable"], true, "{answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("in flight") && message.contains('4'),
            "{answer}"
        );
    }
    assert_eq!(other["error"]["code"], "RATE_LIMITED", "{other}");
    // Closing the socket gives its places back; a new one is served.
    drop(greedy);
    let mut next = Client::connected_at(gateway.addr, None).await.unwrap();
    let subscribed = next.call("sessions.subscribe", json!({})).await.unwrap();
    assert_eq!(subscribed["ok"], true, "{subscribed}");
    let list = next.call("sessions.list", json!({})).await.unwrap();
    assert_eq!(list["ok"], true, "{list}");
    gateway.stop().await.unwrap();
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_address_cannot_hold_more_completions_open_than_its_cap() {
    // Each open completion waits on a run; an address opening them without end would hold
    // the gateway's tasks and the runners' queues for everyone.
    let sandbox = Sandbox::start_with(crate::harness::SandboxOptions {
        gateway: Some(Box::new(|g| g.max_http_in_flight_per_client = 2)),
        ..Default::default()
    })
    .await
    .unwrap();
    let url = format!("http://{}/v1/chat/completions", sandbox.gateway_addr);
    let http = reqwest::Client::new();
    let ask = |user: &str, text: &str| {
        http.post(&url)
            .json(&json!({"model": "agentloop", "user": user,
                          "messages": [{"role": "user", "content": text}]}))
            .send()
    };

    // Act: two slow completions open, then a third.
    let slow = tokio::spawn(futures::future::join(
        ask("held-1", "[[delay_ms:1500]] one"),
        ask("held-2", "[[delay_ms:1500]] two"),
    ));
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let refused = ask("third", "three").await.unwrap();
    let (one, two) = slow.await.unwrap();
    let after = ask("third", "three again").await.unwrap();

    // Assert
    assert_eq!(refused.status().as_u16(), 429);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["type"], "rate_limit_error", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("in flight"),
        "{body}"
    );
    assert_eq!(one.unwrap().status().as_u16(), 200);
    assert_eq!(two.unwrap().status().as_u16(), 200);
    assert_eq!(after.status().as_u16(), 200, "the places came back");
    sandbox.shutdown().await.unwrap();
}
