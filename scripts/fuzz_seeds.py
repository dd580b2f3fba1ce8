#!/usr/bin/env python3
"""Seed corpora for the fuzz targets (fuzz/fuzz_targets/*.rs), from the repo's fixtures and the
cached real files (scripts/fetch_models.sh, fetch_sentencepiece.sh). Standard library only.

Writes OUT/<target>/<name> (default OUT: .cache/fuzz-seeds). Two-part inputs are joined by a
NUL byte as lattice_inference::fuzz::split reads them. Small synthetic files (a safetensors
header, a GGUF with a 40-token BPE vocabulary and a chat template, SentencePiece models cut to
their first pieces) keep the inputs short enough to mutate quickly.

usage: scripts/fuzz_seeds.py [OUT]
"""
import gzip
import json
import os
import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "crates/inference/tests/fixtures"
CACHE = ROOT / ".cache"
OUT = Path(sys.argv[1]) if len(sys.argv) > 1 else CACHE / "fuzz-seeds"
TEXTS = [b"Hello, world!", "ünïcode тест 漢字 🙂\n\t  x".encode(), b"a" * 64, b"<|im_start|>user\nhi"]


def put(target, name, data):
    d = OUT / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data)


# --- safetensors: header + data, valid and slightly wrong ---------------------------------
def safetensors(tensors, meta=None):
    header, data = {}, b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if meta:
        header["__metadata__"] = meta
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


put("safetensors", "two", safetensors({"a": ("F32", [2, 3], bytes(24)), "b": ("BF16", [4], bytes(8))},
                                      {"format": "pt"}))
put("safetensors", "empty", safetensors({}))
put("safetensors", "scalar", safetensors({"s": ("I64", [], bytes(8)), "z": ("U8", [0], b"")}))
put("safetensors", "overlap", struct.pack("<Q", 80) +
    b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F16","shape":[2],"data_offsets":[4,8]}}'[:80] + bytes(8))


# --- GGUF: a small qwen2 file with a BPE vocabulary and a chat template --------------------
def gstr(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, payload):
    return gstr(key) + struct.pack("<I", vtype) + payload


def arr(vtype, items, enc):
    return struct.pack("<IQ", vtype, len(items)) + b"".join(enc(x) for x in items)


def gguf(model="gpt2", arch="qwen2", template=True):
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "Ġ", "Ċ", ",", "!", "H", "W"] + letters + ["he", "ll", "Ġw"]
    merges = ["h e", "l l", "Ġ w"]
    kvs = [
        kv("general.architecture", 8, gstr(arch)),
        kv(f"{arch}.block_count", 4, struct.pack("<I", 1)),
        kv(f"{arch}.context_length", 4, struct.pack("<I", 64)),
        kv(f"{arch}.embedding_length", 4, struct.pack("<I", 8)),
        kv(f"{arch}.feed_forward_length", 4, struct.pack("<I", 16)),
        kv(f"{arch}.attention.head_count", 4, struct.pack("<I", 2)),
        kv(f"{arch}.attention.head_count_kv", 4, struct.pack("<I", 1)),
        kv(f"{arch}.rope.freq_base", 6, struct.pack("<f", 10000.0)),
        kv(f"{arch}.attention.layer_norm_rms_epsilon", 6, struct.pack("<f", 1e-6)),
        kv("tokenizer.ggml.model", 8, gstr(model)),
        kv("tokenizer.ggml.pre", 8, gstr("qwen2")),
        kv("tokenizer.ggml.tokens", 9, arr(8, tokens, gstr)),
        kv("tokenizer.ggml.token_type", 9, arr(5, [3, 3, 3] + [1] * (len(tokens) - 3), lambda x: struct.pack("<i", x))),
        kv("tokenizer.ggml.scores", 9, arr(6, [float(-i) for i in range(len(tokens))], lambda x: struct.pack("<f", x))),
        kv("tokenizer.ggml.merges", 9, arr(8, merges, gstr)),
        kv("tokenizer.ggml.eos_token_id", 4, struct.pack("<I", 2)),
        kv("tokenizer.ggml.bos_token_id", 4, struct.pack("<I", 0)),
    ]
    if template:
        kvs.append(kv("tokenizer.chat_template", 8, gstr(
            "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")))
    tensors = [("token_embd.weight", [8, len(tokens)], 0), ("output_norm.weight", [8], 0)]
    info, data = b"", b""
    for name, dims, t in tensors:
        n = 4
        for d in dims:
            n *= d
        info += gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        info += struct.pack("<IQ", t, len(data))
        data += bytes(n) + bytes(-n % 32)
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs) + info
    head += bytes(-len(head) % 32)
    return head + data


put("gguf", "qwen2_bpe", gguf())
put("gguf", "llama_spm", gguf(model="llama", arch="llama"))
put("gguf", "bert_wordpiece", gguf(model="bert", arch="bert", template=False))

# --- tokenizer.json + text ----------------------------------------------------------------
toks = [FIX / "tiny-qwen3/tokenizer.json", FIX / "tiny-bert/tokenizer.json"]
for i, p in enumerate(toks):
    for j, t in enumerate(TEXTS[:2]):
        put("tokenizer_json", f"{p.parent.name}_{j}", p.read_bytes() + b"\0" + t)
for p in sorted((FIX / "tokenizer/unigram").glob("*/tokenizer.json.gz")):
    v = json.loads(gzip.decompress(p.read_bytes()))
    v["model"]["vocab"] = v["model"]["vocab"][:120]  # a short Unigram vocabulary
    put("tokenizer_json", f"unigram_{p.parent.name}", json.dumps(v).encode() + b"\0" + TEXTS[1])


