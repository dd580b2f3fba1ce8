#!/usr/bin/env python3
"""Writes the WordPiece reference fixture that tests/tokenizer_wordpiece.rs checks id-for-id.

The reference is HF `tokenizers==0.23.3` itself, run on the real tokenizer.json files of
all-MiniLM-L6-v2 (BERT uncased) and all-mpnet-base-v2 (MPNet, RoBERTa-style post-processor) that
scripts/fetch_models.sh puts in .cache/models/. The corpus is hand-written cases plus strings made
programmatically with a fixed seed (all major scripts, emoji, combining marks, whitespace and
control characters, punctuation, numbers, URLs, code, words over 100 characters, literal special
tokens, random Unicode scalars, a few 10,000-character inputs).

Setup and run (from the repository root):
    python3 -m venv .cache/venv-tok && .cache/venv-tok/bin/pip install tokenizers==0.23.3
    .cache/venv-tok/bin/python scripts/gen_tokenizer_reference.py

Outputs, in crates/inference/tests/fixtures/tokenizer/:
- bert_chars.json: for every Unicode scalar value, what each BertNormalizer step and the
  BertPreTokenizer do with it (ranges of removed / space / CJK / punctuation / split characters,
  and the NFD + strip-accents + lowercase result where it differs from the character);
- wordpiece_reference.jsonl.gz (gzip), one JSON object per line. A single-text line is
    {"text": s, "minilm": M, "mpnet": M}
and a pair line is
    {"pair": [a, b], "minilm": M, "mpnet": M}
where M holds, with truncation and padding off:
    ids (and type_ids for pairs)            encode(.., add_special_tokens=True)
    ids_plain (and type_ids_plain for pairs) encode(.., add_special_tokens=False)
(single sequences have type id 0 everywhere, so theirs are not stored)
and, for some lines, "tokens", "offsets" (HF's Python offsets, in characters; (0, 0) for inserted
special tokens), "special_tokens_mask", "decode" ([skip_special_tokens=True, False] of ids), and
"trunc": {"N": {"ids": .., "type_ids": .. (pairs)}} for N in 128/256/384 whenever len(ids) > N (when
len(ids) <= N, truncation leaves ids unchanged).
"""

import gzip
import io
import json
import os
import random
import sys

import tokenizers
from tokenizers import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(ROOT, ".cache", "models")
OUT = os.path.join(ROOT, "crates", "inference", "tests", "fixtures", "tokenizer",
                   "wordpiece_reference.jsonl.gz")
TRUNC_LENGTHS = (128, 256, 384)

rng = random.Random(20240601)


def chars(ranges):
    """All code points of inclusive (lo, hi) ranges, as a list of str."""
    out = []
    for lo, hi in ranges:
        out.extend(chr(c) for c in range(lo, hi + 1))
    return out


SCRIPTS = {
    "latin_accents": chars([(0x41, 0x5A), (0x61, 0x7A), (0xC0, 0xFF), (0x100, 0x17F), (0x1E00, 0x1EFF)]),
    "cyrillic": chars([(0x400, 0x4FF)]),
    "greek": chars([(0x386, 0x3CE), (0x1F00, 0x1F7D)]),
    "arabic": chars([(0x621, 0x64A), (0x64B, 0x652), (0x660, 0x669), (0x6F0, 0x6F9)]),
    "hebrew": chars([(0x5D0, 0x5EA), (0x5B0, 0x5BD), (0x5C1, 0x5C2)]),
    "devanagari": chars([(0x904, 0x939), (0x93E, 0x94D), (0x966, 0x96F), (0x900, 0x903)]),
    "bengali_tamil": chars([(0x985, 0x9B9), (0x9BE, 0x9CD), (0xB85, 0xBB9), (0xBBE, 0xBCD)]),
    "thai": chars([(0xE01, 0xE3A), (0xE40, 0xE4E), (0xE50, 0xE59)]),
    "cjk": chars([(0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x3000, 0x303F)]),
    "cjk_astral": chars([(0x20000, 0x2A6DF), (0x2B740, 0x2B81F), (0x2B820, 0x2B92F), (0x2F800, 0x2FA1F)]),
    "hangul": chars([(0xAC00, 0xD7A3), (0x1100, 0x11FF), (0x3131, 0x318E)]),
    "kana": chars([(0x3041, 0x3096), (0x30A1, 0x30FA), (0x30FC, 0x30FE), (0xFF66, 0xFF9F)]),
    "armenian_georgian": chars([(0x531, 0x556), (0x561, 0x587), (0x10A0, 0x10FF), (0x1C90, 0x1CBF)]),
    "ethiopic": chars([(0x1200, 0x135A)]),
    "fullwidth": chars([(0xFF01, 0xFF5E)]),
    "vietnamese": list("aăâbcdđeêghiklmnoôơpqrstuưvxyAĂÂĐÊÔƠƯ") + chars([(0x1EA0, 0x1EF9)]),
}

