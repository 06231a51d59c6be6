#!/usr/bin/env bash
# Builds agentloop and starts every service in one process (`agentloop all`).
# Starts a nats-server 2.11+ when none answers at NATS_URL, and uses the local Postgres.
# With no model provider configured it uses the built-in fake model server and says so.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$REPO_ROOT"

nats_version_at() { # prints the version of the nats-server at host:port, if any
  python3 - "$1" "$2" <<'PY' 2>/dev/null || true
import json, socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1)
line = s.makefile().readline()
print(json.loads(line.split(" ", 1)[1])["version"] if line.startswith("INFO ") else "")
PY
}

port_free() { # true when nothing listens on 127.0.0.1:$1
  python3 -c "import socket, sys; s = socket.socket(); s.settimeout(0.5); sys.exit(0 if s.connect_ex(('127.0.0.1', int(sys.argv[1]))) else 1)" "$1"
}

version_ok() { # true when $1 >= 2.11
  [[ -n "$1" ]] && python3 -c "import sys; v=[int(x) for x in sys.argv[1].split('-')[0].split('.')[:2]]; sys.exit(0 if v >= [2, 11] else 1)" "$1"
}

ensure_postgres
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/agentloop}"

NATS_URL="${NATS_URL:-nats://127.0.0.1:4222}"
hostport="${NATS_URL#nats://}"; hostport="${hostport##*@}"
host="${hostport%:*}"; port="${hostport##*:}"
found="$(nats_version_at "$host" "$port")"
if version_ok "$found"; then
  log "using nats-server $found at $NATS_URL"
else
  [[ -n "$found" ]] && log "nats-server $found at $NATS_URL is older than 2.11"
  ensure_nats_server
  mkdir -p .run/nats
  # Nothing on the configured local port: our server takes it, so `nats` commands without `-s`
  # reach it. An older server there moves ours to 4223 or the next port not held by one.
  if ! [[ -z "$found" && ( "$host" == 127.0.0.1 || "$host" == localhost ) ]] || ! port_free "$port"; then
    port=4223
    while [[ -n "$(nats_version_at 127.0.0.1 "$port")" ]] && ! version_ok "$(nats_version_at 127.0.0.1 "$port")"; do
      port=$((port + 1))
    done
  fi
  if ! version_ok "$(nats_version_at 127.0.0.1 "$port")"; then
    log "starting nats-server $NATS_SERVER_PIN with JetStream on 127.0.0.1:$port (store in .run/nats)"
    "$NATS_SERVER_BIN" -js -a 127.0.0.1 -p "$port" -sd .run/nats -l .run/nats-server.log &
    NATS_PID=$!
    trap 'kill $NATS_PID 2>/dev/null || true' EXIT
    for _ in $(seq 1 50); do version_ok "$(nats_version_at 127.0.0.1 "$port")" && break; sleep 0.1; done
  fi
  NATS_URL="nats://127.0.0.1:$port"
fi
export NATS_URL

log "building agentloop (release)"
cargo build --release --locked -p agentloop
log "starting agentloop all (NATS_URL=$NATS_URL, DATABASE_URL=$DATABASE_URL); Ctrl-C stops it"
# In the background so that a SIGTERM sent to this script (a supervisor, `timeout`, `kill`) is
# handed on and waited for: bash runs no trap while a foreground child runs, and without one it
# would exit at once, stopping nats-server under a still running agentloop. Ctrl-C needs no
# forwarding: the terminal signals the whole process group, agentloop included, and a second
# signal would make agentloop skip its graceful stop.
target/release/agentloop all "$@" &
AGENTLOOP_PID=$!
trap 'kill -TERM "$AGENTLOOP_PID" 2>/dev/null || true' TERM
trap ':' INT
status=0
while :; do
  # `wait` returns early when a trapped signal arrives; the process may still be stopping.
  wait "$AGENTLOOP_PID" && status=0 || status=$?
  kill -0 "$AGENTLOOP_PID" 2>/dev/null || break
done
exit "$status"
