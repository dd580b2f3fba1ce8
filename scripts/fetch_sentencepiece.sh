#!/usr/bin/env bash
# Fetches the SentencePiece test models (test/*.model from the PyPI sentencepiece==0.2.3 sdist) into
# the git-ignored cache, and builds the small venv (.cache/venv-sp) holding the real `sentencepiece`
# wheel (plus the protobuf runtime its model_pb2 needs) that scripts/gen_sentencepiece_reference.py
# uses (only with --with-venv). Nothing is committed. Safe to re-run.
#
#   .cache/sentencepiece/botchan_en_unigram_1000.model, kyoto_ja_unigram_8000.model, ... (test/*.model)
#   .cache/venv-sp/                                       venv: sentencepiece==0.2.3, protobuf
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache="$root/.cache"
dl="$cache/pypi"
out="$cache/sentencepiece"
mkdir -p "$dl" "$out"
sdist="$dl/sentencepiece-0.2.3.tar.gz"

if [ ! -f "$out/botchan_en_unigram_1000.model" ]; then
  echo "fetch: sentencepiece==0.2.3 sdist (PyPI)" >&2
  if [ ! -f "$sdist" ]; then
    python3 -m pip download -q --no-deps --no-binary :all: --no-build-isolation \
      --disable-pip-version-check sentencepiece==0.2.3 -d "$dl" 2>/dev/null || true
  fi
  if [ ! -f "$sdist" ]; then
    # pip could not prepare the sdist's metadata; fetch the archive through the simple index.
    python3 - "$dl" <<'PY'
import os, re, sys, urllib.request
page = urllib.request.urlopen("https://pypi.org/simple/sentencepiece/").read().decode()
url = re.search(r'href="([^"]*/sentencepiece-0\.2\.3\.tar\.gz)[^"]*"', page).group(1)
dest = os.path.join(sys.argv[1], "sentencepiece-0.2.3.tar.gz")
if not os.path.exists(dest):
    urllib.request.urlretrieve(url, dest + ".part")
    os.replace(dest + ".part", dest)
PY
  fi
  tmp=$(mktemp -d)
  tar -xzf "$sdist" -C "$tmp" --wildcards '*/test/*.model'
  find "$tmp" -path '*/test/*.model' -exec cp {} "$out/" \;
  rm -rf "$tmp"
fi

# The reference venv is only for regenerating fixtures: `scripts/fetch_sentencepiece.sh --with-venv`.
venv="$cache/venv-sp"
if [ "${1:-}" = "--with-venv" ] && { [ ! -x "$venv/bin/python" ] ||
  ! "$venv/bin/python" -c 'from sentencepiece import sentencepiece_model_pb2' 2>/dev/null; }; then
  echo "fetch: venv with sentencepiece==0.2.3 (wheel)" >&2
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --only-binary :all: \
    sentencepiece==0.2.3 protobuf==7.36.1
fi

# ---------------------------------------------------------------------------------------------------
# Mistral's SentencePiece-BPE model (32,000 pieces, byte fallback): data/tokenizer.model.v1 from the
# PyPI mistral-common==1.13.1 wheel (a zip; only that member is extracted), for
# crates/inference/tests/sentencepiece_bpe.rs and scripts/gen_sentencepiece_bpe_reference.py.
#
#   .cache/sentencepiece/mistral_tokenizer.model.v1
mistral="$out/mistral_tokenizer.model.v1"
if [ ! -f "$mistral" ]; then
  echo "fetch: mistral-common==1.13.1 wheel (PyPI)" >&2
  python3 -m pip download -q --no-deps --only-binary :all: --disable-pip-version-check \
    -d "$dl" mistral-common==1.13.1
  python3 - "$dl" "$mistral" <<'PY'
import glob, os, sys, zipfile
wheels = glob.glob(os.path.join(sys.argv[1], "mistral_common-1.13.1-*.whl"))
if not wheels:
    sys.exit("mistral-common 1.13.1 wheel not found in " + sys.argv[1])
with zipfile.ZipFile(wheels[0]) as z:
    member = [n for n in z.namelist() if n.endswith("/data/tokenizer.model.v1")]
    if len(member) != 1:
        sys.exit("data/tokenizer.model.v1 not found in " + wheels[0])
    data = z.read(member[0])
tmp = sys.argv[2] + ".part"
with open(tmp, "wb") as f:
    f.write(data)
os.replace(tmp, sys.argv[2])
PY
fi
echo "fetch: sentencepiece test models ready in $out" >&2