EMOJI = ["😀", "😂", "🤣", "🥰", "🫠", "👍", "👍🏻", "👍🏽", "👍🏿", "👩‍💻", "👨‍👩‍👧‍👦", "🏳️‍🌈",
         "🇫🇷", "🇯🇵", "1️⃣", "#️⃣", "❤️", "❤", "☺️", "🧑🏾‍🚀", "🐈‍⬛", "👁️‍🗨️", "🦙", "🚀", "✅",
         "🙂", "😶‍🌫️", "🧔‍♀️", "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "©️", "™", "🅰️", "🆗", "🀄", "🃏"]
COMBINING = chars([(0x300, 0x36F), (0x1AB0, 0x1ABE), (0x1DC0, 0x1DFF), (0x20D0, 0x20F0)]) + [
    "\u302E", "\u0E48", "\u094D", "\u05B4", "\u064E", "\U0001D165", "\U0001D16D", "\U0001D166"]
SPACES = ["\t", "\n", "\r", "\x0b", "\x0c", "\xa0", "\u1680", "\u2000", "\u2003", "\u2009",
          "\u200a", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000", "\x85", "\x1c", "\x1f"]
CONTROLS = ["\x00", "\x01", "\x07", "\x1b", "\x7f", "\x9f", "\u200b", "\u200c", "\u200d", "\u200e",
            "\u200f", "\u2060", "\ufeff", "\u00ad", "\ufffd", "\ue000", "\ue001", "\uf8ff",
            "\U000e0001", "\U000e0041", "\U000f0000", "\U0010fffd", "\u0600", "\u061c", "\u08e2",
            "\ufff9", "\u2066", "\u180e", "\U0001bca0", "\U0001d173"]
PUNCT = list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + list(
    "«»“”„‘’‹›…—–¡¿·•†‡§¶‰′″‴※‼⁇⁈⁉、。「」『』【】〈〉《》〔〕！？，．：；（）［］｛｝〜・¦¨¬¯°±´µ¸×÷"
    "‐‑‒―‖‗‚‛‟⁅⁆⁊⁋⁌⁍⁎⁏⁐⁑⁓⁔⁕⁖⁗⁘⁙⁚⁛⁜⁝⁞⸀⸁⸂⸮⹂꙳꙾﹐﹑﹒﹔﹕﹖﹗﹘﹙﹚＿＂＃％＆＇＊／＼＠¥€£₹₿")
WORDS = ("the quick brown fox jumps over lazy dog tokenization embedding transformer attention "
         "running unaffable hello world model inference engine lattice paris tokyo naïve café "
         "résumé coöperate über straße internationalization antidisestablishmentarianism "
         "pneumonoultramicroscopicsilicovolcanoconiosis don't isn't we're they've I'm it's "
         "COVID-19 GPT-4 e-mail state-of-the-art 3.14159 1,000,000 $42.50 50% #hashtag @user").split()
SPECIAL_LITERALS = ["[CLS]", "[SEP]", "[MASK]", "[PAD]", "[UNK]", "<s>", "</s>", "<mask>",
                    "<pad>", "<unk>", "<UNK>", "<Unk>", "[cls]", "[mask]", "<MASK>", "[unused0]"]


def word(alphabet, lo=1, hi=9):
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(lo, hi)))


