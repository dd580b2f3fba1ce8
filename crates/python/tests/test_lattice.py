"""`import lattice` against the `lattice` CLI and sentence-transformers' own outputs.

The tiny random-weight fixtures are committed (crates/inference/tests/fixtures); the real
all-MiniLM-L6-v2 is fetched by scripts/fetch_models.sh, and its sentence-transformers vectors
are committed (crates/embed/tests/fixtures/real). `LATTICE_BIN` names the CLI binary
(default target/release/lattice).
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import threading

import numpy as np
import pytest

import lattice

ROOT = pathlib.Path(__file__).resolve().parents[3]
FIX = ROOT / "crates" / "inference" / "tests" / "fixtures"
REAL = ROOT / "crates" / "embed" / "tests" / "fixtures" / "real"
MINILM = ROOT / ".cache" / "models" / "all-MiniLM-L6-v2"
BIN = os.environ.get("LATTICE_BIN", str(ROOT / "target" / "release" / "lattice"))


def cli(*args: str) -> str:
    out = subprocess.run([BIN, *args], check=True, capture_output=True, text=True)
    return out.stdout


def cli_lines(*args: str) -> list:
    return [json.loads(line) for line in cli(*args).splitlines() if line.strip()]


def cosine_gap(a: np.ndarray, b: np.ndarray) -> float:
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return float((1 - cos).max())


def test_embeddings_equal_the_cli_and_sentence_transformers():
    ref = json.load(open(FIX / "tiny-bert" / "reference.json"))
    texts = ref["texts"]
    e = lattice.Embedder(str(FIX / "tiny-bert"))
    v = e.embed(texts)
    assert v.dtype == np.float32 and v.shape == (len(texts), e.dim)
    want = np.array([line["embedding"] for line in cli_lines(
        "embed", "--model", str(FIX / "tiny-bert"), "--", *texts)], dtype=np.float32)
    assert np.abs(v - want).max() <= 1e-6
    st = np.array(ref["embeddings"], dtype=np.float32)
    assert cosine_gap(v, st) < 1e-6
    # Batches of any size give the same vectors.
    assert np.abs(e.embed(texts, batch_size=3) - v).max() <= 1e-6


def test_bf16_and_q8_encoders_equal_the_cli_and_stay_close():
    ref = json.load(open(REAL / "all-MiniLM-L6-v2.json"))
    texts = ref["texts"]
    st = np.array(ref["embeddings"], dtype=np.float32)
    # q8: int8 rows on both sides (ONNX Runtime's own int8 export is further off: max 2.7e-2
    # over STS-B dev, docs/benchmarks.md).
    for flag, bound in (("bf16", 1e-4), ("q8", 2e-2)):
        v = lattice.Embedder(str(MINILM), **{flag: True}).embed(texts)
        want = np.array([line["embedding"] for line in cli_lines(
            "embed", "--model", str(MINILM), f"--{flag}", "--", *texts)], dtype=np.float32)
        assert np.abs(v - want).max() <= 1e-6
        assert 0 < cosine_gap(v, st) < bound
    pairs = [tuple(p) for p in json.load(open(FIX / "tiny-cross-encoder" / "reference.json"))["pairs"]]
    exact = lattice.Reranker(str(FIX / "tiny-cross-encoder")).predict(pairs)
    q8 = lattice.Reranker(str(FIX / "tiny-cross-encoder"), q8=True).predict(pairs)
    assert 0 < np.abs(q8 - exact).max() < 2e-2


def test_encode_has_sentence_transformers_shapes_on_a_real_model():
    ref = json.load(open(REAL / "all-MiniLM-L6-v2.json"))
    e = lattice.Embedder(str(MINILM))
    got = e.encode(ref["texts"], batch_size=8)
    st = np.array(ref["embeddings"], dtype=np.float32)
    assert got.shape == st.shape and got.dtype == np.float32
    assert cosine_gap(got, st) < 1e-6
    one = e.encode(ref["texts"][1])
    assert one.shape == (e.dim,)
    assert np.abs(one - got[1]).max() <= 1e-6
    normed = e.encode(ref["texts"][:4], normalize_embeddings=True)
    assert np.allclose(np.linalg.norm(normed, axis=1), 1.0, atol=1e-6)
    short = e.embed(ref["texts"][:4], dimensions=128)
    assert short.shape == (4, 128)
    with pytest.raises(ValueError, match="dimensions"):
        e.embed(["x"], dimensions=10_000)
    with pytest.raises(TypeError):
        e.embed([1, 2])
    with pytest.raises(ValueError):
        e.encode(["x"], output_value="token_embeddings")
    with pytest.raises(ValueError, match="device"):
        e.encode(["x"], device="cuda")
    with pytest.raises(ValueError, match="prompt_name"):
        e.encode(["x"], prompt_name="document")


def test_one_embedder_serves_many_threads():
    e = lattice.Embedder(str(FIX / "tiny-bert"), threads=2)
    texts = [f"sentence number {i} about threads" for i in range(64)]
    want = e.embed(texts)
    out = [None] * 8
    def work(k: int) -> None:
        out[k] = e.embed(texts[k * 8:(k + 1) * 8])
    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert np.abs(np.concatenate(out) - want).max() <= 1e-6


def test_reranker_equals_the_cli_and_cross_encoder_scores():
    ref = json.load(open(FIX / "tiny-cross-encoder" / "reference.json"))
    r = lattice.Reranker(str(FIX / "tiny-cross-encoder"))
    pairs = [tuple(p) for p in ref["pairs"]]
    got = r.predict(pairs)
    assert got.dtype == np.float32 and got.shape == (len(pairs),)
    # sentence-transformers' logits, through the model's sigmoid (CrossEncoder.predict's default).
    want = 1 / (1 + np.exp(-np.array(ref["scores"], dtype=np.float64)))
    assert np.abs(got - want).max() < 1e-6
    assert np.abs(r.predict(pairs, batch_size=1) - got).max() < 1e-6
    with pytest.raises(TypeError):
        r.predict(pairs, activation_fn=None)
    query, passages = "how many people live in berlin?", ["Berlin is a city.", "I like trains.", "Paris."]
    ranked = r.rerank(query, passages)
    lines = cli_lines("rerank", "--model", str(FIX / "tiny-cross-encoder"), "--query", query, *passages)
    assert [i for i, _ in ranked] == [line["index"] for line in lines]
    assert max(abs(s - line["score"]) for (_, s), line in zip(ranked, lines)) < 1e-6
    assert r.rerank(query, passages, top_n=1) == ranked[:1]


def test_tokenizer_has_hf_shapes_and_equals_the_cli():
    t = lattice.Tokenizer.from_file(str(FIX / "tiny-bert" / "tokenizer.json"))
    text = "Héllo wörld! Tokenizers, ünicode."
    enc = t.encode(text)
    line = cli_lines("tokenize", "--model", str(FIX / "tiny-bert"), text)[0]
    assert enc.ids == line["ids"] and enc.tokens == line["tokens"]
    # Character offsets, as HF tokenizers gives them.
    for tok, (s, e) in zip(enc.tokens, enc.offsets):
        if tok not in ("[CLS]", "[SEP]"):
            assert text[s:e].lower().replace("é", "e").replace("ö", "o").replace("ü", "u") \
                == tok.removeprefix("##")
    assert enc.attention_mask == [1] * len(enc.ids)
    assert t.encode(text, add_special_tokens=False).ids == enc.ids[1:-1]
    batch = t.encode_batch([text, "a b"])
    assert batch[0].ids == enc.ids and len(batch) == 2
    assert t.decode(enc.ids) == line_decode(t, enc.ids)
    same = lattice.Tokenizer.from_pretrained(str(FIX / "tiny-qwen3"))
    assert same.encode("The capital of France is", add_special_tokens=False).ids
    with pytest.raises(FileNotFoundError):
        lattice.Tokenizer.from_file("/nonexistent/tokenizer.json")


def line_decode(t: lattice.Tokenizer, ids: list) -> str:
    return t.decode(ids, skip_special_tokens=True)


PROMPT = "The capital of France is"


def cli_generate(*extra: str) -> dict:
    return cli_lines("generate", "--model", str(FIX / "tiny-qwen3"), "--prompt", PROMPT,
                     "--temperature", "0", "--max-tokens", "24", "--ignore-eos", "--json", *extra)[0]


def test_generation_equals_the_cli_greedy_streamed_and_batched():
    llm = lattice.LLM(str(FIX / "tiny-qwen3"))
    want = cli_generate()["text"]
    assert llm.generate(PROMPT, max_tokens=24, ignore_eos=True) == want
    pieces = list(llm.generate(PROMPT, max_tokens=24, ignore_eos=True, stream=True))
    assert len(pieces) > 1 and "".join(pieces) == want
    other = "Once upon a time"
    both = llm.generate([PROMPT, other], max_tokens=24, ignore_eos=True)
    assert both[0] == want and both[1] == llm.generate(other, max_tokens=24, ignore_eos=True)
    chat = llm.chat([{"role": "user", "content": PROMPT}], max_tokens=24, ignore_eos=True)
    assert chat == cli_generate("--chat")["text"]
    seeded = llm.generate(PROMPT, max_tokens=16, temperature=0.8, seed=7)
    assert seeded == llm.generate(PROMPT, max_tokens=16, temperature=0.8, seed=7)
    assert seeded == cli_lines("generate", "--model", str(FIX / "tiny-qwen3"), "--prompt", PROMPT,
                               "--temperature", "0.8", "--top-k", "0", "--top-p", "1",
                               "--min-p", "0", "--seed", "7", "--max-tokens", "16",
                               "--json")[0]["text"]


def test_structured_outputs_and_lora():
    llm = lattice.LLM(str(FIX / "tiny-qwen3"))
    out = llm.generate(PROMPT, max_tokens=40, regex="(yes|no)")
    assert out in ("yes", "no")
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": False}
    doc = json.loads(llm.generate(PROMPT, max_tokens=60, json_schema=schema))
    assert isinstance(doc["a"], int)
    adapter = FIX / "lora" / "tiny-qwen3" / "attn"
    tuned = lattice.LLM(str(FIX / "tiny-qwen3"), lora=[str(adapter)])
    text = tuned.generate(PROMPT, max_tokens=24, ignore_eos=True)
    assert text == cli_generate("--lora", str(adapter))["text"]
    assert text != cli_generate()["text"]


def test_bad_input_raises_python_exceptions():
    with pytest.raises(FileNotFoundError):
        lattice.Embedder("/nonexistent/model")
    with pytest.raises(FileNotFoundError):
        lattice.LLM("/nonexistent/model.gguf")
    llm = lattice.LLM(str(FIX / "tiny-qwen3"))
    with pytest.raises(ValueError, match="max_tokens"):
        llm.generate(PROMPT, max_tokens=0)
    with pytest.raises(ValueError):
        llm.generate(PROMPT, temperature=-1.0)
    with pytest.raises(ValueError):
        llm.generate(PROMPT, regex="(unclosed")
    with pytest.raises(TypeError, match="unsupported"):
        llm.generate(PROMPT, best_of=2)
    with pytest.raises(ValueError):
        llm.chat([{"content": "no role"}])
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    with pytest.raises(ValueError, match=r"messages\[0\]\.content\[0\]"):
        llm.chat([{"role": "user", "content": [image, {"type": "text", "text": "Hi"}]}])
    with pytest.raises(ValueError, match="string or a list"):
        llm.chat([{"role": "user", "content": 42}])
    parts = [{"type": "text", "text": "Hello, "}, {"type": "text", "text": "world"}]
    assert llm.chat([{"role": "user", "content": parts}], max_tokens=4) == llm.chat(
        [{"role": "user", "content": "Hello, world"}], max_tokens=4)
    with pytest.raises(ValueError):
        lattice.Embedder(str(FIX / "tiny-bert"), threads=0)
    with pytest.raises(ValueError, match="bf16 and q8"):
        lattice.Embedder(str(FIX / "tiny-bert"), bf16=True, q8=True)
