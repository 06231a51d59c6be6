//! Percentiles, the per-hop profile and the markdown report (stdout and `bench/RESULTS.md`).

use std::fmt::Write as _;
use std::time::Duration;

use crate::phases::{HopRow, PhaseResult, STACK_GROUPS};
use crate::setup::Setup;

/// Nearest-rank percentiles of a sample, in milliseconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct Pct {
    /// Sample size.
    pub n: usize,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest value.
    pub max: f64,
}

/// Percentiles of durations.
pub fn pct(sample: &[Duration]) -> Pct {
    pct_ms(
        &sample
            .iter()
            .map(|d| d.as_secs_f64() * 1000.0)
            .collect::<Vec<_>>(),
    )
}

/// Percentiles of millisecond values.
pub fn pct_ms(sample: &[f64]) -> Pct {
    let mut v: Vec<f64> = sample.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return Pct::default();
    }
    v.sort_by(f64::total_cmp);
    let at = |q: f64| {
        let rank = (q * v.len() as f64).ceil() as usize;
        v[rank.clamp(1, v.len()) - 1]
    };
    Pct {
        n: v.len(),
        p50: at(0.50),
        p90: at(0.90),
        p99: at(0.99),
        max: v[v.len() - 1],
    }
}

/// Replies that took over a second: with a model answering at once, a stall, not load.
pub fn stalled(sample: &[Duration]) -> usize {
    sample
        .iter()
        .filter(|d| **d > Duration::from_secs(1))
        .count()
}

type HopFn = fn(&HopRow) -> Option<f64>;

fn diff(later: Option<f64>, earlier: Option<f64>) -> Option<f64> {
    Some((later? - earlier?) / 1000.0)
}

/// The hops of one run, in path order: (name, what it covers, duration in ms). Database times
/// are `now()` (a transaction's start) or `clock_timestamp()` (run start and finish).
pub const HOPS: [(&str, &str, HopFn); 11] = [
    (
        "publish → RunCommand on RUNS",
        "INBOUND store, router pull, session (cached per lane, else ResolveSession), RUNS publish + ack",
        |r| diff(r.trace.run_command_seen, Some(r.trace.sent)),
    ),
    (
        "RunCommand → inbox row",
        "runner pull, decode, Enqueue gRPC into `agentloop_enqueue` (its transaction's start)",
        |r| diff(r.enqueued, r.trace.run_command_seen),
    ),
    (
        "inbox row → run started",
        "same function: lock the session, insert the input, claim, take (runs row)",
        |r| diff(r.started, r.enqueued),
    ),
    (
        "run started → lifecycle start",
        "history window (only entries the runner lacks), commit, gRPC reply, owner start, start event",
        |r| diff(r.trace.start_ev, r.started),
    ),
    (
        "lifecycle start → first delta",
        "context, model HTTP call to the first chunk",
        |r| diff(r.trace.first_delta_ev, r.trace.start_ev),
    ),
    (
        "first delta → last delta",
        "streaming the answer (fake model, no delay)",
        |r| diff(r.trace.last_delta_ev, r.trace.first_delta_ev),
    ),
    (
        "last delta → OutboundMessage",
        "end of stream, the reply built",
        |r| diff(r.trace.outbound_ts, r.trace.last_delta_ev),
    ),
    (
        "OutboundMessage → delivered",
        "OUTBOUND publish + ack, delivery pull, decode, JSON deliver publish",
        |r| diff(Some(r.trace.delivered), r.trace.outbound_ts),
    ),
    (
        "  (off path: OutboundMessage → FinishRun in Postgres)",
        "reply publish ack wait, FinishRun gRPC (transcript rows' time)",
        |r| diff(r.assistant_entry, r.trace.outbound_ts),
    ),
    (
        "  (off path: FinishRun → run finished)",
        "the function: lock, transcript rows, run, input consumed",
        |r| diff(r.finished, r.assistant_entry),
    ),
    (
        "  (off path: run finished → lifecycle end)",
        "commit + reply, end event",
        |r| diff(r.trace.end_ev, r.finished),
    ),
];

