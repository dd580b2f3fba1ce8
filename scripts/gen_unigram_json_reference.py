#!/usr/bin/env python3
"""Writes crates/inference/tests/fixtures/tokenizer/unigram/: one `tokenizer.json.gz` per SentencePiece
Unigram test model plus `reference_<NAME>.jsonl.gz` with HF `tokenizers` (0.23.3) ids and decodes.

The tokenizer.json files are built the way HF's SentencePiece converters build them, through the
`tokenizers` Python API (so the JSON is HF's own serialization):
  botchan_en_unigram_1000  ALBERT/XLNet style: Replace("``", '"'), Replace("''", '"'), Precompiled,
                           Replace(Regex(" {2,}"), " "); Metaspace(prepend_scheme="always");
                           TemplateProcessing "<s> $A </s>" / "<s> $A </s> </s> $B </s>"
  kyoto_ja_unigram_8000    SpmConverter style: Precompiled, Strip(right), Replace(Regex(" {2,}"), "▁");
                           Metaspace(prepend_scheme="first", split=false);
                           TemplateProcessing "$A </s>" (T5 style)
  botchan_en_unigram_1000_bytes  the botchan file with 256 <0xXX> pieces (score 0) appended,
                           byte_fallback=true, decoder Replace/ByteFallback/Fuse/Strip (Llama style);
                           corpus: every other string
Control and unknown pieces are registered as special added tokens, as the converters do.

Needs .cache/venv-sp (scripts/fetch_sentencepiece.sh --with-venv) to read the .model protobufs, and
the HF venv .cache/venv-tok:

    .cache/venv-tok/bin/python scripts/gen_unigram_json_reference.py

Reference files: reference_<NAME>.jsonl.gz, one per tokenizer.
Corpus: the shared SentencePiece corpus tests/fixtures/sentencepiece/corpus.jsonl.gz (written by
scripts/gen_sentencepiece_reference.py; 5,918 strings) plus special-token strings, quote pairs and
whitespace runs. Each reference file starts with {"model": NAME, "prefix": [...],
"suffix": [...]}, the ids its post-processor puts around one sequence; then one line per input:
{"model": NAME, "i": N (corpus string N) or "text": STR, "ids_plain": [...] (no special tokens),
 "ids": [...] (with special tokens; only where not prefix + ids_plain + suffix),
 "decoded": decode(ids, skip_special_tokens=True) (only where not the input),
 "decoded_all": decode(ids, False) (only where not "decoded")}.
"""
import base64
import gzip
import io
import json
import os
import subprocess
import sys

from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import Unigram

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.join(ROOT, ".cache")
OUT = os.path.join(ROOT, "crates/inference/tests/fixtures/tokenizer/unigram")
SP_CORPUS = os.path.join(ROOT, "crates/inference/tests/fixtures/sentencepiece/corpus.jsonl.gz")
MODELS = ["botchan_en_unigram_1000", "kyoto_ja_unigram_8000"]
# Variant: botchan with 256 `<0xXX>` pieces appended and byte_fallback on, Llama-style decoder.
BYTES = "botchan_en_unigram_1000_bytes"

DUMP = r"""
import base64, json, sys
from sentencepiece import sentencepiece_model_pb2 as pb
m = pb.ModelProto()
m.ParseFromString(open(sys.argv[1], "rb").read())
json.dump({
    "pieces": [[p.piece, p.score, p.type] for p in m.pieces],
    "unk_id": m.trainer_spec.unk_id,
    "byte_fallback": m.trainer_spec.byte_fallback,
    "charsmap": base64.b64encode(m.normalizer_spec.precompiled_charsmap).decode(),
}, sys.stdout)
"""

EXTRA = [
    "<s>", "</s>", "<unk>", "<s>hello</s>", "a <s> b </s> c", "x<unk>y", " <s> ", "<s><s></s>",
    "``quoted''", "He said ``hi'' twice", "''''", "````", "` ' \" `` ''", "a  b   c    d",
    "  lead", "trail  ", "\u3000\u3000全角", "tab\t\ttab", "new\n\nline", "▁", "▁▁a▁", "a▁b",
    "吾輩は<s>猫</s>である", "x" * 3000, "猫" * 2000, "ab " * 1500, "\U0001F600" * 500,
]


def dump(name):
    py = os.path.join(CACHE, "venv-sp/bin/python")
    path = os.path.join(CACHE, "sentencepiece", name + ".model")
    return json.loads(subprocess.check_output([py, "-c", DUMP, path]))


