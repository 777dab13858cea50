#!/usr/bin/env python3
"""The pipeline bubble of a profiled run, read off its Perfetto traces (docs/parallel.md, pipeline parallelism).

Usage: tools/pipeline_bubble.py RUN_DIR/profile [--stages P --micro-batches M [--virtual V]]

For every rank's trace (trace_rank<R>.json, written with profile: true and profile_ranks naming the ranks) and every
profiled step, the host track's "pipeline" span is the schedule's wall time and the spans "stage S forward|backward
micro-batch M chunk C" inside it are the stage's compute; the bubble is the rest, as a fraction of the compute:
(wall - compute) / compute, which Megatron's formula puts at (p - 1) / m for 1F1B and (p - 1) / (v m) interleaved.
Prints each rank's per-step fractions and the mean, and the formula's value when the layout is given.
"""
import argparse
import glob
import json
import os
import re
import statistics
import sys

STAGE_SPAN = re.compile(r"^stage \d+ (forward|backward) micro-batch \d+ chunk \d+$")


def bubbles(path):
    events = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X" and e.get("pid") == 1]
    steps = sorted((e for e in events if e["name"] == "pipeline"), key=lambda e: e["ts"])
    out = []
    for step in steps:
        begin, end = step["ts"], step["ts"] + step["dur"]
        compute = sum(e["dur"] for e in events
                      if STAGE_SPAN.match(e["name"]) and begin <= e["ts"] and e["ts"] + e["dur"] <= end)
        if compute > 0:
            out.append((step["dur"] - compute) / compute)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("profile_dir")
    parser.add_argument("--stages", type=int)
    parser.add_argument("--micro-batches", type=int)
    parser.add_argument("--virtual", type=int, default=1)
    args = parser.parse_args()
    paths = sorted(glob.glob(os.path.join(args.profile_dir, "trace_rank*.json")),
                   key=lambda p: int(re.search(r"(\d+)\.json$", p).group(1)))
    if not paths:
        sys.exit(f"{args.profile_dir}: no trace_rank*.json (profile: true, profile_ranks naming every rank)")
    means = []
    for path in paths:
        fractions = bubbles(path)
        if not fractions:
            sys.exit(f"{path}: no 'pipeline' span with stage spans inside (pipeline_model_parallel_size > 1?)")
        means.append(statistics.mean(fractions))
        print(f"{os.path.basename(path)}: bubble {means[-1]:.3f} of compute "
              f"(steps: {', '.join(f'{f:.3f}' for f in fractions)})")
    print(f"mean over ranks: {statistics.mean(means):.3f}")
    if args.stages and args.micro_batches:
        expected = (args.stages - 1) / (args.virtual * args.micro_batches)
        mean = statistics.mean(means)
        print(f"formula (p-1)/(v m) = ({args.stages}-1)/({args.virtual}*{args.micro_batches}) = {expected:.3f}; "
              f"measured/formula = {mean / expected:.2f}")


if __name__ == "__main__":
    main()