/// Everything the report shows.
#[derive(Debug, Default)]
pub struct Report {
    /// `--quick` or full.
    pub mode: String,
    /// Date (UTC).
    pub date: String,
    /// `git rev-parse --short HEAD` (+ `-dirty`).
    pub commit: String,
    /// Cores, CPU model, `free -h` Mem line.
    pub machine: (usize, String, String),
    /// The machine's yardsticks before the stack started.
    pub yardsticks: crate::procfs::Yardsticks,
    /// Versions of nats-server and Postgres.
    pub versions: String,
    /// Clock ticks per second.
    pub tck: u64,
    /// Spawn of the first service to every service ready.
    pub start_to_ready: Duration,
    /// Latency phases (1 session, 10 sessions, ask).
    pub latency: Vec<PhaseResult>,
    /// Throughput phases.
    pub throughput: Vec<PhaseResult>,
    /// The memory phase.
    pub memory_phase: Option<PhaseResult>,
    /// Scaling, after the memory phase, back to back: 100 sessions on one runner, on two, then
    /// on one again.
    pub scaling: Vec<PhaseResult>,
    /// RSS KiB per process: idle after start.
    pub rss_idle: Vec<(String, u64)>,
    /// RSS KiB per process: before the memory phase.
    pub rss_before_mem: Vec<(String, u64)>,
    /// RSS KiB per process: peak during the memory phase.
    pub rss_peak_mem: Vec<(String, u64)>,
    /// RSS KiB per process: idle after the memory phase.
    pub rss_after_mem: Vec<(String, u64)>,
    /// Sessions the memory phase added.
    pub mem_sessions: usize,
    /// Sessions active at once during the memory phase.
    pub mem_active: usize,
    /// The 1-session trace joined with the database.
    pub hops: Vec<HopRow>,
    /// Messages the 1-session latency phase meant to send.
    pub planned_lat1: usize,
    /// Runs completed according to the runner's `/metrics`, at the end.
    pub runner_completed_metric: Option<u64>,
    /// The stack mode and inbound encoding measured.
    pub setup: Setup,
}

fn rss(list: &[(String, u64)], name: &str) -> Option<u64> {
    list.iter().find(|(n, _)| n == name).map(|(_, v)| *v)
}

fn mib(kib: u64) -> String {
    format!("{:.1}", kib as f64 / 1024.0)
}

fn verdict(ok: bool, how: String) -> String {
    if ok {
        format!("met ({how})")
    } else {
        format!("**missed** ({how})")
    }
}

const SERVICES: [&str; 5] = ["gateway", "router", "runner", "memory", "delivery"];

/// The service with the most resident memory in `list`, and that memory (KiB).
fn largest_service(list: &[(String, u64)]) -> Option<(&'static str, u64)> {
    SERVICES
        .iter()
        .filter_map(|n| rss(list, n).map(|v| (*n, v)))
        .max_by_key(|(_, v)| *v)
}

