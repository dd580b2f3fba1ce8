#!/usr/bin/env python3
"""Generates the tiny random-weight decoder checkpoints and their transformers references.

Output (committed, about 1 MB in total), one folder per model under crates/inference/tests/fixtures/:
  tiny-qwen3            Qwen3ForCausalLM: GQA 4/2 heads, head_dim 24 (heads x head_dim != hidden),
                        Q/K RMSNorm, tied embeddings, bf16 weights, the real Qwen3 chat template
  tiny-llama            LlamaForCausalLM: MQA 4/1 heads, llama3 rope scaling, untied, f16 weights
  tiny-qwen2            Qwen2ForCausalLM: QKV bias, GQA 4/2, untied, f32 weights
  tiny-qwen3-embedding  Qwen3Model saved as a sentence-transformers folder (last-token pooling,
                        Normalize, "query" prompt, EOS appended by the tokenizer's post-processor)

All share one byte-level BPE tokenizer trained here on a small corpus (Qwen2 split pattern, NFC,
ByteLevel), 440 learned tokens plus Qwen's special tokens; model vocab_size is 512 (rows past the
tokenizer's vocab exist, as in the real Qwen checkpoints).

Weights are drawn with a large std (0.15) and random RMSNorm scales, so the logits are peaked and
greedy decoding has clear margins; the weights are rounded to the stored dtype before the reference
runs, so the references are exactly what the committed files describe, computed in f32.

reference.json per causal model:
  prompts: [{name, text (or null), ids, last_logits [vocab], greedy_ids [64], min_gap}]
    min_gap = smallest top-1 minus top-2 logit over the 64 greedy steps (how robust the test is)
reference.json for the embedding model:
  queries/documents: [{text, ids, embedding [hidden]}], matryoshka_32 (first 32 dims, renormalized)

Usage: .cache/venv-ref/bin/python scripts/gen_decoder_fixtures.py   (see scripts/setup_reference_env.sh)
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crates" / "inference" / "tests" / "fixtures"
QWEN3_TOKENIZER_CONFIG = ROOT / ".cache" / "npm" / "qwen3" / "package" / "models" / "tokenizer_config.json"

SEED = int(__import__("os").environ.get("FIXTURE_SEED", "4"))
VOCAB = 512
N_LEARNED = 440
GREEDY_STEPS = 64
SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
    r"\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED_NON_SPECIAL = ["<think>", "</think>", "<tool_call>", "</tool_call>"]

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Large language models generate text one token at a time, reading the whole prompt first.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "fn main() { println!(\"hello, world\"); }",
    "Once upon a time there was a little engine that could run inference on any CPU.",
    "Attention is all you need; rotary position embeddings rotate pairs of dimensions.",
    "The capital of France is Paris. The capital of Japan is Tokyo. The capital of Italy is Rome.",
    "Numbers like 3.14159, 2718 and 1e-10 appear in scientific text.",
    "Café, naïve, résumé: accents are bytes too. 東京は日本の首都です。",
    "Question: what is two plus two? Answer: four.",
    "A key-value cache stores the keys and values of earlier tokens so each step is cheap.",
    "In the beginning the universe was created. This has made a lot of people very angry.",
] * 8

PROMPTS = [
    ("short", "Hello"),
    ("sentence", "The capital of France is"),
    ("code", "def fibonacci(n):\n    if n < 2:"),
    ("unicode", "Café 東京 🍕 naïve"),
    ("single_token", None),  # ids [7]
    ("long", None),  # ~320 tokens of corpus text
]


def train_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(pattern=__import__("tokenizers").Regex(SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=N_LEARNED,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
        special_tokens=[],
    )
    tok.train_from_iterator(CORPUS, trainer)
    from tokenizers import AddedToken

    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    tok.add_tokens([AddedToken(s, special=False, normalized=False) for s in ADDED_NON_SPECIAL])
    assert tok.get_vocab_size() <= VOCAB, tok.get_vocab_size()
    return tok


def round_to(model: torch.nn.Module, dtype: torch.dtype) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(dtype).to(torch.float32))


def randomize(model: torch.nn.Module, gen: torch.Generator) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in ("model.norm.weight", "norm.weight"):
                # The final norm scales the logits: large, so greedy steps have clear margins.
                p.copy_(4.0 + 0.5 * torch.randn(p.shape, generator=gen))
            elif name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=gen))


def save_weights(model: torch.nn.Module, path: Path, dtype: torch.dtype, tied: bool) -> None:
    state = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    if tied:
        state.pop("lm_head.weight", None)
    save_file(state, str(path), metadata={"format": "pt"})


def greedy(model, ids: list[int]) -> tuple[list[int], float, list[float]]:
    """Greedy decoding with the KV cache, as generate(do_sample=False) does, without stopping."""
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=True)
        last = out.logits[0, -1].clone()
        past = out.past_key_values
        logits = last
        gen, gaps = [], []
        for _ in range(GREEDY_STEPS):
            top = torch.topk(logits, 2)
            gaps.append(float(top.values[0] - top.values[1]))
            nxt = int(torch.argmax(logits))
            gen.append(nxt)
            out = model(torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits = out.logits[0, -1]
    return gen, min(gaps), last.tolist()


def f32_list(xs) -> list[float]:
    # Shortest decimal that round-trips to the same f32.
    out = []
    for x in xs:
        f = struct.unpack("f", struct.pack("f", float(x)))[0]
        for p in range(6, 12):
            s = float(f"{f:.{p}g}")
            if struct.unpack("f", struct.pack("f", s))[0] == f:
                break
        out.append(s)
    return out


def prompt_ids(tok: Tokenizer, name: str, text: str | None) -> list[int]:
    if name == "single_token":
        return [7]
    if name == "long":
        ids = tok.encode(" ".join(CORPUS[:12]) * 2).ids
        return ids[:320]
    return tok.encode(text).ids


def write_tokenizer(tok: Tokenizer, folder: Path, chat_template: str | None, eos: str) -> None:
    tok.save(str(folder / "tokenizer.json"))
    cfg = {
        "add_bos_token": False,
        "bos_token": None,
        "eos_token": eos,
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": 1024,
        "tokenizer_class": "Qwen2Tokenizer",
        "clean_up_tokenization_spaces": False,
    }
    if chat_template is not None:
        cfg["chat_template"] = chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


def build_causal(name, cls, config, dtype, tied, tok, chat_template, gen):
    folder = OUT / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    torch.manual_seed(SEED)
    model = cls(config).eval()
    randomize(model, gen)
    if tied:
        model.tie_weights()
    round_to(model, dtype)
    config.save_pretrained(folder)
    save_weights(model, folder / "model.safetensors", dtype, tied)
    write_tokenizer(tok, folder, chat_template, "<|im_end|>")
    gen_cfg = {"eos_token_id": [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")]}
    (folder / "generation_config.json").write_text(json.dumps(gen_cfg) + "\n")

    # Reload from disk exactly as a user would, and compute the references from that.
    model = cls.from_pretrained(folder, torch_dtype=torch.float32).eval()
    prompts = []
    for pname, text in PROMPTS:
        ids = prompt_ids(tok, pname, text)
        g, gap, last = greedy(model, ids)
        prompts.append(
            {
                "name": pname,
                "text": text,
                "ids": ids,
                "last_logits": f32_list(last),
                "greedy_ids": g,
                "min_gap": round(gap, 6),
            }
        )
        print(f"{name}/{pname}: {len(ids)} prompt tokens, min top-2 gap {gap:.4f}")
    if chat_template is not None:
        from transformers import AutoTokenizer

        hf_tok = AutoTokenizer.from_pretrained(folder)
        msgs = [{"role": "user", "content": "What is the capital of France?"}]
        text = hf_tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, enable_thinking=False)
        ids = tok.encode(text).ids
        g, gap, last = greedy(model, ids)
        prompts.append(
            {"name": "chat", "text": text, "ids": ids, "last_logits": f32_list(last), "greedy_ids": g, "min_gap": round(gap, 6)}
        )
        print(f"{name}/chat: {len(ids)} prompt tokens, min top-2 gap {gap:.4f}")
    ref = {"model": name, "dtype": str(dtype).removeprefix("torch."), "prompts": prompts}
    (folder / "reference.json").write_text(json.dumps(ref) + "\n")


def build_embedding(tok_base: Tokenizer, gen):
    from transformers import Qwen3Config, Qwen3Model
    from sentence_transformers import SentenceTransformer

    name = "tiny-qwen3-embedding"
    folder = OUT / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    config = Qwen3Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
    )
    config.architectures = ["Qwen3ForCausalLM"]
    torch.manual_seed(SEED + 1)
    model = Qwen3Model(config).eval()
    randomize(model, gen)
    round_to(model, torch.bfloat16)
    config.save_pretrained(folder)
    save_weights(model, folder / "model.safetensors", torch.bfloat16, False)
    tok = Tokenizer.from_str(tok_base.to_str())
    eot = tok.token_to_id("<|endoftext|>")
    tok.post_processor = processors.TemplateProcessing(
        single="$A <|endoftext|>", pair="$A <|endoftext|> $B:1 <|endoftext|>:1",
        special_tokens=[("<|endoftext|>", eot)],
    )
    write_tokenizer(tok, folder, None, "<|endoftext|>")
    query_prompt = "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ], indent=2) + "\n")
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": 64, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": False,
        "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False, "pooling_mode_lasttoken": True, "include_prompt": True,
    }, indent=2) + "\n")
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 256, "do_lower_case": False}) + "\n")
    (folder / "config_sentence_transformers.json").write_text(json.dumps({
        "prompts": {"query": query_prompt, "document": ""}, "default_prompt_name": None, "similarity_fn_name": "cosine",
    }, indent=2) + "\n")

    f32 = {"dtype": torch.float32}
    st = SentenceTransformer(str(folder), device="cpu", model_kwargs=f32)
    queries = ["What is the capital of France?", "how do rotary embeddings work", "東京"]
    docs = ["The capital of France is Paris.", "Attention is all you need; rotary position embeddings rotate pairs of dimensions.", ""]
    q_emb = st.encode(queries, prompt_name="query", convert_to_numpy=True, batch_size=2)
    d_emb = st.encode(docs, convert_to_numpy=True, batch_size=2)
    st32 = SentenceTransformer(str(folder), device="cpu", truncate_dim=32, model_kwargs=f32)
    q32 = st32.encode(queries, prompt_name="query", convert_to_numpy=True)

    def ids_of(text):
        return st.tokenizer(text)["input_ids"]

    ref = {
        "query_prompt": query_prompt,
        "queries": [{"text": t, "ids": ids_of(query_prompt + t), "embedding": f32_list(e)} for t, e in zip(queries, q_emb)],
        "documents": [{"text": t, "ids": ids_of(t), "embedding": f32_list(e)} for t, e in zip(docs, d_emb)],
        "queries_dim32": [f32_list(e) for e in q32],
    }
    (folder / "reference.json").write_text(json.dumps(ref, ensure_ascii=False) + "\n")
    print(f"{name}: {len(queries)} queries, {len(docs)} documents")


def main() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    gen = torch.Generator().manual_seed(SEED)
    tok = train_tokenizer()
    chat_template = json.loads(QWEN3_TOKENIZER_CONFIG.read_text())["chat_template"]
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                  num_attention_heads=4, max_position_embeddings=1024, bos_token_id=None,
                  eos_token_id=tok.token_to_id("<|im_end|>"))

    qwen3 = Qwen3Config(**common, num_key_value_heads=2, head_dim=24, rms_norm_eps=1e-6,
                        rope_theta=1000000.0, tie_word_embeddings=True)
    build_causal("tiny-qwen3", Qwen3ForCausalLM, qwen3, torch.bfloat16, True, tok, chat_template, gen)

    llama = LlamaConfig(**common, num_key_value_heads=1, head_dim=16, rms_norm_eps=1e-5, tie_word_embeddings=False,
                        rope_theta=500000.0,
                        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    build_causal("tiny-llama", LlamaForCausalLM, llama, torch.float16, False, tok, None, gen)

    qwen2 = Qwen2Config(**common, num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=10000.0,
                        tie_word_embeddings=False)
    build_causal("tiny-qwen2", Qwen2ForCausalLM, qwen2, torch.float32, False, tok, None, gen)

    build_embedding(tok, gen)


if __name__ == "__main__":
    main()
