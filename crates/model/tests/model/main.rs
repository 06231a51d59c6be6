//! Black-box tests: the model client against the fake model server over real HTTP.

use std::time::{Duration, Instant};

use agentloop_fake_model::{FakeModel, FakeModelConfig};
use agentloop_model::{
    ChatMessage, ChatRequest, ErrorKind, ModelClient, ModelError, ModelRef, ModelsConfig,
    StopReason, StreamEvent, ToolCall, ToolSpec,
};
use serde_json::json;

const PROVIDERS: [&str; 2] = ["openai/gpt-4o-mini", "anthropic/claude-sonnet-4-5"];

async fn setup(request_timeout_ms: u64) -> (FakeModel, ModelClient) {
    let fake = FakeModel::start(FakeModelConfig::default())
        .await
        .expect("the fake model binds port 0");
    let config = ModelsConfig {
        openai_base_url: format!("{}/", fake.openai_base_url()),
        openai_api_key: Some("sk-openai".into()),
        anthropic_base_url: fake.anthropic_base_url(),
        anthropic_api_key: Some("sk-ant".into()),
        request_timeout_ms,
        ..ModelsConfig::default()
    };
    (
        fake,
        ModelClient::new(&config).expect("the config is valid"),
    )
}

fn request(model: &str, messages: Vec<ChatMessage>) -> ChatRequest {
    ChatRequest {
        model: ModelRef::parse(model).expect("test model refs are valid"),
        system: Some("be brief".into()),
        messages,
        tools: std::sync::Arc::from(vec![ToolSpec {
            name: "search".into(),
            description: "searches".into(),
            parameters: json!({"type": "object", "properties": {"q": {"type": "string"}}}),
        }]),
        max_tokens: None,
        thinking: None,
        credential: None,
    }
}

async fn collect(client: &ModelClient, req: &ChatRequest) -> Result<Vec<StreamEvent>, ModelError> {
    let mut stream = client.stream(req).await?;
    let mut events = Vec::new();
    while let Some(event) = stream.next().await {
        events.push(event?);
    }
    Ok(events)
}

