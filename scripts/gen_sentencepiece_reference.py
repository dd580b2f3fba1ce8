#!/usr/bin/env python3
"""Writes crates/inference/tests/fixtures/sentencepiece/unigram_reference.jsonl.gz.

Reference ids, pieces and decode round trips from the real `sentencepiece` package (0.2.3) for the
Unigram test models of its sdist. Run scripts/fetch_sentencepiece.sh --with-venv first, then:

    .cache/venv-sp/bin/python scripts/gen_sentencepiece_reference.py

Variants (same edits are replayed in crates/inference/tests/sentencepiece_unigram.rs) cover the
paths the sdist models do not reach, on a subset of the corpus:
  botchan_en_unigram_1000+bytes_user      byte_fallback with 256 <0xXX> pieces, user-defined pieces
  kyoto_ja_unigram_8000+raw_ws            add_dummy_prefix=false, remove_extra_whitespaces=false
  botchan_en_unigram_1000+identity_suffix empty charsmap, treat_whitespace_as_suffix=true
  kyoto_ja_unigram_8000+no_escape         escape_whitespaces=false (spaces stay spaces)

Each line: {"model": NAME, "text": STR, "ids": [...], "pieces": [...], "decoded": STR}, or a
decode-only line {"model": NAME, "decode_ids": [...], "decoded": STR} for random id sequences (control,
unknown, byte pieces making invalid UTF-8, leading `▁` pieces).
The corpus is deterministic (fixed seed): lines of botchan.txt (read from the sdist archive),
hand-written English/Japanese/mixed-script text, emoji sequences, whitespace runs, NFKC-affected
characters, unknown characters, random concatenations of vocabulary pieces, random Unicode and
long inputs.
"""
import gzip
import io
import json
import os
import random
import sys
import tarfile

import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as model_pb2

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.join(ROOT, ".cache")
MODELS = ["botchan_en_unigram_1000", "kyoto_ja_unigram_8000"]
OUT = os.path.join(ROOT, "crates/inference/tests/fixtures/sentencepiece/unigram_reference.jsonl.gz")

HAND = [
    "", " ", "   ", "\t", "\n", "\r\n", " \t \n ", "a", " a", "a ", "  a  b  ", "a\tb\nc",
    "Hello world", "Hello  world", "  leading and trailing  ", "multiple    spaces   here",
    "tab\tseparated\tvalues", "line one\nline two\r\nline three", "\u3000full width space\u3000",
    "non\u00a0breaking\u00a0space", "zero\u200bwidth\u200bspace", "soft\u00adhyphen",
    "ｈｅｌｌｏ ｗｏｒｌｄ", "ＡＢＣ１２３", "ﬁne ﬂow ﬃ ﬄ", "① ② ⑳ ㉑", "㍻ ㌔ ㎏ ㎡", "Ⅻ ⅻ ½ ¼ ²³",
    "ｶﾀｶﾅ ﾊﾝｶｸ", "ﾊﾟﾋﾟﾌﾟ", "e\u0301 \u00e9 n\u0303 \u00f1", "Å Å Ω Ω", "ǅ ǆ Ǆ", "ſ ẞ ß",
    "吾輩は猫である。名前はまだ無い。", "どこで生れたかとんと見当がつかぬ。",
    "京都大学は日本の国立大学です。", "東京特許許可局", "今日は良い天気ですね", "ｺﾝﾆﾁﾊ、世界！",
    "日本語とEnglishのmixed文章。", "カタカナとひらがなと漢字", "「かぎ括弧」『二重』【隅付き】",
    "Привет, мир!", "Γειά σου Κόσμε", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "สวัสดีชาวโลก",
    "안녕하세요 세계", "你好，世界", "Xin chào thế giới", "ሰላም ልዑል", "გამარჯობა", "Բարեւ",
    "😀", "😀😀😀", "👨‍👩‍👧‍👦 family", "👍🏽 thumbs", "🇯🇵🇺🇸 flags", "❤️ heart", "a😀b😀c",
    "1234567890", "3.14159 2,718 1e10 -42", "x = y + 2 * (z - 1);", "fn main() { println!(\"hi\"); }",
    "https://example.com/path?q=1&r=2", "user@example.com", "#hashtag @mention", "C++ C# F#",
    "\u0000", "a\u0000b", "\u0007bell", "\u001b[31mred\u001b[0m", "\ufeffbom", "\ufffd", "\ue000 private",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𝐀𝐁𝐂 𝟏𝟐𝟑", "™ ℃ № ℡", "…‥", "‘quotes’ “double”", "—dash–", "«guillemets»",
    "I'm not sure what you mean, Mr. Botchan.", "He said: \"Go away!\" and left.",
]

