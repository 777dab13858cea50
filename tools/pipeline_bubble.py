#!/usr/bin/env python3
"""The pipeline bubble of a profiled run, read off its Perfetto traces (docs/perf/pipeline-bubble.md).

Usage: tools/pipeline_bubble.py RUN_DIR/profile [--stages P --micro-batches M [--virtual V]]

Every rank's trace (trace_rank<R>.json, written with profile: true and profile_ranks naming every rank) holds, per
profiled step, a host-track "pipeline" span (the schedule of one global batch on that rank) and the spans
"stage S forward|backward micro-batch M chunk C" (that rank's compute; waits for inputs lie outside them). The ranks
of one host share its monotonic clock (otherData.host_monotonic_origin_us), so a step's flush is laid out across
them: from the earliest rank's start of the step to the latest rank's end, the time every stage is held for, as in
Megatron's formula. A rank's bubble is the rest of the flush beyond its compute, as a fraction of the compute:
(flush - compute) / compute, which the formula puts at (p - 1) / m for 1F1B and (p - 1) / (v m) interleaved.
Also printed: the bubble inside the rank's own span (which leaves out waiting for the other stages to start or end).

The formula assumes stages of equal compute. When they differ (the first stage holds the embedding, the last the
output layer and loss), the pipeline runs at the pace of the heaviest stage and the lighter ones idle for the
difference as well: that is imbalance, not the schedule's bubble. So the schedule is judged on the stage with the
most compute, and the other stages' compute is printed relative to it.

With --stages, the step is also replayed: each rank's computations in the order they ran, with their measured
durations, each started as soon as its rank is free and its input computed, transfers taking no time. The replay's
bubble is what the measured compute explains (unequal stages, a slow micro-batch); the run's flush over the replay's
is what the transfers and the host's gaps between computations add. (The schedules' compute orders themselves have
exactly the formulas' bubble when replayed with equal stages: tests/parallel/pipeline_schedule_test.cpp.)
"""
import argparse
import glob
import json
import os
import re
import statistics
import sys

STAGE_SPAN = re.compile(r"^stage (\d+) (forward|backward) micro-batch (\d+) chunk (\d+)$")


def steps_of(path):
    """[(begin, end, compute, spans)] per profiled step, in µs on the host's monotonic clock; spans are the step's
    computations in the order they ran: (duration, backward, stage, micro-batch, chunk)."""
    doc = json.load(open(path))
    origin = float(doc.get("otherData", {}).get("host_monotonic_origin_us", "nan"))
    if origin != origin:
        sys.exit(f"{path}: no otherData.host_monotonic_origin_us (a trace from before it was recorded)")
    events = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("pid") == 1]
    computations = sorted(((e, m) for e in events if (m := STAGE_SPAN.match(e["name"]))), key=lambda pair: pair[0]["ts"])
    out = []
    for step in sorted((e for e in events if e["name"] == "pipeline"), key=lambda e: e["ts"]):
        begin, end = step["ts"], step["ts"] + step["dur"]
        spans = [(e["dur"], match.group(2) == "backward", int(match.group(1)), int(match.group(3)), int(match.group(4)))
                 for e, match in computations if begin <= e["ts"] and e["ts"] + e["dur"] <= end]
        compute = sum(span[0] for span in spans)
        if compute > 0:
            out.append((origin + begin, origin + end, compute, spans))
    return out


def replay(step_spans, stages, chunks):
    """The flush the ranks' computations would take if each ran as soon as its rank was free and its input had
    arrived, transfers taking no time, in the order and with the durations measured: what the measured compute alone
    explains (stages of unequal compute, a slow micro-batch), without communication or the host's gaps."""
    last = stages * chunks - 1
    queues = step_spans
    finished, free_at, position = {}, [0.0] * len(queues), [0] * len(queues)
    moved = True
    while moved:
        moved = False
        for r, queue in enumerate(queues):
            while position[r] < len(queue):
                duration, backward, stage, micro_batch, chunk = queue[position[r]]
                k = chunk * stages + stage
                ready = 0.0
                if backward or k > 0:
                    source = ((micro_batch, k - 1, False) if not backward else
                              (micro_batch, k + 1, True) if k < last else (micro_batch, k, False))
                    if source not in finished:
                        break
                    ready = finished[source]
                free_at[r] = max(free_at[r], ready) + duration
                finished[(micro_batch, k, backward)] = free_at[r]
                position[r] += 1
                moved = True
    if any(position[r] < len(q) for r, q in enumerate(queues)):
        sys.exit("replay: a computation's input never ran (traces cut short, or --stages/--virtual wrong)")
    return max(free_at)


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
    ranks = [steps_of(p) for p in paths]
    if any(not r for r in ranks):
        sys.exit("a trace has no 'pipeline' span with stage spans inside (pipeline_model_parallel_size > 1?)")
    steps = min(len(r) for r in ranks)
    flush = [max(r[k][1] for r in ranks) - min(r[k][0] for r in ranks) for k in range(steps)]
    means = []
    for path, r in zip(paths, ranks):
        fractions = [(flush[k] - r[k][2]) / r[k][2] for k in range(steps)]
        own = [(r[k][1] - r[k][0] - r[k][2]) / r[k][2] for k in range(steps)]
        means.append(statistics.mean(fractions))
        print(f"{os.path.basename(path)}: bubble {means[-1]:.3f} of compute "
              f"(steps: {', '.join(f'{f:.3f}' for f in fractions)}; inside its own span {statistics.mean(own):.3f})")
    mean = statistics.mean(means)
    computes = [statistics.mean(step[2] for step in r[:steps]) for r in ranks]
    heaviest = max(range(len(ranks)), key=lambda i: computes[i])
    print(f"mean over ranks: {mean:.3f}; compute of each rank relative to the heaviest: "
          f"{', '.join(f'{c / computes[heaviest]:.3f}' for c in computes)}")
    print(f"bubble of the heaviest stage (rank {heaviest}): {means[heaviest]:.3f}")
    if args.stages:
        replayed = [replay([r[k][3] for r in ranks], args.stages, args.virtual) for k in range(steps)]
        explained = statistics.mean((replayed[k] - ranks[heaviest][k][2]) / ranks[heaviest][k][2] for k in range(steps))
        print(f"replayed with the measured compute and free transfers: bubble of the heaviest stage {explained:.3f}; "
              f"the run's flush / the replay's = {statistics.mean(flush[k] / replayed[k] for k in range(steps)):.3f} "
              f"(the rest: transfers and the host's gaps)")
    if args.stages and args.micro_batches:
        expected = (args.stages - 1) / (args.virtual * args.micro_batches)
        print(f"formula (p-1)/(v m) = ({args.stages}-1)/({args.virtual}*{args.micro_batches}) = {expected:.3f}; "
              f"heaviest stage/formula = {means[heaviest] / expected:.2f}; mean over ranks/formula = "
              f"{mean / expected:.2f}")


if __name__ == "__main__":
    main()
