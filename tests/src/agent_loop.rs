//! The agent loop: tools, batches, steering, follow-ups, budgets, remote tools, hooks.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use futures::future::BoxFuture;
use serde_json::{Value, json};
use sqlx::Row as _;

use agentloop_agent_runner::{AgentConfig, Extensions, HookPoint, Tool, ToolContext, ToolError};
use agentloop_fake_model::ScriptedReply;
use agentloop_model::ToolSpec;
use agentloop_proto::v1::SystemEvent;

use crate::harness::{Sandbox, SandboxOptions, collect_run_events, next_reply};

const WAIT: Duration = Duration::from_secs(20);

/// A test tool: sleeps, records when it ran, answers a fixed text.
struct Probe {
    name: &'static str,
    parallel: bool,
    sleep: Duration,
    timeout: Option<Duration>,
    log: Arc<Mutex<Vec<(String, Instant, Instant)>>>,
}

impl Tool for Probe {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.name.to_owned(),
            description: format!("test probe {}", self.name),
            parameters: json!({"type": "object", "properties": {"n": {"type": "integer"}}}),
        }
    }

    fn parallel_safe(&self) -> bool {
        self.parallel
    }

    fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    fn call<'a>(
        &'a self,
        _ctx: &'a ToolContext,
        arguments: Value,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let start = Instant::now();
            tokio::time::sleep(self.sleep).await;
            self.log
                .lock()
                .unwrap()
                .push((self.name.to_owned(), start, Instant::now()));
            match arguments["n"].as_i64() {
                Some(n) => Ok((n + 1).to_string()),
                None => Ok(format!("{} done", self.name)),
            }
        })
    }
}

type Log = Arc<Mutex<Vec<(String, Instant, Instant)>>>;

fn probe(name: &'static str, parallel: bool, sleep_ms: u64, log: &Log) -> Arc<dyn Tool> {
    Arc::new(Probe {
        name,
        parallel,
        sleep: Duration::from_millis(sleep_ms),
        timeout: None,
        log: log.clone(),
    })
}

fn with_tools(tools: Vec<Arc<dyn Tool>>) -> SandboxOptions {
    SandboxOptions {
        extensions: Extensions {
            tools,
            hooks: Vec::new(),
        },
        ..Default::default()
    }
}

/// The non-system messages the model received in request `i`.
fn request_messages(sandbox: &Sandbox, i: usize) -> Vec<Value> {
    let requests = sandbox.fake.requests();
    requests[i].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] != "system")
        .cloned()
        .collect()
}

async fn session_transcript(sandbox: &Sandbox, key: &str) -> Vec<(String, String, String, String)> {
    let pool = sandbox.pool().await.unwrap();
    sqlx::query(
        "SELECT e.role, e.content, coalesce(e.tool_call_id, '') AS call, coalesce(e.data, '') AS data \
         FROM transcript_entries e JOIN sessions s ON s.id = e.session_id WHERE s.key = $1 ORDER BY e.seq",
    )
    .bind(key)
    .fetch_all(&pool)
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get("role"), r.get("content"), r.get("call"), r.get("data")))
    .collect()
}

/// Every tool call in the transcript has exactly one result.
fn assert_calls_paired(transcript: &[(String, String, String, String)]) {
    let mut asked = Vec::new();
    for (role, _, _, data) in transcript.iter().filter(|e| e.0 == "assistant") {
        let _ = role;
        if let Ok(value) = serde_json::from_str::<Value>(data) {
            for call in value["toolCalls"].as_array().cloned().unwrap_or_default() {
                asked.push(call["id"].as_str().unwrap().to_owned());
            }
        }
    }
    let mut answered: Vec<String> = transcript
        .iter()
        .filter(|e| e.0 == "tool")
        .map(|e| e.2.clone())
        .collect();
    asked.sort();
    answered.sort();
    assert_eq!(
        asked, answered,
        "tool calls and results must pair one to one: {transcript:#?}"
    );
}

