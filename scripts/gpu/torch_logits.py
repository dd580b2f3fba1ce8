#!/usr/bin/env python3
"""transformers reference logits and greedy tokens of a causal LM, for parity checks.

  python3 scripts/gpu/torch_logits.py --model DIR --out FILE.json [--dtype f32|bf16] [--device cuda]

Prompts: --lengths (default 7,64,300) prompts of token ids drawn with numpy's default_rng(--seed)
uniformly from [0, --id-max) (default 151643: the Qwen3 BPE tokens, no special tokens), so the ids do
not depend on the device or the torch version. For each prompt:
  last_logits  the logits at the last prompt position, full vocab, as f32 (computed in --dtype:
               weights and activations both; the f32 run disables TF32 so matmuls are true f32)
  greedy_ids   --greedy (default 32) tokens by argmax, decoding one token at a time with the model's
               own forward and its KV cache (use_cache=True), never stopping at EOS
  gaps         per greedy step, top-1 minus top-2 logit (a small gap means an engine may flip the
               token legitimately); min_gap is their minimum

Output JSON: {"model", "dtype", "device", "torch", "transformers", "attn_implementation", "seed",
"prompts": [{"ids", "last_logits", "greedy_ids", "gaps", "min_gap"}]}. Floats are written as the
shortest decimal that reads back as the same f32.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch


def f32_text(values: np.ndarray) -> str:
    """JSON array of f32 values, each the shortest decimal that round-trips to the same f32."""
    v = np.asarray(values, dtype=np.float32)
    if not np.all(np.isfinite(v)):
        raise SystemExit("non-finite logits")
    return "[" + ",".join(str(x) for x in v) + "]"  # str(np.float32) is the shortest round-trip form


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--lengths", default="7,64,300")
    ap.add_argument("--greedy", type=int, default=32)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--id-max", type=int, default=151643)
    ap.add_argument("--attn", default=None, help="attn_implementation (default: transformers' choice, sdpa)")
    args = ap.parse_args()

    import transformers
    from transformers import AutoModelForCausalLM

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("CUDA is not available: pass --device cpu")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:  # the newer spelling of the same setting (torch >= 2.9)
        torch.backends.cuda.matmul.fp32_precision = "ieee"
    except Exception:
        pass
    torch.set_grad_enabled(False)
    dtype = torch.float32 if args.dtype == "f32" else torch.bfloat16
    kw = {"dtype": dtype}
    if args.attn:
        kw["attn_implementation"] = args.attn
    model = AutoModelForCausalLM.from_pretrained(str(args.model), **kw).to(args.device).eval()
    vocab = model.config.vocab_size
    id_max = min(args.id_max, vocab)

    rng = np.random.default_rng(args.seed)
    lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    prompts = [rng.integers(0, id_max, size=n).tolist() for n in lengths]

    t0 = time.perf_counter()
    results = []
    for ids in prompts:
        inp = torch.tensor([ids], device=args.device)
        out = model(input_ids=inp, use_cache=True)
        last = out.logits[0, -1].float().cpu().numpy()
        past = out.past_key_values
        logits = out.logits[0, -1].float()
        greedy, gaps = [], []
        for step in range(args.greedy):
            top = torch.topk(logits, 2)
            gaps.append(float(top.values[0] - top.values[1]))
            nxt = int(top.indices[0])
            greedy.append(nxt)
            if step + 1 == args.greedy:
                break
            out = model(input_ids=torch.tensor([[nxt]], device=args.device), past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits = out.logits[0, -1].float()
        results.append({"ids": ids, "last_logits": last, "greedy_ids": greedy, "gaps": gaps,
                        "min_gap": min(gaps) if gaps else None})

    head = {
        "model": str(args.model),
        "dtype": args.dtype,
        "device": args.device,
        "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
        "seed": args.seed,
        "id_max": id_max,
        "vocab_size": vocab,
        "seconds": round(time.perf_counter() - t0, 3),
    }
    # Written by hand so the logits keep their short f32 form (json.dumps of the f32 values widened
    # to f64 would print up to 17 digits each).
    parts = [json.dumps(head)[:-1], ', "prompts": [']
    for i, r in enumerate(results):
        if i:
            parts.append(",")
        parts.append('{"ids": ' + json.dumps(r["ids"]) + ', "last_logits": ' + f32_text(r["last_logits"]) +
                     ', "greedy_ids": ' + json.dumps(r["greedy_ids"]) + ', "gaps": ' +
                     json.dumps([float(np.float32(g)) for g in r["gaps"]]) + ', "min_gap": ' +
                     json.dumps(r["min_gap"]) + "}")
    parts.append("]}\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(parts))
    json.loads(args.out.read_text())  # well-formed
    summary = {**head, "out": str(args.out), "prompts": [
        {"len": len(r["ids"]), "argmax": int(np.argmax(r["last_logits"])), "greedy_head": r["greedy_ids"][:8],
         "min_gap": r["min_gap"]} for r in results]}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
