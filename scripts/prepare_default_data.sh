#!/usr/bin/env bash
# Prepares the default job's data (configs/examples/*_cpu.yaml) in OUTDIR, default output/default_data:
#   tokenizers/gpt2/      GPT-2's vocab.json + merges.txt (and the other vocabularies of tools/tokenizers/fetch.sh),
#                         exported from the pinned npm package js-tiktoken
#   fortunes.jsonl        one fortune a line, from Debian's fortunes package
#   fortunes_gpt2_text_document.{bin,idx}
#                         a Megatron indexed dataset of it (primus-cli data preprocess, GPT-2 BPE, EOD appended)
# A second run reuses what is there. Needs the built primus-cli (PRIMUS_CLI, default build/primus-cli).
#   scripts/prepare_default_data.sh [OUTDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-output/default_data}"
cli="${PRIMUS_CLI:-build/primus-cli}"
fortunes=/usr/share/games/fortunes
files=(cookie definitions fortunes humorists kids law literature love men-women miscellaneous people wisdom)

mkdir -p "$out"
exec 9>"$out/.lock"  # concurrent callers (tests under ctest -j) wait for the first
flock 9
tools/tokenizers/fetch.sh "$out/tokenizers"
prefix="$out/fortunes_gpt2"
if [[ ! -f "${prefix}_text_document.idx" ]]; then
  node tools/fortunes_jsonl.mjs "$out/fortunes.jsonl" "${files[@]/#/$fortunes/}"
  "$cli" data preprocess --input "$out/fortunes.jsonl" --json-key text \
    --tokenizer-type GPT2BPETokenizer --tokenizer-model "$out/tokenizers/gpt2" \
    --output-prefix "$prefix" --workers "$(nproc)" --append-eod
fi
