#!/usr/bin/env python3
"""Converts a Qwen3.5 transformers checkpoint to GGUF (arch `qwen35`) with llama.cpp's own
converter (.cache/llama.cpp/src/convert_hf_to_gguf.py), so Lattice reads files exactly as
llama.cpp writes them.

Default: the committed tiny fixture crates/inference/tests/fixtures/tiny-qwen35 -> its
tiny-qwen35.bf16.gguf (committed, ~400 KB; tests/qwen35_gguf.rs compares it with the
safetensors model and transformers' references). bf16 holds the fixture's bf16 weights exactly;
the converter keeps norms, ssm_a, dt bias and the conv kernel f32.

  .cache/venv-ref/bin/python scripts/gen_qwen35_gguf.py
  .cache/venv-ref/bin/python scripts/gen_qwen35_gguf.py --model .cache/models/qwen35-0.8b-random \
      --outtype q8_0 --outfile .cache/models/qwen35-0.8b-random.q8_0.gguf

The converter is run with --no-mtp (the checkpoints carry no multi-token-prediction head) and,
for tokenizers whose pre-tokenizer hash llama.cpp does not list (the tiny fixture's byte-level
BPE), with pre-tokenizer "qwen35" instead of failing. The weights are what matter here.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LLAMA = ROOT / ".cache" / "llama.cpp" / "src"
FIXTURE = ROOT / "crates" / "inference" / "tests" / "fixtures" / "tiny-qwen35"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=FIXTURE, help="transformers checkpoint folder")
    ap.add_argument("--outtype", default="bf16", help="f32, f16, bf16, q8_0 (converter's --outtype)")
    ap.add_argument("--outfile", type=Path, default=None, help="default: <model>/tiny-qwen35.<outtype>.gguf")
    args = ap.parse_args()
    outfile = args.outfile or args.model / f"tiny-qwen35.{args.outtype}.gguf"

    sys.path.insert(0, str(LLAMA / "gguf-py"))
    sys.path.insert(0, str(LLAMA))
    from conversion.base import TextModel  # noqa: E402  (llama.cpp's converter package)

    original = TextModel.get_vocab_base_pre

    def vocab_base_pre(self, tokenizer) -> str:
        try:
            return original(self, tokenizer)
        except NotImplementedError:
            return "qwen35"

    TextModel.get_vocab_base_pre = vocab_base_pre

    import convert_hf_to_gguf  # noqa: E402

    sys.argv = [
        "convert_hf_to_gguf.py", str(args.model), "--outtype", args.outtype, "--no-mtp",
        "--outfile", str(outfile),
    ]
    convert_hf_to_gguf.main()
    print(f"wrote {outfile} ({outfile.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