def sentence(alphabet, n_lo=1, n_hi=12):
    parts = []
    for _ in range(rng.randint(n_lo, n_hi)):
        parts.append(word(alphabet))
        r = rng.random()
        if r < 0.15:
            parts.append(rng.choice(PUNCT))
        elif r < 0.2:
            parts.append(rng.choice(SPACES))
    return rng.choice(["", " "]).join(parts) if rng.random() < 0.1 else " ".join(parts)


def random_scalar(max_cp=0x10FFFF):
    while True:
        cp = rng.randint(0, max_cp)
        if not 0xD800 <= cp <= 0xDFFF:
            return chr(cp)


def hand_written():
    return [
        "", " ", "  ", "\t", "\n", "\n\n\n", " \t\n\r ", "a", "A", ".", "Hello world",
        "Hello, world!", " Hello World! ", "HELLO WORLD", "hello   world", "Héllo Wörld",
        "İstanbul ıi", "ß ẞ Straße STRASSE", "ﬁ ﬂ ﬀ Ⅻ ⅻ ½ ² ① ℌ ℍ", "Ǆǅǆ ǈ", "ΣΑΣ σας ς",
        "Ǳ ǲ ǳ", "K Å Ω", "naïve café résumé coöperate", "tokenization unaffable",
        "I can't believe it's not butter!", "don't do not won't", "he's they've we're I'm",
        "中文字符测试", "日本語のテキスト、カタカナとひらがな。", "한국어 텍스트 처리", "ｈａｌｆ ｆｕｌｌ ＡＢＣ",
        "Привет, мир! Ёжик", "Γειά σου Κόσμε ΐΰ", "مرحبا بالعالم", "שָׁלוֹם עוֹלָם", "नमस्ते दुनिया",
        "สวัสดีชาวโลก", "Xin chào thế giới", "Ελληνικά ΑΒΓ", "Ṩ ṩ ẛ̣ Ḍ̇ ḍ̇ q̣̇ ą́",
        "x\U0001D16D\U0001D165 musical", "a\u0301\u0323b e\u0302\u0323", "\u0301leading mark",
        "🙂 🤣 🥰 🫠 emoji", "👨‍👩‍👧‍👦 family", "👍🏽👍🏿 tones", "🇫🇷🇯🇵 flags", "1️⃣ keycap",
        "\x00NUL\x00", "\ufffd replacement \ufffd", "zero\u200bwidth\u200djoiner",
        "soft\u00adhyphen", "bidi\u202aemb\u202c", "\ufeffBOM", "tab\tnew\nline\rcr",
        "nbsp\xa0here", "ideographic\u3000space", "line\u2028sep\u2029para", "narrow\u202fnbsp",
        "vt\x0bff\x0cfs\x1cus\x1f", "nel\x85here", "pua\ue000\ue001\uf8ff end", "tags\U000e0041\U000e0001",
        "https://example.com/path?query=1&b=two#frag", "mailto:someone@example.org",
        "C:\\Users\\name\\file.txt", "/usr/local/bin/python3", "#hashtag @mention $TICKER",
        "fn main() { println!(\"hi\"); }", "def f(x): return x**2  # square",
        "<div class=\"a\">text</div>", "SELECT * FROM t WHERE id = 42;", "{\"key\": [1, 2.5, null]}",
        "3.14159 2.71828 1e-10 -42 +7 1,000,000.00", "$100 €50 £30 ¥1000 ₹500 ₿0.1",
        "12:30pm 2024-01-01T00:00:00Z", "v1.2.3-beta+build.7", "0x1F 0b1010 0o777",
        "[CLS] [SEP] [MASK] [PAD] [UNK]", "<s> </s> <mask> <pad> <unk>", "x[MASK]y [MASK][MASK]",
        "hello [MASK] world <mask> x  <mask>y <UNK> <unk> [UNK]", "[UNK] <mask>",
        "<mask><mask>  <mask>", "a\u3000<mask>b", "\t<mask>", "<mask>  ", "a[CLS]b", "[ MASK ]",
        "[unused0] [unused1]", "<s>hello</s>", "<<mask>>", "[[MASK]]", "<UNK><unk><Unk>",
        "a" * 100, "a" * 101, "é" * 100, "é" * 101, "ab" * 60, "中" * 120, "🙂" * 101,
        "x" * 99 + "é", "supercalifragilisticexpialidocious" * 4,
        "!!!???...,,,;;;:::", "((([[[{{{}}}]]])))", "«quoted» “smart” ‘single’ „low“",
        "…—–‐ — – -", "¡Hola! ¿Qué tal?", "A.B.C. e.g. i.e. etc.", "U.S.A.", "...", "-" * 150,
    ]


