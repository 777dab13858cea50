#!/usr/bin/env bash
# tools/pipeline_bubble.py on hand-made traces of a 1F1B step, 2 stages, 2 micro-batches: forwards 10 µs, backwards
# 20 µs, each transfer 5 µs. Worked out by hand: rank 0 runs F0 [0,10] F1 [10,20] B0 [50,70] B1 [80,100], rank 1
# F0 [15,25] B0 [25,45] F1 [45,55] B1 [55,75]; the flush is 100 µs against 60 of compute a rank (bubble 0.667), and the
# replay with free transfers takes 90 (bubble 0.5, the formula's (p-1)/m). A trace missing a computation fails the
# replay, naming why.
set -euo pipefail
tool="$1/tools/pipeline_bubble.py"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 - "$dir" <<'PY'
import json, sys
d = sys.argv[1]
spans = {0: [("forward", 0, 0, 10), ("forward", 1, 10, 10), ("backward", 0, 50, 20), ("backward", 1, 80, 20)],
         1: [("forward", 0, 15, 10), ("backward", 0, 25, 20), ("forward", 1, 45, 10), ("backward", 1, 55, 20)]}
ends = {0: 100, 1: 75}
for rank, mine in spans.items():
    events = [{"ph": "X", "pid": 1, "tid": 1, "name": "pipeline", "ts": 0, "dur": ends[rank]}]
    events += [{"ph": "X", "pid": 1, "tid": 1, "name": f"stage {rank} {kind} micro-batch {mb} chunk 0", "ts": ts,
                "dur": dur} for kind, mb, ts, dur in mine]
    doc = {"traceEvents": events, "otherData": {"host_monotonic_origin_us": "1000"}}
    json.dump(doc, open(f"{d}/trace_rank{rank}.json", "w"))
PY
out=$(python3 "$tool" "$dir" --stages 2 --micro-batches 2)
echo "$out"
grep -q '^bubble of the heaviest stage (rank 0): 0.667$' <<<"$out" || { echo "FAIL: measured bubble"; exit 1; }
grep -q 'replayed with the measured compute and free transfers: bubble of the heaviest stage 0.500; the run.s flush / the replay.s = 1.111' <<<"$out" ||
  { echo "FAIL: replay"; exit 1; }
grep -q '(p-1)/(v m) = (2-1)/(1\*2) = 0.500' <<<"$out" || { echo "FAIL: formula"; exit 1; }
# Rank 1 without its backward of micro-batch 1: rank 0's last backward never gets its input.
python3 - "$dir" <<'PY'
import json, sys
path = f"{sys.argv[1]}/trace_rank1.json"
doc = json.load(open(path))
doc["traceEvents"] = [e for e in doc["traceEvents"] if e["name"] != "stage 1 backward micro-batch 1 chunk 0"]
json.dump(doc, open(path, "w"))
PY
set +e
python3 "$tool" "$dir" --stages 2 --micro-batches 2 >/dev/null 2>"$dir/err"; rc=$?
[[ $rc != 0 ]] && grep -q "replay: a computation's input never ran" "$dir/err" ||
  { echo "FAIL: a cut trace gave rc $rc: $(cat "$dir/err")"; exit 1; }
echo PASS
