#!/usr/bin/env bash
# Long fuzz runs on a machine with many cores and no Rust toolchain (the lent device machine's
# CPUs): runs the prebuilt, stripped AddressSanitizer fuzz binaries carried in .device/fz.tar.xz
# (built here by `cd fuzz && cargo +nightly fuzz build`, then `strip`, then
# `tar cf - -C .device fuzz | xz -9 > .device/fz.tar.xz`) all at once, each in libFuzzer's fork
# mode over JOBS processes, for SECONDS, from the committed corpora; crashes, timeouts and
# out-of-memory inputs are kept and fuzzing goes on. Writes to $OUT: summary.txt (executions,
# coverage and findings per target), findings.tar.xz (artifacts), logs.txt (each log's end) and corpus.tar.xz (the grown
# corpora, to fold back with `cargo fuzz cmin`).
#
# A corpus.tar.xz of an earlier campaign, carried as .device/corpus.tar.xz, is where this one
# starts. JOBS is one number for every target, or TARGET=N,... for some (the rest: 2).
#
# usage: scripts/device/fuzz_campaign.sh SECONDS JOBS
set -uo pipefail
seconds=${1:-520}
jobs=${2:-2}
jobs_of() {
  case "$jobs" in
    *=*) echo "$jobs" | tr ',' '\n' | awk -F= -v t="$1" '$1 == t {n = $2} END {print n ? n : 2}' ;;
    *) echo "$jobs" ;;
  esac
}
out=${OUT:-/tmp/fuzz-out}
mkdir -p "$out" /tmp/fz
tar xJf .device/fz.tar.xz -C /tmp/fz
export LATTICE_FIXTURES="$PWD/crates/inference/tests/fixtures"
export ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1
work=/tmp/fz/work
mkdir -p "$work"
[ -f .device/corpus.tar.xz ] && tar xJf .device/corpus.tar.xz -C "$work"
nproc
grep -m1 "model name" /proc/cpuinfo
for bin in /tmp/fz/fuzz/*; do
  t=$(basename "$bin")
  mkdir -p "$work/$t/corpus" "$work/$t/artifacts"
  cp fuzz/corpus/"$t"/* "$work/$t/corpus/" 2>/dev/null
  (cd "$work/$t" && "$bin" corpus -fork="$(jobs_of "$t")" -ignore_crashes=1 -ignore_timeouts=1 \
      -ignore_ooms=1 -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 \
      -max_len=262144 -artifact_prefix="$work/$t/artifacts/" >"$work/$t/log.txt" 2>&1) &
done
wait
{
  echo "fuzz campaign: ${seconds}s per target, fork $jobs, $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
  for d in "$work"/*/; do
    t=$(basename "$d")
    # Fork mode's status lines: "#EXECS: cov: C ft: F corp: N exec/s E oom/timeout/crash: a/b/c time: Ts ..."
    last=$(grep -E '^#[0-9]+: cov:' "$d/log.txt" | tail -n 1)
    found=$(ls "$d/artifacts" | wc -l)
    echo "$t | $last | artifacts: $found $(ls "$d/artifacts" | head -n 5 | tr '\n' ' ')"
  done
} | tee "$out/summary.txt"
tar cJf "$out/findings.tar.xz" -C "$work" $(cd "$work" && ls -d */artifacts) 2>/dev/null
tar cJf "$out/corpus.tar.xz" -C "$work" $(cd "$work" && ls -d */corpus)
for d in "$work"/*/; do echo "== $(basename "$d")"; tail -n 40 "$d/log.txt"; done > "$out/logs.txt" 2>&1
ls -la "$out"
