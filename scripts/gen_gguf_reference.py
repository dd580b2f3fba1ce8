#!/usr/bin/env python3
"""Reference outputs of the real GGUF decoders, for Lattice's text-generation parity tests.

Two peers, two subcommands (run them in this order; the second reads the first's output):

  llamacpp      llama.cpp through llama-cpp-python 0.3.36 (.cache/venv-llama, made by
                scripts/build_llama_cpp.sh; the bindings load
                .cache/llama.cpp/build/bin/libllama.so).
                Greedy 32-token continuations of ~10 prompts, plus teacher-forced logits of a fixed
                64-token text.
  transformers  transformers 5.24 (.cache/venv-ref) with the GGUF weights dequantized to f32.
                The same teacher-forced 64 tokens, greedy continuations of 3 of the prompts, and the
                full last-position logits of the shortest prompt.

Writes, per model (<stem> = the GGUF file name without ".gguf"), under
crates/inference/tests/fixtures/gguf/:
  <stem>.llamacpp.json.gz       see README.md there for the schema
  <stem>.transformers.json.gz
  <stem>.last_logits.json.gz    f16-rounded full logits (transformers), if under 1 MB gzipped

Settings: n_threads=2, n_ctx=2048, logits_all, greedy (argmax; ties -> lowest id), stop at an
end-of-generation token (llama.cpp's EOG set) or after 32 tokens. Prompts are tokenized the way
llama.cpp does for the file: BOS only if tokenizer.ggml.add_bos_token says so (false for both
models), special tokens parsed (so chat-template markers become their single ids).

Usage:
  .cache/venv-llama/bin/python scripts/gen_gguf_reference.py llamacpp [--model NAME ...]
  .cache/venv-ref/bin/python   scripts/gen_gguf_reference.py transformers [--model NAME ...]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / ".cache" / "models"
LIB = ROOT / ".cache" / "llama.cpp" / "build" / "bin"
OUT = ROOT / "crates" / "inference" / "tests" / "fixtures" / "gguf"
MODEL_FILES = ["SmolLM2-135M-Instruct.Q4_1.gguf", "Qwen2.5-Coder-0.5B-Instruct.gguf"]

N_THREADS = 2
N_CTX = 2048
GEN_TOKENS = 32
TF_TOKENS = 64
TOP_K = 64
N_PROBE = 256
PROBE_SEED = 20261129
# Prompts the transformers step also continues greedily (names from PROMPTS).
HF_GREEDY = ["capital", "python", "chat"]

LONG_TEXT = (
    "The story of the lighthouse on the northern cape begins with a shipwreck. In the winter of 1821 a "
    "merchant vessel carrying timber and salt struck the rocks below the cliffs during a storm, and "
    "only three of the nineteen sailors reached the shore alive. The villagers, who had watched the "
    "disaster from the headland without being able to help, petitioned the harbour authority for a "
    "light. It took eleven years, two changes of government and a public subscription before the "
    "first stone was laid. The tower was built from granite quarried a few miles inland and carried "
    "to the site on carts pulled by oxen, because the track along the coast was too narrow for "
    "horses with heavy loads. Its first lamp burned whale oil and could be seen, on a clear night, "
    "from a distance of about fourteen nautical miles. The keepers lived with their families in a "
    "low cottage next to the tower; they trimmed the wicks every four hours, polished the brass and "
    "the glass each morning, and wrote the weather, the passing ships and the consumption of oil "
    "into a logbook that survives to this day. In 1904 the oil lamp was replaced by a paraffin "
    "vapour burner, and in 1958 the station was connected to the electricity grid. The last keeper "
    "left in 1989, when the light became automatic. Today the cottage is a small museum, and "
    "visitors who climb the one hundred and twelve steps to the lantern room can still read the "
    "names of the keepers carved into the wooden frame of the door. Summarize this story in one "
    "sentence:"
)

# (name, kind, text); kind "chat" means: text is the user message, rendered with the GGUF's
# chat template (add_generation_prompt=True).
PROMPTS = [
    ("capital", "text", "The capital of France is"),
    ("story", "text", "Once upon a time, in a small village by the sea, there lived"),
    ("python", "code", 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'),
    ("rust", "code", "fn main() {\n    let numbers = vec![3, 1, 4, 1, 5, 9];\n    let sum: i32 ="),
    ("chat", "chat", "What is the boiling point of water at sea level, in Celsius?"),
    ("french", "text", "La tour Eiffel a été construite pour l'Exposition universelle de"),
    ("chinese", "text", "人工智能是计算机科学的一个分支，它"),
    ("arith", "text", "Q: What is 17 * 23?\nA:"),
    ("list", "text", "Here is a list of the planets of the solar system:\n1. Mercury\n2."),
    ("long", "text", LONG_TEXT),
]

TEACHER_TEXT = (
    "The river rises in the hills above the old market town and flows south through meadows, "
    "orchards and a narrow wooded valley before it reaches the sea. For centuries it turned the "
    "wheels of a dozen mills, and the town grew rich on wool, flour and paper. When the railway "
    "arrived in 1862, the mills began to close one after another."
)


def stem(model_file: str) -> str:
    return model_file[: -len(".gguf")] if model_file.endswith(".gguf") else model_file


def f32_list(values) -> list[float]:
    """Floats as the shortest decimal that round-trips to the same f32."""
    return [float(str(v)) for v in np.asarray(values, dtype=np.float32).ravel()]


def f16_list(values) -> list[float]:
    return [float(str(v)) for v in np.asarray(values, dtype=np.float16).ravel()]


def top2(logits: np.ndarray) -> tuple[int, float, int, float]:
    """Greedy pick (argmax, lowest id on ties) and the runner-up."""
    first = int(np.argmax(logits))
    rest = logits.copy()
    rest[first] = -np.inf
    second = int(np.argmax(rest))
    return first, float(logits[first]), second, float(logits[second])


def position_record(logits: np.ndarray, probe_ids: np.ndarray) -> dict:
    """Compact summary of one position's logits (full rows are too big to commit)."""
    order = np.argsort(-logits, kind="stable")[:TOP_K]
    return {
        "top_ids": [int(i) for i in order],
        "top_logits": f32_list(logits[order]),
        "probe_logits": f32_list(logits[probe_ids]),
        "max_abs": float(str(np.float32(np.max(np.abs(logits))))),
    }


