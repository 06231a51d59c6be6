//! Black-box tests: a real fake model server on port 0, hit over HTTP with reqwest.

use agentloop_fake_model::{Failure, FakeModel, FakeModelConfig, ScriptedReply};
use serde_json::{Value, json};

async fn start() -> FakeModel {
    FakeModel::start(FakeModelConfig::default())
        .await
        .expect("the fake model binds port 0")
}

/// Returns `(event name, data)` for each SSE frame of a body.
fn frames(body: &str) -> Vec<(Option<String>, String)> {
    body.split("\n\n")
        .filter(|frame| !frame.trim().is_empty())
        .map(|frame| {
            let mut event = None;
            let mut data = String::new();
            for line in frame.lines() {
                if let Some(e) = line.strip_prefix("event: ") {
                    event = Some(e.to_owned());
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data.push_str(d);
                }
            }
            (event, data)
        })
        .collect()
}

async fn post(url: String, body: Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(url)
        .json(&body)
        .send()
        .await
        .expect("the fake model answers")
}

#[tokio::test]
async fn openai_non_streaming_echoes_the_last_user_message() {
    let fake = start().await;

    let response = post(
        format!("{}/chat/completions", fake.openai_base_url()),
        json!({"model": "gpt-4o-mini", "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hello there [[delay_ms:1]]"}]}),
    )
    .await;

    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "echo: hello there"
    );
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert!(body["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
    fake.shutdown().await;
}

#[tokio::test]
async fn openai_streaming_sends_several_deltas_usage_and_done() {
    let fake = start().await;

    let response = post(
        format!("{}/chat/completions", fake.openai_base_url()),
        json!({"model": "m", "stream": true, "stream_options": {"include_usage": true},
               "messages": [{"role": "user", "content": [{"type": "text", "text": "one two three"}]}]}),
    )
    .await;

    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let frames = frames(&response.text().await.unwrap());
    assert_eq!(frames.last().unwrap().1, "[DONE]");
    let chunks: Vec<Value> = frames[..frames.len() - 1]
        .iter()
        .map(|(_, d)| serde_json::from_str(d).unwrap())
        .collect();
    let deltas: Vec<&str> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .filter(|d| !d.is_empty())
        .collect();
    assert!(deltas.len() > 2, "{deltas:?}");
    assert_eq!(deltas.concat(), "echo: one two three");
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "stop");
    assert!(
        chunks.last().unwrap()["usage"]["completion_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );
}

#[tokio::test]
async fn openai_tool_round_calls_the_tool_then_reports_results() {
    let fake = start().await;
    let url = format!("{}/chat/completions", fake.openai_base_url());
    let user = json!({"role": "user", "content": "do it [[tool:search:{\"q\":\"rust\"}]] [[tool:clock:{}]]"});

    let first = post(
        url.clone(),
        json!({"model": "m", "stream": true, "messages": [user]}),
    )
    .await;
    let chunks: Vec<Value> = frames(&first.text().await.unwrap())
        .iter()
        .filter(|(_, d)| d != "[DONE]")
        .map(|(_, d)| serde_json::from_str(d).unwrap())
        .collect();
    let mut names = Vec::new();
    let mut args = [String::new(), String::new()];
    for chunk in &chunks {
        for call in chunk["choices"][0]["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let index = call["index"].as_u64().unwrap() as usize;
            if let Some(name) = call["function"]["name"].as_str() {
                names.push(name.to_owned());
            }
            args[index].push_str(call["function"]["arguments"].as_str().unwrap_or(""));
        }
    }
    let second = post(
        url,
        json!({"model": "m", "messages": [user,
            {"role": "assistant", "content": null, "tool_calls": []},
            {"role": "tool", "tool_call_id": "a", "content": "found"},
            {"role": "tool", "tool_call_id": "b", "content": "noon"}]}),
    )
    .await
    .json::<Value>()
    .await
    .unwrap();

    assert_eq!(names, ["search", "clock"]);
    assert_eq!(
        serde_json::from_str::<Value>(&args[0]).unwrap(),
        json!({"q": "rust"})
    );
    assert_eq!(args[1], "{}");
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "tool_calls"
    );
    assert_eq!(
        second["choices"][0]["message"]["content"],
        "tool results: found | noon"
    );
}

#[tokio::test]
async fn anthropic_non_streaming_answers_with_a_tool_use_block() {
    let fake = start().await;

    let body: Value = post(
        format!("{}/v1/messages", fake.anthropic_base_url()),
        json!({"model": "claude", "max_tokens": 10,
               "messages": [{"role": "user", "content": "[[tool:get:{\"id\":7}]]"}]}),
    )
    .await
    .json()
    .await
    .unwrap();

    assert_eq!(body["type"], "message");
    assert_eq!(body["stop_reason"], "tool_use");
    assert_eq!(body["content"][0]["type"], "tool_use");
    assert_eq!(body["content"][0]["input"], json!({"id": 7}));
}

#[tokio::test]
async fn anthropic_streaming_sends_the_named_event_sequence() {
    let fake = start().await;

    let response = post(
        format!("{}/v1/messages", fake.anthropic_base_url()),
        json!({"model": "claude", "max_tokens": 10, "stream": true,
               "messages": [{"role": "user", "content": [{"type": "text", "text": "hi you [[chunk_delay_ms:1]]"}]}]}),
    )
    .await;

    let frames = frames(&response.text().await.unwrap());
    let names: Vec<&str> = frames.iter().map(|(e, _)| e.as_deref().unwrap()).collect();
    assert_eq!(names.first(), Some(&"message_start"));
    assert_eq!(names.last(), Some(&"message_stop"));
    let text: String = frames
        .iter()
        .filter(|(e, _)| e.as_deref() == Some("content_block_delta"))
        .map(|(_, d)| {
            serde_json::from_str::<Value>(d).unwrap()["delta"]["text"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(text, "echo: hi you");
    let delta: Value = serde_json::from_str(&frames[frames.len() - 2].1).unwrap();
    assert_eq!(delta["delta"]["stop_reason"], "end_turn");
}

#[tokio::test]
async fn errors_use_each_providers_shape_and_status() {
    let fake = start().await;

    let openai = post(
        format!("{}/chat/completions", fake.openai_base_url()),
        json!({"model": "m", "messages": [{"role": "user", "content": "[[overflow]]"}]}),
    )
    .await;
    let anthropic = post(
        format!("{}/v1/messages", fake.anthropic_base_url()),
        json!({"model": "m", "messages": [{"role": "user", "content": "[[fail:429]]"}]}),
    )
    .await;
    fake.set_failure(Some(Failure::Auth));
    let auth = post(
        format!("{}/v1/messages", fake.base_url()),
        json!({"messages": []}),
    )
    .await;

    assert_eq!(openai.status(), 400);
    let openai: Value = openai.json().await.unwrap();
    assert_eq!(openai["error"]["code"], "context_length_exceeded");
    assert_eq!(anthropic.status(), 429);
    let anthropic: Value = anthropic.json().await.unwrap();
    assert_eq!(anthropic["type"], "error");
    assert_eq!(anthropic["error"]["type"], "rate_limit_error");
    assert_eq!(auth.status(), 401);
}

#[tokio::test]
async fn scripts_over_http_take_precedence_and_requests_are_recorded() {
    let fake = start().await;
    let client = reqwest::Client::new();
    let script = json!([{"text": "scripted"}, {"error": "server"}]);
    let pushed = client
        .post(format!("{}/_fake/script", fake.base_url()))
        .json(&script)
        .send()
        .await
        .unwrap();
    fake.push_script(ScriptedReply::text("third"));
    let url = format!("{}/chat/completions", fake.openai_base_url());
    let ask = |n: u32| {
        client
            .post(&url)
            .bearer_auth("sk-test")
            .json(
                &json!({"model": "m", "messages": [{"role": "user", "content": format!("q{n}")}]}),
            )
            .send()
    };

    let first: Value = ask(1).await.unwrap().json().await.unwrap();
    let second = ask(2).await.unwrap().status();
    let third: Value = ask(3).await.unwrap().json().await.unwrap();
    let fourth: Value = ask(4).await.unwrap().json().await.unwrap();
    let recorded: Vec<Value> = client
        .get(format!("{}/_fake/requests", fake.base_url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();

    assert_eq!(pushed.status(), 204);
    assert_eq!(first["choices"][0]["message"]["content"], "scripted");
    assert_eq!(second, 500);
    assert_eq!(third["choices"][0]["message"]["content"], "third");
    assert_eq!(fourth["choices"][0]["message"]["content"], "echo: q4");
    assert_eq!(recorded.len(), 4);
    assert_eq!(recorded[0]["path"], "/v1/chat/completions");
    assert_eq!(recorded[0]["headers"]["authorization"], "Bearer sk-test");
    assert_eq!(recorded[3]["body"]["messages"][0]["content"], "q4");
    client
        .post(format!("{}/_fake/reset", fake.base_url()))
        .send()
        .await
        .unwrap();
    assert!(fake.requests().is_empty());
}

#[tokio::test]
async fn models_are_listed() {
    let fake = start().await;

    let body: Value = reqwest::get(format!("{}/models", fake.openai_base_url()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();

    assert_eq!(body["object"], "list");
    assert!(body["data"].as_array().unwrap().len() >= 2);
}