def corpus():
    out = hand_written()
    for name, alphabet in SCRIPTS.items():
        for _ in range(45):
            out.append(sentence(alphabet))
        for _ in range(5):
            out.append(sentence(alphabet + WORDS + PUNCT))
    for _ in range(120):
        parts = [rng.choice(EMOJI + WORDS) for _ in range(rng.randint(1, 8))]
        out.append(rng.choice([" ", ""]).join(parts))
    for _ in range(120):
        s = ""
        for _ in range(rng.randint(1, 6)):
            s += rng.choice(SCRIPTS["latin_accents"] + SCRIPTS["cyrillic"] + ["中", "ก", "क"])
            s += "".join(rng.choice(COMBINING) for _ in range(rng.randint(0, 4)))
            if rng.random() < 0.3:
                s += " "
        out.append(s)
    for _ in range(160):
        items = [rng.choice(WORDS + SPACES + CONTROLS + [" "]) for _ in range(rng.randint(1, 14))]
        out.append("".join(items))
    for _ in range(100):
        out.append("".join(rng.choice(PUNCT + [" ", "a", "1"]) for _ in range(rng.randint(1, 30))))
    for _ in range(80):
        n = rng.choice([str(rng.randint(0, 10 ** rng.randint(1, 12))),
                        f"{rng.uniform(-1e6, 1e6):.{rng.randint(0, 6)}f}",
                        f"{rng.randint(1, 999):,}" + "," + f"{rng.randint(0, 999):03}",
                        f"{rng.random():e}", rng.choice(["½", "¾", "²", "³", "①", "Ⅻ", "٣", "७"])])
        out.append(f"{rng.choice(WORDS)} {n} {rng.choice(['%', '$', '€', 'km', ''])}")
    for _ in range(80):
        host = word(list("abcdefghijklmnopqrstuvwxyz"), 3, 10)
        path = "/".join(word(list("abcdefghijklmnopqrstuvwxyz0123456789-_"), 1, 8)
                        for _ in range(rng.randint(0, 4)))
        out.append(rng.choice([f"https://{host}.com/{path}?q={host}&n={rng.randint(0, 99)}",
                               f"{host}@{host}.org", f"www.{host}.io/{path}",
                               f"ftp://{host}.net:{rng.randint(1, 65535)}/{path}"]))
    code = ["for (int i = 0; i < n; ++i) { a[i] += b[i]; }", "let x: Vec<u32> = (0..10).collect();",
            "import numpy as np\nnp.zeros((3, 4))", "if x != null && y >= 0 { return; }",
            "<?php echo $var; ?>", "#include <stdio.h>", "SELECT a, b FROM t GROUP BY a;",
            "x = {'k': [1, 2, 3]}  # comment", "const f = (a, b) => a ?? b;", "\\d+\\.\\d*[eE]?"]
    for _ in range(60):
        out.append(" ".join(rng.sample(code, rng.randint(1, 3))))
    for _ in range(60):
        alphabet = rng.choice(list(SCRIPTS.values()))
        out.append(word(alphabet, 95, 130))
        out.append(word(list("abcdefghijklmnopqrstuvwxyz"), 98, 103))
    for _ in range(70):
        parts = [rng.choice(SPECIAL_LITERALS + WORDS + [" ", "  ", "\t", "\u3000"])
                 for _ in range(rng.randint(1, 8))]
        out.append(rng.choice(["", " "]).join(parts))
    for _ in range(220):
        max_cp = rng.choice([0x7F, 0x7FF, 0xFFFF, 0x10FFFF, 0x10FFFF])
        s = "".join(random_scalar(max_cp) for _ in range(rng.randint(1, 40)))
        out.append(s)
    for _ in range(60):
        raw = bytes(rng.randint(0, 255) for _ in range(rng.randint(1, 60)))
        out.append(raw.decode("utf-8", "replace"))
    for _ in range(200):
        ws = [rng.choice(WORDS) for _ in range(rng.randint(3, 25))]
        ws = [w.upper() if rng.random() < 0.1 else w.capitalize() if rng.random() < 0.2 else w
              for w in ws]
        out.append(" ".join(ws) + rng.choice([".", "!", "?", "", "..."]))
    all_alpha = [c for a in SCRIPTS.values() for c in a]
    for _ in range(100):
        out.append(sentence(all_alpha + WORDS + EMOJI + PUNCT, 2, 15))
    # Long inputs: prose, mixed scripts, random scalars, one huge word.
    prose = " ".join(rng.choice(WORDS) for _ in range(1600))[:10000]
    mixed = "".join(sentence(all_alpha + WORDS + EMOJI + PUNCT + SPACES, 5, 10) + " "
                    for _ in range(200))[:10000]
    scalars = "".join(random_scalar() for _ in range(10000))
    huge = word(list("abcdefghijklmnopqrstuvwxyz"), 10000, 10000)
    out += [prose, mixed, scalars, huge]
    return out


