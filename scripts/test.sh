#!/usr/bin/env bash
# Runs every test of the workspace against a real nats-server (pinned, started per test) and
# the local Postgres. Usage: ./scripts/test.sh [extra nextest args]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$REPO_ROOT"

ensure_nats_server
ensure_postgres
ensure_nextest
# The TLS test makes its certificates with the openssl command.
command -v openssl >/dev/null 2>&1 || { log "installing openssl"; apt-get install -y -qq openssl >/dev/null; }
# The partition tests make "hosts" of network namespaces with iproute2's `ip` (as root).
command -v ip >/dev/null 2>&1 || { log "installing iproute2"; apt-get install -y -qq iproute2 >/dev/null; }
# A real Prometheus (Debian's package) for the metrics test.
command -v prometheus >/dev/null 2>&1 || { log "installing prometheus"; apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }
# Chromium and the pinned Python clients (openai, playwright) for the gateway's client tests.
bash tests/python/setup.sh
# The MCP servers (npm) the runner's MCP tests start.
bash tests/mcp/setup.sh
# Node 24 and OpenClaw 2026.9.6, whose own CLI and TUI the gateway's compatibility test runs.
bash bench/openclaw/install.sh >/dev/null
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}"
log "nats-server: $("$NATS_SERVER_BIN" --version), postgres: $DATABASE_URL"
cargo nextest run --workspace --locked "$@"
