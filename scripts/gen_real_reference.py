#!/usr/bin/env python3
"""Reference outputs of the real embedding models, for the real-model parity tests of lattice-embed.

Reads the sentence-transformers folders in .cache/models/ (scripts/fetch_models.sh) and writes, under
crates/embed/tests/fixtures/real/:
  <model>.json         {"model", "max_seq_length", "texts", "input_ids" (after truncation, specials
                       included), "embeddings" (SentenceTransformer.encode, f32, normalized)}
  stsb_reference.json  {"all-MiniLM-L6-v2": spearman*100, "all-mpnet-base-v2": ...} on STS-B dev
                       (cosine similarity of the two sentence embeddings vs the gold score)

Everything runs with SentenceTransformer(path, device="cpu") in f32. Floats are written as the
shortest decimal string that round-trips to the same f32.

Usage: .cache/venv-ref/bin/python scripts/gen_real_reference.py [--skip-stsb] [--stsb PATH]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / ".cache" / "models"
OUT = ROOT / "crates" / "embed" / "tests" / "fixtures" / "real"
STSB = Path("/work/shared/data/stsb/stsb-en-dev.csv")
MODEL_NAMES = ["all-MiniLM-L6-v2", "all-mpnet-base-v2"]

LONG_EN = (
    "The history of the printing press begins long before Johannes Gutenberg. Woodblock printing was "
    "practised in China as early as the seventh century, and movable type made of ceramic was invented "
    "there by Bi Sheng around 1040. Metal movable type appeared in Korea during the Goryeo dynasty, where "
    "the Jikji, a collection of Buddhist teachings, was printed in 1377. Gutenberg's contribution in "
    "Mainz around 1450 combined several innovations: a hand mould for casting type quickly and "
    "precisely, an oil-based ink that adhered well to metal, and a screw press adapted from those used "
    "to make wine and olive oil. The result was a system that could produce books in quantities that had "
    "never been possible before. Within fifty years, printing shops had spread to more than two hundred "
    "and fifty cities across Europe, and an estimated twenty million volumes had been produced. The "
    "consequences were enormous. Scholars could compare identical copies of a text, which made it easier "
    "to correct errors and to build on the work of others. Vernacular languages gained prestige as "
    "printers sought larger markets, and spelling gradually became standardised. Religious reformers "
    "used pamphlets to spread their ideas faster than authorities could suppress them, while scientists "
    "circulated tables, diagrams and observations to colleagues they would never meet. Newspapers "
    "followed in the seventeenth century, and with them a public sphere in which citizens debated the "
    "affairs of the day. Historians still argue about how much of the early modern transformation of "
    "Europe should be credited to the press, but few doubt that it changed how knowledge was stored, "
    "shared and trusted. Today the same questions are being asked about the internet, about search "
    "engines, and about machine learning systems that read and summarise text at a scale no human "
    "library could match, and the comparison with the fifteenth century is made so often that it has "
    "almost become a cliché in essays about technology and society, including, perhaps, this one. "
    "Whether the analogy holds will only become clear long after all of us have stopped arguing about it."
)
LONG_MIXED = (
    "多言語のテキスト埋め込みは、検索、分類、クラスタリングなど多くの用途で使われています。"
    "Emoji 🎉🚀🔥 and symbols ∑∫√∞ ≠ ≤ ≥ are sprinkled in, along with URLs like https://example.com/a/b?c=d "
    "and code such as `fn main() { println!(\"hi\"); }`. "
    "中文句子也会出现在这里，每个汉字通常都是一个单独的词元，所以这段文字会很快超过最大长度。"
    "Числа 1234567890 и слова на русском языке, ελληνικά γράμματα, עברית, العربية, हिन्दी, 한국어 문장. "
) * 4

TEXTS = [
    "",
    "Hello, world!",
    "A man is playing a guitar.",
    "A woman is slicing an onion in the kitchen.",
    "The stock market fell sharply on Monday after the central bank raised interest rates.",
    "How do I reset my password if I no longer have access to my email account?",
    "Python is a programming language that lets you work quickly and integrate systems more effectively.",
    "What's the capital of France? It's Paris, of course.",
    "Café au lait, crème brûlée, naïve résumé, jalapeño, Zürich, Ångström.",
    "東京は日本の首都です。",
    "北京是中华人民共和国的首都。",
    "서울은 대한민국의 수도입니다.",
    "Москва — столица России.",
    "Η Αθήνα είναι η πρωτεύουσα της Ελλάδας.",
    "القاهرة هي عاصمة مصر.",
    "I love pizza 🍕🍕 and tacos 🌮 — best weekend ever! 😀🎉",
    "!!! ??? ... ;-) :-( <3 #hashtag @mention $100 50% & more",
    "   Leading and trailing whitespace, \t tabs \t and\nnewlines\r\n   ",
    "UPPER CASE, lower case and MiXeD CaSe should all be lower-cased by this tokenizer.",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "supercalifragilisticexpialidocious pneumonoultramicroscopicsilicovolcanoconiosis",
    "fill the [MASK] or the <mask> here, then [SEP] and </s>",
    LONG_EN,
    LONG_MIXED,
    None,  # placeholder: exactly max_seq_length tokens, built per model
]


def f32_round_trip(x) -> float:
    v = np.float32(x)
    s = np.format_float_scientific(v, unique=True) if v != 0 and (abs(v) < 1e-4 or abs(v) >= 1e6) else str(v)
    out = float(s)
    assert np.float32(out) == v, (x, s)
    return out


def to_json_floats(a):
    a = np.asarray(a, dtype=np.float32)
    if a.ndim == 0:
        return f32_round_trip(a)
    return [to_json_floats(x) for x in a]


def write_json(path: Path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False)
        f.write("\n")


def exact_limit_text(st, limit: int) -> str:
    """English words added one by one until the text is exactly `limit` ids, specials included."""
    tok = st.tokenizer
    words = (LONG_EN + " " + LONG_EN).split()
    lo = 0
    text = ""
    for n in range(1, len(words) + 1):
        cand = " ".join(words[:n])
        k = len(tok(cand)["input_ids"])
        if k == limit:
            text = cand
            break
        if k > limit:
            # this word added several pieces at once; pad the previous text with one-piece words
            base = " ".join(words[: n - 1])
            while len(tok(base)["input_ids"]) < limit:
                base += " the"
            text = base
            break
        lo = n
    assert len(tok(text)["input_ids"]) == limit, (len(tok(text)["input_ids"]), limit, lo)
    return text


def reference(name: str) -> None:
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(MODELS / name), device="cpu")
    st.eval()
    limit = st.max_seq_length
    texts = list(TEXTS)
    texts[texts.index(None)] = exact_limit_text(st, limit)
    input_ids = [st.tokenize([t])["input_ids"][0].tolist() for t in texts]
    lens = [len(i) for i in input_ids]
    untruncated = [len(st.tokenizer(t)["input_ids"]) for t in texts]
    n_over = sum(u > limit for u in untruncated)
    print(f"{name}: max_seq_length {limit}; token counts {lens}")
    print(f"{name}: {n_over} texts over the limit (untruncated lengths {[u for u in untruncated if u > limit]})")
    assert n_over >= 2 and lens.count(limit) >= 3 and max(lens) == limit
    t0 = time.time()
    with torch.no_grad():
        emb = st.encode(texts, batch_size=len(texts), convert_to_numpy=True).astype(np.float32)
        emb1 = np.stack([st.encode([t], batch_size=1, convert_to_numpy=True)[0] for t in texts]).astype(np.float32)
    diff = float(np.abs(emb - emb1).max())
    print(f"{name}: encode batch={len(texts)} vs batch=1 max |diff| = {diff:.3g} ({time.time() - t0:.1f} s)")
    norms = np.linalg.norm(emb, axis=1)
    assert np.allclose(norms, 1, atol=1e-5), norms
    obj = {
        "model": name,
        "max_seq_length": limit,
        "texts": texts,
        "input_ids": input_ids,
        "embeddings": to_json_floats(emb),
    }
    path = OUT / f"{name}.json"
    write_json(path, obj)
    size = path.stat().st_size
    print(f"{name}: wrote {path.relative_to(ROOT)} ({size} bytes)")
    assert size < 1_500_000


def read_stsb(path: Path):
    s1, s2, gold = [], [], []
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.reader(f):
            try:
                score = float(row[2])
            except ValueError:  # header line
                continue
            s1.append(row[0])
            s2.append(row[1])
            gold.append(score)
    return s1, s2, np.array(gold, dtype=np.float64)


def stsb(path: Path) -> None:
    from scipy.stats import spearmanr
    from sentence_transformers import SentenceTransformer

    s1, s2, gold = read_stsb(path)
    print(f"STS-B dev: {len(gold)} pairs from {path}")
    result = {}
    for name in MODEL_NAMES:
        st = SentenceTransformer(str(MODELS / name), device="cpu")
        st.eval()
        t0 = time.time()
        a = st.encode(s1, batch_size=32, convert_to_numpy=True).astype(np.float64)
        b = st.encode(s2, batch_size=32, convert_to_numpy=True).astype(np.float64)
        cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
        rho = float(spearmanr(cos, gold).statistic) * 100.0
        result[name] = rho
        print(f"STS-B dev Spearman x100 {name}: {rho!r} ({time.time() - t0:.0f} s)")
    with open(OUT / "stsb_reference.json", "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skip-stsb", action="store_true", help="only the per-text references")
    ap.add_argument("--only-stsb", action="store_true", help="only the STS-B Spearman values")
    ap.add_argument("--stsb", type=Path, default=STSB, help="STS-B dev csv (sentence1,sentence2,score)")
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("REF_THREADS", "2")))
    if not args.only_stsb:
        for name in MODEL_NAMES:
            reference(name)
    if not args.skip_stsb:
        stsb(args.stsb)


if __name__ == "__main__":
    main()
