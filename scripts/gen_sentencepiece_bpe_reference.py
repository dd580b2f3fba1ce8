#!/usr/bin/env python3
"""Writes crates/inference/tests/fixtures/sentencepiece/bpe_reference.jsonl.gz.

Reference ids and decode round trips from the real `sentencepiece` package (0.2.3) for two
SentencePiece BPE models:
  botchan_en_bpe_1000         test/botchan_en_bpe_1000.model of the sentencepiece 0.2.3 sdist
  mistral_tokenizer.model.v1  data/tokenizer.model.v1 of PyPI mistral-common==1.13.1 (32,000
                              pieces, byte fallback, identity normalizer; Llama / Mistral style)
Run scripts/fetch_sentencepiece.sh --with-venv first, then:

    .cache/venv-sp/bin/python scripts/gen_sentencepiece_bpe_reference.py

The texts are the shared corpus tests/fixtures/sentencepiece/corpus.jsonl.gz written by
scripts/gen_sentencepiece_reference.py (one JSON string per line; run that first). Each line is either
  {"i": N, "ids": {MODEL: [...], ...}, "decoded": {MODEL: STR, ...}}
for corpus string N ("decoded" only for the models whose decode(ids) is not the text), or a
decode-only line {"model": MODEL, "decode_ids": [...], "decoded": STR} for random id sequences
(control, unknown and byte pieces, pieces starting with `▁`), or a line of the edited variant
  {"model": VARIANT, "i": N or "text": STR, "ids": [...], "decoded": STR}
on every 8th corpus string of at most 2,000 characters and a few extra strings. The variant (edits
replayed in crates/inference/tests/sentencepiece_bpe.rs)
reaches the paths the two models do not:
  botchan_en_bpe_1000+bytes_user_unused  byte_fallback with 256 <0xXX> pieces, user-defined pieces
                                         (frozen symbols), and every NORMAL piece of at least two
                                         characters whose id is 3 mod 7 made UNUSED (merged, then
                                         split back)
"""
import gzip
import io
import json
import os
import random
import sys

import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as model_pb2

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.join(ROOT, ".cache", "sentencepiece")
FIXTURES = os.path.join(ROOT, "crates/inference/tests/fixtures/sentencepiece")
SOURCE = os.path.join(FIXTURES, "corpus.jsonl.gz")
OUT = os.path.join(FIXTURES, "bpe_reference.jsonl.gz")
MODELS = {
    "botchan_en_bpe_1000": "botchan_en_bpe_1000.model",
    "mistral_tokenizer.model.v1": "mistral_tokenizer.model.v1",
}


VARIANT = "botchan_en_bpe_1000+bytes_user_unused"
USER_SYMBOLS = ["<mask>", "\u2581Botchan", "12", "\U0001F600", "ing\u2581", "\uff48\uff45\uff4c\uff4c\uff4f"]
EXTRA = ["hello <mask> Botchan \uff48\uff45\uff4c\uff4c\uff4f 12 123 \U0001F600\U0001F600 \u00bf\u00e9?",
         "<mask><mask>", "x<mask>y", "  a  ", "singing king ring", "Botchan Botchan's Botchanx",
         "\u00e9\u0301 \u00f1 \u65e5\u672c \U0001F9D1\u200D\U0001F680", "the tonight ot nd is as an was it"]


def variant(base):
    """The bytes_user_unused edit of the serialized model `base`."""
    m = model_pb2.ModelProto()
    m.ParseFromString(base)
    sp_type = model_pb2.ModelProto.SentencePiece
    for i, p in enumerate(m.pieces):
        if p.type == sp_type.NORMAL and i % 7 == 3 and len(p.piece) >= 2:
            p.type = sp_type.UNUSED
    m.trainer_spec.byte_fallback = True
    for sym in USER_SYMBOLS:
        m.pieces.add(piece=sym, score=0.0, type=sp_type.USER_DEFINED)
    for b in range(256):
        m.pieces.add(piece="<0x%02X>" % b, score=0.0, type=sp_type.BYTE)
    return m.SerializeToString()


def texts():
    """The shared corpus written by scripts/gen_sentencepiece_reference.py."""
    with gzip.open(SOURCE, "rt", encoding="utf-8", newline="\n") as f:
        return [json.loads(line) for line in f.read().split("\n") if line]


def main():
    assert spm.__version__ == "0.2.3", spm.__version__
    procs = {}
    for name, file in MODELS.items():
        path = os.path.join(CACHE, file)
        if not os.path.exists(path):
            sys.exit(f"missing {path}: run scripts/fetch_sentencepiece.sh")
        procs[name] = spm.SentencePieceProcessor(model_file=path)
    corpus = texts()
    n_lines = 0
    with io.TextIOWrapper(gzip.GzipFile(OUT, "wb", compresslevel=9, mtime=0), encoding="utf-8") as f:
        for index, text in enumerate(corpus):
            ids = {name: sp.encode(text) for name, sp in procs.items()}
            rec = {"i": index, "ids": ids}
            for name, i in ids.items():
                decoded = procs[name].decode(i)
                if decoded != text:
                    rec.setdefault("decoded", {})[name] = decoded
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
            n_lines += 1
        blob = open(os.path.join(CACHE, MODELS["botchan_en_bpe_1000"]), "rb").read()
        vsp = spm.SentencePieceProcessor(model_proto=variant(blob))
        sub = [("text", t) for t in EXTRA]
        sub += [("i", i) for i, t in enumerate(corpus) if i % 8 == 0 and len(t) <= 2000]
        for key, value in sub:
            text = value if key == "text" else corpus[value]
            ids = vsp.encode(text)
            f.write(json.dumps({"model": VARIANT, key: value, "ids": ids, "decoded": vsp.decode(ids)},
                               ensure_ascii=False) + "\n")
            n_lines += 1
        rng = random.Random(5151)
        for name, sp in procs.items():
            n = sp.get_piece_size()
            special = [0, 1, 2] + [i for i in range(n) if sp.is_byte(i)][:60]
            special += [i for i in range(n) if sp.id_to_piece(i).startswith("\u2581")][:60]
            for _ in range(200):
                ids = [rng.choice(special) if rng.random() < 0.5 else rng.randrange(n)
                       for _ in range(rng.randint(0, 12))]
                f.write(json.dumps({"model": name, "decode_ids": ids, "decoded": sp.decode(ids)},
                                   ensure_ascii=False) + "\n")
                n_lines += 1
    print(f"wrote {n_lines} lines ({len(corpus)} strings x {len(procs)} models, {len(sub)} strings "
          f"for {VARIANT}) to {OUT}")


if __name__ == "__main__":
    main()
