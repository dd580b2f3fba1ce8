#!/usr/bin/env python3
"""Writes random-weight Qwen3 checkpoints in transformers layout, for GPU speed and parity runs.

  python3 scripts/gpu/make_models.py --out DIR --tokenizer PATH/tokenizer.json [--tiny] [--device cuda]

Output (one folder per dtype, same weights in both):
  DIR/qwen3-0.6b-bf16/   config.json, model.safetensors (BF16), tokenizer.json [, tokenizer_config.json]
  DIR/qwen3-0.6b-f32/    the same values in F32 (exactly the bf16 values widened, so the two
                         checkpoints describe one model and only the compute precision differs)
  with --tiny:  DIR/qwen3-tiny-bf16/, DIR/qwen3-tiny-f32/

Shape (Qwen3-0.6B): hidden 1024, 28 layers, 16 query / 8 KV heads of 128, intermediate 3072,
vocab 151,936, tied embeddings (no lm_head.weight is written, as in the real checkpoint), rope_theta
1e6, rms_norm_eps 1e-6, max_position_embeddings 40960. --tiny: hidden 64, 2 layers, 4 / 2 heads of
16, intermediate 128, same vocab (so the real Qwen3 tokenizer still fits).

Weights: drawn in f32 on --device from torch.Generator(--device) seeded with --seed, in a fixed
name order; matrices N(0, 0.02), every RMSNorm weight (input/post-attention/final and Q/K norms)
1 + 0.1 N(0, 1). The values depend on the device kind (CUDA and CPU generators differ), so a
checkpoint made on the GPU machine is not byte-identical to one made on a CPU.

The tensor names and shapes are checked against transformers' Qwen3ForCausalLM (built on the meta
device, no memory), and the written bf16 folder is reloaded with from_pretrained as a final check
(--no-verify skips that; it costs a few seconds on the GPU machine).

tokenizer.json: copied from --tokenizer (the Qwen3 byte-level BPE: 151,643 tokens + 26 added); a
path ending in .gz is decompressed (11 MB -> 2 MB to carry: scripts/gpu/prepare_carry.py makes it).
A tokenizer_config.json next to it is copied too (chat template), if present.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent.parent
DEFAULT_TOKENIZER = ROOT / ".cache" / "npm" / "qwen3" / "package" / "models" / "tokenizer.json"

FULL = dict(
    hidden_size=1024,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    intermediate_size=3072,
)
TINY = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=128,
)
COMMON = dict(
    vocab_size=151936,
    max_position_embeddings=40960,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    tie_word_embeddings=True,
    hidden_act="silu",
    attention_bias=False,
    attention_dropout=0.0,
    use_sliding_window=False,
    bos_token_id=151643,
    eos_token_id=151645,
)


def make_config(shape: dict, dtype: str):
    from transformers import Qwen3Config

    kw = dict(COMMON)
    kw.update(shape)
    theta = kw.pop("rope_theta")
    try:  # transformers 5: rope settings live in rope_parameters
        cfg = Qwen3Config(**kw, rope_parameters={"rope_type": "default", "rope_theta": theta})
    except TypeError:
        cfg = Qwen3Config(**kw, rope_theta=theta)
    # Older and newer spellings alike, so any loader finds the theta.
    rp = getattr(cfg, "rope_parameters", None)
    if isinstance(rp, dict):
        rp["rope_theta"] = theta
    cfg.architectures = ["Qwen3ForCausalLM"]
    cfg.dtype = dtype
    return cfg


def tensor_specs(cfg) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, kind) in a fixed order; kind is 'matrix' or 'norm'."""
    h, inter = cfg.hidden_size, cfg.intermediate_size
    hd, nq, nkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    out = [("model.embed_tokens.weight", (cfg.vocab_size, h), "matrix")]
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        out += [
            (p + "input_layernorm.weight", (h,), "norm"),
            (p + "self_attn.q_proj.weight", (nq * hd, h), "matrix"),
            (p + "self_attn.k_proj.weight", (nkv * hd, h), "matrix"),
            (p + "self_attn.v_proj.weight", (nkv * hd, h), "matrix"),
            (p + "self_attn.o_proj.weight", (h, nq * hd), "matrix"),
            (p + "self_attn.q_norm.weight", (hd,), "norm"),
            (p + "self_attn.k_norm.weight", (hd,), "norm"),
            (p + "post_attention_layernorm.weight", (h,), "norm"),
            (p + "mlp.gate_proj.weight", (inter, h), "matrix"),
            (p + "mlp.up_proj.weight", (inter, h), "matrix"),
            (p + "mlp.down_proj.weight", (h, inter), "matrix"),
        ]
    out.append(("model.norm.weight", (h,), "norm"))
    return out


