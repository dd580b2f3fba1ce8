#!/usr/bin/env python3
"""Writes crates/inference/tests/fixtures/sentencepiece/corpus.jsonl.gz (the shared SentencePiece
corpus: one JSON string per line) and unigram_reference_{botchan,kyoto}.jsonl.gz (one per base
model, with its variants).

Reference ids, pieces and decode round trips from the real `sentencepiece` package (0.2.3) for the
Unigram test models of its sdist. Run scripts/fetch_sentencepiece.sh --with-venv first, then:

    .cache/venv-sp/bin/python scripts/gen_sentencepiece_reference.py

Variants (same edits are replayed in crates/inference/tests/sentencepiece_unigram.rs) cover the
paths the sdist models do not reach, on a subset of the corpus:
  botchan_en_unigram_1000+bytes_user      byte_fallback with 256 <0xXX> pieces, user-defined pieces
  kyoto_ja_unigram_8000+raw_ws            add_dummy_prefix=false, remove_extra_whitespaces=false
  botchan_en_unigram_1000+identity_suffix empty charsmap, treat_whitespace_as_suffix=true
  kyoto_ja_unigram_8000+no_escape         escape_whitespaces=false (spaces stay spaces)

The corpus is also the one of scripts/gen_sentencepiece_bpe_reference.py and
scripts/gen_unigram_json_reference.py, which read corpus.jsonl.gz; every reference line names its
string by its 0-based line number "i" in corpus.jsonl.gz.
One line per corpus string: {"i": N, "ids": {MODEL: [...], ...}} for the two models and, on the
variant subset (every 8th string of at most 2,000 characters plus the hand-written ones), the
variants; "unk_pieces": {MODEL: [...]}, the text of each unknown piece in order (every other piece
is the vocabulary spelling of its id), only where there are unknown pieces, and "decoded":
{MODEL: STR} only where decode(ids) is not the text. Then decode-only lines
{"model": NAME, "decode_ids": [...], "decoded": STR} for random id sequences (control, unknown,
byte pieces making invalid UTF-8, leading `▁` pieces).
The corpus is deterministic (fixed seeds): lines of botchan.txt (read from the sdist archive),
hand-written English/Japanese/mixed-script text, word-like strings in 45 scripts (with combining
marks), emoji sequences (ZWJ, skin tones, flags, keycaps, tag sequences), whitespace runs, code,
text holding special-token strings, NFKC-affected characters, unknown characters, random
concatenations of vocabulary pieces, random Unicode, and long inputs (13 of 10,000 characters).
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
FIXTURES = os.path.join(ROOT, "crates/inference/tests/fixtures/sentencepiece")
CORPUS = os.path.join(FIXTURES, "corpus.jsonl.gz")
# One reference file per base model (with its variants), to keep each file small.
OUT = {m: os.path.join(FIXTURES, f"unigram_reference_{m.split('_')[0]}.jsonl.gz") for m in MODELS}

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


# Letters of many scripts (inclusive code point ranges), for word-like random strings.
SCRIPTS = {
    "latin": (0x61, 0x7A), "latin_ext": (0x100, 0x17F), "ipa": (0x250, 0x2AF), "greek": (0x3B1, 0x3C9),
    "cyrillic": (0x430, 0x44F), "armenian": (0x561, 0x586), "hebrew": (0x5D0, 0x5EA),
    "arabic": (0x627, 0x64A), "syriac": (0x710, 0x72F), "thaana": (0x780, 0x7A5),
    "devanagari": (0x905, 0x939), "bengali": (0x985, 0x9B9), "gurmukhi": (0xA05, 0xA39),
    "gujarati": (0xA85, 0xAB9), "oriya": (0xB05, 0xB39), "tamil": (0xB85, 0xBB9),
    "telugu": (0xC05, 0xC39), "kannada": (0xC85, 0xCB9), "malayalam": (0xD05, 0xD39),
    "sinhala": (0xD85, 0xDC6), "thai": (0xE01, 0xE30), "lao": (0xE81, 0xEAE), "tibetan": (0xF40, 0xF6C),
    "myanmar": (0x1000, 0x102A), "georgian": (0x10D0, 0x10FA), "hangul_jamo": (0x1100, 0x1112),
    "ethiopic": (0x1200, 0x1357), "cherokee": (0x13A0, 0x13F4), "canadian": (0x1401, 0x166C),
    "ogham": (0x1681, 0x169A), "runic": (0x16A0, 0x16EA), "khmer": (0x1780, 0x17B3),
    "mongolian": (0x1820, 0x1877), "hiragana": (0x3041, 0x3096), "katakana": (0x30A1, 0x30FA),
    "bopomofo": (0x3105, 0x312D), "cjk": (0x4E00, 0x9FA5), "yi": (0xA000, 0xA48C),
    "hangul": (0xAC00, 0xD7A3), "halfwidth": (0xFF66, 0xFF9D), "gothic": (0x10330, 0x1034A),
    "cuneiform": (0x12000, 0x1236E), "math_bold": (0x1D41A, 0x1D433), "cjk_ext_b": (0x20000, 0x2A6D6),
}
# Combining marks some scripts put after letters (vowel signs, viramas, diacritics).
MARKS = {"devanagari": (0x93E, 0x94D), "bengali": (0x9BE, 0x9CD), "tamil": (0xBBE, 0xBCD),
         "thai": (0xE31, 0xE3A), "arabic": (0x64B, 0x652), "hebrew": (0x5B0, 0x5BC),
         "latin": (0x300, 0x36F), "myanmar": (0x102B, 0x103A), "khmer": (0x17B6, 0x17D3),
         "tibetan": (0xF71, 0xF84), "sinhala": (0xDCF, 0xDDF)}
EMOJI = ["\U0001F600", "\U0001F602", "\U0001F923", "\u2764\ufe0f", "\U0001F44D", "\U0001F389",
         "\U0001F680", "\U0001F30D", "\u2615", "\U0001F431", "\U0001F436", "\u2728", "\U0001F525",
         "\U0001F4AF", "\u263A\ufe0f", "\u2600\ufe0f", "\U0001F9D1\u200D\U0001F4BB",
         "\U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466",
         "\U0001F469\u200D\u2764\ufe0f\u200D\U0001F468", "\U0001F3F3\ufe0f\u200D\U0001F308",
         "\U0001F3F4\U000E0067\U000E0062\U000E0065\U000E006E\U000E0067\U000E007F",
         "1\ufe0f\u20e3", "#\ufe0f\u20e3", "\U0001F1EF\U0001F1F5", "\U0001F1FA\U0001F1F8",
         "\U0001F1EB\U0001F1F7", "\U0001F44B\U0001F3FB", "\U0001F44B\U0001F3FF",
         "\U0001F9D1\U0001F3FD\u200D\U0001F680", "\U0001FAE0", "\U0001F972", "\u00a9\ufe0f"]
WHITESPACE = [" ", "  ", "   ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2002", "\u2003",
              "\u2009", "\u200b", "\u202f", "\u205f", "\u0085", "\u2028", "\u000b", "\u000c",
              " \t ", "\n\n", "\n \n", " " * 8, "\t\t\t"]
SPECIAL_STRINGS = ["<s>", "</s>", "<unk>", "<pad>", "<mask>", "<|endoftext|>", "<|im_start|>",
                   "<|im_end|>", "[INST]", "[/INST]", "<<SYS>>", "<</SYS>>", "<0x41>", "<0x0A>",
                   "<0xE3>", "\u2581", "\u2581\u2581", "[CLS]", "[SEP]", "<eos>", "<bos>", "<s", "s>",
                   "</", "<unk", "<<s>>", "<s><s>", "</s></s>"]
CODE = [
    "def {f}({a}, {b}=None):\n    return {a} + {n}\n",
    "fn {f}({a}: &str) -> Option<u32> {{\n    {a}.parse().ok()\n}}",
    "for (int {a} = 0; {a} < {n}; ++{a}) {{ {b}[{a}] = {a} * 2; }}",
    "const {f} = ({a}, {b}) => {{ return `${{{a}}}-${{{b}}}`; }};",
    "SELECT {a}, COUNT(*) FROM {b} WHERE {a} > {n} GROUP BY {a};",
    "<div class=\"{a}\"><span id='{b}'>{n}</span></div>",
    "{{\"{a}\": [{n}, {n}.5, null, true], \"{b}\": {{\"k\": \"v\"}}}}",
    "if [ -z \"${a}\" ]; then echo \"{b}\" >&2; exit {n}; fi",
    "#include <stdio.h>\nint main(void) {{ printf(\"%d\\n\", {n}); return 0; }}",
    "    {a} = {b}.get('{f}', {n})  # {f} comment\n\t\treturn {a}",
    "let {a} = vec![{n}; 4]; // {f}\r\n{b} += {a}.len() as i64;",
    "\\begin{{equation}} {a}^{n} + \\frac{{{b}}}{{2}} \\end{{equation}}",
    "[{f}](https://example.com/{a}?{b}={n}#top) **{a}** _{b}_ `code`",
    "{a}@{b}.org, +1-555-{n}, 192.168.{n}.1, 0x{n}FF, 1e-{n}",
]
IDENT = ["x", "y", "i", "idx", "value", "result", "my_var", "CamelCase", "snake_case_name", "tmp2",
         "data", "self", "buf", "\u540d\u524d", "caf\u00e9", "\u03bb"]


def script_word(rng, script):
    lo, hi = SCRIPTS[script]
    word = ""
    for _ in range(rng.randint(1, 8)):
        word += chr(rng.randint(lo, hi))
        if script in MARKS and rng.random() < 0.3:
            mlo, mhi = MARKS[script]
            word += chr(rng.randint(mlo, mhi))
    return word


def extended_corpus(lines):
    """The strings added to reach >= 5,000: more of the text above, many scripts, emoji
    sequences, whitespace runs, code, special-token strings, and 10,000-character inputs."""
    rng = random.Random(5000)
    out = rng.sample(lines, 700)
    names = sorted(SCRIPTS)
    for script in names:  # word-like strings per script, some with marks
        for _ in range(15):
            out.append(" ".join(script_word(rng, script) for _ in range(rng.randint(1, 8))))
    for _ in range(150):  # mixed scripts in one string
        out.append(" ".join(script_word(rng, rng.choice(names)) for _ in range(rng.randint(2, 10))))
    for _ in range(300):  # emoji sequences: ZWJ, skin tones, flags, keycaps, tags, with text
        parts = [rng.choice(EMOJI) for _ in range(rng.randint(1, 6))]
        glue = rng.choice(["", " ", "x", "\u200d", "\ufe0f", " and "])
        out.append(glue.join(parts))
    for _ in range(300):  # whitespace runs between words
        words = [rng.choice(EN_WORDS + JA_WORDS) for _ in range(rng.randint(0, 6))]
        s = rng.choice(WHITESPACE + [""])
        for w in words:
            s += w + "".join(rng.choice(WHITESPACE) for _ in range(rng.randint(1, 4)))
        out.append(s)
    for _ in range(400):  # code
        t = rng.choice(CODE)
        out.append(t.format(f=rng.choice(IDENT), a=rng.choice(IDENT), b=rng.choice(IDENT),
                            n=rng.randint(0, 99999)))
    for _ in range(300):  # text holding special-token strings
        parts = []
        for _ in range(rng.randint(1, 8)):
            r = rng.random()
            if r < 0.45:
                parts.append(rng.choice(SPECIAL_STRINGS))
            elif r < 0.8:
                parts.append(rng.choice(EN_WORDS + JA_WORDS))
            else:
                parts.append(rng.choice(WHITESPACE))
        out.append(rng.choice(["", " "]).join(parts))
    for _ in range(400):  # more Japanese-like, English-like and random Unicode text
        out.append("".join(rng.choice(JA_WORDS) for _ in range(rng.randint(1, 40))))
        out.append(" ".join(rng.choice(EN_WORDS) for _ in range(rng.randint(1, 40))))
        out.append("".join(rand_char(rng) for _ in range(rng.randint(1, 40))))
    # 10,000-character inputs of each kind.
    n = 10000
    big = [
        " ".join(rng.sample(lines, 200)),
        "".join(rng.choice(JA_WORDS) for _ in range(8000)),
        " ".join(script_word(rng, rng.choice(names)) for _ in range(3000)),
        "".join(rng.choice(EMOJI) + rng.choice(["", " "]) for _ in range(5000)),
        "".join(rng.choice(WHITESPACE) + rng.choice(EN_WORDS) for _ in range(5000)),
        "\n".join(rng.choice(CODE).format(f="f", a="a", b="b", n=i) for i in range(400)),
        "".join(rand_char(rng) for _ in range(n)),
        " ".join(rng.choice(SPECIAL_STRINGS + EN_WORDS) for _ in range(3000)),
        "a" * n,
        "\u3042" * n,
        " " * n,
        "ab " * (n // 3 + 1),
    ]
    out += [s[:n] for s in big]
    return out


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
    out += extended_corpus(lines)
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
    for base, edit in [("botchan_en_unigram_1000", "bytes_user"), ("kyoto_ja_unigram_8000", "raw_ws"),
                       ("botchan_en_unigram_1000", "identity_suffix"),
                       ("kyoto_ja_unigram_8000", "no_escape")]:
        procs[f"{base}+{edit}"] = spm.SentencePieceProcessor(model_proto=variant(blobs[base], edit))
    extra = ["hello <mask> Botchan ｈｅｌｌｏ 12 123 😀😀 ¿é?", "<mask><mask>", "x<mask>y", "  a  ",
             "é\u0301 ñ 日本 \U0001F9D1\u200D\U0001F680", "\uff48\uff45\uff4c\uff4c\uff4f\uff4f"]
    sub = set(HAND + extra + [t for i, t in enumerate(texts) if i % 8 == 0 and len(t) <= 2000])
    os.makedirs(FIXTURES, exist_ok=True)
    all_texts = texts + [t for t in extra if t not in texts]
    with io.TextIOWrapper(gzip.GzipFile(CORPUS, "wb", compresslevel=9, mtime=0), encoding="utf-8") as f:
        for text in all_texts:
            f.write(json.dumps(text, ensure_ascii=False) + "\n")
    counts = {name: 0 for name in procs}
    n_lines = 0
    for base, out in OUT.items():
        models = {n: sp for n, sp in procs.items() if n.split("+")[0] == base}
        with io.TextIOWrapper(gzip.GzipFile(out, "wb", compresslevel=9, mtime=0),
                              encoding="utf-8") as f:
            for index, text in enumerate(all_texts):
                rec = {"i": index, "ids": {}}
                for name, sp in models.items():
                    if "+" in name and text not in sub or "+" not in name and text in extra:
                        continue
                    ids = sp.encode(text)
                    pieces = sp.encode(text, out_type=str)
                    rec["ids"][name] = ids
                    counts[name] += 1
                    # Pieces are the vocabulary spelling of the ids except unknown pieces, which
                    # keep their text: only those are written. A decode is written when it is not
                    # the text.
                    unk = [p for p, i in zip(pieces, ids) if sp.is_unknown(i)]
                    assert all(p == sp.id_to_piece(i)
                               for p, i in zip(pieces, ids) if not sp.is_unknown(i))
                    if unk:
                        rec.setdefault("unk_pieces", {})[name] = unk
                    decoded = sp.decode(ids)
                    if decoded != text:
                        rec.setdefault("decoded", {})[name] = decoded
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
                n_lines += 1
            rng = random.Random(4242)
            for name, sp in models.items():
                n = sp.get_piece_size()
                special = [0, 1, 2] + [i for i in range(n) if sp.is_byte(i)][:40]
                special += [i for i in range(n) if sp.id_to_piece(i).startswith("\u2581")][:40]
                for _ in range(200):
                    ids = [rng.choice(special) if rng.random() < 0.5 else rng.randrange(n)
                           for _ in range(rng.randint(0, 12))]
                    rec = {"model": name, "decode_ids": ids, "decoded": sp.decode(ids)}
                    f.write(json.dumps(rec, ensure_ascii=False) + "\n")
                    n_lines += 1
    print(f"wrote {len(all_texts)} strings to {CORPUS}, {n_lines} lines to "
          f"{', '.join(OUT.values())}; strings per "
          f"model: {counts}")


if __name__ == "__main__":
    main()
