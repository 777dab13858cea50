#!/usr/bin/env bash
# Installs the pinned npm tokenizer packages (package-lock.json; --prefer-offline uses the npm cache when it has
# them) into OUTDIR and writes the vocabularies they ship as the files users have: GPT-2 vocab.json + merges.txt
# and tokenizer.json, Llama 3's tiktoken rank file and tokenizer.json, Llama 2's SentencePiece tokenizer.model,
# cl100k/o200k/r50k rank files (see vocab_files.mjs). A stamp of the inputs makes a second call with unchanged
# inputs return at once; a lock file serializes callers.
#   tools/tokenizers/fetch.sh OUTDIR
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 OUTDIR" >&2
  exit 2
fi
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="$1"
for tool in node npm sha256sum flock; do
  command -v "$tool" >/dev/null || { echo "fetch.sh: '$tool' not found (scripts/setup.sh installs it)" >&2; exit 3; }
done

mkdir -p "$out"
exec 9>"$out/.vocab.lock"
flock 9
stamp="$(cat "$here/package.json" "$here/package-lock.json" "$here/vocab_files.mjs" | sha256sum | cut -d' ' -f1) \
$(node --version)"
if [[ -f "$out/vocab.stamp" && "$(cat "$out/vocab.stamp")" == "$stamp" ]]; then
  exit 0
fi
rm -f "$out/vocab.stamp"
cp "$here/package.json" "$here/package-lock.json" "$here/vocab_files.mjs" "$out/"
(cd "$out" && npm ci --prefer-offline --no-audit --no-fund --loglevel=error)
node "$out/vocab_files.mjs" "$out"
echo "$stamp" > "$out/vocab.stamp"