impl Report {
    fn phase<'a>(&'a self, name: &str) -> Option<&'a PhaseResult> {
        self.latency
            .iter()
            .chain(&self.throughput)
            .chain(self.memory_phase.iter())
            .chain(&self.scaling)
            .find(|p| p.name == name)
    }

    /// The share of each stack group in the CPU of a phase, largest first.
    fn cpu_split(&self, p: &PhaseResult) -> Vec<(String, f64)> {
        let mut split: Vec<(String, f64)> = STACK_GROUPS
            .iter()
            .map(|g| (g.to_string(), p.cpu_ms_per_run(&[g], self.tck)))
            .collect();
        split.sort_by(|a, b| b.1.total_cmp(&a.1));
        split
    }

    fn stack_cores(&self, p: &PhaseResult) -> f64 {
        let ms = p.cpu_ms_per_run(&STACK_GROUPS, self.tck) * p.ok as f64;
        ms / 1000.0 / p.elapsed.as_secs_f64().max(1e-9)
    }

    /// The machine over a phase, in cores: (taken by the hypervisor's steal, left idle).
    fn machine_cores(&self, p: &PhaseResult) -> Option<(f64, f64)> {
        let machine = p.machine?;
        let cores =
            |ticks: u64| ticks as f64 / self.tck.max(1) as f64 / p.elapsed.as_secs_f64().max(1e-9);
        let idle = machine.total.saturating_sub(machine.busy + machine.steal);
        Some((cores(machine.steal), cores(idle)))
    }

    /// The same, as words for a verdict.
    fn machine_words(&self, p: &PhaseResult) -> String {
        self.machine_cores(p)
            .map_or_else(String::new, |(steal, idle)| {
                format!("; the hypervisor withheld {steal:.2} cores (steal), {idle:.2} stayed idle")
            })
    }

    fn hop_summary(&self) -> Vec<(String, String, Pct)> {
        hop_summary(&self.hops)
    }

    fn bound_latency(&self) -> String {
        let mut hops: Vec<(String, Pct)> = self
            .hop_summary()
            .into_iter()
            .filter(|(n, _, _)| !n.starts_with("  "))
            .map(|(n, _, p)| (n, p))
            .collect();
        hops.sort_by(|a, b| b.1.p50.total_cmp(&a.1.p50));
        let top: Vec<String> = hops
            .iter()
            .take(3)
            .map(|(n, p)| format!("{n} {:.2} ms", p.p50))
            .collect();
        if top.is_empty() {
            "no hop profile".to_owned()
        } else {
            format!("largest hops (p50): {}", top.join(", "))
        }
    }

    fn bound_cpu(&self, p: &PhaseResult) -> String {
        let split: Vec<String> = self
            .cpu_split(p)
            .iter()
            .take(4)
            .map(|(g, ms)| format!("{g} {ms:.2}"))
            .collect();
        format!(
            "stack used {:.2} of {} cores; CPU-ms/run by process: {}{}",
            self.stack_cores(p),
            self.machine.0,
            split.join(", "),
            self.machine_words(p)
        )
    }

    /// Renders the whole report as markdown.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let (cores, model, mem) = &self.machine;
        let _ = writeln!(s, "# agentloop benchmark results\n");
        s.push_str(&self.setup.report_intro(self.mode == "quick"));
        s.push('\n');
        let _ = writeln!(s, "- date: {}", self.date);
        let _ = writeln!(s, "- commit: {}", self.commit);
        let _ = writeln!(
            s,
            "- machine: {cores} cores (`nproc`), {model}; memory (`free -h`): {mem}"
        );
        let _ = writeln!(
            s,
            "- yardsticks of the machine (lower is faster; compare them before comparing figures of \
             different runs, and see `bench/HISTORY.md` for same-machine before/after runs): a fixed \
             single-threaded integer loop (50 M steps) {:.1} ms, best of 5; a loopback TCP ping-pong \
             between two threads {} µs per round trip, median of 20 000",
            self.yardsticks.integer_loop.as_secs_f64() * 1000.0,
            self.yardsticks.round_trip_micros()
        );
        let _ = writeln!(s, "- {}", self.versions);
        let _ = writeln!(s, "- mode: {}; stack {}", self.mode, self.setup.line());
        let _ = writeln!(
            s,
            "- stack start (nats-server, fake model, 5 services) to all `/readyz` green: {:.2} s\n",
            self.start_to_ready.as_secs_f64()
        );

        s.push_str(&self.summary());
        s.push_str(&self.latency_section());
        s.push_str(&self.gateway_section());
        s.push_str(&self.throughput_section());
        s.push_str(&self.memory_section());
        s.push_str(&self.hops_section());
        s.push_str(
            "\n## How it is measured\n\n\
             - Latency: publish (just before the JetStream publish of the InboundMessage) to the first \
             assistant delta SystemEvent seen on `agentloop.events.>` and to the reply seen on \
             `agentloop.deliver.>` (delivery's bus adapter); the latency table also times the same reply \
             where it first appears, on `agentloop.outbound.>`, the subject `DESIGN.md` gives final replies; the JetStream publish ack is awaited concurrently, not before.\n\
             - Throughput: replies with the right text per second, from the first publish to the last reply; \
             every message carries a unique tag (`<phase>-<session>-<n>`, also its idempotency key) that the \
             fake model echoes. Persisted = rows in `runs` with status `completed` for the phase's keys.\n\
             - CPU: utime+stime deltas from `/proc/<pid>/stat` of the five service processes, nats-server, \
             and Postgres: the backends of the bench database (from `pg_stat_activity`, excluding the \
             bench's own connection), the checkpointer, background writer, WAL writer, autovacuum launcher \
             and the postmaster. The shared Postgres processes also serve other databases on this machine, \
             so the Postgres figure is an upper bound. The fake model and the bench client are shown apart \
             and not counted. Machine cores stolen / idle: from the machine's `/proc/stat` over the \
             phase, the hypervisor's steal (time a virtual CPU had work but was not given a real one) and \
             the idle time (iowait included), in cores.\n\
             - Memory: VmRSS from `/proc/<pid>/status`; the idle readings after a load are taken 3 s \
             after it, when the services have handed back what the load freed. Per idle session: runner \
             RSS after the memory phase (idle) minus before it, divided by the sessions it added.\n\
             - Hop profile: a phase of its own after the 1-session latency phase, so its tracing (a \
             subscription to every RunCommand and a record per event) stays out of the overhead figures; \
             wall-clock timestamps on one host: the bench's publish and receive times, the \
             RunCommand seen on `agentloop.run.>`, SystemEvent `ts`, `OutboundMessage.ts`, and \
             `session_inbox.enqueued_at`, `runs.started_at/finished_at`, `transcript_entries.created_at` \
             (Postgres `now()`: the transaction's start; run start and finish use `clock_timestamp()`).\n\
             - Gateway protocols: the bench's client talks to the gateway on loopback (no token). WebSocket: \
             one connection per session, `connect` first (not timed), then each `agent` request timed to the \
             first `agent` event with `stream: assistant, phase: delta` and to the second `res` (status `ok`, \
             text checked); the bench's gateway runs with its per-connection rate limit raised \
             (`AGENTLOOP_GATEWAY__RATE_LIMIT_PER_SEC`/`_BURST`), since one session in turn sends faster than \
             the default 20/s. HTTP: `POST /v1/chat/completions`, non-streaming, `user` = session, \
             `Idempotency-Key` = tag, keep-alive connections (reqwest), timed to the parsed JSON answer, \
             `choices[0].message.content` checked.\n\
             - Peer columns of the targets table come from `PEERS.md` (same machine type); \
             `./scripts/bench.sh --openclaw` measures OpenClaw and agentloop side by side in one run \
             (section below, when it has been run).\n",
        );
        s
    }

    fn summary(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "## Targets (issue 6) and peers\n");
        let _ = writeln!(
            s,
            "| metric | agentloop | target | verdict / what bounds it | OpenClaw 2026.9.6 | nanobot 0.3.5 |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|");
        if let Some(p) = self.phase("lat1") {
            let l = pct(&p.totals);
            let _ = writeln!(
                s,
                "| overhead inbound → final reply, 1 session, p50 | {:.2} ms | < 3 ms | {} | 363 ms (median, via HTTP) | 89 ms |",
                l.p50,
                verdict(
                    l.p50 < 3.0,
                    format!(
                        "{:.1}× the target; {}{}",
                        l.p50 / 3.0,
                        self.bound_latency(),
                        self.machine_words(p)
                    )
                )
            );
            let _ = writeln!(
                s,
                "| overhead inbound → final reply, 1 session, p99 | {:.2} ms | < 10 ms | {} | 430 ms (p95) | 99 ms (p95) |",
                l.p99,
                verdict(
                    l.p99 < 10.0,
                    format!(
                        "{:.1}× the target; {} of {} replies stalled > 1 s (≈ the runner's 5 s sweep interval: \
                         a session with pending input and no owner until the sweeper claims it); {} of {} planned messages sent before the phase's time limit",
                        l.p99 / 10.0,
                        stalled(&p.totals),
                        p.totals.len(),
                        p.sent,
                        self.planned_lat1
                    )
                )
            );
        }
        if let Some(p) = self.phase("lat10") {
            let l = pct(&p.totals);
            let _ = writeln!(
                s,
                "| overhead, 10 sessions at once, p99 | {:.2} ms | < 25 ms | {} | 4.0 s (p95, 10 sessions) | 0.95 s (p95) |",
                l.p99,
                verdict(
                    l.p99 < 25.0,
                    format!(
                        "{:.1}× the target; {} of {} replies stalled > 1 s",
                        l.p99 / 25.0,
                        stalled(&p.totals),
                        p.totals.len()
                    )
                )
            );
        }
        if let Some(p) = self.phase("tp100") {
            let all = p.persisted == Some(i64::try_from(p.sent).unwrap_or(-1))
                && p.lost == 0
                && p.wrong == 0;
            let _ = writeln!(
                s,
                "| completed runs/s, 100 sessions | {:.0} | ≥ 1,500, all persisted | {} | 3.4 msg/s (50 sessions) | 13.4 msg/s (50 sessions) |",
                p.rate(),
                verdict(
                    p.rate() >= 1500.0 && all,
                    format!(
                        "{}; persisted {}/{}; {}",
                        if p.rate() >= 1500.0 {
                            format!("{:.2}× the target", p.rate() / 1500.0)
                        } else {
                            format!("{:.2}× below", 1500.0 / p.rate().max(1e-9))
                        },
                        p.persisted.unwrap_or(-1),
                        p.sent,
                        self.bound_cpu(p)
                    )
                )
            );
            let cpu = p.cpu_ms_per_run(&STACK_GROUPS, self.tck);
            let _ = writeln!(
                s,
                "| CPU-ms per completed run, whole stack (100 sessions) | {cpu:.2} | < 1.5 | {} | 330–420 | 70–90 |",
                verdict(
                    cpu < 1.5,
                    format!(
                        "{:.1}× the target; largest: {}",
                        cpu / 1.5,
                        self.cpu_split(p)
                            .iter()
                            .take(3)
                            .map(|(g, ms)| format!("{g} {ms:.2}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                )
            );
        }
        if let Some((name, kib)) = largest_service(&self.rss_idle) {
            let all: Vec<String> = SERVICES
                .iter()
                .filter_map(|n| rss(&self.rss_idle, n).map(|v| format!("{n} {}", mib(v))))
                .collect();
            // Idle after work too: what a service keeps once a load is over is what it costs
            // to leave running.
            let after_load =
                largest_service(&self.rss_before_mem).map_or(String::new(), |(n, v)| {
                    format!(
                        "; idle after the throughput phases, largest: {n} {} MiB{}",
                        mib(v),
                        if v < 30 * 1024 {
                            ""
                        } else {
                            ", over the target"
                        }
                    )
                });
            let _ = writeln!(
                s,
                "| RSS idle, largest service | {} MiB ({name}) | < 30 MiB each | {} | 977 MB (3 processes) | 105 MB |",
                mib(kib),
                verdict(
                    kib < 30 * 1024,
                    format!("MiB after start: {}{after_load}", all.join(", "))
                )
            );
        }
        if let Some(per) = self.kib_per_session() {
            let _ = writeln!(
                s,
                "| runner RSS per idle session known | {per:.2} KiB | < 5 KiB | {} | 1.9 GB after load | 152 MB after load |",
                verdict(
                    per < 5.0,
                    format!(
                        "{} +{} MiB for {} sessions",
                        self.setup.runner_process(),
                        mib(self.runner_delta()),
                        self.mem_sessions
                    )
                )
            );
        }
        if let (Some(one), Some(two), Some(again)) = (
            self.phase("tp100x1"),
            self.phase("tp100x2"),
            self.phase("tp100x1b"),
        ) {
            let base = f64::midpoint(one.rate(), again.rate());
            let _ = writeln!(
                s,
                "| scaling, 100 sessions: 1 → 2 runners | {:.0} / {:.0} → {:.0} runs/s ({:.2}×) | (measure) | \
                 1 runner, 2 runners, 1 runner again, back to back after the memory phase, against the mean \
                 of the two 1-runner phases; with 2 runners the {} (the runner is {:.0} % of the stack's \
                 CPU per run: a second runner process spreads that share, and on 2 cores it finds no \
                 idle core) | — | — |",
                one.rate(),
                again.rate(),
                two.rate(),
                two.rate() / base.max(1e-9),
                self.bound_cpu(two),
                100.0 * one.cpu_ms_per_run(&["runner"], self.tck)
                    / one.cpu_ms_per_run(&STACK_GROUPS, self.tck).max(1e-9),
            );
        }
        let _ = writeln!(
            s,
            "| start to ready | {:.2} s | — | — | 11.5–19 s | 1.8–2 s |\n",
            self.start_to_ready.as_secs_f64()
        );
        s
    }

    /// The runner's growth, or with `--mode all` the whole process's (an upper bound).
    fn runner_delta(&self) -> u64 {
        let name = self.setup.runner_rss_name();
        let before = rss(&self.rss_before_mem, name).unwrap_or(0);
        let after = rss(&self.rss_after_mem, name).unwrap_or(0);
        after.saturating_sub(before)
    }

    fn kib_per_session(&self) -> Option<f64> {
        (self.mem_sessions > 0 && !self.rss_after_mem.is_empty())
            .then(|| self.runner_delta() as f64 / self.mem_sessions as f64)
    }

    fn latency_section(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "## Overhead latency (ms)\n");
        let _ = writeln!(
            s,
            "| scenario | messages | ok | stalled > 1 s | to first delta p50 / p90 / p99 / max | to the final reply on `outbound.>` p50 / p99 | to final reply p50 / p90 / p99 / max |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|");
        for p in &self.latency {
            let f = pct(&p.first_deltas);
            let t = pct(&p.totals);
            let what = match p.name.as_str() {
                "lat1" => "1 session, in turn".to_owned(),
                "lat1o" => "1 session, in turn, each reply read on `agentloop.outbound.>`".to_owned(),
                "lat10" => "10 sessions at once, each in turn".to_owned(),
                "ask1" => "1 session via gateway `agentloop.ask` (request → reply)".to_owned(),
                "ws1" => {
                    "1 session via gateway WebSocket `agent` (request → first `agent` delta event / final `res`)"
                        .to_owned()
                }
                "http1" => {
                    "1 session via gateway `POST /v1/chat/completions` (non-streaming, request → answer)"
                        .to_owned()
                }
                "http10" => format!(
                    "{} sessions at once via `POST /v1/chat/completions`, each in turn",
                    p.concurrency
                ),
                other => other.to_owned(),
            };
            let first = if f.n == 0 {
                "—".to_owned()
            } else {
                format!("{:.2} / {:.2} / {:.2} / {:.2}", f.p50, f.p90, f.p99, f.max)
            };
            let o = pct(&p.outbounds);
            let on_outbound = if o.n == 0 {
                "—".to_owned()
            } else {
                format!("{:.2} / {:.2}", o.p50, o.p99)
            };
            let _ = writeln!(
                s,
                "| {what} | {} | {} | {} | {first} | {on_outbound} | {:.2} / {:.2} / {:.2} / {:.2} |",
                p.sent,
                p.ok,
                stalled(&p.totals),
                t.p50,
                t.p90,
                t.p99,
                t.max
            );
        }
        s.push('\n');
        s
    }

    fn gateway_section(&self) -> String {
        let mut s = String::new();
        let rows: Vec<&PhaseResult> = ["ask1", "ws1", "http1", "http10"]
            .iter()
            .filter_map(|n| self.phase(n))
            .collect();
        if rows.is_empty() {
            return s;
        }
        let _ = writeln!(
            s,
            "## Through the gateway's client protocols
"
        );
        let _ = writeln!(
            s,
            "| protocol | sessions at once | sent | ok | wrong / lost | msg/s | to first delta p50 / p99 ms | to final answer p50 / p90 / p99 / max ms | persisted runs | stack CPU-ms/msg | of which gateway / memory / postgres |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|");
        for p in rows {
            let what = match p.name.as_str() {
                "ask1" => "NATS `agentloop.ask`",
                "ws1" => "WebSocket `agent`",
                _ => "HTTP `POST /v1/chat/completions`",
            };
            let f = pct(&p.first_deltas);
            let t = pct(&p.totals);
            let first = if f.n == 0 {
                "—".to_owned()
            } else {
                format!("{:.2} / {:.2}", f.p50, f.p99)
            };
            let _ = writeln!(
                s,
                "| {what} | {} | {} | {} | {} / {} | {:.0} | {first} | {:.2} / {:.2} / {:.2} / {:.2} | {} | {:.2} | {:.2} / {:.2} / {:.2} |",
                p.concurrency,
                p.sent,
                p.ok,
                p.wrong,
                p.lost,
                p.rate(),
                t.p50,
                t.p90,
                t.p99,
                t.max,
                p.persisted.unwrap_or(-1),
                p.cpu_ms_per_run(&STACK_GROUPS, self.tck),
                p.cpu_ms_per_run(&["gateway"], self.tck),
                p.cpu_ms_per_run(&["memory"], self.tck),
                p.cpu_ms_per_run(&["postgres"], self.tck)
            );
        }
        s.push('\n');
        s
    }

    /// A throughput row's sessions column, with the phase named where the count alone is
    /// ambiguous.
    fn row_label(&self, p: &PhaseResult) -> String {
        if p.name == "mem" {
            format!(
                "{} (memory phase, 1 msg × {} sessions)",
                p.concurrency, self.mem_sessions
            )
        } else if p.name.starts_with("tp100x") {
            format!("{} (scaling, after the memory phase)", p.concurrency)
        } else {
            p.concurrency.to_string()
        }
    }

    fn throughput_section(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "## Throughput (closed loop, each session sends in turn)\n"
        );
        let _ = writeln!(
            s,
            "| sessions | runners | sent | replies ok | wrong / lost / dup / stray | persisted runs | transcript rows | runs/s | latency p50 / p99 ms | stalled > 1 s | stack CPU-ms/run | stack cores busy | machine cores stolen / idle | memory calls per batch |"
        );
        let _ = writeln!(
            s,
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        );
        let rows: Vec<&PhaseResult> = self
            .throughput
            .iter()
            .chain(self.memory_phase.iter())
            .chain(&self.scaling)
            .collect();
        for p in &rows {
            let t = pct(&p.totals);
            let label = self.row_label(p);
            let _ = writeln!(
                s,
                "| {label} | {} | {} | {} | {} / {} / {} / {} | {} | {} | {:.0} | {:.1} / {:.1} | {} | {:.2} | {:.2} | {} | {} |",
                p.runners,
                p.sent,
                p.ok,
                p.wrong,
                p.lost,
                p.tally.duplicates,
                p.tally.unexpected,
                p.persisted.unwrap_or(-1),
                p.transcript_entries.unwrap_or(-1),
                p.rate(),
                t.p50,
                t.p99,
                // Above 100 sessions a second-long wait is the queue of a saturated stack.
                if p.concurrency > 100 {
                    "—".to_owned()
                } else {
                    stalled(&p.totals).to_string()
                },
                p.cpu_ms_per_run(&STACK_GROUPS, self.tck),
                self.stack_cores(p),
                self.machine_cores(p)
                    .map_or("—".to_owned(), |(steal, idle)| format!(
                        "{steal:.2} / {idle:.2}"
                    )),
                p.batched.map_or("—".to_owned(), |(calls, batches)| format!(
                    "{:.2}",
                    calls as f64 / batches.max(1) as f64
                ))
            );
        }
        let _ = writeln!(s, "\n### CPU-ms per completed run, by process\n");
        let mut header = "| sessions | runners |".to_owned();
        let mut sep = "|---|---|".to_owned();
        let groups: Vec<&str> = STACK_GROUPS
            .iter()
            .copied()
            .chain(["fake-model", "bench"])
            .collect();
        for g in &groups {
            let _ = write!(header, " {g} |");
            sep.push_str("---|");
        }
        let _ = writeln!(s, "{header}\n{sep}");
        for p in &rows {
            let _ = write!(s, "| {} | {} |", self.row_label(p), p.runners);
            for g in &groups {
                let _ = write!(s, " {:.3} |", p.cpu_ms_per_run(&[g], self.tck));
            }
            s.push('\n');
        }
        s.push('\n');
        s
    }

    fn memory_section(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "## Resident memory (MiB)\n");
        let _ = writeln!(
            s,
            "| process | idle after start | idle after the throughput phases | peak, {} sessions active | after {} more sessions known, idle |",
            self.mem_active, self.mem_sessions
        );
        let _ = writeln!(s, "|---|---|---|---|---|");
        for (name, idle) in &self.rss_idle {
            let cell = |list: &[(String, u64)]| rss(list, name).map_or("—".to_owned(), mib);
            let _ = writeln!(
                s,
                "| {name} | {} | {} | {} | {} |",
                mib(*idle),
                cell(&self.rss_before_mem),
                cell(&self.rss_peak_mem),
                cell(&self.rss_after_mem)
            );
        }
        if let Some(per) = self.kib_per_session() {
            let _ = writeln!(
                s,
                "\nRSS of the {}: +{} MiB for {} sessions known (idle) = **{per:.2} KiB per idle session**.",
                self.setup.runner_process(),
                mib(self.runner_delta()),
                self.mem_sessions
            );
        }
        s.push('\n');
        s
    }

    fn hops_section(&self) -> String {
        format!(
            "## Where the time goes (1 session in turn, {} runs)\n\n{}",
            self.hops.len(),
            hop_table(&self.hops)
        )
    }
}

