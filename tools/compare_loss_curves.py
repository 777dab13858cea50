#!/usr/bin/env python3
"""Compares training runs' loss curves against a baseline run, in windows of N steps (issue 15's convergence test:
fp8 loss within 1% of bf16 at equal steps, 20-step window means).

    tools/compare_loss_curves.py bf16=RUN/metrics.jsonl tensorwise=RUN2/metrics.jsonl ... [--window 20]
        [--skip 100] [--svg curves.svg]

The first NAME=PATH is the baseline. Each metrics.jsonl line is one logged step ({"step": S, "loss": L, ...}); runs
must log every step (log_interval: 1) so that windows hold the same steps. Prints a Markdown table: per run the
steps compared, the last window's mean loss and its difference from the baseline's, and the largest and mean
relative difference over the windows after the first --skip steps (the warm-up, where both curves fall fastest).
--svg writes the windowed curves as a plain SVG chart. Exit 2 on unreadable input.
"""
import argparse
import json
import sys


def fail(message):
    print(f"compare_loss_curves: {message}", file=sys.stderr)
    sys.exit(2)


def load(path):
    losses = {}
    try:
        with open(path) as f:
            for number, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    record = json.loads(line)
                    losses[int(record["step"])] = float(record["loss"])
                except (ValueError, KeyError, TypeError) as e:
                    fail(f"{path}:{number}: not a metrics record with step and loss ({e})")
    except OSError as e:
        fail(str(e))
    if not losses:
        fail(f"{path}: no steps")
    return losses


def windows(losses, steps, size):
    """Mean loss of each full window [s, s + size) of `steps` (sorted), keyed by the window's last step."""
    out = {}
    for i in range(0, len(steps) - size + 1, size):
        chunk = steps[i:i + size]
        out[chunk[-1]] = sum(losses[s] for s in chunk) / size
    return out


def svg_chart(curves, path):
    width, height, pad = 720, 420, 50
    xs = [x for c in curves.values() for x in c]
    ys = [y for c in curves.values() for y in c.values()]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    x1 = x1 if x1 > x0 else x0 + 1
    y1 = y1 if y1 > y0 else y0 + 1

    def px(x):
        return pad + (x - x0) / (x1 - x0) * (width - 2 * pad)

    def py(y):
        return height - pad - (y - y0) / (y1 - y0) * (height - 2 * pad)

    colours = ["#000000", "#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e"]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
             f'font-size="12">', f'<rect width="{width}" height="{height}" fill="white"/>',
             f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" stroke="black"/>',
             f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" stroke="black"/>',
             f'<text x="{width / 2}" y="{height - 12}" text-anchor="middle">step</text>',
             f'<text x="14" y="{height / 2}" transform="rotate(-90 14 {height / 2})" text-anchor="middle">'
             f'loss (window mean)</text>']
    for value in (y0, (y0 + y1) / 2, y1):
        parts.append(f'<text x="{pad - 4}" y="{py(value) + 4}" text-anchor="end">{value:.2f}</text>')
    for value in (x0, x1):
        parts.append(f'<text x="{px(value)}" y="{height - pad + 16}" text-anchor="middle">{value}</text>')
    for i, (name, curve) in enumerate(curves.items()):
        colour = colours[i % len(colours)]
        points = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in sorted(curve.items()))
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{points}"/>')
        parts.append(f'<text x="{width - pad - 120}" y="{pad + 16 * i}" fill="{colour}">{name}</text>')
    parts.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(parts) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="NAME=PATH to a metrics.jsonl; the first is the baseline")
    parser.add_argument("--window", type=int, default=20)
    parser.add_argument("--skip", type=int, default=100, help="steps left out of the max/mean differences")
    parser.add_argument("--svg", help="write the windowed curves here")
    args = parser.parse_args()
    if args.window < 1:
        fail("--window must be at least 1")
    runs = []
    for item in args.runs:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            fail(f"{item!r}: expected NAME=PATH")
        runs.append((name, load(path)))
    base_name, base = runs[0]
    curves = {}
    print(f"| run | steps | last window mean | vs {base_name} | max rel. diff after step {args.skip} | "
          f"mean rel. diff |")
    print("|---|---|---|---|---|---|")
    for name, losses in runs:
        common = sorted(set(losses) & set(base))
        mine, theirs = windows(losses, common, args.window), windows(base, common, args.window)
        curves[name] = mine
        if not mine:
            print(f"| {name} | {len(common)} | (fewer steps than one window) | | | |")
            continue
        last = max(mine)
        diffs = [abs(mine[s] - theirs[s]) / theirs[s] for s in mine if s > args.skip]
        worst = f"{max(diffs) * 100:.2f}%" if diffs else "—"
        mean = f"{sum(diffs) / len(diffs) * 100:.2f}%" if diffs else "—"
        print(f"| {name} | {len(common)} | {mine[last]:.4f} | {(mine[last] - theirs[last]) / theirs[last] * 100:+.2f}% "
              f"| {worst} | {mean} |")
    if args.svg:
        svg_chart(curves, args.svg)


if __name__ == "__main__":
    main()
