#!/usr/bin/env python3
"""Random rank-16 LoRA adapters (PEFT layout) for a Qwen2.5-0.5B-shaped model (or, with
--shape qwen3-0.6b, a Qwen3-0.6B-shaped one), for speed tests.

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

# (hidden, layers, query width, key/value width, MLP width)
MODELS = {
    # Qwen2.5-0.5B: 14 heads of 64, 2 KV heads.
    "qwen2.5-0.5b": (896, 24, 14 * 64, 2 * 64, 4864),
    # Qwen3-0.6B: 16 heads of 128, 8 KV heads.
    "qwen3-0.6b": (1024, 28, 16 * 128, 8 * 128, 3072),
}


def shapes(hidden: int, q: int, kv: int, mlp: int) -> dict[str, tuple[int, int]]:
    """module -> (in, out)"""
    return {
        "self_attn.q_proj": (hidden, q),
        "self_attn.k_proj": (hidden, kv),
        "self_attn.v_proj": (hidden, kv),
        "self_attn.o_proj": (q, hidden),
        "mlp.gate_proj": (hidden, mlp),
        "mlp.up_proj": (hidden, mlp),
        "mlp.down_proj": (mlp, hidden),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--shape", choices=sorted(MODELS), default="qwen2.5-0.5b")
    args = ap.parse_args()
    r = args.rank
    hidden, layers, q, kv, mlp = MODELS[args.shape]
    modules = shapes(hidden, q, kv, mlp)
    for k in range(args.n):
        rng = np.random.default_rng(1000 + k)
        tensors = {}
        for layer in range(layers):
            for module, (i, o) in modules.items():
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
            "target_modules": sorted({m.split(".")[-1] for m in modules}), "use_rslora": False,
            "use_dora": False, "fan_in_fan_out": False, "modules_to_save": None,
            "task_type": "CAUSAL_LM",
        }
        (folder / "adapter_config.json").write_text(json.dumps(cfg, indent=2))
        print(folder)


if __name__ == "__main__":
    main()
