//! The chat-app clients against local servers answering as a hostile or broken API would: a
//! redirect to somewhere else, an answer larger than any real one.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a failed fixture should panic the test

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse as _;

use agentloop_channels::{SendError, SlackConfig, TelegramConfig, slack, telegram};

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr
}

fn telegram_at(base: &str) -> telegram::Client {
    telegram::Client::new(&TelegramConfig {
        bot_token: "123:abc".into(),
        api_base: base.to_owned(),
        ..TelegramConfig::default()
    })
    .unwrap()
}

fn slack_at(base: &str) -> slack::Client {
    slack::Client::new(&SlackConfig {
        bot_token: "xoxb-1".into(),
        api_base: base.to_owned(),
        ..SlackConfig::default()
    })
    .unwrap()
}

fn target() -> telegram::Target {
    telegram::Target {
        chat: "42".to_owned(),
        thread: None,
        reply_to: None,
    }
}

#[tokio::test]
async fn a_redirect_is_refused_and_where_it_points_is_never_reached() {
    // An internal address the redirect points at: it must never see the bot's request.
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    let inside = serve(Router::new().fallback(move || {
        counted.fetch_add(1, Ordering::SeqCst);
        async { axum::Json(serde_json::json!({"ok": true, "result": {"message_id": 1}})) }
    }))
    .await;
    let bouncer = serve(Router::new().fallback(move || async move {
        (
            StatusCode::TEMPORARY_REDIRECT,
            [(header::LOCATION, format!("http://{inside}/internal"))],
            r#"{"ok":true}"#,
        )
            .into_response()
    }))
    .await;
    let base = format!("http://{bouncer}");

    let sent = telegram_at(&base).send_message(&target(), "hi").await;
    let posted = slack_at(&base).post_message("C1", None, "hi").await;

    for outcome in [sent.map(|_| ()), posted.map(|_| ())] {
        match outcome {
            Err(SendError::Permanent(reason)) => assert!(reason.contains("redirect"), "{reason}"),
            other => panic!("a redirect must be a permanent failure: {other:?}"),
        }
    }
    assert_eq!(hits.load(Ordering::SeqCst), 0, "the redirect was followed");
}

#[tokio::test]
async fn an_answer_larger_than_any_real_one_is_refused() {
    let huge = format!(r#"{{"ok":true,"pad":"{}"}}"#, "x".repeat(2 << 20));
    let app = Router::new().fallback(move || {
        let huge = huge.clone();
        async move { ([(header::CONTENT_TYPE, "application/json")], huge).into_response() }
    });
    let base = format!("http://{}", serve(app).await);

    let sent = telegram_at(&base).send_message(&target(), "hi").await;

    match sent {
        Err(SendError::Permanent(reason)) => assert!(reason.contains("larger than"), "{reason}"),
        other => panic!("an oversized answer must be refused: {other:?}"),
    }
}
