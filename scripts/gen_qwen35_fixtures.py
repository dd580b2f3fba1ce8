#!/usr/bin/env python3
"""Generates the tiny random-weight Qwen3.5 checkpoint and its transformers references.

Output (committed) in crates/inference/tests/fixtures/tiny-qwen35/:
  config.json         the multimodal layout of the real Qwen3.5 checkpoints: model_type "qwen3_5" with
                      the text model under "text_config" (layer_types: 3 Gated DeltaNet layers, then
                      one full-attention layer), partial rotary factor 0.25, mrope sections
  model.safetensors   bf16, tensor names as Qwen3_5ForConditionalGeneration saves them
                      ("model.language_model.layers.N...."), tied embeddings, no vision tower
  tokenizer.json etc. the tiny byte-level BPE of the other decoder fixtures (scripts/gen_decoder_fixtures.py),
                      with the Qwen3.5 chat template (llama.cpp's models/templates/Qwen3.5-4B.jinja)
  reference.json      prompts: [{name, ids, last_logits, greedy_ids [64], min_gap}] computed by
                      Qwen3_5ForCausalLM in f32 with transformers' torch fallback for the GDN layers
                      (chunked delta rule for the prompt, recurrent rule for each decoded token)

Prompts include 300+ and 2,000+ token ones, so prefill crosses many 64-token chunks.

Usage: .cache/venv-ref/bin/python scripts/gen_qwen35_fixtures.py
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_decoder_fixtures import f32_list, greedy  # noqa: E402  (same greedy loop, 64 steps)
from gen_random_qwen35 import qwen35_chat_template  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "crates" / "inference" / "tests" / "fixtures"
OUT = FIX / "tiny-qwen35"
SEED = int(__import__("os").environ.get("FIXTURE_SEED", "2"))



def main():
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    text_cfg = dict(
        vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=4096,
        rms_norm_eps=1e-6, tie_word_embeddings=True, linear_conv_kernel_dim=4, linear_key_head_dim=16,
        linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": [11, 11, 10], "mrope_interleaved": True},
        eos_token_id=442,
    )
    config = Qwen3_5TextConfig(**text_cfg)
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    model = Qwen3_5ForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name == "model.norm.weight":
                p.copy_(3.0 + 0.5 * torch.randn(p.shape, generator=gen))  # (1 + w): peaked logits
            elif name.endswith("linear_attn.norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))  # gated norm: plain w
            elif name.endswith("norm.weight"):
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))  # zero-centred (1 + w) norms
            elif name.endswith("A_log"):
                p.copy_(torch.log(torch.empty(p.shape).uniform_(0.5, 8.0, generator=gen)))
            elif name.endswith("dt_bias"):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen))
            elif name.endswith("conv1d.weight"):
                p.copy_(0.4 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=gen))
        model.tie_weights()
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).to(torch.float32))

    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    # Weights under the multimodal names, as the real checkpoints store them.
    state = {}
    for k, v in model.state_dict().items():
        if k == "lm_head.weight":
            continue
        state[k.replace("model.", "model.language_model.", 1)] = v.detach().to(torch.bfloat16).contiguous()
    save_file(state, str(OUT / "model.safetensors"), metadata={"format": "pt"})
    text = json.loads(config.to_json_string())
    text["model_type"] = "qwen3_5_text"
    full = {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": text,
        "tie_word_embeddings": True,
        "vision_config": {"model_type": "qwen3_5_vision", "depth": 1, "hidden_size": 16, "num_heads": 2},
    }
    (OUT / "config.json").write_text(json.dumps(full, indent=2) + "\n")
    for f in ["tokenizer.json", "generation_config.json"]:
        shutil.copy(FIX / "tiny-qwen3" / f, OUT / f)
    tok_cfg = json.loads((FIX / "tiny-qwen3" / "tokenizer_config.json").read_text())
    tok_cfg["chat_template"] = qwen35_chat_template()
    (OUT / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2, ensure_ascii=False) + "\n")

    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(OUT / "tokenizer.json"))
    corpus = json.loads((FIX / "tiny-qwen3" / "reference.json").read_text())
    long_ids = next(p["ids"] for p in corpus["prompts"] if p["name"] == "long")
    base_text = ("The quick brown fox jumps over the lazy dog. Large language models generate text one token "
                 "at a time. A key-value cache stores the keys and values of earlier tokens. ") * 60
    very_long = tok.encode(base_text).ids[:2100]
    assert len(very_long) == 2100
    prompts = [
        ("short", tok.encode("Hello").ids),
        ("sentence", tok.encode("The capital of France is").ids),
        ("single_token", [7]),
        ("chunk_edge", long_ids[:64]),
        ("chunk_edge_plus_one", long_ids[:65]),
        ("long", long_ids),
        ("very_long", very_long),
    ]
    refs = []
    for name, ids in prompts:
        g, gap, last = greedy(model, ids)
        refs.append({"name": name, "ids": ids, "last_logits": f32_list(last), "greedy_ids": g, "min_gap": round(gap, 6)})
        print(f"{name}: {len(ids)} prompt tokens, min top-2 gap {gap:.4f}", flush=True)
    (OUT / "reference.json").write_text(json.dumps({"model": "tiny-qwen35", "prompts": refs}) + "\n")


if __name__ == "__main__":
    main()