def check_against_transformers(cfg, specs) -> None:
    from transformers import Qwen3ForCausalLM

    with torch.device("meta"):
        model = Qwen3ForCausalLM(cfg)
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if cfg.tie_word_embeddings:
        want.pop("lm_head.weight", None)
    have = {name: shape for name, shape, _ in specs}
    missing = sorted(set(want) - set(have))
    extra = sorted(set(have) - set(want))
    wrong = sorted(k for k in set(want) & set(have) if want[k] != have[k])
    if missing or extra or wrong:
        raise SystemExit(f"tensor layout differs from transformers: missing {missing[:5]} extra {extra[:5]} "
                         f"wrong shapes {[(k, have[k], want[k]) for k in wrong[:5]]}")


def generate(specs, device: str, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    out = {}
    for name, shape, kind in specs:
        x = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
        if kind == "matrix":
            x.mul_(0.02)
        else:
            x.mul_(0.1).add_(1.0)
        out[name] = x.to(torch.bfloat16)
    return out


def write_folder(folder: Path, cfg, tensors: dict[str, torch.Tensor], dtype: torch.dtype,
                 tokenizer: Path) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob("*.safetensors*"):
        stale.unlink()
    cpu = {k: v.to(dtype).cpu().contiguous() for k, v in tensors.items()}
    save_file(cpu, str(folder / "model.safetensors"), metadata={"format": "pt"})
    cfg.save_pretrained(str(folder))
    (folder / "tokenizer.json").write_bytes(read_tokenizer(tokenizer))
    tok_cfg = tokenizer.parent / "tokenizer_config.json"
    if tok_cfg.is_file():
        shutil.copy(tok_cfg, folder / "tokenizer_config.json")


def read_tokenizer(path: Path) -> bytes:
    raw = path.read_bytes()
    return gzip.decompress(raw) if path.suffix == ".gz" else raw


def verify(folder: Path, tensors: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
    """Reloads the folder with transformers: every weight present, lm_head tied, values equal."""
    from transformers import Qwen3ForCausalLM

    model = Qwen3ForCausalLM.from_pretrained(str(folder), dtype=dtype)
    sd = model.state_dict()
    for name, t in tensors.items():
        if not torch.equal(sd[name].cpu(), t.to(dtype).cpu()):
            raise SystemExit(f"{folder}: {name} differs after reload")
    if model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
        if not torch.equal(model.lm_head.weight, model.model.embed_tokens.weight):
            raise SystemExit(f"{folder}: lm_head is not tied to embed_tokens")
    del model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="parent folder of the checkpoints")
    ap.add_argument("--tiny", action="store_true", help="tiny shape for local tests (qwen3-tiny-*)")
    ap.add_argument("--tokenizer", type=Path, default=DEFAULT_TOKENIZER, help="Qwen3 tokenizer.json to copy")
    ap.add_argument("--device", default="cuda", help="where the random weights are drawn (cuda, cpu)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtypes", default="bf16,f32", help="which folders to write: bf16, f32 or both")
    ap.add_argument("--no-verify", action="store_true", help="skip the reload check")
    args = ap.parse_args()

    if not args.tokenizer.is_file():
        raise SystemExit(f"tokenizer not found: {args.tokenizer} (pass --tokenizer PATH/tokenizer.json)")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("CUDA is not available: pass --device cpu")
    vocab_needed = max(
        [t["id"] for t in json.loads(read_tokenizer(args.tokenizer)).get("added_tokens", [])] + [0]
    ) + 1
    if vocab_needed > COMMON["vocab_size"]:
        raise SystemExit(f"tokenizer ids reach {vocab_needed - 1}, above the model vocab {COMMON['vocab_size']}")

    shape = TINY if args.tiny else FULL
    stem = "qwen3-tiny" if args.tiny else "qwen3-0.6b"
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    for d in dtypes:
        if d not in ("bf16", "f32"):
            raise SystemExit(f"unknown dtype {d!r} in --dtypes")

    t0 = time.perf_counter()
    specs = tensor_specs(make_config(shape, "bfloat16"))
    check_against_transformers(make_config(shape, "bfloat16"), specs)
    tensors = generate(specs, args.device, args.seed)
    n_params = sum(t.numel() for t in tensors.values())
    print(f"make_models: {n_params / 1e6:.1f}M parameters drawn on {args.device} "
          f"in {time.perf_counter() - t0:.1f}s", file=sys.stderr)

    for d in dtypes:
        tdtype = torch.bfloat16 if d == "bf16" else torch.float32
        folder = args.out / f"{stem}-{d}"
        t1 = time.perf_counter()
        write_folder(folder, make_config(shape, "bfloat16" if d == "bf16" else "float32"), tensors, tdtype,
                     args.tokenizer)
        if not args.no_verify:
            verify(folder, tensors, tdtype)
        size = (folder / "model.safetensors").stat().st_size
        print(f"make_models: wrote {folder} ({size / 1e6:.1f} MB, {time.perf_counter() - t1:.1f}s"
              f"{'' if args.no_verify else ', reload verified'})", file=sys.stderr)
    print(json.dumps({"out": str(args.out), "folders": [str(args.out / f"{stem}-{d}") for d in dtypes],
                      "parameters": n_params, "seed": args.seed, "device": args.device,
                      "tokenizer": str(args.tokenizer)}))


if __name__ == "__main__":
    main()