JA_WORDS = ["私", "は", "学校", "へ", "行く", "猫", "犬", "が", "好き", "です", "東京", "大阪", "京都",
            "寺", "神社", "山", "川", "の", "に", "を", "で", "ました", "でしょう", "こと", "もの",
            "ため", "日本", "歴史", "文化", "時代", "天皇", "将軍", "戦い", "年", "月", "日", "、", "。"]
EN_WORDS = ["the", "a", "of", "and", "to", "in", "I", "was", "he", "that", "it", "his", "had", "you",
            "with", "school", "teacher", "Botchan", "Red", "Shirt", "said", "went", "back", "home",
            "money", "yen", "never", "always", "Tokyo", "Shikoku", ",", ".", "!", "?", ";", "'"]

RANGES = [(0x20, 0x7E), (0xA0, 0x24F), (0x300, 0x36F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x6FF),
          (0x900, 0x97F), (0xE00, 0xE7F), (0x1100, 0x11FF), (0x2000, 0x206F), (0x2100, 0x24FF),
          (0x2E80, 0x2FDF), (0x3000, 0x30FF), (0x3200, 0x33FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3),
          (0xF900, 0xFAFF), (0xFE30, 0xFE4F), (0xFF00, 0xFFEF), (0x1D400, 0x1D7FF), (0x1F300, 0x1FAFF),
          (0x20000, 0x2A6DF)]


USER_SYMBOLS = ["<mask>", "\u2581Botchan", "\uff48\uff45\uff4c\uff4c\uff4f", "12", "\U0001F600"]


def variant(base, name):
    """Applies the edits for variant `name` to the serialized model `base`."""
    m = model_pb2.ModelProto()
    m.ParseFromString(base)
    if name == "bytes_user":
        m.trainer_spec.byte_fallback = True
        for sym in USER_SYMBOLS:
            p = m.pieces.add(piece=sym, score=0.0, type=model_pb2.ModelProto.SentencePiece.USER_DEFINED)
        for b in range(256):
            m.pieces.add(piece="<0x%02X>" % b, score=0.0, type=model_pb2.ModelProto.SentencePiece.BYTE)
    elif name == "raw_ws":
        m.normalizer_spec.add_dummy_prefix = False
        m.normalizer_spec.remove_extra_whitespaces = False
    elif name == "identity_suffix":
        m.normalizer_spec.name = "identity"
        m.normalizer_spec.precompiled_charsmap = b""
        m.trainer_spec.treat_whitespace_as_suffix = True
    elif name == "no_escape":
        m.normalizer_spec.escape_whitespaces = False
    else:
        raise ValueError(name)
    return m.SerializeToString()


def rand_char(rng):
    lo, hi = rng.choice(RANGES)
    return chr(rng.randint(lo, hi))