#[tokio::test]
async fn two_tools_in_sequence_each_use_the_previous_result_then_the_run_answers() {
    let log = Log::default();
    let sandbox = Sandbox::start_with(with_tools(vec![probe("add_one", false, 0, &log)]))
        .await
        .unwrap();
    sandbox
        .fake
        .push_script(ScriptedReply::tool_call("add_one", json!({"n": 1})));
    sandbox
        .fake
        .push_script(ScriptedReply::tool_call("add_one", json!({"n": 2})));
    sandbox
        .fake
        .push_script(ScriptedReply::text("the answer is 3"));
    let mut events = sandbox.subscribe("events.*.*").await;
    let mut replies = sandbox.subscribe("deliver.>").await;

    sandbox
        .publish_json("cli", json!({"sessionKey": "seq", "text": "count for me"}))
        .await
        .unwrap();

    assert_eq!(
        next_reply(&mut replies, WAIT).await.unwrap().text,
        "the answer is 3"
    );
    let run = collect_run_events(&mut events, WAIT).await.unwrap();
    assert_eq!(run.last().unwrap().phase, "end");
    let tool_events: Vec<(&str, &str)> = run
        .iter()
        .filter(|e| e.stream == "tool")
        .map(|e| (e.phase.as_str(), e.tool_name.as_str()))
        .collect();
    assert_eq!(
        tool_events,
        vec![
            ("start", "add_one"),
            ("result", "add_one"),
            ("start", "add_one"),
            ("result", "add_one")
        ]
    );
    assert!(
        run.iter()
            .filter(|e| e.stream == "tool")
            .all(|e| !e.tool_call_id.is_empty())
    );
    // The second model call saw the first result; the third saw the second.
    assert_eq!(sandbox.fake.requests().len(), 3);
    let second = request_messages(&sandbox, 1);
    assert_eq!(second.last().unwrap()["role"], "tool");
    assert_eq!(second.last().unwrap()["content"], "2");
    let third = request_messages(&sandbox, 2);
    assert_eq!(third.last().unwrap()["content"], "3");
    let transcript = session_transcript(&sandbox, "seq").await;
    let roles: Vec<&str> = transcript.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(
        roles,
        vec![
            "user",
            "assistant",
            "tool",
            "assistant",
            "tool",
            "assistant"
        ]
    );
    assert_calls_paired(&transcript);
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_batch_runs_parallel_safe_calls_together_and_the_other_alone() {
    let log = Log::default();
    let sandbox = Sandbox::start_with(with_tools(vec![
        probe("fetch_a", true, 400, &log),
        probe("fetch_b", true, 400, &log),
        probe("write_c", false, 200, &log),
    ]))
    .await
    .unwrap();
    sandbox.fake.push_script(
        ScriptedReply::tool_call("fetch_a", json!({}))
            .with_tool_call("fetch_b", json!({}))
            .with_tool_call("write_c", json!({})),
    );
    sandbox
        .fake
        .push_script(ScriptedReply::text("all three done"));
    let mut replies = sandbox.subscribe("deliver.>").await;

    sandbox
        .publish_json("cli", json!({"sessionKey": "batch", "text": "go"}))
        .await
        .unwrap();

    assert_eq!(
        next_reply(&mut replies, WAIT).await.unwrap().text,
        "all three done"
    );
    let log = log.lock().unwrap().clone();
    let span = |name: &str| {
        log.iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, s, e)| (*s, *e))
            .unwrap()
    };
    let (a, b, c) = (span("fetch_a"), span("fetch_b"), span("write_c"));
    let overlap = |x: (Instant, Instant), y: (Instant, Instant)| x.0 < y.1 && y.0 < x.1;
    assert!(overlap(a, b), "parallel-safe calls did not overlap");
    assert!(
        !overlap(a, c) && !overlap(b, c),
        "the serial call did not run alone"
    );
    let transcript = session_transcript(&sandbox, "batch").await;
    assert_eq!(transcript.iter().filter(|e| e.0 == "tool").count(), 3);
    assert_calls_paired(&transcript);
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn steering_during_a_batch_skips_unstarted_calls_and_reaches_the_next_turn() {
    let log = Log::default();
    let sandbox = Sandbox::start_with(with_tools(vec![
        probe("slow_step", false, 1_500, &log),
        probe("next_step", false, 0, &log),
    ]))
    .await
    .unwrap();
    sandbox.fake.push_script(
        ScriptedReply::tool_call("slow_step", json!({})).with_tool_call("next_step", json!({})),
    );
    sandbox
        .fake
        .push_script(ScriptedReply::text("changed course"));
    let mut events = sandbox.subscribe("events.*.*").await;
    let mut replies = sandbox.subscribe("deliver.>").await;

    sandbox
        .publish_json(
            "cli",
            json!({"sessionKey": "steer", "text": "do two steps"}),
        )
        .await
        .unwrap();
    // Steer once the first tool has started.
    loop {
        let msg = tokio::time::timeout(WAIT, events.next())
            .await
            .unwrap()
            .unwrap();
        let (event, _) = agentloop_bus::decode::<SystemEvent>(&msg).unwrap();
        if event.stream == "tool" && event.phase == "start" {
            break;
        }
    }
    sandbox
        .publish_json("cli", json!({"sessionKey": "steer", "text": "actually, stop after the first step", "queueMode": "steer"}))
        .await
        .unwrap();

    assert_eq!(
        next_reply(&mut replies, WAIT).await.unwrap().text,
        "changed course"
    );
    let ran: Vec<String> = log
        .lock()
        .unwrap()
        .iter()
        .map(|(n, _, _)| n.clone())
        .collect();
    assert_eq!(ran, vec!["slow_step"], "the unstarted call must not run");
    let transcript = session_transcript(&sandbox, "steer").await;
    assert_calls_paired(&transcript);
    let results: Vec<&str> = transcript
        .iter()
        .filter(|e| e.0 == "tool")
        .map(|e| e.1.as_str())
        .collect();
    assert_eq!(results[0], "slow_step done");
    assert!(results[1].starts_with("skipped"), "{results:?}");
    // The steering text reached the next model turn of the same run.
    let second = request_messages(&sandbox, 1);
    assert_eq!(
        second.last().unwrap()["content"],
        "actually, stop after the first step"
    );
    let pool = sandbox.finished_runs(1).await.unwrap();
    let runs: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM runs r JOIN sessions s ON s.id = r.session_id WHERE s.key = 'steer'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        runs, 1,
        "steering joins the live run instead of starting another"
    );
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_follow_up_runs_after_the_live_run_in_the_same_execution() {
    let sandbox = Sandbox::start().await.unwrap();
    let mut replies = sandbox.subscribe("deliver.>").await;

    sandbox
        .publish_json(
            "cli",
            json!({"sessionKey": "fu", "text": "first [[delay_ms:600]]"}),
        )
        .await
        .unwrap();
    sandbox
        .publish_json(
            "cli",
            json!({"sessionKey": "fu", "text": "second", "queueMode": "followup"}),
        )
        .await
        .unwrap();

    assert_eq!(
        next_reply(&mut replies, WAIT).await.unwrap().text,
        "echo: first"
    );
    assert_eq!(
        next_reply(&mut replies, WAIT).await.unwrap().text,
        "echo: second"
    );
    let pool = sandbox.finished_runs(2).await.unwrap();
    let runs =
        sqlx::query("SELECT epoch, owner, started_at, finished_at FROM runs ORDER BY started_at")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(runs.len(), 2);
    let (e1, e2): (i64, i64) = (runs[0].get("epoch"), runs[1].get("epoch"));
    assert_eq!(
        e1, e2,
        "the follow-up ran under the same lease, without handing the session back"
    );
    let f1: chrono::DateTime<chrono::Utc> = runs[0].get("finished_at");
    let s2: chrono::DateTime<chrono::Utc> = runs[1].get("started_at");
    assert!(f1 <= s2);
    let second = request_messages(&sandbox, 1);
    let contents: Vec<&str> = second
        .iter()
        .map(|m| m["content"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        contents,
        vec!["first [[delay_ms:600]]", "echo: first", "second"]
    );
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn collect_merges_three_queued_messages_into_one_turn() {
    let sandbox = Sandbox::start().await.unwrap();
    let mut replies = sandbox.subscribe("deliver.>").await;

    sandbox
        .publish_json(
            "cli",
            json!({"sessionKey": "col", "text": "busy [[delay_ms:800]]"}),
        )
        .await
        .unwrap();
    for text in ["one", "two", "three"] {
        sandbox
            .publish_json(
                "cli",
                json!({"sessionKey": "col", "text": text, "queueMode": "collect"}),
            )
            .await
            .unwrap();
    }

    assert_eq!(
        next_reply(&mut replies, WAIT).await.unwrap().text,
        "echo: busy"
    );
    next_reply(&mut replies, WAIT).await.unwrap();
    assert_eq!(
        sandbox.fake.requests().len(),
        2,
        "three collected messages make one model turn"
    );
    let merged = request_messages(&sandbox, 1);
    let tail: Vec<&str> = merged
        .iter()
        .rev()
        .take(3)
        .rev()
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(tail, vec!["one", "two", "three"]);
    let pool = sandbox.finished_runs(2).await.unwrap();
    let runs: i64 = sqlx::query_scalar("SELECT count(*) FROM runs")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(runs, 2);
    let pending: i64 =
        sqlx::query_scalar("SELECT count(*) FROM session_inbox WHERE consumed_at IS NULL")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(pending, 0);
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn interrupt_aborts_the_live_run_and_answers_the_new_message() {
    let sandbox = Sandbox::start().await.unwrap();
    let mut events = sandbox.subscribe("events.*.*").await;
    let mut replies = sandbox.subscribe("deliver.>").await;

    sandbox
        .publish_json(
            "cli",
            json!({"sessionKey": "int", "text": "long task [[delay_ms:8000]]"}),
        )
        .await
        .unwrap();
    let first = tokio::time::timeout(WAIT, events.next())
        .await
        .unwrap()
        .unwrap();
    let (start, _) = agentloop_bus::decode::<SystemEvent>(&first).unwrap();
    assert_eq!(start.phase, "start");
    sandbox
        .publish_json(
            "cli",
            json!({"sessionKey": "int", "text": "urgent", "queueMode": "interrupt"}),
        )
        .await
        .unwrap();

    let mut first_run = vec![start];
    first_run.extend(collect_run_events(&mut events, WAIT).await.unwrap());
    let end = first_run.last().unwrap();
    let data: Value = serde_json::from_str(&end.data).unwrap();
    assert_eq!(
        (end.phase.as_str(), data["reason"].as_str()),
        ("end", Some("aborted"))
    );
    assert_eq!(
        next_reply(&mut replies, WAIT).await.unwrap().text,
        "Stopped."
    );
    assert_eq!(
        next_reply(&mut replies, WAIT).await.unwrap().text,
        "echo: urgent"
    );
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn budgets_end_runs_with_their_reason() {
    let log = Log::default();
    let hang: Arc<dyn Tool> = Arc::new(Probe {
        name: "hang",
        parallel: false,
        sleep: Duration::from_secs(3600),
        timeout: Some(Duration::from_millis(300)),
        log: log.clone(),
    });
    let sandbox = Sandbox::start_with(SandboxOptions {
        runner: Some(Box::new(|config| {
            config.agents.insert(
                "looper".into(),
                AgentConfig {
                    max_turns: 3,
                    ..Default::default()
                },
            );
            config.agents.insert(
                "timeboxed".into(),
                AgentConfig {
                    run_timeout_ms: 700,
                    ..Default::default()
                },
            );
        })),
        ..with_tools(vec![hang])
    })
    .await
    .unwrap();
    let mut events = sandbox.subscribe("events.*.*").await;
    let mut replies = sandbox.subscribe("deliver.>").await;

    // A model that always asks for a tool is stopped by the turn budget.
    for _ in 0..5 {
        sandbox
            .fake
            .push_script(ScriptedReply::tool_call("current_time", json!({})));
    }
    sandbox
        .publish_json(
            "cli",
            json!({"sessionKey": "b1", "agentId": "looper", "text": "loop"}),
        )
        .await
        .unwrap();
    let run = collect_run_events(&mut events, WAIT).await.unwrap();
    let data: Value = serde_json::from_str(&run.last().unwrap().data).unwrap();
    assert_eq!(data["reason"], "max_turns", "{run:?}");
    assert_eq!(data["turns"], 3);
    next_reply(&mut replies, WAIT).await.unwrap();
    sandbox.fake.reset();

    // A hung tool is cut by its timeout and the model sees why.
    sandbox
        .fake
        .push_script(ScriptedReply::tool_call("hang", json!({})));
    sandbox.fake.push_script(ScriptedReply::text("moved on"));
    sandbox
        .publish_json("cli", json!({"sessionKey": "b2", "text": "hang"}))
        .await
        .unwrap();
    assert_eq!(
        next_reply(&mut replies, WAIT).await.unwrap().text,
        "moved on"
    );
    let second = request_messages(&sandbox, 1);
    assert!(
        second.last().unwrap()["content"]
            .as_str()
            .unwrap()
            .contains("did not answer within 300 ms")
    );
    collect_run_events(&mut events, WAIT).await.unwrap();

    // A run past its timeout ends with reason timeout.
    sandbox
        .publish_json(
            "cli",
            json!({"sessionKey": "b3", "agentId": "timeboxed", "text": "slow [[delay_ms:5000]]"}),
        )
        .await
        .unwrap();
    let run = collect_run_events(&mut events, WAIT).await.unwrap();
    let end = run.last().unwrap();
    let data: Value = serde_json::from_str(&end.data).unwrap();
    assert_eq!(
        (end.phase.as_str(), data["reason"].as_str()),
        ("error", Some("timeout"))
    );
    let reply = next_reply(&mut replies, WAIT).await.unwrap();
    assert!(reply.error.starts_with("timeout"), "{reply:?}");
    sandbox.shutdown().await.unwrap();
}

fn example_tool_bin() -> std::path::PathBuf {
    // The e2e test binary lives in target/<profile>/deps; the example tool in target/<profile>.
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let bin = dir.join("agentloop-example-tool");
    if !bin.exists() {
        let status = std::process::Command::new(env!("CARGO"))
            .args([
                "build",
                "-p",
                "agentloop-tool-server",
                "--bin",
                "agentloop-example-tool",
            ])
            .status()
            .unwrap();
        assert!(status.success());
    }
    bin
}

#[tokio::test]
async fn a_remote_tool_in_another_process_is_discovered_and_called() {
    let sandbox = Sandbox::start().await.unwrap();
    let mut child = tokio::process::Command::new(example_tool_bin())
        .env("NATS_URL", sandbox.nats.url())
        .env("AGENTLOOP_BUS__PREFIX", &sandbox.prefix)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
    let ready = tokio::time::timeout(WAIT, lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(ready.starts_with("ready"));
    let mut replies = sandbox.subscribe("deliver.>").await;

    // Until the runner has heard the announcement the model is offered no word_count; retry.
    let deadline = Instant::now() + WAIT;
    loop {
        sandbox.fake.push_script(ScriptedReply::text("probe"));
        sandbox
            .publish_json(
                "cli",
                json!({"sessionKey": "probe", "text": "which tools?"}),
            )
            .await
            .unwrap();
        next_reply(&mut replies, WAIT).await.unwrap();
        let last = sandbox.fake.requests().last().unwrap().body.clone();
        let offered = last["tools"]
            .as_array()
            .is_some_and(|tools| tools.iter().any(|t| t["function"]["name"] == "word_count"));
        if offered {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "word_count was never offered to the model"
        );
    }
    sandbox.fake.push_script(ScriptedReply::tool_call(
        "word_count",
        json!({"text": "a b c d"}),
    ));
    sandbox.fake.push_script(ScriptedReply::text("four words"));

    sandbox
        .publish_json(
            "cli",
            json!({"sessionKey": "remote", "text": "count a b c d"}),
        )
        .await
        .unwrap();

    assert_eq!(
        next_reply(&mut replies, WAIT).await.unwrap().text,
        "four words"
    );
    let requests = sandbox.fake.requests();
    let last = &requests[requests.len() - 1].body["messages"];
    let tool_result = last.as_array().unwrap().last().unwrap();
    assert_eq!(tool_result["role"], "tool");
    assert_eq!(tool_result["content"], "4");
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_external_before_tool_call_hook_blocks_a_call_and_the_model_sees_why() {
    let seen = Arc::new(Mutex::new(Vec::<Value>::new()));
    let calls = seen.clone();
    let sandbox = Sandbox::start_with_hook(HookPoint::BeforeToolCall, move |body| {
        calls.lock().unwrap().push(body.clone());
        json!({"block": true, "reason": "clock access is not allowed here"})
    })
    .await
    .unwrap();
    sandbox
        .fake
        .push_script(ScriptedReply::tool_call("current_time", json!({})));
    sandbox
        .fake
        .push_script(ScriptedReply::text("I cannot tell the time"));
    let mut replies = sandbox.subscribe("deliver.>").await;

    sandbox
        .publish_json(
            "cli",
            json!({"sessionKey": "hooked", "text": "what time is it?"}),
        )
        .await
        .unwrap();

    assert_eq!(
        next_reply(&mut replies, WAIT).await.unwrap().text,
        "I cannot tell the time"
    );
    let second = request_messages(&sandbox, 1);
    let result = second.last().unwrap()["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        result.contains("blocked by a hook: clock access is not allowed here"),
        "{result}"
    );
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0]["point"], "before_tool_call");
    assert_eq!(seen[0]["toolName"], "current_time");
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn send_message_delivers_once_and_the_final_reply_is_not_duplicated() {
    let sandbox = Sandbox::start().await.unwrap();
    sandbox.fake.push_script(ScriptedReply::tool_call(
        "send_message",
        json!({"text": "hello via tool"}),
    ));
    sandbox
        .fake
        .push_script(ScriptedReply::text("hello via tool"));
    let mut replies = sandbox.subscribe("deliver.>").await;

    let ask = sandbox.client.request(
        sandbox.subject("ask"),
        json!({"sessionKey": "sender", "channel": "cli", "text": "greet me"})
            .to_string()
            .into(),
    );
    let answer = tokio::time::timeout(WAIT, ask).await.unwrap().unwrap();
    let answer: Value = serde_json::from_slice(&answer.payload).unwrap();
    assert_eq!(
        answer["text"], "hello via tool",
        "the caller still gets the final answer"
    );
    sandbox
        .publish_json("cli", json!({"sessionKey": "sender", "text": "next"}))
        .await
        .unwrap();

    let mut delivered = Vec::new();
    loop {
        let reply = next_reply(&mut replies, WAIT).await.unwrap();
        let last = reply.text == "echo: next";
        delivered.push(reply.text);
        if last {
            break;
        }
    }
    assert_eq!(delivered, vec!["hello via tool", "echo: next"]);
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_stop_command_aborts_the_live_run() {
    let sandbox = Sandbox::start().await.unwrap();
    let mut events = sandbox.subscribe("events.*.*").await;
    let mut replies = sandbox.subscribe("deliver.>").await;
    sandbox
        .publish_json(
            "cli",
            json!({"sessionKey": "stopme", "text": "long [[delay_ms:8000]]"}),
        )
        .await
        .unwrap();
    let first = tokio::time::timeout(WAIT, events.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        agentloop_bus::decode::<SystemEvent>(&first)
            .unwrap()
            .0
            .phase,
        "start"
    );

    sandbox
        .publish_json("cli", json!({"sessionKey": "stopme", "text": "/stop"}))
        .await
        .unwrap();

    let run = collect_run_events(&mut events, WAIT).await.unwrap();
    let data: Value = serde_json::from_str(&run.last().unwrap().data).unwrap();
    assert_eq!(data["reason"], "aborted");
    let mut texts = vec![
        next_reply(&mut replies, WAIT).await.unwrap().text,
        next_reply(&mut replies, WAIT).await.unwrap().text,
    ];
    texts.sort();
    assert_eq!(texts, vec!["Stopped.", "Stopping the current run."]);
    let pool = sandbox.finished_runs(1).await.unwrap();
    let status: String = sqlx::query_scalar("SELECT status FROM runs")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(status, "aborted");
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_long_tool_call_emits_update_events_between_start_and_result() {
    let log = Log::default();
    let sandbox = Sandbox::start_with(SandboxOptions {
        runner: Some(Box::new(|config| {
            config.runner.tool_update_interval_ms = 150
        })),
        ..with_tools(vec![probe("slow", false, 700, &log)])
    })
    .await
    .unwrap();
    sandbox
        .fake
        .push_script(ScriptedReply::tool_call("slow", json!({})));
    sandbox.fake.push_script(ScriptedReply::text("done"));
    let mut events = sandbox.subscribe("events.*.*").await;

    sandbox
        .publish_json("cli", json!({"sessionKey": "upd", "text": "go"}))
        .await
        .unwrap();

    let mut run = collect_run_events(&mut events, WAIT).await.unwrap();
    run.sort_by_key(|e| e.seq);
    let phases: Vec<&str> = run
        .iter()
        .filter(|e| e.stream == "tool")
        .map(|e| e.phase.as_str())
        .collect();
    assert_eq!(phases.first(), Some(&"start"));
    assert_eq!(phases.last(), Some(&"result"));
    assert!(
        phases.iter().filter(|p| **p == "update").count() >= 2,
        "{phases:?}"
    );
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_hook_given_more_than_ten_seconds_may_use_them() {
    // The NATS client's own request timeout (10 s) must not cut a hook configured for longer.
    let subject = format!("hooks{}.slow", &agentloop_bus::nuid()[24..]);
    let hook_subject = subject.clone();
    let sandbox = Sandbox::start_with(SandboxOptions {
        runner: Some(Box::new(move |config| {
            config
                .runner
                .hooks
                .push(agentloop_agent_runner::ExternalHookConfig {
                    point: HookPoint::MessageSending,
                    subject: hook_subject,
                    timeout_ms: 20_000,
                    fail_open: false,
                });
        })),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut calls = sandbox.client.subscribe(subject).await.unwrap();
    let client = sandbox.client.clone();
    tokio::spawn(async move {
        while let Some(call) = calls.next().await {
            let body: Value = serde_json::from_slice(&call.payload).unwrap_or_default();
            tokio::time::sleep(Duration::from_millis(10_500)).await;
            let text = format!("slowly: {}", body["text"].as_str().unwrap_or_default());
            if let Some(reply) = call.reply {
                let _ = client
                    .publish(reply, json!({"text": text}).to_string().into())
                    .await;
            }
        }
    });
    let mut replies = sandbox.subscribe("deliver.>").await;

    sandbox
        .publish_json(
            "cli",
            json!({"sessionKey": "slow-hook", "text": "take your time"}),
        )
        .await
        .unwrap();

    let reply = next_reply(&mut replies, Duration::from_secs(40))
        .await
        .unwrap();
    assert_eq!(reply.text, "slowly: echo: take your time");
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn calls_a_server_sends_under_one_id_each_run_and_each_keeps_its_result() {
    // Some servers send calls without ids, or number every answer's calls from 0. The id keys
    // a call's result and the messages it sends: a repeat must not drop either.
    let sandbox = Sandbox::start().await.unwrap();
    sandbox.fake.push_script(
        ScriptedReply::default()
            .with_tool_call_id("call_0", "send_message", json!({"text": "first"}))
            .with_tool_call_id("", "send_message", json!({"text": "second"})),
    );
    sandbox
        .fake
        .push_script(ScriptedReply::default().with_tool_call_id(
            "call_0",
            "send_message",
            json!({"text": "third"}),
        ));
    sandbox.fake.push_script(ScriptedReply::text("done"));
    let mut replies = sandbox.subscribe("deliver.>").await;

    sandbox
        .publish_json("cli", json!({"sessionKey": "reused-ids", "text": "go"}))
        .await
        .unwrap();

    let mut delivered = Vec::new();
    while delivered.last().map(String::as_str) != Some("done") {
        delivered.push(next_reply(&mut replies, WAIT).await.unwrap().text);
    }
    delivered.sort();
    assert_eq!(delivered, ["done", "first", "second", "third"]);
    let transcript = session_transcript(&sandbox, "reused-ids").await;
    let results = transcript.iter().filter(|e| e.0 == "tool").count();
    assert_eq!(results, 3, "every call has its result: {transcript:?}");
    sandbox.shutdown().await.unwrap();
}
