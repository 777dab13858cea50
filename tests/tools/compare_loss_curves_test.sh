#!/usr/bin/env bash
# tools/compare_loss_curves.py: a run 1% above its baseline at every step reads +1.00% in every column; a missing
# file and a malformed line exit 2 naming them.
set -euo pipefail
tool="$1/tools/compare_loss_curves.py"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 - "$dir" <<'PY'
import json, math, sys
d = sys.argv[1]
with open(f"{d}/base.jsonl", "w") as a, open(f"{d}/high.jsonl", "w") as b:
    for s in range(1, 201):
        loss = 2 + 8 * math.exp(-s / 50) + 0.05 * math.sin(s)
        a.write(json.dumps({"step": s, "loss": loss}) + "\n")
        b.write(json.dumps({"step": s, "loss": loss * 1.01}) + "\n")
PY
out=$(python3 "$tool" base="$dir/base.jsonl" high="$dir/high.jsonl" --window 20 --skip 100 --svg "$dir/c.svg")
echo "$out"
grep -q '^| high | 200 | [0-9.]* | +1.00% | 1.00% | 1.00% |$' <<<"$out" || { echo "FAIL: expected +1.00% everywhere"; exit 1; }
grep -q '<polyline' "$dir/c.svg" || { echo "FAIL: no curve in the SVG"; exit 1; }
set +e
python3 "$tool" base="$dir/base.jsonl" x="$dir/missing.jsonl" 2>"$dir/err"; rc=$?
[[ $rc == 2 ]] && grep -q "missing.jsonl" "$dir/err" || { echo "FAIL: missing file gave rc $rc: $(cat "$dir/err")"; exit 1; }
echo '{"step": 1}' > "$dir/bad.jsonl"
python3 "$tool" base="$dir/base.jsonl" x="$dir/bad.jsonl" 2>"$dir/err"; rc=$?
[[ $rc == 2 ]] && grep -q "bad.jsonl:1" "$dir/err" || { echo "FAIL: malformed line gave rc $rc: $(cat "$dir/err")"; exit 1; }
echo PASS