# --- SentencePiece .model: the cached models cut to their first pieces ---------------------
def varint(b, i):
    v, s = 0, 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << s
        s += 7
        if c < 0x80:
            return v, i


def fields(b):
    """(field number, wire type, raw bytes of the field) of one protobuf message."""
    i, out = 0, []
    while i < len(b):
        start = i
        key, i = varint(b, i)
        wt = key & 7
        if wt == 0:
            _, i = varint(b, i)
        elif wt == 1:
            i += 8
        elif wt == 2:
            n, i = varint(b, i)
            i += n
        elif wt == 5:
            i += 4
        else:
            raise ValueError("unknown wire type")
        out.append((key >> 3, wt, b[start:i]))
    return out


for p in sorted((CACHE / "sentencepiece").glob("*.model")):
    fs = fields(p.read_bytes())
    pieces = [f for f in fs if f[0] == 1]
    others = [f for f in fs if f[0] != 1]
    small = b"".join(f[2] for f in pieces[:300]) + b"".join(f[2] for f in others)
    put("sentencepiece", p.stem, small + b"\0" + TEXTS[1])
    # Without the normalizer's precompiled character map (most of the file's bytes).
    no_map = b"".join(f[2] for f in pieces[:300]) + b"".join(f[2] for f in others if f[0] != 3)
    put("sentencepiece", p.stem + "_nomap", no_map + b"\0" + TEXTS[0])

# --- config.json: every fixture's ---------------------------------------------------------
for p in sorted(FIX.glob("**/config.json")):
    put("config_json", str(p.relative_to(FIX)).replace("/", "_"), p.read_bytes())

# --- chat templates + messages ------------------------------------------------------------
ref = json.loads((FIX / "chat_template/reference.json").read_text())
convs = ref["conversations"]
for name, src in ref["templates"].items():
    if isinstance(src, dict):
        src = src.get("template") or src.get("source") or json.dumps(src)
    for cname in list(convs)[:3]:
        msgs = convs[cname]
        msgs = msgs.get("messages", msgs) if isinstance(msgs, dict) else msgs
        put("chat_template", f"{name}_{cname}", src.encode() + b"\0" + json.dumps(msgs).encode())
put("chat_template", "loop", b"{% for i in range(100) %}{{ i }}{% endfor %}\0[]")
put("chat_template", "macro", b"{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(5) }}\0x")

# --- output constraints: schemas, regexes, Lark, GBNF -------------------------------------
for i, line in enumerate((FIX / "schemas/corpus.jsonl").read_text().splitlines()[:60]):
    put("constraint", f"schema_{i}", b"\0" + json.dumps(json.loads(line)["schema"]).encode())
for i, r in enumerate([r"[a-z]{1,8}@[a-z]+\.com", r"(yes|no)", r"\d{3}-\d{4}", r"[^\n]{0,20}"]):
    put("constraint", f"regex_{i}", b"\1" + r.encode())
put("constraint", "lark", b"\2start: \"a\" b*\nb: \"x\" | \"y\"\n")
put("constraint", "gbnf", b"\3root ::= \"(\" [a-z]+ (\",\" [a-z]+)* \")\"\n")

# --- OpenAI / TEI request bodies ----------------------------------------------------------
ROUTES = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/embed", "/rerank",
          "/v1/rerank", "/tokenize", "/v1/load_lora_adapter", "/v1/unload_lora_adapter"]
bodies = {
    0: [{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
        {"messages": [{"role": "system", "content": "x"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
         "stream": True, "logprobs": True, "top_logprobs": 2, "temperature": 0.5, "seed": 1, "n": 2},
        {"messages": [{"role": "user", "content": "j"}], "response_format": {"type": "json_schema",
         "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}}},
        {"messages": [{"role": "user", "content": "t"}], "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}], "tool_choice": "required"}],
    1: [{"prompt": "Hello", "max_tokens": 2, "stop": ["\n"]}, {"prompt": [1, 2, 3], "echo": True, "logprobs": 1},
        {"prompt": ["a", "b"], "stream": True, "stream_options": {"include_usage": True}, "logit_bias": {"5": -100}}],
    2: [{"input": "hello"}, {"input": ["a", "b"], "encoding_format": "base64"}, {"input": [[1, 2, 3]]}],
    3: [{"inputs": "hello"}, {"inputs": ["a", "b"], "normalize": False, "truncate": True}],
    4: [{"query": "q", "texts": ["a", "b"]}, {"query": "q", "texts": ["a"], "raw_scores": True, "return_text": True}],
    5: [{"query": "q", "documents": ["a", "b"], "top_n": 1}],
    6: [{"inputs": "hello world"}, {"inputs": ["a", "b"], "add_special_tokens": False}],
    7: [{"lora_name": "a", "lora_path": "tiny-qwen3/attn"}, {"lora_name": "b", "lora_path": "../x"}],
    8: [{"lora_name": "a"}],
}
for r, bs in bodies.items():
    for i, b in enumerate(bs):
        put("openai_request", f"{ROUTES[r].strip('/').replace('/', '_')}_{i}", bytes([r]) + json.dumps(b).encode())
print(f"seeds in {OUT}: " + ", ".join(f"{d.name} {len(list(d.iterdir()))}" for d in sorted(OUT.iterdir())))
