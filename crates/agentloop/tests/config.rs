//! Loading the configuration as a started service sees it: a name that nothing reads, or a log
//! format that does not exist, stops the process with the name to use; a key of another
//! service is part of the product's one file and is accepted.

use std::io::Read as _;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Starts `agentloop delivery` with only `env` (and `--config file` when given).
fn start_delivery(file: Option<&str>, env: &[(&str, &str)]) -> Child {
    let mut command = Command::new(env!("CARGO_BIN_EXE_agentloop"));
    command
        .arg("delivery")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        // Nothing listens on port 1: a service past its configuration keeps retrying NATS.
        .env("NATS_URL", "nats://127.0.0.1:1")
        .env("RUST_LOG", "warn")
        .env("AGENTLOOP_WORKER_THREADS", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(file) = file {
        command.arg("--config").arg(file);
    }
    command.envs(env.iter().copied());
    command.spawn().expect("start agentloop delivery")
}

/// Returns the process's stderr once it exited, or `None` if it still runs after `wait`.
fn exited_with(mut child: Child, wait: Duration) -> Option<String> {
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().expect("wait for agentloop") {
            let mut stderr = String::new();
            let _ = child
                .stderr
                .take()
                .map(|mut s| s.read_to_string(&mut stderr));
            assert!(!status.success(), "exited 0: {stderr}");
            return Some(stderr);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

fn config_file(name: &str, text: &str) -> String {
    let path = std::env::temp_dir().join(format!(
        "agentloop-config-{name}-{}.toml",
        std::process::id()
    ));
    std::fs::write(&path, text).expect("write the config file");
    path.to_string_lossy().into_owned()
}

#[test]
fn a_misspelt_key_in_the_file_stops_a_service_with_the_closest_valid_key() {
    let file = config_file("typo", "[runner]\nmax_turn = 3\n");
    let stderr = exited_with(start_delivery(Some(&file), &[]), Duration::from_secs(20))
        .expect("delivery refuses the file");
    assert!(
        stderr.contains("unknown key `runner.max_turn`; did you mean `runner.max_turns`?"),
        "{stderr}"
    );
}

#[test]
fn a_misspelt_variable_stops_a_service_with_the_closest_valid_variable() {
    let child = start_delivery(None, &[("AGENTLOOP_DELIVERY__CONCURENCY", "8")]);
    let stderr = exited_with(child, Duration::from_secs(20)).expect("delivery refuses it");
    assert!(
        stderr.contains(
            "unknown environment variable `AGENTLOOP_DELIVERY__CONCURENCY`; \
             did you mean `AGENTLOOP_DELIVERY__CONCURRENCY`?"
        ),
        "{stderr}"
    );
}

#[test]
fn an_unknown_log_format_stops_a_service_naming_the_valid_ones() {
    let child = start_delivery(None, &[("AGENTLOOP_TELEMETRY__LOG_FORMAT", "jsn")]);
    let stderr = exited_with(child, Duration::from_secs(20)).expect("delivery refuses it");
    assert!(
        stderr.contains("invalid log format `jsn`: expected `text` or `json`"),
        "{stderr}"
    );
}

#[test]
fn keys_of_every_service_are_accepted_by_each_one() {
    let file = config_file(
        "product",
        r#"
[telemetry]
log_format = "json"
[bus]
prefix = "cfgtest"
[memory]
url = "http://127.0.0.1:1"
history_limit = 50
tls_domain = "memory.internal"
[models]
default_model = "openai/a"
allowlist = ["openai/a"]
request_timeout_ms = 1000
[[models.profiles]]
name = "main"
provider = "openai"
[models.context_windows]
"openai/gpt-4.1" = 1000000
[router]
concurrency = 8
[runner]
max_turns = 3
[[runner.hooks]]
point = "before_tool_call"
subject = "hooks.check"
[agents.helper]
model = "openai/a"
max_turns = 2
[gateway]
listen = "127.0.0.1:0"
[[gateway.tokens]]
token = "s3cret"
principal = "alice"
scopes = ["read"]
[delivery]
concurrency = 8
"#,
    );
    let child = start_delivery(Some(&file), &[("AGENTLOOP_RUNNER__MAX_TURNS", "4")]);
    // Past its configuration the service waits for NATS, which never comes.
    if let Some(stderr) = exited_with(child, Duration::from_secs(3)) {
        panic!("delivery refused a valid product configuration: {stderr}");
    }
}

/// Loads `path` as each service does; every service's config type is named, so every one is in
/// the program and registered, as in the binary.
fn load_as_every_service(path: &str) -> Result<(), agentloop_lifecycle::ConfigError> {
    use agentloop_lifecycle::load_config_from;
    let env = Vec::<(String, String)>::new;
    load_config_from::<agentloop_memory::MemoryConfig>(Some(path), env())?;
    load_config_from::<agentloop_router::RouterConfig>(Some(path), env())?;
    load_config_from::<agentloop_agent_runner::RunnerConfig>(Some(path), env())?;
    load_config_from::<agentloop_delivery::DeliveryConfig>(Some(path), env())?;
    load_config_from::<agentloop_gateway::GatewayConfig>(Some(path), env())?;
    Ok(())
}

#[test]
fn every_toml_example_of_the_readme_is_valid_configuration() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))
        .expect("read README.md");
    let examples: Vec<&str> = readme
        .split("```toml\n")
        .skip(1)
        .filter_map(|rest| rest.split_once("```").map(|(block, _)| block))
        .collect();
    assert!(!examples.is_empty(), "README.md has TOML examples");
    for (i, example) in examples.iter().enumerate() {
        let file = config_file(&format!("readme-{i}"), example);
        if let Err(err) = load_as_every_service(&file) {
            panic!("README example {i} is refused: {err:#?}\n{example}");
        }
    }
    let typo = config_file("readme-typo", "[runner]\nmax_turn = 3\n");
    assert!(matches!(
        load_as_every_service(&typo),
        Err(agentloop_lifecycle::ConfigError::Unknown(_))
    ));
}

#[test]
fn json_logs_go_to_stderr_like_text_logs_one_object_per_line() {
    // A service that cannot reach NATS logs its retries; in JSON they are on stderr too.
    let mut child = start_delivery(
        None,
        &[
            ("AGENTLOOP_TELEMETRY__LOG_FORMAT", "json"),
            ("RUST_LOG", "info"),
        ],
    );
    std::thread::sleep(Duration::from_secs(2));
    let _ = child.kill();
    let _ = child.wait();
    let mut stderr = String::new();
    let _ = child
        .stderr
        .take()
        .map(|mut s| s.read_to_string(&mut stderr));
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!lines.is_empty(), "nothing logged on stderr");
    for line in lines {
        let object: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(object["level"].is_string(), "{line}");
    }
}
