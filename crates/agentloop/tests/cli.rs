//! The binary's process-level settings: how many worker threads a service runs on.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A NATS URL nothing listens on: the service keeps retrying, so it stays up to be looked at.
fn unreachable_nats() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(1);
    format!("nats://127.0.0.1:{port}")
}

fn start_delivery(threads: Option<&str>) -> Child {
    let mut command = Command::new(env!("CARGO_BIN_EXE_agentloop"));
    command
        .arg("delivery")
        .env("NATS_URL", unreachable_nats())
        .env("RUST_LOG", "warn")
        .env_remove("AGENTLOOP_WORKER_THREADS")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(threads) = threads {
        command.env("AGENTLOOP_WORKER_THREADS", threads);
    }
    command.spawn().expect("start agentloop delivery")
}

/// Tokio names its workers; counted once the runtime has started them all.
fn worker_threads(child: &Child, expected: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let tasks = std::fs::read_dir(format!("/proc/{}/task", child.id())).expect("read tasks");
        let workers = tasks
            .filter_map(Result::ok)
            .filter(|t| {
                std::fs::read_to_string(t.path().join("comm"))
                    .is_ok_and(|comm| comm.trim() == "tokio-rt-worker")
            })
            .count();
        if workers >= expected || Instant::now() > deadline {
            return workers;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn stop(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn a_service_runs_on_one_worker_thread_unless_told_otherwise() {
    let default = start_delivery(None);
    let told = start_delivery(Some("3"));
    let counted = (worker_threads(&default, 1), worker_threads(&told, 3));
    // A second worker, if any, starts with the first: give it the time to show up.
    std::thread::sleep(Duration::from_millis(300));
    let default_again = worker_threads(&default, 1);
    stop(default);
    stop(told);
    assert_eq!(counted, (1, 3));
    assert_eq!(default_again, 1);
}

#[test]
fn a_worker_thread_count_that_is_not_a_positive_number_is_refused_clearly() {
    for bad in ["0", "two"] {
        let output = start_delivery(Some(bad))
            .wait_with_output()
            .expect("agentloop delivery exits");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{bad}: exited {}", output.status);
        assert!(
            stderr.contains("AGENTLOOP_WORKER_THREADS must be a whole number of at least 1"),
            "{bad}: {stderr}"
        );
    }
}
