#!/usr/bin/env python3
"""Validate benign.jsonl: one JSON object per line, required fields, unique ids and
texts, and the minimum counts. Prints counts per lang and kind.

Usage: python3 check_benign.py [path]   (default: benign.jsonl next to this file)
Exit status 1 if any check fails. Stdlib only.
"""
import json
import re
import sys
import unicodedata
from collections import Counter
from pathlib import Path

FIELDS = {"id", "lang", "kind", "text"}
KINDS = {"question", "request", "code", "chat", "tricky", "data"}
REQUIRED_LANGS = ["de", "fr", "es", "it", "pt", "nl", "ru", "zh", "ja", "pl", "tr", "ko", "ar", "sv"]
MIN_ROWS, MIN_NON_EN = 600, 0.35
MIN_KIND = {"tricky": 120, "code": 60, "data": 40}


def main():
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("benign.jsonl")
    errors = []
    rows = []
    raw = path.read_bytes()
    try:
        content = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        sys.exit(f"FAIL: not UTF-8: {e}")
    if raw.startswith(b"\xef\xbb\xbf"):
        errors.append("file starts with a BOM")
    for n, line in enumerate(content.split("\n"), 1):
        if line == "":
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            errors.append(f"line {n}: invalid JSON ({e})")
            continue
        if not isinstance(obj, dict) or set(obj) != FIELDS:
            errors.append(f"line {n}: expected exactly the keys {sorted(FIELDS)}")
            continue
        if not all(isinstance(obj[k], str) for k in FIELDS):
            errors.append(f"line {n}: all fields must be strings")
            continue
        if not re.fullmatch(r"b\d{4}", obj["id"]):
            errors.append(f"line {n}: bad id {obj['id']!r}")
        if obj["kind"] not in KINDS:
            errors.append(f"line {n}: unknown kind {obj['kind']!r}")
        if not re.fullmatch(r"[a-z]{2}", obj["lang"]):
            errors.append(f"line {n}: bad lang {obj['lang']!r}")
        if not obj["text"].strip() or obj["text"] != obj["text"].strip():
            errors.append(f"line {n}: empty text or leading/trailing whitespace")
        rows.append(obj)

    ids = Counter(r["id"] for r in rows)
    errors += [f"duplicate id {i}" for i, c in ids.items() if c > 1]
    # texts compared after NFC + case/whitespace folding, so near-copies also count as duplicates
    norm = Counter(" ".join(unicodedata.normalize("NFC", r["text"]).casefold().split()) for r in rows)
    errors += [f"duplicate text: {t[:60]!r}" for t, c in norm.items() if c > 1]

    langs = Counter(r["lang"] for r in rows)
    kinds = Counter(r["kind"] for r in rows)
    non_en = sum(c for l, c in langs.items() if l != "en")
    if len(rows) < MIN_ROWS:
        errors.append(f"only {len(rows)} rows (< {MIN_ROWS})")
    if rows and non_en / len(rows) < MIN_NON_EN:
        errors.append(f"non-English share {non_en / len(rows):.1%} < {MIN_NON_EN:.0%}")
    errors += [f"language {l} missing" for l in REQUIRED_LANGS if l not in langs]
    errors += [f"kind {k}: {kinds[k]} < {m}" for k, m in MIN_KIND.items() if kinds[k] < m]

    print(f"{path.name}: {len(rows)} rows, {len(ids)} unique ids, {len(norm)} unique texts")
    print(f"non-English: {non_en} ({non_en / max(len(rows), 1):.1%})")
    print("per lang: " + ", ".join(f"{l} {c}" for l, c in langs.most_common()))
    print("per kind: " + ", ".join(f"{k} {c}" for k, c in kinds.most_common()))
    tricky = Counter(r["lang"] for r in rows if r["kind"] == "tricky")
    print("tricky per lang: " + ", ".join(f"{l} {c}" for l, c in tricky.most_common()))
    if errors:
        print(f"FAIL ({len(errors)} problems):")
        for e in errors[:50]:
            print("  " + e)
        sys.exit(1)
    print("OK")


if __name__ == "__main__":
    main()