def encode_all(tok, a, b=None, with_details=False):
    tok.no_truncation()
    full = tok.encode(a, b) if b is not None else tok.encode(a)
    plain = tok.encode(a, b, add_special_tokens=False) if b is not None else tok.encode(
        a, add_special_tokens=False)
    m = {"ids": full.ids, "ids_plain": plain.ids}
    if b is None:
        # Single sequences get type id 0 everywhere; the test checks that instead of storing it.
        assert not any(full.type_ids) and not any(plain.type_ids)
    else:
        m["type_ids"] = full.type_ids
        m["type_ids_plain"] = plain.type_ids
    if with_details:
        m["tokens"] = full.tokens
        m["offsets"] = [list(o) for o in full.offsets]
        m["special_tokens_mask"] = full.special_tokens_mask
        m["decode"] = [tok.decode(full.ids, skip_special_tokens=True),
                       tok.decode(full.ids, skip_special_tokens=False)]
    trunc = {}
    for n in TRUNC_LENGTHS:
        if len(full.ids) > n:
            tok.enable_truncation(n)
            e = tok.encode(a, b) if b is not None else tok.encode(a)
            trunc[str(n)] = {"ids": e.ids}
            if b is not None:
                trunc[str(n)]["type_ids"] = e.type_ids
    tok.no_truncation()
    if trunc:
        m["trunc"] = trunc
    return m


def ranges(cps):
    out = []
    for cp in cps:
        if out and out[-1][1] + 1 == cp:
            out[-1][1] = cp
        else:
            out.append([cp, cp])
    return out


