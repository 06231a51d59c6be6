#!/usr/bin/env bash
# Runs the cargo-fuzz targets (fuzz/fuzz_targets) for a bounded time each.
#
#   bash scripts/fuzz.sh                 every target for 600 s
#   bash scripts/fuzz.sh 60 scanner      one target for 60 s
#
# Targets: bus_codec (protobuf and JSON bus payloads, validated as the router does),
# gateway_frame (a WebSocket client's frames before it is authenticated: connect params,
# protocol range, device proofs), channel_webhooks (Telegram, Slack and signed-webhook bodies),
# scanner (the injection scanner's normaliser and rules).
#
# Needs cargo-fuzz (installed here if missing) and a nightly toolchain for its sanitizer flags;
# without one, the stable toolchain is used with RUSTC_BOOTSTRAP=1. A crash leaves its input in
# fuzz/artifacts/<target>/: turn it into a regression test next to the code it broke.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

seconds="${1:-600}"
shift || true
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(bus_codec gateway_frame channel_webhooks scanner)

command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    fuzz=(cargo +nightly fuzz)
else
    export RUSTC_BOOTSTRAP=1
    fuzz=(cargo fuzz)
fi

for target in "${targets[@]}"; do
    mkdir -p "fuzz/corpus/$target"
    echo "[fuzz] $target for ${seconds}s"
    "${fuzz[@]}" run "$target" "fuzz/corpus/$target" "fuzz/seeds/$target" -- \
        -max_total_time="$seconds" -max_len=65536 -timeout=10 -rss_limit_mb=2048
done
