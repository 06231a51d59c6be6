//! Who the assistant is and what it remembers: agents with their own identity and files, skills
//! listed and loaded, long-term memory recalled for its user only, and `agentloop prompt`
//! showing what the model receives. The fake model's recorded requests show what it saw.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use agentloop_agent_runner::{AgentConfig, PreviewRequest, RunnerConfig};

use agentloop_fake_model::ScriptedReply;

use crate::harness::{Sandbox, SandboxOptions, next_reply};

const WAIT: Duration = Duration::from_secs(20);

/// A folder of its own under the temp dir, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Self {
        let dir =
            std::env::temp_dir().join(format!("agentloop-knowledge-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn write(&self, rel: &str, text: &str) -> PathBuf {
        let path = self.0.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        path
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Sends `text` as `sender` (on `cli`) to `session` for `agent` and waits for the reply.
pub(crate) async fn ask(
    sandbox: &Sandbox,
    replies: &mut async_nats::Subscriber,
    session: &str,
    sender: &str,
    agent: &str,
    text: &str,
) -> String {
    let mut message = json!({"sessionKey": session, "text": text, "senderId": sender});
    if !agent.is_empty() {
        message["agentId"] = agent.into();
    }
    sandbox.publish_json("cli", message).await.unwrap();
    let reply = next_reply(replies, WAIT).await.unwrap();
    assert_eq!(reply.session_key, session, "replies come in order");
    reply.text
}

/// The system prompt of the last model request whose last user message is `text`.
pub(crate) fn system_for(sandbox: &Sandbox, text: &str) -> String {
    request_for(sandbox, text)["messages"][0]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

pub(crate) fn request_for(sandbox: &Sandbox, text: &str) -> Value {
    sandbox
        .fake
        .requests()
        .into_iter()
        .rev()
        .find(|r| {
            r.body["messages"]
                .as_array()
                .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
                .is_some_and(|m| m["content"] == text)
        })
        .unwrap_or_else(|| panic!("no model request ends with {text:?}"))
        .body
}

fn agents_options(scratch: &Scratch) -> SandboxOptions {
    let alpha_file = scratch.write("alpha/ALPHA.md", "Alpha's secret word is heliotrope.");
    let beta_file = scratch.write("beta/BETA.md", "Beta speaks only in haiku.");
    let skills = scratch.path().join("skills");
    scratch.write(
        "skills/weather-report/SKILL.md",
        "---\nname: weather-report\ndescription: Writes a weather report for a city.\n---\n# Weather report\nAlways give the temperature in Celsius first.\n",
    );
    scratch.write(
        "skills/weather-report/template.txt",
        "City: {city}\nTemp: {celsius}",
    );
    SandboxOptions {
        runner: Some(Box::new(move |config: &mut RunnerConfig| {
            config.runner.skills_dir = skills.display().to_string();
            config.agents.insert(
                "alpha".into(),
                AgentConfig {
                    identity: "You are Alpha, the gardener.".into(),
                    context_files: vec![alpha_file],
                    ..Default::default()
                },
            );
            config.agents.insert(
                "beta".into(),
                AgentConfig {
                    identity: "You are Beta, the poet.".into(),
                    context_files: vec![beta_file],
                    skills: vec!["nothing-matches".into()],
                    ..Default::default()
                },
            );
        })),
        ..Default::default()
    }
}

#[tokio::test]
async fn two_agents_answer_with_their_own_identity_and_files() {
    let scratch = Scratch::new();
    let sandbox = Sandbox::start_with(agents_options(&scratch)).await.unwrap();
    let mut replies = sandbox.subscribe("deliver.>").await;

    ask(&sandbox, &mut replies, "ka", "u", "alpha", "who are you?").await;
    ask(&sandbox, &mut replies, "kb", "u", "beta", "and you?").await;

    let alpha = system_for(&sandbox, "who are you?");
    let beta = system_for(&sandbox, "and you?");
    assert!(alpha.starts_with("You are Alpha, the gardener."), "{alpha}");
    assert!(
        alpha.contains("### ALPHA.md\nAlpha's secret word is heliotrope."),
        "{alpha}"
    );
    assert!(!alpha.contains("haiku"), "{alpha}");
    assert!(beta.starts_with("You are Beta, the poet."), "{beta}");
    assert!(beta.contains("Beta speaks only in haiku."), "{beta}");
    assert!(!beta.contains("heliotrope"), "{beta}");
    // Beta's skill filter names no existing skill: it lists none and has no load_skill tool.
    assert!(
        alpha.contains("- weather-report: Writes a weather report for a city."),
        "{alpha}"
    );
    assert!(!beta.contains("weather-report"), "{beta}");
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_skill_is_listed_loaded_by_the_tool_and_its_body_reaches_the_model() {
    let scratch = Scratch::new();
    let sandbox = Sandbox::start_with(agents_options(&scratch)).await.unwrap();
    let mut replies = sandbox.subscribe("deliver.>").await;
    let load = r#"[[tool:load_skill:{"name":"weather-report"}]]"#;
    let file = r#"[[tool:load_skill:{"name":"weather-report","file":"template.txt"}]]"#;

    let answer = ask(&sandbox, &mut replies, "ks", "u", "alpha", load).await;
    assert!(
        answer.contains("Always give the temperature in Celsius first."),
        "{answer}"
    );
    let answer = ask(&sandbox, &mut replies, "ks", "u", "alpha", file).await;
    assert!(answer.contains("Temp: {celsius}"), "{answer}");

    let first = request_for(&sandbox, load);
    let tools: Vec<&str> = first["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["function"]["name"].as_str())
        .collect();
    assert!(tools.contains(&"load_skill"), "{tools:?}");
    // The tool result the model got holds the skill's body.
    let requests = sandbox.fake.requests();
    let result = requests
        .iter()
        .flat_map(|r| r.body["messages"].as_array().cloned().unwrap_or_default())
        .find(|m| m["role"] == "tool")
        .expect("a tool result reached the model");
    assert!(
        result["content"]
            .as_str()
            .unwrap()
            .contains("# Weather report"),
        "{result}"
    );
    let pool = sandbox.pool().await.unwrap();
    let versions: Vec<i32> = sqlx::query_scalar(
        "SELECT k.version FROM skill_snapshots k JOIN sessions s ON s.id = k.session_id WHERE s.key = 'ks'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(versions, vec![1], "one snapshot for the session's runs");
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_fact_of_one_user_is_recalled_in_their_new_session_never_in_anothers_and_forgotten_on_request()
 {
    let sandbox = Sandbox::start().await.unwrap();
    let mut replies = sandbox.subscribe("deliver.>").await;
    // Nothing is stored yet: the runner notes that for a few seconds and asks no more...
    ask(&sandbox, &mut replies, "alice-1", "alice", "", "hello").await;
    let save = r#"[[tool:memory_save:{"text":"Alice keeps bees on her roof in Lisbon"}]]"#;
    let saved = ask(&sandbox, &mut replies, "alice-1", "alice", "", save).await;
    assert!(saved.contains("\"id\""), "{saved}");
    // ...until a save: the next run of the same session recalls it at once.
    let same = "Tell me about bees in Lisbon";
    ask(&sandbox, &mut replies, "alice-1", "alice", "", same).await;
    assert!(
        system_for(&sandbox, same).contains("- Alice keeps bees on her roof in Lisbon"),
        "a memory saved here was not recalled by the session's next run"
    );

    let question = "Where do my bees live?";
    ask(&sandbox, &mut replies, "alice-2", "alice", "", question).await;
    let system = system_for(&sandbox, question);
    assert!(
        system.contains("## What you remember about this user"),
        "{system}"
    );
    assert!(
        system.contains("- Alice keeps bees on her roof in Lisbon"),
        "{system}"
    );

    let bobs = "Where do bees live?";
    ask(&sandbox, &mut replies, "bob-1", "bob", "", bobs).await;
    let system = system_for(&sandbox, bobs);
    assert!(
        !system.contains("Lisbon"),
        "another user's memory reached Bob: {system}"
    );

    let forget = r#"[[tool:memory_forget:{"query":"bees Lisbon"}]]"#;
    let forgot = ask(&sandbox, &mut replies, "alice-2", "alice", "", forget).await;
    assert!(forgot.contains("forgotten"), "{forgot}");
    let again = "Do you know where my bees are?";
    ask(&sandbox, &mut replies, "alice-3", "alice", "", again).await;
    let system = system_for(&sandbox, again);
    assert!(
        !system.contains("Lisbon"),
        "a forgotten memory was recalled: {system}"
    );
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn agentloop_prompt_matches_the_request_the_model_received_part_by_part() {
    let scratch = Scratch::new();
    let sandbox = Sandbox::start_with(agents_options(&scratch)).await.unwrap();
    let mut replies = sandbox.subscribe("deliver.>").await;
    let save = r#"[[tool:memory_save:{"text":"The user's garden has twelve tomato plants"}]]"#;
    ask(&sandbox, &mut replies, "kp", "carol", "alpha", save).await;
    // The reply goes out just before the run's last entry is stored.
    sandbox.finished_runs(1).await.unwrap();

    // The same configuration the sandbox's runner has.
    let mut config = RunnerConfig::default();
    config.memory.url = sandbox.memory_url.clone();
    (agents_options(&scratch).runner.unwrap())(&mut config);
    let next = "How many tomato plants are in my garden?";
    let preview = agentloop_agent_runner::preview(
        &config,
        &PreviewRequest {
            session_key: "kp".into(),
            message: Some(next.into()),
            sender_id: "carol".into(),
            channel: String::new(),
        },
    )
    .await
    .unwrap();
    ask(&sandbox, &mut replies, "kp", "carol", "alpha", next).await;

    let sent = request_for(&sandbox, next);
    let messages = sent["messages"].as_array().unwrap();
    assert_eq!(messages[0]["role"], "system");
    let system = messages[0]["content"].as_str().unwrap();
    assert_eq!(system, preview.system, "the system prompt differs");
    let mut at = 0;
    for part in preview.parts.iter().filter(|p| !p.text.is_empty()) {
        let found = system[at..]
            .find(&part.text)
            .unwrap_or_else(|| panic!("part {:?} is not where it should be", part.kind));
        at += found + part.text.len();
    }
    let kinds: Vec<&str> = preview.parts.iter().map(|p| p.kind.name()).collect();
    for kind in [
        "identity",
        "instructions",
        "tools",
        "context_files",
        "skills",
        "memories",
        "session",
        "transcript",
    ] {
        assert!(kinds.contains(&kind), "{kind} missing from {kinds:?}");
    }
    assert!(system.contains("twelve tomato plants"), "{system}");
    assert_eq!(
        messages.len() - 1,
        preview.messages.len(),
        "the conversation differs"
    );
    for (wire, ours) in messages[1..].iter().zip(&preview.messages) {
        let ours = serde_json::to_value(ours).unwrap();
        assert_eq!(wire["role"], ours["role"]);
        if ours["role"] != "assistant" || !ours["content"].as_str().unwrap_or_default().is_empty() {
            assert_eq!(wire["content"], ours["content"], "{wire} vs {ours}");
        }
    }
    let tools: Vec<&str> = sent["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["function"]["name"].as_str())
        .collect();
    let previewed: Vec<&str> = preview.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(tools, previewed);

    // The run stored the same report: each part with its tokens, and the whole request's.
    sandbox.finished_runs(2).await.unwrap();
    let pool = sandbox.pool().await.unwrap();
    let report: Value = sqlx::query_scalar(
        "SELECT prompt_report FROM runs WHERE status = 'completed' ORDER BY started_at DESC LIMIT 1",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let stored: Vec<(String, u64)> = report["parts"]
        .as_array()
        .unwrap_or_else(|| panic!("no parts in {report}"))
        .iter()
        .map(|p| {
            (
                p["part"].as_str().unwrap().to_owned(),
                p["tokens"].as_u64().unwrap(),
            )
        })
        .collect();
    let previewed: Vec<(String, u64)> = preview
        .parts
        .iter()
        .map(|p| (p.kind.name().to_owned(), p.tokens as u64))
        .collect();
    assert_eq!(
        stored, previewed,
        "runs.prompt_report differs from agentloop prompt"
    );
    assert_eq!(report["total_tokens"], preview.total_tokens);
    sandbox.shutdown().await.unwrap();
}

/// Waits until `sql` (one bigint) reaches `n`.
async fn wait_count(pool: &sqlx::PgPool, sql: &'static str, n: i64) {
    agentloop_testkit::wait_until(sql, WAIT, || {
        let pool = pool.clone();
        async move {
            let count: i64 = sqlx::query_scalar(sql).fetch_one(&pool).await.ok()?;
            (count >= n).then_some(())
        }
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn auto_learn_stores_a_fact_once_and_finishes_a_job_a_dead_runner_left_behind() {
    let options = SandboxOptions {
        runner: Some(Box::new(|config: &mut RunnerConfig| {
            config.memory.learn_model = "openai/fake-learn".into();
        })),
        ..Default::default()
    };
    let sandbox = Sandbox::start_with(options).await.unwrap();
    let pool = sandbox.pool().await.unwrap();
    let mut replies = sandbox.subscribe("deliver.>").await;
    let fact = "The user's daughter is called Mila";
    let facts = json!({ "facts": [fact] }).to_string();

    // The run's answer, then the learn model's.
    sandbox.fake.push_script(ScriptedReply::text("Noted."));
    sandbox.fake.push_script(ScriptedReply::text(facts.clone()));
    ask(
        &sandbox,
        &mut replies,
        "dana-1",
        "dana",
        "",
        "My daughter is called Mila",
    )
    .await;
    wait_count(
        &pool,
        "SELECT count(*) FROM learn_jobs WHERE status = 'done'",
        1,
    )
    .await;
    let learn_request = sandbox
        .fake
        .requests()
        .into_iter()
        .find(|r| r.body["model"] == "fake-learn")
        .expect("the learn model was asked");
    assert!(
        learn_request
            .body
            .to_string()
            .contains("My daughter is called Mila")
    );

    // A new session of the same user recalls it; learning the same fact again keeps one.
    sandbox
        .fake
        .push_script(ScriptedReply::text("Her name is Mila."));
    sandbox.fake.push_script(ScriptedReply::text(facts));
    let question = "What is my daughter's name?";
    ask(&sandbox, &mut replies, "dana-2", "dana", "", question).await;
    assert!(
        system_for(&sandbox, question).contains(fact),
        "the learned fact was not recalled"
    );
    wait_count(
        &pool,
        "SELECT count(*) FROM learn_jobs WHERE status = 'done'",
        2,
    )
    .await;
    let stored: Vec<(String, String)> =
        sqlx::query_as("SELECT text, source FROM memories ORDER BY created_at")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(stored, vec![(fact.to_owned(), "learned".to_owned())]);

    // A runner that died mid-job left its job leased; once the lease runs out a live runner
    // takes it over and finishes it.
    sandbox.fake.push_script(ScriptedReply::text(
        json!({"facts": ["The user keeps a parrot"]}).to_string(),
    ));
    sqlx::query(
        "INSERT INTO learn_jobs (id, run_id, session_id, agent_id, sender_id, channel, exchange, \
                                 attempts, lease_owner, lease_expires_at) \
         SELECT $1, $2, s.id, 'main', 'dana', 'cli', 'User: I also keep a parrot\nAssistant: Nice.', \
                1, 'runner-that-died', now() + interval '1 second' \
         FROM sessions s WHERE s.key = 'dana-1'",
    )
    .bind(uuid::Uuid::now_v7())
    .bind(uuid::Uuid::now_v7())
    .execute(&pool)
    .await
    .unwrap();
    wait_count(
        &pool,
        "SELECT count(*) FROM learn_jobs WHERE status = 'done'",
        3,
    )
    .await;
    let attempts: i32 = sqlx::query_scalar(
        "SELECT attempts FROM learn_jobs WHERE exchange LIKE '%parrot%' AND status = 'done'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        attempts, 2,
        "taken over once, after the dead runner's attempt"
    );
    let parrots: i64 =
        sqlx::query_scalar("SELECT count(*) FROM memories WHERE text = 'The user keeps a parrot'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(parrots, 1);
    sandbox.shutdown().await.unwrap();
}