def corpus(vocabs):
    rng = random.Random(20261129)
    out = list(HAND)
    sdist = os.path.join(CACHE, "pypi", "sentencepiece-0.2.3.tar.gz")
    with tarfile.open(sdist) as tar:
        botchan = tar.extractfile("sentencepiece-0.2.3/test/botchan.txt").read().decode("utf-8")
    lines = [l for l in botchan.splitlines() if l.strip()]
    out += rng.sample(lines, 500)
    for _ in range(250):  # Japanese-like sentences
        out.append("".join(rng.choice(JA_WORDS) for _ in range(rng.randint(1, 25))))
    for _ in range(150):  # English words with random whitespace
        ws = [" ", "  ", "\t", "\n", " \n ", "\u3000", ""]
        out.append("".join(rng.choice(EN_WORDS) + rng.choice(ws) for _ in range(rng.randint(1, 20))))
    for vocab in vocabs:  # random concatenations of vocabulary pieces: many Viterbi ties
        for _ in range(250):
            n = rng.randint(1, 12)
            out.append("".join(rng.choice(vocab).replace("\u2581", " ") for _ in range(n)))
    for _ in range(300):  # random Unicode
        out.append("".join(rand_char(rng) for _ in range(rng.randint(1, 30))))
    for _ in range(150):  # mixed scripts from the hand list
        out.append(" ".join(rng.choice(HAND) for _ in range(rng.randint(2, 6))))
    for _ in range(100):  # NFKC-heavy characters mixed with text
        chars = "ｈｅｌｌｏＷＯＲＬＤ０１２ﬁﬂ①②③㍻㌔ｶﾀｶﾅﾊﾟ™℃½²　…"
        out.append("".join(rng.choice(chars + "abc あい ") for _ in range(rng.randint(1, 20))))
    for n in (1000, 2000, 4000):  # long inputs
        out.append(" ".join(rng.sample(lines, min(len(lines), n // 60 + 1)))[:n])
        out.append("".join(rng.choice(JA_WORDS) for _ in range(n // 2))[:n])
    out.append((" ".join(rng.choice(lines) for _ in range(200)))[:10000])
    out.append("".join(rng.choice(JA_WORDS) for _ in range(6000))[:10000])
    out.append(" " * 300 + "x" + "\t" * 300)
    seen, uniq = set(), []
    for s in out:
        if s not in seen:
            seen.add(s)
            uniq.append(s)
    return uniq


def main():
    procs, blobs = {}, {}
    for name in MODELS:
        path = os.path.join(CACHE, "sentencepiece", name + ".model")
        if not os.path.exists(path):
            sys.exit(f"missing {path}: run scripts/fetch_sentencepiece.sh")
        procs[name] = spm.SentencePieceProcessor(model_file=path)
        blobs[name] = open(path, "rb").read()
    vocabs = [[p.id_to_piece(i) for i in range(p.get_piece_size())] for p in procs.values()]
    texts = corpus(vocabs)
    n_base = len(texts)
    for base, edit in [("botchan_en_unigram_1000", "bytes_user"), ("kyoto_ja_unigram_8000", "raw_ws"),
                       ("botchan_en_unigram_1000", "identity_suffix"),
                       ("kyoto_ja_unigram_8000", "no_escape")]:
        procs[f"{base}+{edit}"] = spm.SentencePieceProcessor(model_proto=variant(blobs[base], edit))
    extra = ["hello <mask> Botchan ｈｅｌｌｏ 12 123 😀😀 ¿é?", "<mask><mask>", "x<mask>y", "  a  ",
             "é\u0301 ñ 日本 \U0001F9D1\u200D\U0001F680", "\uff48\uff45\uff4c\uff4c\uff4f\uff4f"]
    sub = list(HAND) + extra + [t for i, t in enumerate(texts) if i % 4 == 0 and len(t) <= 2000]
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    n_lines = 0
    with io.TextIOWrapper(gzip.GzipFile(OUT, "wb", compresslevel=9, mtime=0), encoding="utf-8") as f:
        for name, sp in procs.items():
            for text in (texts if "+" not in name else sub):
                ids = sp.encode(text)
                rec = {"model": name, "text": text, "ids": ids,
                       "pieces": sp.encode(text, out_type=str), "decoded": sp.decode(ids)}
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
                n_lines += 1
        rng = random.Random(4242)
        for name, sp in procs.items():
            n = sp.get_piece_size()
            special = [0, 1, 2] + [i for i in range(n) if sp.is_byte(i)][:40]
            special += [i for i in range(n) if sp.id_to_piece(i).startswith("\u2581")][:40]
            for _ in range(200):
                ids = [rng.choice(special) if rng.random() < 0.5 else rng.randrange(n)
                       for _ in range(rng.randint(0, 12))]
                rec = {"model": name, "decode_ids": ids, "decoded": sp.decode(ids)}
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
                n_lines += 1
    print(f"wrote {n_lines} lines ({n_base} strings x {len(MODELS)} models, {len(sub)} strings x "
          f"{len(procs) - len(MODELS)} variants) to {OUT}")


if __name__ == "__main__":
    main()
