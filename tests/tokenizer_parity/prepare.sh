#!/usr/bin/env bash
# Prepares the tokenizer parity fixtures in OUTDIR: tools/tokenizers/fetch.sh installs the pinned npm reference
# tokenizers there and exports their vocabularies into the file formats Primus loads; export.mjs then writes the
# reference encodings of the corpus.
# A stamp of the inputs makes a second call with unchanged inputs return at once; a lock file serializes callers.
#   tests/tokenizer_parity/prepare.sh OUTDIR SHAKESPEARE_TXT
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 OUTDIR SHAKESPEARE_TXT" >&2
  exit 2
fi
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="$1"
shakespeare="$2"
for tool in node npm sha256sum flock; do
  command -v "$tool" >/dev/null || { echo "prepare.sh: '$tool' not found (scripts/setup.sh --test installs it)" >&2; exit 3; }
done
[[ -r "$shakespeare" ]] || { echo "prepare.sh: cannot read $shakespeare" >&2; exit 3; }

mkdir -p "$out"
# Test processes started in parallel (ctest -j) share OUTDIR: one prepares, the others wait for it.
exec 9>"$out/.lock"
flock 9
"$here/../../tools/tokenizers/fetch.sh" "$out"
stamp="$(cat "$out/vocab.stamp" "$here/export.mjs" "$here/corpus.mjs" "$here/bench.mjs" "$shakespeare" \
  | sha256sum | cut -d' ' -f1)"
if [[ -f "$out/stamp" && "$(cat "$out/stamp")" == "$stamp" ]]; then
  exit 0
fi
rm -f "$out/stamp"
cp "$here/export.mjs" "$here/corpus.mjs" "$here/bench.mjs" "$out/"
node "$out/export.mjs" "$out" "$shakespeare"
echo "$stamp" > "$out/stamp"
