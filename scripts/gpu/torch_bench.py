#!/usr/bin/env python3
"""PyTorch / transformers speed peer for a causal LM on the GPU (bf16 by default).

  python3 scripts/gpu/torch_bench.py --model DIR [--prompt 512] [--gen 128] [--streams 64] [--runs 5]
      [--decode-prompt 16] [--stream-prompt 16] [--sections prefill,eager,static,static_auto]
      [--out FILE.json] [--device cuda] [--dtype bf16]

Token ids are random (torch.Generator seeded with --seed, uniform in [0, 151643): no special
tokens); speed does not depend on them. Every timed region is bracketed by
torch.cuda.synchronize(); each figure is the median of --runs timed runs after warm-up.

Sections (--sections, comma-separated, in this order):
  prefill      one forward over --prompt tokens at batch 1, no cache, logits of the last position
               only (logits_to_keep=1, as generate does and as Lattice's pp test does):
               prefill.tokens_per_s = prompt / median seconds.
  eager        generate() with the default dynamic KV cache, greedy, min_new_tokens = max_new_tokens
               = --gen (never stops early), from a --decode-prompt-token prompt:
               t_prefill = median time of generate(max_new_tokens=1), t_total = median time of
               generate(max_new_tokens=gen); decode_tokens_per_s = (gen - 1) / (t_total - t_prefill).
               With --streams N > 0 the same at batch N (N different random prompts of
               --stream-prompt tokens, no padding): aggregate decode_tokens_per_s =
               N (gen - 1) / (t_total - t_prefill); e2e_tokens_per_s = N gen / t_total.
  static       transformers' documented static-cache recipe:
                 model.generation_config.cache_implementation = "static"
                 model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
               (generation_config.disable_compile = True, so generate does not wrap its own
               compile around the compiled forward). Warm-up: --compile-warmup full generate calls
               and 2 one-token calls per batch size, timed and reported (warmup_s) so that
               compilation is excluded from the figures; graphs compiled during the timed runs are
               counted (new_graphs_during_timing, expected 0). Same figures as eager, batch 1 and
               batch --streams. Any exception is caught and its text stored in "error".
  static_auto  cache_implementation = "static" with nothing compiled by hand: transformers 5
               compiles the decode step itself on CUDA (generation_config.compile_config).
               Same figures; on the CPU nothing is compiled (it is then static eager).

The result is printed as one JSON object on the last stdout line and, with --out, also written to
FILE after each section (so a run cut short still leaves the finished sections). Progress goes to
stderr.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch


def log(msg: str) -> None:
    print(f"torch_bench: {msg}", file=sys.stderr, flush=True)


class Bench:
    def __init__(self, args):
        self.args = args
        self.cuda = args.device.startswith("cuda")
        self.gen = torch.Generator().manual_seed(args.seed)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def timed(self, fn) -> float:
        self.sync()
        t = time.perf_counter()
        fn()
        self.sync()
        return time.perf_counter() - t

    def ids(self, batch: int, length: int) -> torch.Tensor:
        x = torch.randint(0, self.args.id_max, (batch, length), generator=self.gen)
        return x.to(self.args.device)


def graphs_compiled() -> int | None:
    try:
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])
    except Exception:
        return None


def run_generate(model, ids: torch.Tensor, n: int, pad: int) -> torch.Tensor:
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=n,
        min_new_tokens=n,
        pad_token_id=pad,
    )
    if out.shape != (ids.shape[0], ids.shape[1] + n):
        raise RuntimeError(f"generate returned shape {tuple(out.shape)}, expected {(ids.shape[0], ids.shape[1] + n)}")
    return out


def decode_figures(b: Bench, model, batch: int, prompt_len: int, warmup: int, pad: int) -> dict:
    """t_prefill (generate 1 token), t_total (generate --gen tokens) and the decode rate."""
    a = b.args
    gen = a.gen
    ids = b.ids(batch, prompt_len)
    warm = []
    # Longest call first: a static cache is then allocated at its final length, and the
    # one-token calls reuse that shape (transformers keeps the largest max_cache_len).
    for _ in range(warmup):
        warm.append(round(b.timed(lambda: run_generate(model, ids, gen, pad)), 4))
    for _ in range(2 if warmup else 0):
        warm.append(round(b.timed(lambda: run_generate(model, ids, 1, pad)), 4))
    g0 = graphs_compiled()
    totals, prefills = [], []
    for _ in range(a.runs):  # interleaved, so drift hits both alike
        prefills.append(b.timed(lambda: run_generate(model, ids, 1, pad)))
        totals.append(b.timed(lambda: run_generate(model, ids, gen, pad)))
    g1 = graphs_compiled()
    t_total = statistics.median(totals)
    t_prefill = statistics.median(prefills)
    decode_s = t_total - t_prefill
    res = {
        "batch": batch,
        "prompt_tokens": prompt_len,
        "gen_tokens": gen,
        "decode_tokens_per_s": (batch * (gen - 1) / decode_s) if decode_s > 0 and gen > 1 else None,
        "e2e_tokens_per_s": batch * gen / t_total,
        "ms_per_step": 1000 * decode_s / (gen - 1) if gen > 1 else None,
        "t_prefill_s": t_prefill,
        "t_total_s": t_total,
        "samples_total_s": [round(x, 5) for x in totals],
        "samples_prefill_s": [round(x, 5) for x in prefills],
        "warmup_s": warm,
    }
    if g0 is not None and g1 is not None:
        res["new_graphs_during_timing"] = g1 - g0
    if b.cuda:
        res["peak_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", choices=["bf16", "f16", "f32"], default="bf16")
    ap.add_argument("--prompt", type=int, default=512, help="prefill test length")
    ap.add_argument("--gen", type=int, default=128, help="tokens generated per decode test")
    ap.add_argument("--decode-prompt", type=int, default=16,
                    help="prompt length before the batch-1 decode test (Lattice's tg runs from an empty cache)")
    ap.add_argument("--streams", type=int, default=64, help="concurrent sequences for the batched decode test; 0 skips")
    ap.add_argument("--stream-prompt", type=int, default=16, help="prompt length of each stream (Lattice uses 16)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2, help="untimed warm-up calls of the eager tests")
    ap.add_argument("--compile-warmup", type=int, default=3, help="warm-up generate calls of the compiled tests")
    ap.add_argument("--sections", default="prefill,eager,static,static_auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--id-max", type=int, default=151643)
    ap.add_argument("--attn", default=None, help="attn_implementation (default: transformers' choice, sdpa)")
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON here, after every section")
    ap.add_argument("--compile-on-cpu", action="store_true",
                    help="static_auto: let generate compile on the CPU too (for testing the path locally)")
    args = ap.parse_args()

    import transformers
    from transformers import AutoModelForCausalLM

    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = set(sections) - {"prefill", "eager", "static", "static_auto"}
    if unknown:
        raise SystemExit(f"unknown sections {sorted(unknown)}")
    b = Bench(args)
    if b.cuda and not torch.cuda.is_available():
        raise SystemExit("CUDA is not available: pass --device cpu")
    torch.set_grad_enabled(False)
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[args.dtype]
    kw = {"dtype": dtype}
    if args.attn:
        kw["attn_implementation"] = args.attn
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(str(args.model), **kw).to(args.device).eval()
    load_s = time.perf_counter() - t0
    eos = model.config.eos_token_id
    pad = eos[0] if isinstance(eos, list) else (eos if eos is not None else 0)
    args.id_max = min(args.id_max, model.config.vocab_size)
    # Several batch sizes and prompt lengths each compile their own graphs.
    for knob in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 64)

    result = {
        "engine": "transformers",
        "model": str(args.model),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "device": args.device,
        "gpu": torch.cuda.get_device_name() if b.cuda else None,
        "dtype": args.dtype,
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
        "parameters": sum(p.numel() for p in model.parameters()),
        "load_s": round(load_s, 3),
        "prompt": args.prompt,
        "gen": args.gen,
        "decode_prompt": args.decode_prompt,
        "streams": args.streams,
        "stream_prompt": args.stream_prompt,
        "runs": args.runs,
        "seed": args.seed,
        "sections": sections,
    }

    def save() -> None:
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=1) + "\n")

    def failed(key: str, e: Exception) -> None:
        log(f"{key} failed: {type(e).__name__}: {e}")
        traceback.print_exc(file=sys.stderr)
        result[key] = {"error": f"{type(e).__name__}: {str(e)[:2000]}"}
        save()

    def attempt(key: str, fn) -> bool:
        t = time.perf_counter()
        try:
            result[key] = fn()
            ok = True
        except Exception as e:  # reported, not fatal: the other sections still run
            failed(key, e)
            ok = False
        result[key]["section_s"] = round(time.perf_counter() - t, 2)
        log(f"{key} done in {result[key]['section_s']}s: {json.dumps({k: v for k, v in result[key].items() if not k.startswith('samples')})}")
        save()
        return ok

    def decode_pair(prefix: str, warmup: int) -> None:
        ok = attempt(prefix, lambda: decode_figures(b, model, 1, args.decode_prompt, warmup, pad))
        if args.streams > 0 and ok:
            attempt(prefix + "_streams",
                    lambda: decode_figures(b, model, args.streams, args.stream_prompt, warmup, pad))

    save()
    for section in sections:
        log(f"section {section}")
        if section == "prefill":
            def prefill() -> dict:
                ids = b.ids(1, args.prompt)
                fwd = lambda: model(input_ids=ids, use_cache=False, logits_to_keep=1)  # noqa: E731
                for _ in range(max(args.warmup, 1)):
                    b.timed(fwd)
                ts = [b.timed(fwd) for _ in range(args.runs)]
                med = statistics.median(ts)
                return {"tokens": args.prompt, "tokens_per_s": args.prompt / med, "median_s": med,
                        "samples_s": [round(x, 5) for x in ts]}

            attempt("prefill", prefill)
        elif section == "eager":
            model.generation_config.cache_implementation = None
            decode_pair("eager", args.warmup)
        elif section == "static":
            original = model.forward
            try:
                model.generation_config.cache_implementation = "static"
                model.generation_config.disable_compile = True
                model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
                decode_pair("static", max(args.compile_warmup, 1))
            except Exception as e:  # e.g. torch.compile itself refusing
                failed("static", e)
            finally:
                model.forward = original
                model.generation_config.cache_implementation = None
                model.generation_config.disable_compile = False
                torch._dynamo.reset()
        elif section == "static_auto":
            try:
                model.generation_config.cache_implementation = "static"
                model.generation_config.disable_compile = False
                if args.compile_on_cpu:
                    from transformers import CompileConfig

                    cc = CompileConfig()
                    cc._compile_all_devices = True
                    model.generation_config.compile_config = cc
                decode_pair("static_auto", max(args.compile_warmup, 1))
                result["static_auto"]["auto_compile_expected"] = b.cuda or args.compile_on_cpu
                # generate keeps its compiled decode step here once it has made one.
                result["static_auto"]["auto_compiled"] = hasattr(model, "_compiled_call")
                save()
            except Exception as e:
                failed("static_auto", e)
            finally:
                model.generation_config.cache_implementation = None
                torch._dynamo.reset()
        if b.cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
    save()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