/// Each hop's percentiles over the traced runs, in path order.
fn hop_summary(hops: &[HopRow]) -> Vec<(String, String, Pct)> {
    HOPS.iter()
        .map(|(name, covers, f)| {
            let v: Vec<f64> = hops.iter().filter_map(f).collect();
            (name.to_string(), covers.to_string(), pct_ms(&v))
        })
        .collect()
}

/// The markdown table of where the time of the traced runs went, hop by hop and end to end.
#[must_use]
pub fn hop_table(hops: &[HopRow]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "| hop | covers | p50 ms | p90 ms | p99 ms |");
    let _ = writeln!(s, "|---|---|---|---|---|");
    for (name, covers, p) in hop_summary(hops) {
        if p.n == 0 {
            let _ = writeln!(s, "| {name} | {covers} | n/a | n/a | n/a |");
            continue;
        }
        let _ = writeln!(
            s,
            "| {name} | {covers} | {:.3} | {:.3} | {:.3} |",
            p.p50, p.p90, p.p99
        );
    }
    let total: Vec<f64> = hops
        .iter()
        .map(|r| (r.trace.delivered - r.trace.sent) / 1000.0)
        .collect();
    let t = pct_ms(&total);
    let _ = writeln!(
        s,
        "| **publish → delivered** | end to end | {:.3} | {:.3} | {:.3} |",
        t.p50, t.p90, t.p99
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let p = pct_ms(&v);
        assert_eq!(p.p50, 50.0);
        assert_eq!(p.p90, 90.0);
        assert_eq!(p.p99, 99.0);
        assert_eq!(p.max, 100.0);
        assert_eq!(pct_ms(&[]).n, 0);
    }
}
