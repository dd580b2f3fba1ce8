#!/usr/bin/env python3
"""Random rank-16 LoRA adapters (PEFT layout) for a Qwen2.5-0.5B-shaped model, for speed tests.

Writes N adapters (default 8) to OUT/adapter-K/ (adapter_config.json + adapter_model.safetensors),
each targeting the attention and MLP projections of every layer (q/k/v/o, gate/up/down), with A
and B drawn N(0, 0.01^2) (seeded per adapter). The tensors follow the names PEFT writes for
Qwen2ForCausalLM (checked against the fixtures of scripts/gen_lora_fixtures.py); no base model
is needed. Needs numpy and safetensors (and torch for --dtype bf16, which rounds the same
values to bf16 and saves them so, as adapters trained in bf16 are):
  .cache/venv-ref/bin/python scripts/gen_lora_bench_adapters.py --out .cache/lora-bench
  .cache/venv-ref/bin/python scripts/gen_lora_bench_adapters.py --out .cache/lora-bench-bf16 --dtype bf16
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

# Qwen2.5-0.5B: hidden 896, 24 layers, 14 heads of 64, 2 KV heads, MLP 4864.
HIDDEN, LAYERS, Q, KV, MLP = 896, 24, 14 * 64, 2 * 64, 4864
SHAPES = {  # module -> (in, out)
    "self_attn.q_proj": (HIDDEN, Q),
    "self_attn.k_proj": (HIDDEN, KV),
    "self_attn.v_proj": (HIDDEN, KV),
    "self_attn.o_proj": (Q, HIDDEN),
    "mlp.gate_proj": (HIDDEN, MLP),
    "mlp.up_proj": (HIDDEN, MLP),
    "mlp.down_proj": (MLP, HIDDEN),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    args = ap.parse_args()
    r = args.rank
    for k in range(args.n):
        rng = np.random.default_rng(1000 + k)
        tensors = {}
        for layer in range(LAYERS):
            for module, (i, o) in SHAPES.items():
                base = f"base_model.model.model.layers.{layer}.{module}"
                tensors[f"{base}.lora_A.weight"] = (rng.standard_normal((r, i)) * 0.01).astype(np.float32)
                tensors[f"{base}.lora_B.weight"] = (rng.standard_normal((o, r)) * 0.01).astype(np.float32)
        folder = args.out / f"adapter-{k}"
        folder.mkdir(parents=True, exist_ok=True)
        if args.dtype == "bf16":
            import torch
            from safetensors.torch import save_file as save_torch

            save_torch({k: torch.from_numpy(v).to(torch.bfloat16) for k, v in tensors.items()},
                       str(folder / "adapter_model.safetensors"))
        else:
            save_file(tensors, str(folder / "adapter_model.safetensors"))
        cfg = {
            "peft_type": "LORA", "r": r, "lora_alpha": 2 * r, "lora_dropout": 0.0, "bias": "none",
            "target_modules": sorted({m.split(".")[-1] for m in SHAPES}), "use_rslora": False,
            "use_dora": False, "fan_in_fan_out": False, "modules_to_save": None,
            "task_type": "CAUSAL_LM",
        }
        (folder / "adapter_config.json").write_text(json.dumps(cfg, indent=2))
        print(folder)


if __name__ == "__main__":
    main()
