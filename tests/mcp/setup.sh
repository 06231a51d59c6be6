#!/usr/bin/env bash
# Installs the MCP servers the runner's MCP tests start (npm, versions pinned by
# package-lock.json) into tests/mcp/node_modules. Idempotent: `npm ci` runs only when the lock
# file differs from the stamp the last install left.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
stamp="$here/node_modules/.agentloop-lock"
if [ ! -x "$here/node_modules/.bin/mcp-server-everything" ] || ! cmp -s "$here/package-lock.json" "$stamp"; then
  echo "installing the test MCP servers (npm ci in $here)"
  (cd "$here" && npm ci --silent --no-audit --no-fund)
  cp "$here/package-lock.json" "$stamp"
fi
