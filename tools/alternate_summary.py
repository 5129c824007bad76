#!/usr/bin/env python3
"""A table of decode-step timings from builds run alternately in one lease (bench/cuda_alternate.sh).

Input: lines `RUN <variant> <build> <tok_s> <device_us>` (other lines are ignored; `-` where a run
gave no figure). Per variant, in the order the variants first appear, one row per build in the order
the builds first appear: every run's device µs a step, their median, the change of that median
against the first build's, and the median tok/s. Runs without a figure show as `-` and count in no
median; a build with none has no median and no change.

    python3 tools/alternate_summary.py RUNS.txt
"""
import argparse
import statistics
import sys


def number(s):
    """The figure s, or None for `-` (a run that gave none)."""
    try:
        return float(s)
    except ValueError:
        return None


def read_runs(lines):
    """{variant: {build: [(tok_s or None, device_us or None), ...]}}, both levels in first-seen order."""
    runs = {}
    for line in lines:
        parts = line.split()
        if len(parts) != 5 or parts[0] != "RUN":
            continue
        _, variant, build, tok_s, device_us = parts
        runs.setdefault(variant, {}).setdefault(build, []).append((number(tok_s), number(device_us)))
    return runs


def median_of(values):
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


def table(runs):
    """The markdown table's lines."""
    out = ["| variant | build | device µs a step (each run) | median | change | tok/s (median) |",
           "|---|---|---|---|---|---|"]
    for variant, builds in runs.items():
        base = None
        for i, (build, rs) in enumerate(builds.items()):
            us = median_of([d for _, d in rs])
            tok = median_of([t for t, _ in rs])
            if i == 0:
                base = us
            each = " / ".join("-" if d is None else f"{d:.1f}" for _, d in rs)
            change = "" if i == 0 else ("-" if us is None or not base else f"{100.0 * (us - base) / base:+.1f} %")
            out.append(f"| {variant} | {build} | {each} | {'-' if us is None else f'{us:.1f}'} | {change} | "
                       f"{'-' if tok is None else f'{tok:.1f}'} |")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", help="the RUN lines bench/cuda_alternate.sh wrote")
    args = ap.parse_args(argv)
    with open(args.runs) as f:
        runs = read_runs(f)
    if not runs:
        sys.exit(f"alternate_summary: no RUN lines in {args.runs}")
    print("\n".join(table(runs)))


if __name__ == "__main__":
    main()
