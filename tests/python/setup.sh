#!/usr/bin/env bash
# Installs what the gateway's client tests need: Chromium (Debian package) for the web chat test
# and a venv at tests/python/.venv with the pinned OpenAI SDK and Playwright driver.
# Idempotent; run before ./scripts/test.sh on a fresh machine (CI does).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

if ! command -v chromium >/dev/null 2>&1; then
  echo "installing chromium (apt)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq chromium >/dev/null
fi

venv="$here/.venv"
stamp="$venv/.requirements"
if [ ! -x "$venv/bin/python" ] || ! cmp -s "$here/requirements.txt" "$stamp"; then
  echo "installing $(grep -v '^#' "$here/requirements.txt" | xargs) into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$here/requirements.txt"
  cp "$here/requirements.txt" "$stamp"
fi
