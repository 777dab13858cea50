#!/usr/bin/env bash
# Prepares the default job's data (configs/examples/*_cpu.yaml) in OUTDIR, default output/default_data:
#   tokenizers/gpt2/      GPT-2's vocab.json + merges.txt (and the other vocabularies of tools/tokenizers/fetch.sh),
#                         exported from the pinned npm package js-tiktoken
#   fortunes.jsonl        one fortune a line, from Debian's fortunes package
#   fortunes_gpt2_text_document.{bin,idx}
#                         a Megatron indexed dataset of it (primus-cli data preprocess, GPT-2 BPE, EOD appended)
#   fortunes_llama3_text_document.{bin,idx}
#                         the same in Llama 3's tokens (for configs/H200 and configs/H100's Llama 3.2 configs)
# A second run reuses what is there. Needs the built primus-cli (PRIMUS_CLI, default build/primus-cli).
#   scripts/prepare_default_data.sh [OUTDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-output/default_data}"
cli="${PRIMUS_CLI:-build/primus-cli}"
fortunes=/usr/share/games/fortunes
files=(cookie definitions fortunes humorists kids law literature love men-women miscellaneous people wisdom)
[[ -x "$cli" ]] || { echo "prepare_default_data.sh: $cli not found: build first (scripts/build.sh) or set PRIMUS_CLI" >&2; exit 3; }
[[ -d "$fortunes" ]] || { echo "prepare_default_data.sh: $fortunes not found (scripts/setup.sh installs fortunes)" >&2; exit 3; }

mkdir -p "$out"
exec 9>"$out/.lock"  # concurrent callers (tests under ctest -j) wait for the first
flock 9
tools/tokenizers/fetch.sh "$out/tokenizers"
[[ -f "$out/fortunes.jsonl" ]] || node tools/fortunes_jsonl.mjs "$out/fortunes.jsonl" "${files[@]/#/$fortunes/}"
preprocess() {  # NAME TOKENIZER_TYPE TOKENIZER_MODEL
  [[ -f "$out/fortunes_$1_text_document.idx" ]] && return
  "$cli" data preprocess --input "$out/fortunes.jsonl" --json-key text --tokenizer-type "$2" \
    --tokenizer-model "$out/tokenizers/$3" --output-prefix "$out/fortunes_$1" --workers "$(nproc)" --append-eod
}
preprocess gpt2 GPT2BPETokenizer gpt2
preprocess llama3 Llama3Tokenizer llama3/tokenizer.model
