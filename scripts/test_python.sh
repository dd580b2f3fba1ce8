#!/usr/bin/env bash
# The Python package's tests: builds `import lattice` into a git-ignored venv
# (.cache/venv-python: numpy, pytest, maturin, Ray Data and kubernetes-validate from PyPI, pinned
# below), then runs crates/python/tests with pytest against the release `lattice` binary.
# Ends with a "test result: ... N passed; N failed" line that scripts/test.sh adds up.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv="$root/.cache/venv-python"
py="$venv/bin/python"
pins=(numpy==2.4.6 pytest==9.2.0 maturin==1.16.0 "ray[data]==2.60.0" kubernetes-validate==1.37.0)
if [ ! -x "$py" ]; then
  mkdir -p "$root/.cache"
  python3 -m venv "$venv"
fi
"$py" -m pip install -q --disable-pip-version-check "${pins[@]}"
# The extension builds in the workspace's target folder (release), sharing what cargo built.
PATH="$venv/bin:$PATH" "$py" -m pip install -q --disable-pip-version-check --no-build-isolation \
  --force-reinstall --no-deps "$root/crates/python"
cargo build --release -q -p lattice-cli
junit=$(mktemp)
trap 'rm -f "$junit"' EXIT
status=0
LATTICE_BIN="$root/target/release/lattice" "$py" -m pytest -q -p no:cacheprovider \
  --junitxml="$junit" "$root/crates/python/tests" || status=$?
"$py" - "$junit" <<'PY'
import sys, xml.etree.ElementTree as ET
s = ET.parse(sys.argv[1]).getroot()
s = s if s.tag == "testsuite" else s.find("testsuite")
total, bad = int(s.get("tests")), int(s.get("failures")) + int(s.get("errors"))
skipped = int(s.get("skipped", 0))
print(f"test result: {'ok' if bad == 0 else 'FAILED'}. {total - bad - skipped} passed; {bad} failed; {skipped} ignored (pytest)")
PY
exit "$status"
