#!/usr/bin/env python3
"""Where a step's time goes, from a Perfetto trace the engine wrote (profile: true, or benchmark train --trace).

Usage: tools/trace_summary.py TRACE.json [BASELINE.json] [--top N]

Each scope of the trace (a phase, a layer, an op) has a span on the host track (when it was issued) and one on the
device track (from the device reaching its start to finishing its work). A scope's self time is its span less the
spans of the scopes nested in it, so the self times of a track add up to the track's busy time once. Scopes are
grouped by name with every number replaced by '#' (the layers and micro-batches of a step fold into one row). The
rows are sorted by device self time: where the device time goes. A row whose host self time is near its device
self time was waiting for the host to issue it (the device track counts from reaching the scope's start, so it
includes the host's gaps). With a baseline trace the table gets the baseline's device self times beside, and the
difference, so a slower run shows which scopes added the time.
"""
import argparse
import json
import re
import sys

NUMBER = re.compile(r"\d+")


def self_times(path, pid):
    """{grouped name: [self µs, count]} over the spans of track `pid` (1 host, 2 device), and the track's total."""
    try:
        doc = json.load(open(path))
    except (OSError, ValueError) as error:
        sys.exit(f"{path}: {error}")
    spans = sorted(
        ((e["ts"], -e["dur"], e["name"]) for e in doc.get("traceEvents", []) if e.get("ph") == "X" and e.get("pid") == pid),
        key=lambda s: (s[0], s[1]),
    )
    if not spans:
        sys.exit(f"{path}: no spans on track {pid}")
    out, stack, total = {}, [], 0.0
    # Parents open before their children and end after them (ties: the longer span first, so it is the parent).
    for ts, neg_dur, name in spans:
        dur = -neg_dur
        while stack and ts >= stack[-1][1] - 1e-3:
            stack.pop()
        key = NUMBER.sub("#", name)
        row = out.setdefault(key, [0.0, 0])
        row[0] += dur
        row[1] += 1
        if stack:
            out[stack[-1][2]][0] -= dur
        else:
            total += dur
        stack.append((ts, ts + dur, key))
    return out, total


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace")
    parser.add_argument("baseline", nargs="?")
    parser.add_argument("--top", type=int, default=30, help="rows to print (default 30)")
    args = parser.parse_args()
    device, device_total = self_times(args.trace, 2)
    host, host_total = self_times(args.trace, 1)
    base, base_total = self_times(args.baseline, 2) if args.baseline else ({}, 0.0)
    print(f"device busy {device_total / 1000:.1f} ms, host busy {host_total / 1000:.1f} ms"
          + (f"; baseline device busy {base_total / 1000:.1f} ms" if args.baseline else ""))
    header = "| scope | count | device self ms | host self ms |"
    rule = "|---|---|---|---|"
    if args.baseline:
        header += " baseline device ms | difference ms |"
        rule += "---|---|"
    print(header)
    print(rule)
    names = sorted(set(device) | set(base), key=lambda k: -max(device.get(k, [0])[0], base.get(k, [0])[0]))
    for name in names[: args.top]:
        d, n = device.get(name, [0.0, 0])
        line = f"| {name} | {n} | {d / 1000:.2f} | {host.get(name, [0.0])[0] / 1000:.2f} |"
        if args.baseline:
            b = base.get(name, [0.0])[0]
            line += f" {b / 1000:.2f} | {(d - b) / 1000:+.2f} |"
        print(line)


if __name__ == "__main__":
    main()
