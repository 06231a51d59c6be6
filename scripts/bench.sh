#!/usr/bin/env bash
# Benchmarks the whole stack (five services as separate processes or in one `agentloop all`, a
# private nats-server, a fresh Postgres database, the fake model answering at once), prints a
# markdown table and writes bench/RESULTS.md. Takes under a minute once built (the first release
# build about 6); --quick about 30 s.
#
# Usage: ./scripts/bench.sh [--quick] [--no-write | --out PATH] [--keep-logs]
#          [--mode separate|all] [--inbound proto|json]
#        ./scripts/bench.sh --soak N [--sessions S] [--runners R] [--trace | --outbound | --http]   (S sessions,
#          default 100, × N messages only, on R runner processes, default 1; a short summary printed;
#          --trace times each hop of the bus path, so not with --http; --outbound: the client
#          takes each reply from agentloop.outbound.>, where it first appears, instead of waiting
#          for delivery's copy on agentloop.deliver.>, which is still checked)
#   --mode all: the five services in one `agentloop all` process instead of five (default
#   separate; no runner scaling phase, --runners refused). --inbound json: the load client
#   publishes its InboundMessages as JSON with Content-Type: application/json, as the NATS CLI
#   does (default proto). Both work with --soak, e.g. a before/after of all vs separate:
#   ./scripts/bench.sh --soak 20 --mode all --inbound json; ./scripts/bench.sh --soak 20 --inbound json
#        ./scripts/bench.sh --matrix [--quick] [--no-write | --out PATH] [--keep-logs]
#   --matrix: what users run, side by side: a fresh stack for each of --mode separate|all ×
#   --inbound proto|json, each warmed up, then 1 session in turn, 10 and 100 sessions at once
#   (closed loop: each session waits for its reply; 1 session also with each reply taken from
#   agentloop.outbound.>, as issue 30 measured) and a burst (100 sessions × 10 messages
#   published at once, queue mode followup; runs/s from first publish to last reply, lost
#   replies and persisted runs); one table, which replaces its own section of bench/RESULTS.md
#   (under a minute; --quick fewer messages)
#        ./scripts/bench.sh --openclaw [--rounds N] [--no-write | --out PATH] [--keep-logs]
#   --openclaw: side by side with OpenClaw 2026.9.6 through the same OpenAI-compatible
#   POST /v1/chat/completions and the same fake model process (about 3.5 minutes after the
#   install); the sequential phase runs in N rounds (default 3) alternating the two systems. Installs Node 24 and OpenClaw with npm into .bench-peers/ (reused when present;
#   BENCH_PEERS_DIR overrides) and replaces its own section of bench/RESULTS.md.
#        ./scripts/bench.sh --retrieval [--quick] [--no-write | --out PATH] [--keep-logs]
#   --retrieval: long-term memory search against the memory service alone: recall@1 and
#   recall@5 of bench/retrieval/facts.jsonl (one user), full text and hybrid with the vectors of
#   all-MiniLM-L6-v2 (bench/embed/server.py; bench/embed/setup.sh installs it into .venv), then
#   SearchMemories latency over gRPC at 100,000 memories; replaces its own section of
#   bench/RESULTS.md (about two minutes).
# Environment: BENCH_PG_URL (default postgres://postgres@127.0.0.1:5432), BENCH_RUST_LOG
# (services' RUST_LOG, default info), BENCH_PEERS_DIR (default .bench-peers),
# BENCH_NATS_GOMAXPROCS (nats-server's GOMAXPROCS, default 1).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$REPO_ROOT"

extra=()
for arg in "$@"; do
  if [[ "$arg" == "--retrieval" ]]; then
    bash "$REPO_ROOT/bench/embed/setup.sh"
  fi
  if [[ "$arg" == "--openclaw" ]]; then
    if ! paths="$("$REPO_ROOT/bench/openclaw/install.sh" "${BENCH_PEERS_DIR:-$REPO_ROOT/.bench-peers}")"; then
      log "--openclaw: installing OpenClaw failed (see above); the default bench does not need it"
      exit 1
    fi
    node_bin="$(sed -n 's/^NODE=//p' <<<"$paths")"
    openclaw_dir="$(sed -n 's/^OPENCLAW_DIR=//p' <<<"$paths")"
    extra=(--node "$node_bin" --openclaw-dir "$openclaw_dir")
  fi
done

ensure_nats_server
ensure_postgres
cargo build --release --locked -p agentloop -p agentloop-fake-model -p agentloop-bench
exec "$REPO_ROOT/target/release/agentloop-bench" --nats-server "$NATS_SERVER_BIN" "$@" ${extra[@]+"${extra[@]}"}