def build(name, m):
    vocab = [(p, s) for p, s, _ in m["pieces"]]
    byte_fallback = m["byte_fallback"]
    if name == BYTES:
        vocab += [(f"<0x{b:02X}>", 0.0) for b in range(256)]
        byte_fallback = True
    tok = Tokenizer(Unigram(vocab, m["unk_id"], byte_fallback))
    charsmap = base64.b64decode(m["charsmap"])
    # Types 2 (UNKNOWN) and 3 (CONTROL) become special added tokens.
    specials = [p for p, _, t in m["pieces"] if t in (2, 3)]
    if name.startswith("botchan"):
        tok.normalizer = normalizers.Sequence([
            normalizers.Replace("``", '"'),
            normalizers.Replace("''", '"'),
            normalizers.Precompiled(charsmap),
            normalizers.Replace(Regex(" {2,}"), " "),
        ])
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
        if name == BYTES:
            tok.decoder = decoders.Sequence([
                decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                decoders.Strip(" ", 1, 0)])
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
            special_tokens=[("<s>", tok.token_to_id("<s>")), ("</s>", tok.token_to_id("</s>"))])
    else:
        tok.normalizer = normalizers.Sequence([
            normalizers.Precompiled(charsmap),
            normalizers.Strip(left=False, right=True),
            normalizers.Replace(Regex(" {2,}"), "▁"),
        ])
        tok.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement="▁", prepend_scheme="first", split=False)
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first", split=False)
        tok.post_processor = processors.TemplateProcessing(
            single="$A </s>", pair="$A </s> $B </s>",
            special_tokens=[("</s>", tok.token_to_id("</s>"))])
    tok.add_special_tokens(specials)
    return tok


def corpus(name):
    """(key, value) per input: ("i", N) for string N of the shared SentencePiece corpus
    (scripts/gen_sentencepiece_reference.py), ("text", STR) for the strings added here."""
    with gzip.open(SP_CORPUS, "rt", encoding="utf-8", newline="\n") as f:
        n = len([line for line in f.read().split("\n") if line])
    inputs = [("i", i) for i in range(n)]
    if name == BYTES:
        inputs = inputs[::2] + [("text", t) for t in ["<0x41>", "a<0xE3>b", "<0x>"]]
    return inputs + [("text", t) for t in EXTRA]


def read_corpus():
    with gzip.open(SP_CORPUS, "rt", encoding="utf-8", newline="\n") as f:
        return [json.loads(line) for line in f.read().split("\n") if line]


def main():
    os.makedirs(OUT, exist_ok=True)
    lines = []
    counts = {}
    texts = read_corpus()
    for name in MODELS + [BYTES]:
        tok = build(name, dump(MODELS[0] if name == BYTES else name))
        tok_dir = os.path.join(OUT, name)
        os.makedirs(tok_dir, exist_ok=True)
        # HF's compact serialization (`to_str()`), gzipped (mtime 0), to keep the committed
        # files small; the tests gunzip it.
        text = tok.to_str()
        with gzip.GzipFile(os.path.join(tok_dir, "tokenizer.json.gz"), "wb", compresslevel=9, mtime=0) as f:
            f.write(text.encode("utf-8"))
        # Reload from that text so the reference is what the file says.
        tok = Tokenizer.from_str(text)
        # The ids the post-processor puts around a single sequence.
        probe = tok.encode("a", add_special_tokens=True)
        mask = probe.special_tokens_mask
        first, last = mask.index(0), len(mask) - 1 - mask[::-1].index(0)
        prefix, suffix = probe.ids[:first], probe.ids[last + 1:]
        lines.append({"model": name, "prefix": prefix, "suffix": suffix})
        for key, value in corpus(name):
            text = value if key == "text" else texts[value]
            ids = tok.encode(text, add_special_tokens=True).ids
            plain = tok.encode(text, add_special_tokens=False).ids
            rec = {"model": name, key: value, "ids_plain": plain}
            if ids != prefix + plain + suffix:
                rec["ids"] = ids
            decoded = tok.decode(ids, skip_special_tokens=True)
            decoded_all = tok.decode(ids, skip_special_tokens=False)
            if decoded != text:
                rec["decoded"] = decoded
            if decoded_all != decoded:
                rec["decoded_all"] = decoded_all
            lines.append(rec)
            counts[name] = counts.get(name, 0) + 1
    # One reference file per model, to keep each file small.
    old = os.path.join(OUT, "reference.jsonl.gz")
    if os.path.exists(old):
        os.remove(old)
    for name in MODELS + [BYTES]:
        path = os.path.join(OUT, f"reference_{name}.jsonl.gz")
        # gzip.open takes no `mtime`; a fixed mtime keeps the archive byte-identical between runs.
        with gzip.GzipFile(path, "wb", compresslevel=9, mtime=0) as raw, \
                io.TextIOWrapper(raw, encoding="utf-8") as f:
            for d in lines:
                if d["model"] == name:
                    f.write(json.dumps(d, ensure_ascii=False) + "\n")
    print(f"wrote {len(lines)} lines to {OUT}/reference_*.jsonl.gz; strings per model: {counts}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
