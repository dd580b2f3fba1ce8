#!/usr/bin/env python3
"""Generates the tiny random-weight checkpoints and their reference outputs used by the parity tests.

Output (committed, < 3 MB in total), one folder per model under crates/inference/tests/fixtures/:
  tiny-bert           BertModel, mean pooling + Normalize, bare tensor names ("embeddings.…")
  tiny-bert-cls       BertModel weights saved from a BertForMaskedLM ("bert.…" prefix plus unused
                      "cls.predictions.*", no pooler), CLS pooling, no Normalize
  tiny-mpnet          MPNetModel (relative attention buckets, position offset pad_token_id+1),
                      MPNet tokenizer (RobertaProcessing), mean pooling + Normalize
  tiny-cross-encoder  BertForSequenceClassification, num_labels=1 ("bert.…" + "classifier.*")

Each sentence-transformers folder is written in the classic layout of the real models (modules.json
with sentence_transformers.models.* types, 1_Pooling/config.json with pooling_mode_* flags,
sentence_bert_config.json with max_seq_length, vocab.txt, special_tokens_map.json, tokenizer.json),
not the layout sentence-transformers 6.x would write, and is then loaded back with
SentenceTransformer(folder) to compute the references, so they reflect how the reference library
reads exactly these files.

The tokenizer.json files deliberately carry a "truncation"/"padding" section (32 tokens, Fixed 32)
that differs from max_seq_length (48), as the real models' files do (128 vs 256/384): the reference
libraries ignore that section; max_seq_length wins.

The WordPiece vocab is a subset of the real bert-base-uncased vocab (read from the MiniLM folder in
.cache/models): specials, every piece that the real tokenizer produces for the fixture texts (so the
tiny tokenizer splits them into exactly the same pieces as the real one), single characters and
their "##" forms, and the most frequent whole words and suffixes, all kept in real-vocab order.

reference.json floats are written as the shortest decimal string that round-trips to the same f32.

Usage: .cache/venv-ref/bin/python scripts/gen_fixtures.py   (see scripts/setup_reference_env.sh)
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crates" / "inference" / "tests" / "fixtures"
REAL_VOCAB = ROOT / ".cache" / "models" / "all-MiniLM-L6-v2" / "vocab.txt"

SEED = 20240601
MAX_SEQ_LEN = 48  # sentence_bert_config.json max_seq_length of the tiny encoders
TOK_JSON_TRUNC = 32  # the (ignored) truncation/padding section inside tokenizer.json
CROSS_MAX_LEN = 40  # max_length used for the cross-encoder pairs
N_WHOLE_WORDS = 700
N_SUFFIXES = 250

BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
MPNET_HEAD = ["<s>", "<pad>", "</s>", "<unk>"]  # as in the real MPNet vocab, before the BERT vocab

LONG_TEXT = (
    "Sentence embeddings map a piece of text to a single vector, so that texts with similar meaning "
    "end up close to each other. This paragraph is deliberately long: it has many more word pieces "
    "than the maximum sequence length of the tiny test models, which means that the tokenizer has to "
    "cut it off, and every token after the limit must be ignored by the pooling step as well."
)

TEXTS = [
    "",
    "a",
    "Hello world!",
    "The quick brown fox jumps over the lazy dog.",
    "A man is playing a guitar on the street.",
    "What's the weather like in New York today?",
    "!!! ??? ... --- ,,, ;;; ()[]{} @#$%^&*",
    "Café, naïve résumé — déjà vu à la française.",
    "Ünïcödé ﬁ ligature and ＡＢＣ full-width letters",
    "東京は日本の首都です。北京欢迎你！",
    "I love pizza 🍕😀 and sushi 🍣!",
    "  leading and trailing whitespace\tand\ttabs\nand newlines  ",
    "HeLLo WoRLD, SHOUTING and MiXeD case",
    "Numbers: 3.14159, 2,718 and 1e-10; dates 2024-01-31.",
    "Привет, как дела? Γειά σου κόσμε. مرحبا بالعالم",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "x" * 120 + " is longer than max_input_chars_per_word",
    "zero\u200bwidth space, non\u00a0breaking space and a control\u0007char",
    "fill the [MASK] or the <mask> here, then [SEP] and </s>",
    LONG_TEXT,
    None,  # placeholder: a text of exactly MAX_SEQ_LEN tokens, built per tokenizer
]

PAIRS = [
    ("how many people live in berlin?", "Berlin has a population of about 3.7 million people."),
    ("how many people live in berlin?", "The weather in Berlin is often cloudy."),
    ("what is a sentence embedding?", "A sentence embedding is a vector that represents the meaning of a text."),
    ("what is a sentence embedding?", "Pizza is a dish of Italian origin."),
    ("", "An empty query paired with a short passage."),
    ("a query with an empty passage", ""),
    ("Café?", "Déjà vu, naïve résumé 東京 🍕"),
    ("short query", LONG_TEXT),
    (LONG_TEXT, "short passage"),
    (LONG_TEXT, LONG_TEXT.upper()),
    ("[MASK] in the query", "and [SEP] in the passage"),
]


# ----------------------------------------------------------------------------- helpers


def f32_round_trip(x) -> float:
    """The shortest decimal string that round-trips to the same f32, as a Python float."""
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


def write_json(path: Path, obj, indent=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=indent)
        f.write("\n")


def read_real_vocab() -> list[str]:
    if not REAL_VOCAB.exists():
        sys.exit(f"missing {REAL_VOCAB}: run scripts/fetch_models.sh first")
    return REAL_VOCAB.read_text(encoding="utf-8").split("\n")[:-1]


# ----------------------------------------------------------------------------- tokenizers


def build_vocab(real_vocab: list[str], texts: list[str]) -> list[str]:
    """Subset of the real BERT vocab, in real order, specials first."""
    from tokenizers import Tokenizer

    real_tok = Tokenizer.from_file(str(REAL_VOCAB.parent / "tokenizer.json"))
    real_tok.no_truncation()
    real_tok.no_padding()
    keep: set[str] = set()
    for t in texts:
        keep.update(real_tok.encode(t, add_special_tokens=False).tokens)
    n_words = n_suffixes = 0
    for i, tok in enumerate(real_vocab):
        if tok.startswith("[") and tok.endswith("]"):
            continue
        body = tok[2:] if tok.startswith("##") else tok
        if len(body) == 1 and (ord(body) < 0x250 or tok in keep or ("##" + tok) in keep):
            keep.add(tok)
        elif i >= 1996 and tok.startswith("##") and n_suffixes < N_SUFFIXES and len(body) >= 2:
            keep.add(tok)
            n_suffixes += 1
        elif i >= 1996 and not tok.startswith("##") and n_words < N_WHOLE_WORDS and tok.isalpha():
            keep.add(tok)
            n_words += 1
    body = [t for t in real_vocab if t in keep and t not in BERT_SPECIALS]
    vocab = BERT_SPECIALS + body
    assert len(set(vocab)) == len(vocab), "duplicate vocab entries"
    return vocab


def make_tokenizer(vocab: list[str], kind: str):
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    ids = {t: i for i, t in enumerate(vocab)}
    tok = Tokenizer(models.WordPiece(vocab=ids, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    if kind == "bert":
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A:0 [SEP]:0",
            pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
            special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])],
        )
        specials = [AddedToken(t, normalized=False, special=True) for t in ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]]
        pad = "[PAD]"
    else:  # mpnet, reproducing the real all-mpnet-base-v2 tokenizer.json quirks
        tok.post_processor = processors.RobertaProcessing(
            ("</s>", ids["</s>"]), ("<s>", ids["<s>"]), trim_offsets=True, add_prefix_space=False
        )
        specials = [
            AddedToken("<s>", normalized=False, special=True),
            AddedToken("<pad>", normalized=False, special=True),
            AddedToken("</s>", normalized=False, special=True),
            AddedToken("<unk>", normalized=True, special=True),
            AddedToken("[UNK]", normalized=False, special=True),
            AddedToken("<mask>", lstrip=True, normalized=False, special=True),
        ]
        pad = "<pad>"
    tok.add_special_tokens(specials)
    tok.enable_truncation(max_length=TOK_JSON_TRUNC)
    tok.enable_padding(length=TOK_JSON_TRUNC, pad_id=ids[pad], pad_type_id=0, pad_token=pad)
    return tok


def write_tokenizer_files(folder: Path, vocab: list[str], kind: str, model_max_length: int):
    tok = make_tokenizer(vocab, kind)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "vocab.txt").write_text("".join(t + "\n" for t in vocab), encoding="utf-8")
    if kind == "bert":
        cfg = {
            "do_lower_case": True,
            "unk_token": "[UNK]",
            "sep_token": "[SEP]",
            "pad_token": "[PAD]",
            "cls_token": "[CLS]",
            "mask_token": "[MASK]",
            "tokenize_chinese_chars": True,
            "strip_accents": None,
            "do_basic_tokenize": True,
            "never_split": None,
            "tokenizer_class": "BertTokenizer",
            "model_max_length": model_max_length,
        }
        stm = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]", "mask_token": "[MASK]"}
    else:
        cfg = {
            "do_lower_case": True,
            "bos_token": "<s>",
            "eos_token": "</s>",
            "sep_token": "</s>",
            "cls_token": "<s>",
            "unk_token": "[UNK]",
            "pad_token": "<pad>",
            "mask_token": "<mask>",
            "tokenize_chinese_chars": True,
            "strip_accents": None,
            "tokenizer_class": "MPNetTokenizer",
            "model_max_length": model_max_length,
        }
        stm = {
            "bos_token": "<s>",
            "eos_token": "</s>",
            "unk_token": "[UNK]",
            "sep_token": "</s>",
            "pad_token": "<pad>",
            "cls_token": "<s>",
            "mask_token": {"content": "<mask>", "single_word": False, "lstrip": True, "rstrip": False, "normalized": False},
        }
    write_json(folder / "tokenizer_config.json", cfg, indent=2)
    write_json(folder / "special_tokens_map.json", stm, indent=2)


def exact_limit_text(tok, limit: int) -> str:
    """A text that tokenizes to exactly `limit` ids (specials included) without truncation."""
    tok.no_truncation()
    tok.no_padding()
    words = []
    fillers = ("the cat sat on a mat and then it went to sleep in the sun near the old house " * 20).split()
    for w in fillers:
        n = len(tok.encode(" ".join(words + [w])).ids)
        if n > limit:
            break
        words.append(w)
    text = " ".join(words)
    assert len(tok.encode(text).ids) == limit, (len(tok.encode(text).ids), limit)
    return text


# ----------------------------------------------------------------------------- weights


def randomize_(model: torch.nn.Module, seed: int):
    """Overwrites every parameter with seeded random values; LayerNorms are not identity, biases not 0."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if "LayerNorm.weight" in name:
                v = 1.0 + 0.3 * torch.randn(p.shape, generator=g)
            elif name.endswith("bias"):
                v = 0.1 * torch.randn(p.shape, generator=g)
            elif "embeddings" in name or "relative_attention_bias" in name:
                v = 0.5 * torch.randn(p.shape, generator=g)
            else:  # Linear [out, in]
                v = torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1])
            p.copy_(v)


