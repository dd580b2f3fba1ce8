#!/usr/bin/env bash
# Checks the AMX paths on the lent device machine's CPU with `.device/` carried (stripped
# `lattice`, the unit-test binary as `libtests`, the `bf16_weights` and `encoder_parity` test
# binaries, qwen35-tokenizer.json.gz and llama-src.tar.xz holding the Qwen3.5 chat template):
# the bf16 kernel tests (AMX included), tiny-model bf16/Q8 tests, Qwen3.5-0.8B-shaped `--bf16`
# prefill and decode with and without AMX on cores 0-1, and `lattice bench peaks`.
set -uo pipefail; D=.device; OUT=${OUT:-/tmp}
$D/libtests bf16 --nocapture 2>&1 | grep -E "AMX|test result|FAILED|panicked"
$D/bf16_weights 2>&1 | grep -E "test result|FAILED|panicked|^test "
$D/encoder_parity tiny 2>&1 | grep -E "test result|FAILED|panicked|^test "
mkdir -p .cache/qwen35 .cache/llama.cpp/src; gunzip -c $D/qwen35-tokenizer.json.gz > .cache/qwen35/tokenizer.json; tar -xJf $D/llama-src.tar.xz -C .cache/llama.cpp/src
taskset -c 2-15 python3 scripts/gen_random_qwen35.py
M=.cache/models/qwen35-0.8b-random
for r in 1 2; do
 taskset -c 0,1 $D/lattice bench generate --model $M --bf16 --prompt-tokens 512 --gen-tokens 64 --runs 1 --threads 2 --json 2>/dev/null
 LATTICE_AMX=0 taskset -c 0,1 $D/lattice bench generate --model $M --bf16 --prompt-tokens 512 --gen-tokens 64 --runs 1 --threads 2 --json 2>/dev/null
done | tee $OUT/q35.jsonl | python3 -c "
import json,sys
for l in sys.stdin:
    r=json.loads(l); print(r['weights'], r['bf16_isa'], 'pp512', round(r['prompt_tokens_per_s'],1), 'tg64', round(r['gen_tokens_per_s'],2))"
taskset -c 0,1 $D/lattice bench peaks --runs 3 --megabytes 256