def write_gz(path: Path, obj: dict) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    with open(path, "wb") as raw:
        # mtime=0 and no file name: regenerating identical data gives identical bytes.
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as gz:
            gz.write(data)
    size = path.stat().st_size
    print(f"wrote {path.relative_to(ROOT)} ({size / 1024:.1f} KiB)", flush=True)
    return size


def read_gz(path: Path) -> dict:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def render_chat(template: str, user: str, bos: str, eos: str) -> str:
    """The GGUF's tokenizer.chat_template for one user turn, generation prompt appended."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(msg):
        raise RuntimeError(msg)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(
        messages=[{"role": "user", "content": user}],
        add_generation_prompt=True,
        bos_token=bos,
        eos_token=eos,
        tools=None,
    )


# ----------------------------------------------------------------------------------- llama.cpp


def run_llamacpp(model_file: str) -> None:
    os.environ.setdefault("LLAMA_CPP_LIB_PATH", str(LIB))
    import llama_cpp
    from llama_cpp import Llama

    path = MODELS / model_file
    t0 = time.time()
    llm = Llama(
        model_path=str(path),
        n_ctx=N_CTX,
        n_threads=N_THREADS,
        n_threads_batch=N_THREADS,
        logits_all=True,
        verbose=False,
    )
    meta = llm.metadata
    add_bos = meta.get("tokenizer.ggml.add_bos_token", "false") == "true"
    vocab = llm._model.vocab
    n_vocab = llm.n_vocab()
    eog_ids = [t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)]

    def piece(tok: int) -> str:
        return llm.detokenize([tok], special=True).decode("utf-8", errors="replace")

    bos_text, eos_text = piece(llm.token_bos()), piece(llm.token_eos())

    def tokenize(text: str) -> list[int]:
        return llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=True)

    prompts = []
    for name, kind, text in PROMPTS:
        if kind == "chat":
            text = render_chat(meta["tokenizer.chat_template"], text, bos_text, eos_text)
        ids = tokenize(text)
        llm.reset()
        llm.eval(ids)
        generated, steps, stopped = [], [], False
        for _ in range(GEN_TOKENS):
            logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            a, la, b, lb = top2(logits)
            generated.append(a)
            steps.append([a, la, b, lb])
            if a in eog_ids:
                stopped = True
                break
            llm.eval([a])
        prompts.append(
            {
                "name": name,
                "kind": kind,
                "text": text,
                "prompt_ids": ids,
                "generated_ids": generated,
                "top2": [[s[0], f32_list([s[1]])[0], s[2], f32_list([s[3]])[0]] for s in steps],
                "top2_gap": f32_list([s[1] - s[3] for s in steps]),
                "generated_text": llm.detokenize(generated, special=True).decode(
                    "utf-8", errors="replace"
                ),
                "stopped_at_eog": stopped,
            }
        )
        gaps = [s[1] - s[3] for s in steps]
        print(
            f"  {name:8s} prompt {len(ids):3d} tok, gen {len(generated):2d}, min gap "
            f"{min(gaps):.4f}: {prompts[-1]['generated_text'][:60]!r}",
            flush=True,
        )

    # Teacher forcing: the first 64 tokens of TEACHER_TEXT, all positions' logits.
    all_ids = tokenize(TEACHER_TEXT)
    assert len(all_ids) >= TF_TOKENS, f"teacher text has only {len(all_ids)} tokens"
    tf_ids = all_ids[:TF_TOKENS]
    probe_ids = np.sort(np.random.default_rng(PROBE_SEED).choice(n_vocab, N_PROBE, replace=False))
    llm.reset()
    llm.eval(tf_ids)
    scores = np.array(llm.scores[:TF_TOKENS], dtype=np.float32)
    positions = [position_record(scores[p], probe_ids) for p in range(TF_TOKENS)]

    out = {
        "model": model_file,
        "arch": meta.get("general.architecture"),
        "engine": "llama.cpp via llama-cpp-python 0.3.36 (vendored llama.cpp, CPU, GGML_NATIVE)",
        "n_threads": N_THREADS,
        "n_ctx": N_CTX,
        "vocab_size": n_vocab,
        "add_bos": add_bos,
        "parse_special": True,
        "bos_id": llm.token_bos(),
        "eos_id": llm.token_eos(),
        "eog_ids": eog_ids,
        "gen_tokens": GEN_TOKENS,
        "prompts": prompts,
        "teacher_forced": {
            "text": TEACHER_TEXT,
            "text_ids": all_ids,
            "ids": tf_ids,
            "probe_seed": PROBE_SEED,
            "probe_ids": [int(i) for i in probe_ids],
            "top_k": TOP_K,
            "positions": positions,
        },
    }
    write_gz(OUT / f"{stem(model_file)}.llamacpp.json.gz", out)
    print(f"  llama.cpp done in {time.time() - t0:.1f}s", flush=True)


# -------------------------------------------------------------------------------- transformers


def run_transformers(model_file: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(N_THREADS)
    ref_path = OUT / f"{stem(model_file)}.llamacpp.json.gz"
    if not ref_path.exists():
        sys.exit(f"{ref_path} missing: run the llamacpp subcommand first")
    ref = read_gz(ref_path)

    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(str(MODELS), gguf_file=model_file)
    model = AutoModelForCausalLM.from_pretrained(
        str(MODELS), gguf_file=model_file, dtype=torch.float32
    )
    model.eval()
    print(f"  loaded in {time.time() - t0:.1f}s", flush=True)

    # Tokenization agreement with llama.cpp (no BOS for either file; checked against the fixture).
    def hf_ids(text: str) -> list[int]:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        if ref["add_bos"]:
            ids = [ref["bos_id"]] + ids
        return ids

    token_checks = []
    for p in ref["prompts"]:
        ours = hf_ids(p["text"])
        token_checks.append({"name": p["name"], "equal": ours == p["prompt_ids"], "hf_ids": ours})
    tf = ref["teacher_forced"]
    tf_hf = hf_ids(tf["text"])
    token_checks.append(
        {"name": "teacher_forced", "equal": tf_hf == tf["text_ids"], "hf_ids": tf_hf}
    )
    for c in token_checks:
        print(f"  tokenize {c['name']:15s} equal to llama.cpp: {c['equal']}", flush=True)
    # Keep hf_ids only where they differ (they are then the evidence).
    for c in token_checks:
        if c["equal"]:
            del c["hf_ids"]

    # The chat prompt as transformers renders it from the same GGUF template.
    chat = next(p for p in ref["prompts"] if p["kind"] == "chat")
    user = next(t for n, _, t in PROMPTS if n == chat["name"])
    hf_chat = tok.apply_chat_template(
        [{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True
    )
    chat_equal = hf_chat == chat["text"]
    print(f"  chat template text equal to ours: {chat_equal}", flush=True)

    vocab = model.config.vocab_size
    probe_ids = np.array(tf["probe_ids"])

    # Teacher forcing on llama.cpp's ids (so both engines see identical inputs).
    with torch.no_grad():
        logits = model(torch.tensor([tf["ids"]])).logits[0].float().numpy()
    positions = [position_record(logits[p], probe_ids) for p in range(len(tf["ids"]))]
    lc = tf["positions"]
    top1_agree = sum(a["top_ids"][0] == b["top_ids"][0] for a, b in zip(positions, lc))
    probe_diff = max(
        float(np.max(np.abs(np.array(a["probe_logits"]) - np.array(b["probe_logits"]))))
        for a, b in zip(positions, lc)
    )
    print(
        f"  teacher forced vs llama.cpp: top-1 agree {top1_agree}/{len(lc)}, "
        f"max |probe diff| {probe_diff:.4f}",
        flush=True,
    )

    # Greedy continuations of a few prompts (same prompt ids, same stop set).
    eog = set(ref["eog_ids"])
    greedy = []
    for name in HF_GREEDY:
        p = next(q for q in ref["prompts"] if q["name"] == name)
        ids = list(p["prompt_ids"])
        generated, gaps, stopped = [], [], False
        past = None
        step_input = torch.tensor([ids])
        with torch.no_grad():
            for _ in range(GEN_TOKENS):
                out = model(step_input, past_key_values=past, use_cache=True)
                past = out.past_key_values
                row = out.logits[0, -1].float().numpy()
                a, la, _, lb = top2(row)
                generated.append(a)
                gaps.append(la - lb)
                if a in eog:
                    stopped = True
                    break
                step_input = torch.tensor([[a]])
        same = generated == p["generated_ids"]
        greedy.append(
            {
                "name": name,
                "prompt_ids": p["prompt_ids"],
                "generated_ids": generated,
                "top2_gap": f32_list(gaps),
                "generated_text": tok.decode(generated, skip_special_tokens=False),
                "stopped_at_eog": stopped,
                "equal_to_llamacpp": same,
            }
        )
        first_diff = next(
            (i for i, (x, y) in enumerate(zip(generated, p["generated_ids"])) if x != y), None
        )
        print(
            f"  greedy {name:8s} equal to llama.cpp: {same} (first diff at {first_diff}): "
            f"{greedy[-1]['generated_text'][:60]!r}",
            flush=True,
        )

    out = {
        "model": model_file,
        "engine": "transformers 5.24.0 + torch 2.15.0, GGUF dequantized to f32, CPU",
        "vocab_size": vocab,
        "tokenization_vs_llamacpp": token_checks,
        "chat_template_text_equal": chat_equal,
        "chat_template_text_hf": hf_chat,
        "teacher_forced": {
            "ids": tf["ids"],
            "probe_ids": tf["probe_ids"],
            "top_k": TOP_K,
            "positions": positions,
            "top1_agree_with_llamacpp": top1_agree,
            "max_abs_probe_diff_vs_llamacpp": float(str(np.float32(probe_diff))),
        },
        "greedy": greedy,
    }
    write_gz(OUT / f"{stem(model_file)}.transformers.json.gz", out)

    # Full last-position logits of the shortest prompt, rounded to f16.
    shortest = min(ref["prompts"], key=lambda q: len(q["prompt_ids"]))
    with torch.no_grad():
        last = model(torch.tensor([shortest["prompt_ids"]])).logits[0, -1].float().numpy()
    path = OUT / f"{stem(model_file)}.last_logits.json.gz"
    size = write_gz(
        path,
        {
            "model": model_file,
            "engine": out["engine"],
            "prompt_name": shortest["name"],
            "prompt_ids": shortest["prompt_ids"],
            "dtype": "f16-rounded f32 logits",
            "logits": f16_list(last),
        },
    )
    if size >= 1024 * 1024:
        path.unlink()
        print(f"  {path.name} is {size} bytes (>= 1 MiB): removed", flush=True)
    print(f"  transformers done in {time.time() - t0:.1f}s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("engine", choices=["llamacpp", "transformers"])
    ap.add_argument("--model", action="append", help="GGUF file name in .cache/models (repeatable)")
    args = ap.parse_args()
    for model_file in args.model or MODEL_FILES:
        print(f"{args.engine}: {model_file}", flush=True)
        if args.engine == "llamacpp":
            run_llamacpp(model_file)
        else:
            run_transformers(model_file)


if __name__ == "__main__":
    main()
