#!/usr/bin/env bash
# Speculative decoding side by side (issue 15): the same workloads with drafts off, by prompt
# lookup (ngram) and by suffix match (suffix), runs alternating, one JSON line per run with
# the decode rate and the drafted / accepted tokens. Workloads (scripts/speculative/):
#   edit  - rename a function in a ~780-token Python file and reply with the whole file
#   qa    - answer a question by quoting a ~570-token passage
#   story - open-ended: a short story
#
#   scripts/bench_speculative.sh MODEL [RUNS] [STREAMS]
#
# One stream: `lattice generate --chat` (greedy, and sampled at temperature 0.7 with a seed).
# STREAMS > 1: `lattice bench generate --streams N` with every stream on the workload's prompt.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
model=${1:?usage: scripts/bench_speculative.sh MODEL [RUNS] [STREAMS]}
runs=${2:-2}
streams=${3:-1}
lattice=${LATTICE:-$root/target/release/lattice}
[ -x "$lattice" ] || (cd "$root" && cargo build --release -p lattice-cli)
work="$root/scripts/speculative"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) threads" >&2
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
declare -A tokens=([edit]=600 [qa]=200 [story]=256)
for w in edit qa story; do
  for r in $(seq "$runs"); do
    for spec in off ngram suffix; do
      if [ "$streams" -le 1 ]; then
        for temp in 0 0.7; do
          out=$("$lattice" generate --model "$model" --chat --prompt "$(cat "$work/$w.txt")" \
            --max-tokens "${tokens[$w]}" --temperature "$temp" --seed 1 --json \
            --speculative "$spec" 2>/dev/null)
          # Greedy runs are checked token for token against the run without drafts.
          [ "$spec" = off ] && [ "$temp" = 0 ] && echo "$out" > "$tmp/$w.off"
          python3 -c 'import json,sys; d=json.loads(sys.argv[1]); off=json.load(open(sys.argv[6])) if sys.argv[5] == "0" else None; print(json.dumps({"workload": sys.argv[2], "run": int(sys.argv[3]), "speculative": sys.argv[4], "temperature": float(sys.argv[5]), "streams": 1, "tokens": d["completion_tokens"], "decode_tokens_per_s": round(d["decode_tokens_per_s"], 2), "drafted": d["drafted_tokens"], "accepted": d["accepted_tokens"], "same_as_off": None if off is None else off["token_ids"] == d["token_ids"]}))' \
            "$out" "$w" "$r" "$spec" "$temp" "$tmp/$w.off"
        done
      else
        out=$("$lattice" bench generate --model "$model" --prompt-tokens 16 \
          --gen-tokens 256 --runs 1 --streams "$streams" --stream-prompt "$work/$w.txt" \
          --speculative "$spec" --json 2>/dev/null)
        python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(json.dumps({"workload": sys.argv[2], "run": int(sys.argv[3]), "speculative": sys.argv[4], "streams": d["streams"], "batched_tokens_per_s": round(d["batched_gen_tokens_per_s"], 2), "drafted": d["drafted_tokens"], "accepted": d["accepted_tokens"]}))' \
          "$out" "$w" "$r" "$spec"
      fi
    done
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
