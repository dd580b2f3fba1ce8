#!/usr/bin/env bash
# Creates the git-ignored Python environment that crates/cli/tests/serve.rs uses to drive
# `lattice serve` with the official OpenAI client (scripts/openai_client_check.py):
#   .cache/venv-openai   openai (pinned below) from PyPI
# Idempotent: an environment that already holds the pinned version is left as it is.
# Prints the environment's python path on stdout; everything else is quiet.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv="$root/.cache/venv-openai"
pin="2.54.0"
py="$venv/bin/python"
installed() {
  "$py" -c "import importlib.metadata as m, sys; sys.exit(m.version('openai') != '$pin')" 2>/dev/null
}
if [ ! -x "$py" ]; then
  mkdir -p "$root/.cache"
  python3 -m venv "$venv"
fi
if ! installed; then
  "$py" -m pip install -q --disable-pip-version-check "openai==$pin" >&2
  installed || { echo "setup_openai_client: openai==$pin did not install in $venv" >&2; exit 1; }
fi
echo "$py"