#[tokio::test]
async fn text_streams_as_several_deltas_for_both_providers() {
    let (fake, client) = setup(10_000).await;
    for model in PROVIDERS {
        let req = request(model, vec![ChatMessage::user("hello wide world")]);

        let events = collect(&client, &req).await.unwrap();

        let deltas: Vec<&str> = events
            .iter()
            .filter_map(|e| match e {
                StreamEvent::TextDelta(t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        assert!(deltas.len() > 2, "{model}: {deltas:?}");
        assert_eq!(deltas.concat(), "echo: hello wide world", "{model}");
        let Some(StreamEvent::Done { stop_reason, usage }) = events.last() else {
            panic!("{model}: no done event in {events:?}");
        };
        assert_eq!(*stop_reason, StopReason::EndTurn);
        assert!(
            usage.input_tokens > 0 && usage.output_tokens > 0,
            "{model}: {usage:?}"
        );
    }
    let requests = fake.requests();
    assert_eq!(
        requests[0].header("authorization"),
        Some("Bearer sk-openai")
    );
    assert_eq!(requests[0].body["stream_options"]["include_usage"], true);
    assert_eq!(requests[0].body["messages"][0]["role"], "system");
    assert_eq!(requests[1].path, "/v1/messages");
    assert_eq!(requests[1].header("x-api-key"), Some("sk-ant"));
    assert_eq!(requests[1].header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(requests[1].body["system"], "be brief");
    assert_eq!(requests[1].body["max_tokens"], 4096);
}

#[tokio::test]
async fn a_tool_call_is_assembled_from_pieces_and_its_result_goes_back() {
    let (fake, client) = setup(10_000).await;
    for model in PROVIDERS {
        let user = ChatMessage::user(r#"look it up [[tool:search:{"q":"rust async","n":2}]]"#);

        let first = client
            .complete(&request(model, vec![user.clone()]))
            .await
            .unwrap();
        let call: ToolCall = first.tool_calls[0].clone();
        let second = client
            .complete(&request(
                model,
                vec![
                    user,
                    ChatMessage::Assistant {
                        content: "".into(),
                        tool_calls: vec![call.clone()],
                    },
                    ChatMessage::tool_result(&call.id, "found it", false),
                ],
            ))
            .await
            .unwrap();

        assert_eq!(first.stop_reason, StopReason::ToolUse, "{model}");
        assert_eq!(first.tool_calls.len(), 1);
        assert_eq!(call.name, "search");
        assert_eq!(call.arguments, json!({"q": "rust async", "n": 2}));
        assert!(!call.id.is_empty());
        assert_eq!(second.text, "tool results: found it", "{model}");
        assert_eq!(second.stop_reason, StopReason::EndTurn);
    }
    let requests = fake.requests();
    assert_eq!(requests[1].body["messages"][3]["role"], "tool");
    assert_eq!(requests[1].body["tools"][0]["function"]["name"], "search");
    let anthropic_result = &requests[3].body["messages"][2]["content"][0];
    assert_eq!(anthropic_result["type"], "tool_result");
    assert_eq!(
        requests[3].body["tools"][0]["input_schema"]["type"],
        "object"
    );
}

#[tokio::test]
async fn error_statuses_map_to_error_kinds() {
    let (_fake, client) = setup(10_000).await;
    let cases = [
        ("[[fail:500]]", ErrorKind::Unavailable, 500),
        ("[[fail:429]]", ErrorKind::RateLimit, 429),
        ("[[fail:401]]", ErrorKind::Auth, 401),
        ("[[overflow]]", ErrorKind::ContextOverflow, 400),
    ];
    for model in PROVIDERS {
        for (directive, kind, status) in cases {
            let req = request(model, vec![ChatMessage::user(directive)]);

            let err = client.stream(&req).await.unwrap_err();

            assert_eq!(err.kind(), kind, "{model} {directive}: {err}");
            assert_eq!(err.status(), Some(status));
            let provider = model.split('/').next().unwrap();
            assert!(
                err.to_string()
                    .starts_with(&format!("{provider} returned status {status}: ")),
                "{err}"
            );
        }
    }
}

#[tokio::test]
async fn a_server_that_is_down_is_unavailable_at_once() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let client = ModelClient::new(&ModelsConfig {
        openai_base_url: format!("http://127.0.0.1:{port}/v1"),
        anthropic_base_url: format!("http://127.0.0.1:{port}"),
        ..ModelsConfig::default()
    })
    .unwrap();
    for model in PROVIDERS {
        let started = Instant::now();

        let err = client
            .stream(&request(model, vec![ChatMessage::user("hi")]))
            .await
            .unwrap_err();

        assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
        assert!(started.elapsed() < Duration::from_secs(2));
    }
}

#[tokio::test]
async fn slow_headers_and_stalled_streams_time_out() {
    let (_fake, client) = setup(300).await;
    for model in PROVIDERS {
        let slow = request(model, vec![ChatMessage::user("[[delay_ms:3000]] hi")]);
        let stalled = request(
            model,
            vec![ChatMessage::user("[[chunk_delay_ms:3000]] a b c")],
        );

        let slow_err = client.stream(&slow).await.unwrap_err();
        let mut stream = client.stream(&stalled).await.unwrap();
        let mut stall_err = None;
        while let Some(event) = stream.next().await {
            if let Err(err) = event {
                stall_err = Some(err);
            }
        }

        assert_eq!(slow_err.kind(), ErrorKind::Timeout, "{slow_err}");
        let stall_err = stall_err.expect("the stream should stall");
        assert_eq!(stall_err.kind(), ErrorKind::Timeout, "{stall_err}");
        assert!(stall_err.to_string().contains("stalled"), "{stall_err}");
    }
}

#[test]
fn models_config_has_laptop_defaults_and_accepts_partial_input() {
    let config: ModelsConfig =
        serde_json::from_value(json!({"anthropic_api_key": "k", "max_tokens": 10})).unwrap();

    assert_eq!(config.default_model, "openai/gpt-4o-mini");
    assert_eq!(config.openai_base_url, "https://api.openai.com/v1");
    assert_eq!(
        config
            .anthropic_api_key
            .as_ref()
            .map(agentloop_model::Secret::expose),
        Some("k")
    );
    assert_eq!(config.max_tokens, 10);
    assert!(
        ModelClient::new(&ModelsConfig {
            default_model: "gpt".into(),
            ..config
        })
        .is_err()
    );
}

/// Sends `n` calls at once, each answered after 300 ms, and returns the connection (peer) and
/// HTTP version the fake model saw for each, in the order it saw them.
async fn calls_at_once(http2_streams: u32, n: usize) -> (Vec<String>, Vec<String>) {
    let fake = FakeModel::start(FakeModelConfig::default())
        .await
        .expect("the fake model binds port 0");
    let client = ModelClient::new(&ModelsConfig {
        openai_base_url: fake.openai_base_url(),
        openai_api_key: Some("sk-openai".into()),
        http2_streams,
        ..ModelsConfig::default()
    })
    .expect("the config is valid");
    let calls = (0..n).map(|i| {
        let (client, text) = (client.clone(), format!("call {i} [[delay_ms:300]]"));
        async move {
            let req = request("openai/gpt-4o-mini", vec![ChatMessage::user(text)]);
            collect(&client, &req).await
        }
    });
    for answered in futures::future::join_all(calls).await {
        assert!(answered.is_ok(), "{answered:?}");
    }
    let seen = fake.requests();
    let peers = seen
        .iter()
        .map(|r| r.peer.clone().expect("the fake model knows each caller"))
        .collect();
    let versions = seen.iter().map(|r| r.http_version.clone()).collect();
    (peers, versions)
}

fn distinct(peers: &[String]) -> usize {
    peers
        .iter()
        .collect::<std::collections::BTreeSet<_>>()
        .len()
}

#[tokio::test]
async fn over_http2_calls_share_connections_up_to_the_stream_limit_and_no_further() {
    // Act: ten calls in flight at once, at most four on a connection
    let (peers, versions) = calls_at_once(4, 10).await;

    // Assert: HTTP/2 throughout, on three connections (4 + 4 + 2), none queued behind a full one
    assert!(versions.iter().all(|v| v == "HTTP/2.0"), "{versions:?}");
    assert_eq!(distinct(&peers), 3, "{peers:?}");
}

#[tokio::test]
async fn by_default_each_call_in_flight_has_an_http1_connection_of_its_own() {
    let (peers, versions) = calls_at_once(0, 10).await;

    assert!(versions.iter().all(|v| v == "HTTP/1.1"), "{versions:?}");
    assert_eq!(distinct(&peers), 10, "{peers:?}");
}
