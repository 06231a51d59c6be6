#!/usr/bin/env bash
# Benchmarks the whole stack (five services as separate processes, a private nats-server, a
# fresh Postgres database, the fake model answering at once), prints a markdown table and
# writes bench/RESULTS.md. Takes about 3 minutes; --quick about 1.
#
# Usage: ./scripts/bench.sh [--quick] [--no-write | --out PATH] [--keep-logs]
#        ./scripts/bench.sh --openclaw   # side by side with OpenClaw: not available yet (it needs
#                                        # the gateway's OpenAI-compatible HTTP endpoint)
# Environment: BENCH_PG_URL (default postgres://postgres@127.0.0.1:5432), BENCH_RUST_LOG
# (services' RUST_LOG, default info).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$REPO_ROOT"

for arg in "$@"; do
  if [[ "$arg" == "--openclaw" ]]; then
    log "--openclaw is not available yet: both systems must be driven through the same"
    log "OpenAI-compatible POST /v1/chat/completions, which agentloop's gateway does not serve yet."
    log "PEERS.md has the steps to run OpenClaw headless once it does."
    exit 2
  fi
done

ensure_nats_server
ensure_postgres
cargo build --release --locked -p agentloop -p agentloop-fake-model -p agentloop-bench
exec "$REPO_ROOT/target/release/agentloop-bench" --nats-server "$NATS_SERVER_BIN" "$@"
