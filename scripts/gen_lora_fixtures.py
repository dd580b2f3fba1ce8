#!/usr/bin/env python3
"""Tiny random LoRA adapters made with peft on the decoder fixtures, and their references.

For each base in crates/inference/tests/fixtures/{tiny-llama,tiny-qwen3,tiny-qwen35} writes
crates/inference/tests/fixtures/lora/<base>/:
  attn/   adapter_config.json + adapter_model.safetensors: r 4, alpha 8, the attention
          projections (q/k/v/o; Qwen3.5's Gated DeltaNet in_proj_qkv/z/b/a and out_proj too)
  mlp/    r 8, alpha 16, rsLoRA, gate/up/down
  reference.json: for the base fixture's first prompt, with each adapter (and with the mixture
          0.7 * attn + 0.5 * mlp, peft's add_weighted_adapter(combination_type="cat"), which
          adds the scaled deltas exactly): last-position logits (f32) and 40 greedy ids.

peft initializes B to zero; here A and B are drawn N(0, 0.2^2) from a fixed seed so that every
adapter changes the logits. Run with the reference venv (scripts/setup_reference_env.sh, or a
venv with torch, transformers 5.24 and peft 0.21):
  .cache/venv-ref/bin/python scripts/gen_lora_fixtures.py
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "crates" / "inference" / "tests" / "fixtures"
OUT = FIX / "lora"
BASES = ["tiny-llama", "tiny-qwen3", "tiny-qwen35"]
ATTN = ["q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]
ADAPTERS = {
    "attn": dict(r=4, lora_alpha=8, targets=ATTN, rslora=False),
    "mlp": dict(r=8, lora_alpha=16, targets=MLP, rslora=True),
}
MIX = [("attn", 0.7), ("mlp", 0.5)]
STEPS = 40


def base_model(name: str):
    m = AutoModelForCausalLM.from_pretrained(FIX / name, torch_dtype=torch.float32)
    return m.eval()


def present(model, targets):
    names = {n.split(".")[-1] for n, _ in model.named_modules()}
    return [t for t in targets if t in names]


def run(model, ids):
    """Last-position logits of `ids` and 40 greedy ids (no cache, no end-of-sequence stop)."""
    with torch.no_grad():
        x = torch.tensor([ids])
        logits = model(x).logits[0, -1].float()
        out = []
        for _ in range(STEPS):
            nxt = int(model(x).logits[0, -1].argmax())
            out.append(nxt)
            x = torch.cat([x, torch.tensor([[nxt]])], dim=1)
    return logits.tolist(), out


def main() -> None:
    gen = torch.Generator().manual_seed(1234)
    for base in BASES:
        ref = json.loads((FIX / base / "reference.json").read_text())
        ids = ref["prompts"][0]["ids"]
        folder = OUT / base
        folder.mkdir(parents=True, exist_ok=True)
        result = {"base": base, "prompt_ids": ids, "steps": STEPS, "adapters": {}}
        for name, spec in ADAPTERS.items():
            model = base_model(base)
            cfg = LoraConfig(
                r=spec["r"], lora_alpha=spec["lora_alpha"], lora_dropout=0.0,
                target_modules=present(model, spec["targets"]), use_rslora=spec["rslora"],
            )
            peft_model = get_peft_model(model, cfg)
            with torch.no_grad():
                for n, p in peft_model.named_parameters():
                    if "lora_A" in n or "lora_B" in n:
                        p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
            peft_model.save_pretrained(folder / name, safe_serialization=True)
            (folder / name / "README.md").unlink(missing_ok=True)  # peft's model card
            logits, greedy = run(peft_model.eval(), ids)
            merged_logits, merged_greedy = run(peft_model.merge_and_unload().eval(), ids)
            result["adapters"][name] = {
                "logits": logits, "greedy": greedy,
                "merged_logits": merged_logits, "merged_greedy": merged_greedy,
            }
            print(f"{base}/{name}: greedy {greedy[:8]}...; merged equal: {greedy == merged_greedy}")
        model = PeftModel.from_pretrained(base_model(base), folder / MIX[0][0], adapter_name=MIX[0][0])
        for name, _ in MIX[1:]:
            model.load_adapter(folder / name, adapter_name=name)
        model.add_weighted_adapter(
            [n for n, _ in MIX], [w for _, w in MIX], adapter_name="mix", combination_type="cat"
        )
        model.set_adapter("mix")
        logits, greedy = run(model.eval(), ids)
        result["mixture"] = {"adapters": MIX, "logits": logits, "greedy": greedy}
        with torch.no_grad():
            plain_logits, plain_greedy = run(base_model(base), ids)
        result["base_greedy"] = plain_greedy
        (folder / "reference.json").write_text(json.dumps(result))
        print(f"{base}: mixture greedy {greedy[:8]}...; base greedy {plain_greedy[:8]}...")


if __name__ == "__main__":
    main()
