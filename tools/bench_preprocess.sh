#!/usr/bin/env bash
# `data preprocess` throughput against --workers: TEXT cut into 4 KB documents, repeated 40 times, as JSONL,
# encoded with GPT-2's BPE (a folder with vocab.json + merges.txt, e.g. output/default_data/tokenizers/gpt2
# from scripts/prepare_default_data.sh) by 1, 2, 4, 8 and 16 workers. Prints the line each run reports.
#   tools/bench_preprocess.sh PRIMUS_CLI GPT2_DIR TEXT [WORKDIR]
set -euo pipefail
if [[ $# -lt 3 ]]; then
  echo "usage: $0 PRIMUS_CLI GPT2_DIR TEXT [WORKDIR]" >&2
  exit 2
fi
cli=$1 gpt2=$2 text=$3 work=${4:-$(mktemp -d)}
python3 - "$text" "$work/corpus.jsonl" <<'PY'
import json, sys
text = open(sys.argv[1], encoding="utf-8").read()
docs = [text[i:i + 4096] for i in range(0, len(text), 4096)]
with open(sys.argv[2], "w") as out:
    for _ in range(40):
        for d in docs:
            out.write(json.dumps({"text": d}) + "\n")
PY
echo "input: $(du -h "$work/corpus.jsonl" | cut -f1), $(nproc) cores"
for w in 1 2 4 8 16; do
  "$cli" data preprocess --input "$work/corpus.jsonl" --json-key text --tokenizer-type GPT2BPETokenizer \
    --tokenizer-model "$gpt2" --output-prefix "$work/out_$w" --workers "$w" 2>&1 | grep wrote | sed "s/^/workers $w: /"
done
