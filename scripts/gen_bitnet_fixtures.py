#!/usr/bin/env python3
"""Generates the tiny random-weight BitNet b1.58 checkpoints and their transformers references.

Output (committed) under crates/inference/tests/fixtures/, one folder per way transformers 5.24 holds
BitNet weights (transformers/integrations/bitnet.py), all with BitNetForCausalLM's layout as in
microsoft/bitnet-b1.58-2B-4T (sub-norms before o_proj and down_proj, squared-ReLU GLU, tied
embeddings, bf16 non-linear weights):
  tiny-bitnet         quantization_config linear_class "bitlinear", offline: weights packed 4 per uint8
                      [out/4, in] (row r of quarter q in bits 2q), weight_scale = 1 / mean|W|
                      (y = x_q . w / (x_scale * weight_scale))
  tiny-bitnet-auto    linear_class "autobitlinear", offline: the same packing, weight_scale = mean|W|
                      (hidden 256, intermediate 512: whole 256-value GGUF TQ blocks)
                      (y = (x_q / x_scale) . w * weight_scale)
  tiny-bitnet-online  linear_class "autobitlinear", online: bf16 master weights, ternarized by
                      absmean when the model runs (the "-bf16" training checkpoints)
Also quant/ternary_blocks.json: gguf-py's TQ1_0 / TQ2_0 bytes for random ternary rows (llama.cpp's
block layouts, for the Rust encoder and decoder).
Activations are quantized per token to int8 (absmax) before every BitLinear; lm_head stays dense.

reference.json: prompts [{name, ids, last_logits, greedy_ids [64], min_gap, f64_rel_err,
f64_greedy_equal}] computed in f32 by the model reloaded from disk (f64_*: the same model in f64
against that: int8 activation codes make BitNet discontinuous, so where a last-bit difference
flips a code the f32 result itself moves far more than f32 rounding; the tests hold such prompts
to that measured sensitivity), plus "min_act_margin": the smallest distance of any scaled activation
x * scale from a rounding boundary (k + 0.5) seen while computing the references — how far the
test is from a case where a last-bit difference in x could flip an int8 activation (exact ties,
counted in "exact_ties", are left out of it).

Usage: .cache/venv-ref/bin/python scripts/gen_bitnet_fixtures.py   (see scripts/setup_reference_env.sh)
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_decoder_fixtures import (  # noqa: E402  (same tokenizer, prompts and greedy loop)
    PROMPTS, f32_list, greedy, prompt_ids, train_tokenizer, write_tokenizer,
)

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "crates" / "inference" / "tests" / "fixtures"
SEED = int(__import__("os").environ.get("FIXTURE_SEED", "11"))
# (name, linear_class, quantization_mode, layers, hidden, intermediate): tiny-bitnet-auto is wide
# enough (256, 512) for GGUF's 256-value TQ1_0 / TQ2_0 blocks, so the tests also write it as GGUF.
VARIANTS = [
    ("tiny-bitnet", "bitlinear", "offline", 3, 64, 96),
    ("tiny-bitnet-auto", "autobitlinear", "offline", 2, 256, 512),
    ("tiny-bitnet-online", "autobitlinear", "online", 2, 64, 96),
]


def pack(t: torch.Tensor) -> torch.Tensor:
    """transformers' pack_weights: [out, in] ternary -> uint8 [out/4, in], quarter q in bits 2q."""
    out = t.shape[0]
    assert out % 4 == 0
    rows = out // 4
    codes = (t + 1).to(torch.uint8)
    packed = torch.zeros((rows, t.shape[1]), dtype=torch.uint8)
    for q in range(4):
        packed |= codes[q * rows:(q + 1) * rows] << (2 * q)
    return packed


MARGIN = [1.0]
TIES = [0]


def watch_margins():
    """Records the smallest distance of x * scale from k + 0.5 in every activation quantization."""
    import transformers.integrations.bitnet as bn

    def note(x: torch.Tensor):
        x = x.float()
        scale = 127 / x.abs().max(dim=-1, keepdim=True).values.clamp(min=1e-5)
        v = (x * scale).abs()
        d = (v - v.floor() - 0.5).abs()
        # Exact zeros (ReLU) and the row maximum (exactly 127 after scaling) are never near a
        # boundary whatever the last bits of x: leave them out.
        d = torch.where((x == 0) | (v >= 126.5), torch.ones_like(d), d)
        # Exact ties (x * scale = k + 0.5 exactly) come from exact ratios between elements
        # (e.g. one value half the row maximum); they are counted apart: an engine doing the
        # same f32 operations meets the same tie and rounds it half to even as torch does.
        TIES[0] += int((d == 0).sum())
        d = torch.where(d == 0, torch.ones_like(d), d)
        MARGIN[0] = min(MARGIN[0], float(d.min()))

    orig_bl = bn.BitLinear.forward
    orig_auto = bn.AutoBitLinear.forward

    def bl(self, x):
        note(x)
        return orig_bl(self, x)

    def auto(self, x):
        note(x)
        return orig_auto(self, x)

    bn.BitLinear.forward = bl
    bn.AutoBitLinear.forward = auto


def widen(model, dtype: torch.dtype):
    """transformers 5.24 keeps a quantized model in the checkpoint's dtype (bf16) even when asked
    for f32, and refuses .float(): widen every float tensor by hand (bf16 values, ternary
    weights and scales are exact in f32), so the references are f32 (or f64) arithmetic."""
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            if t.is_floating_point():
                t.data = t.data.to(dtype)
    for m in model.modules():
        if type(m).__name__ == "BitLinear":
            m.dtype = dtype  # the dtype it unpacks weights to and multiplies in
    return model


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b|, the tests' measure."""
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


