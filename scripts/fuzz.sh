#!/usr/bin/env bash
# Runs the fuzz targets (fuzz/fuzz_targets, libFuzzer through cargo fuzz on the nightly
# toolchain) on their committed corpora, each for SECONDS (default 20), and prints one line per
# target with its executions and whether it found anything. New inputs go to .cache/fuzz/<target>
# (not committed; `cargo fuzz cmin` folds the useful ones into fuzz/corpus). A crash, timeout
# or out-of-memory stops with the reproducer in fuzz/artifacts/<target>/: turn it into a test by
# copying it to fuzz/regressions/<target>/ and fixing the parser.
#
# usage: scripts/fuzz.sh [SECONDS] [TARGET ...]
#   FUZZ_SANITIZER=none|address (default: address), FUZZ_JOBS=N parallel workers per target
set -euo pipefail
shopt -s nullglob
cd "$(dirname "$0")/.."
seconds=${1:-20}
shift || true
if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "installing the nightly toolchain (rustup)" >&2
  rustup toolchain install nightly --profile minimal >&2 || {
    echo "scripts/fuzz.sh: cargo fuzz needs the nightly toolchain: rustup toolchain install nightly" >&2
    exit 1
  }
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  echo "installing cargo-fuzz (crates.io)" >&2
  cargo install cargo-fuzz --locked --quiet
fi
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cd fuzz && cargo +nightly fuzz list)
fi
sanitizer=${FUZZ_SANITIZER:-address}
(cd fuzz && cargo +nightly fuzz build -s "$sanitizer") >&2
jobs=()
if [ "${FUZZ_JOBS:-1}" -gt 1 ]; then
  jobs=(-jobs="$FUZZ_JOBS" -workers="$FUZZ_JOBS")
fi
status=0
export LATTICE_FIXTURES="$PWD/crates/inference/tests/fixtures"
for t in "${targets[@]}"; do
  scratch=.cache/fuzz/$t
  mkdir -p "$scratch" "fuzz/artifacts/$t"
  log=$(mktemp)
  if (cd fuzz && cargo +nightly fuzz run -s "$sanitizer" "$t" "../$scratch" "corpus/$t" -- \
      -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -max_len=262144 \
      -print_final_stats=1 "${jobs[@]}") >"$log" 2>&1; then
    result=ok
  else
    result="FOUND (see $log and fuzz/artifacts/$t)"
    status=1
  fi
  execs=$(awk '/stat::number_of_executed_units/ {s += $2} END {print s + 0}' "$log" fuzz/fuzz-*.log)
  echo "fuzz $t: ${seconds}s, $execs executions, $result"
  [ "$result" = ok ] && rm -f "$log"
done
rm -f fuzz/fuzz-*.log
exit "$status"