def bert_config(vocab_size: int, **extra):
    from transformers import BertConfig

    return BertConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        hidden_act="gelu",
        max_position_embeddings=64,
        type_vocab_size=2,
        layer_norm_eps=1e-12,
        pad_token_id=0,
        **extra,
    )


def mpnet_config(vocab_size: int):
    from transformers import MPNetConfig

    return MPNetConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        hidden_act="gelu",
        max_position_embeddings=66,
        relative_attention_num_buckets=32,
        layer_norm_eps=1e-5,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
    )


def write_st_files(folder: Path, pooling: str, normalize: bool, dim: int):
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    write_json(folder / "modules.json", modules, indent=2)
    write_json(folder / "sentence_bert_config.json", {"max_seq_length": MAX_SEQ_LEN, "do_lower_case": False}, indent=2)
    write_json(
        folder / "1_Pooling" / "config.json",
        {
            "word_embedding_dimension": dim,
            "pooling_mode_cls_token": pooling == "cls",
            "pooling_mode_mean_tokens": pooling == "mean",
            "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False,
        },
        indent=2,
    )


# ----------------------------------------------------------------------------- references


def encoder_reference(folder: Path, texts: list[str], pooling: str, normalize: bool) -> dict:
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(folder), device="cpu")
    st.eval()
    assert st.max_seq_length == MAX_SEQ_LEN, st.max_seq_length
    model = st[0].auto_model
    input_ids, hidden = [], []
    with torch.no_grad():
        for t in texts:
            feats = st.tokenize([t])
            ids = feats["input_ids"][0].tolist()
            assert len(ids) <= MAX_SEQ_LEN
            kw = {k: v for k, v in feats.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
            h = model(**kw).last_hidden_state[0].float().numpy()
            input_ids.append(ids)
            hidden.append(h)
        emb = st.encode(texts, batch_size=len(texts), convert_to_numpy=True).astype(np.float32)
        emb1 = np.stack([st.encode([t], batch_size=1, convert_to_numpy=True)[0] for t in texts]).astype(np.float32)
    diff = float(np.abs(emb - emb1).max())
    print(f"  {folder.name}: encode batch={len(texts)} vs batch=1 max |diff| = {diff:.3g}")
    assert diff < 1e-5, "padding leaks into the batched result"
    # Independent pooling check: the reference pipeline must match what the config files say.
    mine = np.stack([h.mean(0) if pooling == "mean" else h[0] for h in hidden])
    if normalize:
        mine = mine / np.maximum(np.linalg.norm(mine, axis=1, keepdims=True), 1e-12)
    pdiff = float(np.abs(mine - emb1).max())
    print(f"  {folder.name}: own {pooling} pooling{' + normalize' if normalize else ''} vs ST max |diff| = {pdiff:.3g}")
    assert pdiff < 1e-5
    lens = [len(i) for i in input_ids]
    print(f"  {folder.name}: token counts {lens}")
    assert max(lens) == MAX_SEQ_LEN and lens.count(MAX_SEQ_LEN) >= 2
    return {
        "model": folder.name,
        "max_seq_length": MAX_SEQ_LEN,
        "pooling": pooling,
        "normalize": normalize,
        "texts": texts,
        "input_ids": input_ids,
        "last_hidden_state": [to_json_floats(h) for h in hidden],
        "embeddings": to_json_floats(emb),
    }


def check_hf_tokenizer(folder: Path, texts: list[str]):
    """The transformers tokenizer loaded from the folder must agree with the bare tokenizer.json."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(folder))
    raw = Tokenizer.from_file(str(folder / "tokenizer.json"))
    raw.no_truncation()
    raw.no_padding()
    for t in texts:
        a = hf(t)["input_ids"]
        b = raw.encode(t).ids
        assert a == b, (folder.name, t, a, b)
    n_unk = sum(raw.encode(t).ids.count(raw.token_to_id("[UNK]")) for t in texts)
    print(f"  {folder.name}: HF tokenizer == tokenizer.json on {len(texts)} texts ({n_unk} [UNK] in total)")


def build_encoder(name: str, kind: str, vocab: list[str], texts: list[str], pooling: str, normalize: bool, seed: int):
    from transformers import BertForMaskedLM, BertModel, MPNetModel

    folder = OUT / name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    torch.manual_seed(seed)
    if kind == "mpnet":
        model = MPNetModel(mpnet_config(len(vocab)))
    elif name == "tiny-bert-cls":
        # Saved as a masked-LM checkpoint: tensors are "bert.*" (+ unused "cls.predictions.*", no
        # pooler), as in many hub checkpoints that sentence-transformers loads through AutoModel.
        model = BertForMaskedLM(bert_config(len(vocab), architectures=["BertForMaskedLM"]))
    else:
        model = BertModel(bert_config(len(vocab)))
    randomize_(model, seed)
    model.eval()
    model.save_pretrained(str(folder), safe_serialization=True)
    write_tokenizer_files(folder, vocab, kind, model_max_length=64)
    write_st_files(folder, pooling, normalize, dim=32)
    check_hf_tokenizer(folder, texts)
    ref = encoder_reference(folder, texts, pooling, normalize)
    if name == "tiny-bert-cls":
        # The bare model inside the MLM checkpoint must be what ST loaded (prefix stripped correctly).
        with torch.no_grad():
            from transformers import AutoTokenizer

            enc = AutoTokenizer.from_pretrained(str(folder))([texts[3]], return_tensors="pt")
            h = model.bert(**enc).last_hidden_state[0].numpy()
        assert np.abs(h - np.array(ref["last_hidden_state"][3], dtype=np.float32)).max() < 1e-5
    write_json(folder / "reference.json", ref)
    return ref


def build_cross_encoder(vocab: list[str], seed: int):
    from transformers import AutoTokenizer, BertForSequenceClassification

    folder = OUT / "tiny-cross-encoder"
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    torch.manual_seed(seed)
    model = BertForSequenceClassification(bert_config(len(vocab), num_labels=1, architectures=["BertForSequenceClassification"]))
    randomize_(model, seed)
    model.eval()
    model.save_pretrained(str(folder), safe_serialization=True)
    write_tokenizer_files(folder, vocab, "bert", model_max_length=CROSS_MAX_LEN)
    tok = AutoTokenizer.from_pretrained(str(folder))
    input_ids, type_ids, scores = [], [], []
    with torch.no_grad():
        for q, p in PAIRS:
            # Lists, not bare strings: tok(q, "") would silently drop an empty text_pair
            # ([CLS] q [SEP]); the pair template (and CrossEncoder, which batches) gives [CLS] q [SEP] [SEP].
            enc = tok([q], [p], truncation=True, max_length=CROSS_MAX_LEN, return_tensors="pt")
            input_ids.append(enc["input_ids"][0].tolist())
            type_ids.append(enc["token_type_ids"][0].tolist())
            scores.append(float(model(**enc).logits[0, 0]))
        enc = tok([q for q, _ in PAIRS], [p for _, p in PAIRS], truncation=True, max_length=CROSS_MAX_LEN, padding=True, return_tensors="pt")
        batched = model(**enc).logits[:, 0].numpy()
    diff = float(np.abs(batched - np.array(scores, dtype=np.float32)).max())
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(folder / "tokenizer.json"))
    raw.no_padding()
    raw.enable_truncation(max_length=CROSS_MAX_LEN, strategy="longest_first")
    for (q, p), ids, tt in zip(PAIRS, input_ids, type_ids):
        e = raw.encode(q, p)
        assert e.ids == ids and e.type_ids == tt, (q, p, e.ids, ids)
    lens = [len(i) for i in input_ids]
    print(f"  tiny-cross-encoder: batched vs single max |diff| = {diff:.3g}; token counts {lens}")
    assert diff < 1e-5 and max(lens) == CROSS_MAX_LEN
    ref = {
        "model": "tiny-cross-encoder",
        "max_length": CROSS_MAX_LEN,
        "truncation": "longest_first",
        "pairs": [list(p) for p in PAIRS],
        "input_ids": input_ids,
        "token_type_ids": type_ids,
        "scores": to_json_floats(np.array(scores, dtype=np.float32)),
    }
    write_json(folder / "reference.json", ref)


def main():
    torch.set_num_threads(int(os.environ.get("FIXTURE_THREADS", "2")))
    torch.use_deterministic_algorithms(True)
    real_vocab = read_real_vocab()
    all_texts = [t for t in TEXTS if t is not None] + [s for pair in PAIRS for s in pair]
    bert_vocab = build_vocab(real_vocab, all_texts + [exact_limit_words()])
    mpnet_vocab = MPNET_HEAD + bert_vocab + ["<mask>"]
    print(f"vocab: {len(bert_vocab)} entries (BERT), {len(mpnet_vocab)} (MPNet)")

    for name, kind, vocab, pooling, normalize, seed in [
        ("tiny-bert", "bert", bert_vocab, "mean", True, SEED),
        ("tiny-bert-cls", "bert", bert_vocab, "cls", False, SEED + 1),
        ("tiny-mpnet", "mpnet", mpnet_vocab, "mean", True, SEED + 2),
    ]:
        texts = list(TEXTS)
        texts[texts.index(None)] = exact_limit_text(make_tokenizer(vocab, kind), MAX_SEQ_LEN)
        build_encoder(name, kind, vocab, texts, pooling, normalize, seed)
    build_cross_encoder(bert_vocab, SEED + 3)

    total = 0
    for p in sorted(OUT.rglob("*")):
        if p.is_file() and "tokenizer" not in p.relative_to(OUT).parts[:1]:
            total += p.stat().st_size
            print(f"  {p.stat().st_size:>9}  {p.relative_to(ROOT)}")
    print(f"total {total} bytes")
    assert total < 3_000_000


def exact_limit_words() -> str:
    return "the cat sat on a mat and then it went to sleep in the sun near the old house"


if __name__ == "__main__":
    main()