def build(name: str, linear_class: str, mode: str, layers: int, hidden: int, inter: int, tok,
          gen: torch.Generator):
    from transformers import BitNetConfig, BitNetForCausalLM

    folder = FIX / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    config = BitNetConfig(
        vocab_size=512, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=None,
        eos_token_id=tok.token_to_id("<|im_end|>"),
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
    )
    config.torch_dtype = "bfloat16"
    plain = BitNetForCausalLM(config).eval()
    state = {}
    bf = lambda t: t.to(torch.bfloat16).contiguous()  # noqa: E731
    for key, p in plain.state_dict().items():
        if key == "lm_head.weight":
            continue  # tied
        shape = tuple(p.shape)
        if key == "model.norm.weight":
            state[key] = bf(4.0 + 0.5 * torch.randn(shape, generator=gen))
        elif key.endswith("norm.weight"):
            state[key] = bf(1.0 + 0.2 * torch.randn(shape, generator=gen))
        elif key == "model.embed_tokens.weight":
            state[key] = bf(0.5 * torch.randn(shape, generator=gen))
        else:
            # A BitLinear: ternary values with about a third zeros, and a per-tensor scale.
            tern = torch.randint(-1, 2, shape, generator=gen).to(torch.float32)
            absmean = float(0.08 + 0.1 * torch.rand((), generator=gen))
            base = key.removesuffix(".weight")
            if mode == "online":
                # Master weights whose absmean ternarization is `tern` (values well inside each
                # rounding interval), stored in bf16 as the -bf16 checkpoints are.
                jitter = 1.0 + 0.3 * (torch.rand(shape, generator=gen) - 0.5)
                w = tern * absmean * jitter + 0.2 * absmean * (torch.rand(shape, generator=gen) - 0.5) * (tern == 0)
                state[key] = bf(w)
            else:
                state[key] = pack(tern)
                ws = 1.0 / absmean if linear_class == "bitlinear" else absmean
                state[base + ".weight_scale"] = bf(torch.tensor([ws]))
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    cfg = config.to_dict()
    cfg["architectures"] = ["BitNetForCausalLM"]
    cfg["quantization_config"] = {
        "quant_method": "bitnet", "linear_class": linear_class, "quantization_mode": mode,
    }
    (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    write_tokenizer(tok, folder, None, "<|im_end|>")

    # Reload from disk exactly as a user would; the references come from that model.
    model = BitNetForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    model = widen(model, torch.float32)
    kinds = {type(m).__name__ for n, m in model.named_modules() if n.endswith("_proj")}
    assert kinds == {"BitLinear" if linear_class == "bitlinear" else "AutoBitLinear"}, kinds
    assert type(model.lm_head).__name__ == "Linear", type(model.lm_head)
    model64 = widen(BitNetForCausalLM.from_pretrained(folder, dtype=torch.float32).eval(), torch.float64)
    MARGIN[0], TIES[0] = 1.0, 0
    prompts = []
    for pname, text in PROMPTS:
        ids = prompt_ids(tok, pname, text)
        g, gap, last = greedy(model, ids)
        # The same model in f64: how far transformers' own f32 result is from its f64 one.
        # Int8 activation codes make the model discontinuous, so on long inputs a last-bit
        # difference somewhere flips a code and moves the logits far more than f32 rounding.
        g64, _, last64 = greedy(model64, ids)
        prompts.append({"name": pname, "text": text, "ids": ids, "last_logits": f32_list(last),
                        "greedy_ids": g, "min_gap": round(gap, 6),
                        "f64_rel_err": rel_err(torch.tensor(last), torch.tensor(last64)),
                        "f64_greedy_equal": g64 == g})
        print(f"{name}/{pname}: {len(ids)} prompt tokens, min top-2 gap {gap:.4f}, "
              f"f32 vs f64 {prompts[-1]['f64_rel_err']:.2e}, greedy equal {g64 == g}")
    print(f"{name}: min activation rounding margin {MARGIN[0]:.2e}, {TIES[0]} exact ties")
    ref = {"model": name, "dtype": "bfloat16", "linear_class": linear_class, "quantization_mode": mode,
           "min_act_margin": MARGIN[0], "exact_ties": TIES[0], "prompts": prompts}
    (folder / "reference.json").write_text(json.dumps(ref) + "\n")


def write_block_vectors(gen: torch.Generator) -> None:
    """gguf-py's TQ1_0 / TQ2_0 encodings (llama.cpp's reference quantizers ported) of random
    ternary rows, so the Rust encoder and decoder are checked against llama.cpp's own layout."""
    import numpy as np
    from gguf import GGMLQuantizationType, quants

    values = torch.randint(-1, 2, (2, 512), generator=gen).to(torch.float32)
    values[1, 256:] = 0  # an all-zero block
    scale = 0.3125  # exact in f16
    out = {"values": values.to(torch.int8).flatten().tolist(), "rows": 2, "cols": 512, "scale": scale}
    for name, t in [("tq1_0", GGMLQuantizationType.TQ1_0), ("tq2_0", GGMLQuantizationType.TQ2_0)]:
        b = quants.quantize((values * scale).numpy().astype(np.float32), t)
        out[name] = bytes(b.flatten().tolist()).hex()
    path = FIX / "quant" / "ternary_blocks.json"
    path.write_text(json.dumps(out) + "\n")
    print(f"{path.relative_to(ROOT)}: TQ1_0 / TQ2_0 of 2 x 512 values")


def main() -> None:
    watch_margins()
    gen = torch.Generator().manual_seed(SEED)
    torch.manual_seed(SEED)
    tok = train_tokenizer()
    for variant in VARIANTS:
        build(*variant, tok, gen)
    write_block_vectors(gen)


if __name__ == "__main__":
    main()
