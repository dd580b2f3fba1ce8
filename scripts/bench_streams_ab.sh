#!/usr/bin/env bash
# Continuous-batching throughput of two `lattice` binaries side by side (e.g. before and after
# an engine change): for each model, each binary serves it in turn (A, B, A, B: ROUNDS rounds,
# interleaved so a change in machine load hits both) and `lattice bench serve --streams S
# --gen-tokens 128 --runs 3` measures aggregate tokens/s at each stream count. Prints one line
# per (model, binary, round, streams).
#
#   A=old/lattice B=target/release/lattice scripts/bench_streams_ab.sh MODEL[::FLAGS] ...
#   (env: STREAMS=1,8,16 ROUNDS=2)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
a=${A:?set A to the first lattice binary}
b=${B:-$root/target/release/lattice}
streams=${STREAMS:-1,8,16}
rounds=${ROUNDS:-2}
log=$(mktemp)
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -f "$log"; }
trap cleanup EXIT
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
for spec in "$@"; do
  model=${spec%%::*}
  flags=""
  [ "$spec" != "$model" ] && flags=${spec#*::}
  for round in $(seq "$rounds"); do
    for which in A B; do
      bin=$a
      [ $which = B ] && bin=$b
      # shellcheck disable=SC2086
      "$bin" serve --model "$model" $flags --port 0 2>"$log" &
      pid=$!
      url=""
      for _ in $(seq 1 1200); do
        port=$(sed -n 's|^lattice serve: listening on http://127.0.0.1:\([0-9]*\)$|\1|p' "$log")
        [ -n "$port" ] && { url="http://127.0.0.1:$port"; break; }
        kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; exit 1; }
        sleep 0.1
      done
      [ -n "$url" ] || { echo "server did not start" >&2; exit 1; }
      echo "== $(basename "$model") $flags binary $which round $round, load $(cut -d' ' -f1 /proc/loadavg)"
      "$b" bench serve --url "$url" --streams "$streams" --gen-tokens 128 --runs 3
      kill -TERM "$pid"; wait "$pid" || true; pid=""
    done
  done
done
