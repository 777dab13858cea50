#!/usr/bin/env python3
"""The real-text corpus of the fp8 convergence runs (tools/fp8_convergence.sh) as JSON lines {"text": ...}.

Usage: tools/realtext_jsonl.py SHAKESPEARE.txt FORTUNES.jsonl OUT.jsonl [DIR ...]

Documents: Shakespeare (../shared/data/tinyshakespeare.txt) in stretches of 40 lines, every line of the fortunes
corpus scripts/prepare_default_data.sh writes (output/default_data/fortunes.jsonl), then every *.txt file under each
DIR, one document a file (/usr/share/doc/python3.11/html/_sources from Debian's python3.11-doc: the Python
documentation's reStructuredText, 11 MB of English prose). Then `primus-cli data preprocess --input OUT.jsonl
--json-key text --tokenizer-type Llama3Tokenizer --tokenizer-model output/default_data/tokenizers/llama3/tokenizer.model
--output-prefix PREFIX --append-eod` makes the dataset (with the Python documentation: 8,138 documents, 3,200,839
Llama 3 tokens on 2026-12-05).
"""
import json
import pathlib
import sys

if len(sys.argv) < 4:
    sys.exit(__doc__)
shakespeare, fortunes, out = sys.argv[1:4]
dirs = [pathlib.Path(d) for d in sys.argv[4:]]
try:
    lines = open(shakespeare, encoding="utf-8").read().splitlines()
    fortune_lines = open(fortunes, encoding="utf-8").read().splitlines()
    for d in dirs:
        if not d.is_dir():
            raise OSError(f"{d}: not a folder")
    texts = [p.read_text(encoding="utf-8", errors="replace") for d in dirs for p in sorted(d.rglob("*.txt"))]
except OSError as error:
    print(f"realtext_jsonl.py: {error}", file=sys.stderr)
    sys.exit(2)
with open(out, "w", encoding="utf-8") as f:
    for start in range(0, len(lines), 40):
        f.write(json.dumps({"text": "\n".join(lines[start : start + 40])}) + "\n")
    for line in fortune_lines:
        if line.strip():
            f.write(line + "\n")
    for text in texts:
        if text.strip():
            f.write(json.dumps({"text": text}) + "\n")