def write_char_classes():
    """Per-code-point behaviour of each BERT normalizer step and the BERT pre-tokenizer, over
    every Unicode scalar value, as ranges (and a map for NFD + strip accents + lowercase)."""
    from tokenizers import normalizers, pre_tokenizers
    bert = normalizers.BertNormalizer
    clean = bert(clean_text=True, handle_chinese_chars=False, strip_accents=False, lowercase=False)
    cjk = bert(clean_text=False, handle_chinese_chars=True, strip_accents=False, lowercase=False)
    strip_lower = bert(clean_text=False, handle_chinese_chars=False, strip_accents=True,
                       lowercase=True)
    pre = pre_tokenizers.BertPreTokenizer()
    classes = {"removed": [], "space": [], "cjk": [], "punct": [], "split": []}
    mapping = {}
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        c = chr(cp)
        r = clean.normalize_str("a" + c + "b")
        if r == "ab":
            classes["removed"].append(cp)
        elif r == "a b":
            classes["space"].append(cp)
        if cjk.normalize_str(c) == " " + c + " ":
            classes["cjk"].append(cp)
        words = [w for w, _ in pre.pre_tokenize_str("a" + c + "b")]
        if words == ["a", c, "b"]:
            classes["punct"].append(cp)
        elif words == ["a", "b"]:
            classes["split"].append(cp)
        # Hangul syllables (11,172) decompose algorithmically; the test checks a sample.
        if not 0xAC00 <= cp <= 0xD7A3 or cp % 64 == 0:
            out = strip_lower.normalize_str(c)
            if out != c:
                mapping[str(cp)] = out
    data = {k: ranges(v) for k, v in classes.items()}
    data["strip_lower"] = mapping
    path = os.path.join(os.path.dirname(OUT), "bert_chars.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, separators=(",", ":"))
    print(f"wrote {path} ({os.path.getsize(path) / 1e3:.0f} kB)")


def main():
    if tokenizers.__version__ != "0.23.3":
        sys.exit(f"need tokenizers==0.23.3, found {tokenizers.__version__}")
    toks = {}
    for key, folder in (("minilm", "all-MiniLM-L6-v2"), ("mpnet", "all-mpnet-base-v2")):
        path = os.path.join(MODELS, folder, "tokenizer.json")
        if not os.path.exists(path):
            sys.exit(f"{path} missing: run scripts/fetch_models.sh first")
        t = Tokenizer.from_file(path)
        t.no_padding()
        toks[key] = t
    texts = corpus()
    pairs = []
    for _ in range(300):
        pairs.append((rng.choice(texts[:-4]), rng.choice(texts[:-4])))
    long_texts = texts[-4:]
    pairs += [(long_texts[0][:3000], "short second"), ("short first", long_texts[1][:1500]),
              (long_texts[0][:2000], long_texts[1][:1000]), (long_texts[2][:800], texts[10]),
              (" ".join(WORDS * 3), " ".join(WORDS * 2)), (" ".join(WORDS * 2), " ".join(WORDS * 5))]
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with io.TextIOWrapper(gzip.GzipFile(OUT, "wb", compresslevel=9, mtime=0), encoding="utf-8") as f:
        for i, text in enumerate(texts):
            details = i % 5 == 0 and len(text) <= 400
            line = {"text": text}
            for key, t in toks.items():
                line[key] = encode_all(t, text, with_details=details)
            f.write(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n")
        for i, (a, b) in enumerate(pairs):
            details = i % 3 == 0 and len(a) + len(b) <= 400
            line = {"pair": [a, b]}
            for key, t in toks.items():
                line[key] = encode_all(t, a, b, with_details=details)
            f.write(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n")
    size = os.path.getsize(OUT)
    print(f"wrote {len(texts)} texts and {len(pairs)} pairs to {OUT} ({size / 1e6:.2f} MB)")
    write_char_classes()


if __name__ == "__main__":
    main()
