#!/usr/bin/env python3
"""Writes crates/inference/tests/fixtures/tokenizer/unigram/: one `tokenizer.json` per SentencePiece
Unigram test model plus `reference.jsonl.gz` with HF `tokenizers` (0.23.3) ids and decodes.

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
                           corpus: every other botchan line
Control and unknown pieces are registered as special added tokens, as the converters do.

Needs .cache/venv-sp (scripts/fetch_sentencepiece.sh --with-venv) to read the .model protobufs, and
the HF venv .cache/venv-tok:

    .cache/venv-tok/bin/python scripts/gen_unigram_json_reference.py

Corpus: the texts of tests/fixtures/sentencepiece/unigram_reference.jsonl.gz (2,043 per model) plus
special-token strings, quote pairs and whitespace runs. Each line of reference.jsonl.gz:
{"model": NAME, "text": STR, "ids": [...] (with special tokens), "ids_plain": [...] (without),
 "decoded": decode(ids, skip_special_tokens=True), "decoded_all": decode(ids, False)}.
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
SP_CORPUS = os.path.join(ROOT, "crates/inference/tests/fixtures/sentencepiece/unigram_reference.jsonl.gz")
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
    texts = []
    base = MODELS[0] if name == BYTES else name
    with gzip.open(SP_CORPUS, "rt") as f:
        for line in f:
            d = json.loads(line)
            if d["model"] == base and "text" in d:
                texts.append(d["text"])
    if name == BYTES:
        texts = texts[::2] + ["<0x41>", "a<0xE3>b", "<0x>"]
    return texts + EXTRA


def main():
    os.makedirs(OUT, exist_ok=True)
    lines = []
    for name in MODELS + [BYTES]:
        tok = build(name, dump(MODELS[0] if name == BYTES else name))
        tok_dir = os.path.join(OUT, name)
        os.makedirs(tok_dir, exist_ok=True)
        # HF's compact serialization (`to_str()`), to keep the committed files small.
        with open(os.path.join(tok_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
            f.write(tok.to_str())
        # Reload from the file so the reference is what the file says.
        tok = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
        for text in corpus(name):
            ids = tok.encode(text, add_special_tokens=True).ids
            lines.append({
                "model": name, "text": text, "ids": ids,
                "ids_plain": tok.encode(text, add_special_tokens=False).ids,
                "decoded": tok.decode(ids, skip_special_tokens=True),
                "decoded_all": tok.decode(ids, skip_special_tokens=False),
            })
    path = os.path.join(OUT, "reference.jsonl.gz")
    # gzip.open takes no `mtime`; a fixed mtime keeps the archive byte-identical between runs.
    with gzip.GzipFile(path, "wb", compresslevel=9, mtime=0) as raw, \
            io.TextIOWrapper(raw, encoding="utf-8") as f:
        for d in lines:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
    print(f"wrote {len(lines)} lines to {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
