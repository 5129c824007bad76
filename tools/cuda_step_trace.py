#!/usr/bin/env python3
"""Where a decode step's device time goes, from an Nsight Systems kernel trace.

Input: the CSV that `nsys stats -r cuda_gpu_trace -f csv` writes for a run of `gemma4 bench`
profiled with `nsys profile -t cuda --cuda-graph-trace=node` (graph replays traced kernel by
kernel, so the times are those of the kernels inside the step's graph, with programmatic dependent
launch overlapping them, not of each kernel alone as Nsight Compute measures), or the CSV that
tools/cupti_trace's LD_PRELOAD library writes in the same columns on machines without nsys.
bench/cuda_step_trace.sh runs all of it on the GPU machine.

Steps are cut where a kernel whose name matches --step-start begins (the token embedding opens
every forward). The last --steps steps with the most common kernel count (the decode steps) are
summarized: per kernel name, its launches per step, median duration, time per step, and the median
gap from the end of the kernel before it to its start (negative: it started before that kernel
ended, as PDL allows); then the step's span from first start to last end, the sum of kernel times
and the sum of gaps.
"""
import argparse
import collections
import csv
import re
import statistics
import sys


def read_kernels(path):
    """(start_ns, duration_ns, name) of every kernel in the trace, by start time."""
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            name = r.get("Name") or r.get("name")
            start = r.get("Start (ns)") or r.get("Start")
            dur = r.get("Duration (ns)") or r.get("Duration")
            if not name or start in (None, "") or dur in (None, ""):
                continue
            if name.startswith("[CUDA"):  # memcpy / memset rows
                continue
            rows.append((int(float(start)), int(float(dur)), name))
    rows.sort()
    return rows


def short_name(name):
    """A kernel's name without its namespace, template arguments kept short and parameters dropped."""
    n = re.sub(r"^void ", "", name)
    n = re.sub(r"\(anonymous namespace\)::", "", n)
    n = re.sub(r"g4::cuda::", "", n)
    n = re.sub(r"\((?!g4::WFormat)[^()]*\)$", "", n)  # the parameter list
    n = n.replace("(g4::WFormat)", "F").replace("(int)", "").replace("(bool)", "")
    return n[:90]


def split_steps(rows, start_pattern):
    starts = re.compile(start_pattern)
    steps, cur = [], []
    for r in rows:
        if starts.search(r[2]) and cur:
            steps.append(cur)
            cur = []
        cur.append(r)
    if cur:
        steps.append(cur)
    return steps


def summarize(steps, keep):
    counts = collections.Counter(len(s) for s in steps)
    common = counts.most_common(1)[0][0]
    chosen = [s for s in steps if len(s) == common][-keep:]
    per = collections.defaultdict(lambda: {"d": [], "g": [], "n": 0})
    spans, sums, gaps = [], [], []
    for s in chosen:
        spans.append((s[-1][0] + s[-1][1] - s[0][0]) / 1e3)
        sums.append(sum(d for _, d, _ in s) / 1e3)
        g_total, prev_end = 0.0, None
        for t, d, n in s:
            k = per[short_name(n)]
            k["d"].append(d / 1e3)
            k["n"] += 1
            if prev_end is not None:
                k["g"].append((t - prev_end) / 1e3)
                g_total += (t - prev_end) / 1e3
            prev_end = max(prev_end or 0, t + d)
        gaps.append(g_total)
    return common, chosen, per, spans, sums, gaps


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", help="nsys stats -r cuda_gpu_trace -f csv output")
    ap.add_argument("--step-start", default="embed_kernel", help="regex of the kernel that opens a step")
    ap.add_argument("--steps", type=int, default=4, help="decode steps summarized (the last ones)")
    args = ap.parse_args(argv)
    rows = read_kernels(args.csv)
    if not rows:
        print(f"{args.csv}: no kernels in the trace", file=sys.stderr)
        return 1
    steps = split_steps(rows, args.step_start)
    common, chosen, per, spans, sums, gaps = summarize(steps, args.steps)
    n = len(chosen)
    print(f"{len(steps)} steps; {n} summarized, {common} kernels each")
    print("step span us: " + " ".join(f"{x:.1f}" for x in spans))
    print("kernel time us: " + " ".join(f"{x:.1f}" for x in sums) +
          " | gaps us: " + " ".join(f"{x:.1f}" for x in gaps))
    print(f"{'kernel':90s} {'n/step':>6s} {'med us':>7s} {'us/step':>8s} {'med gap':>8s}")
    for name, k in sorted(per.items(), key=lambda kv: -sum(kv[1]["d"])):
        gap = statistics.median(k["g"]) if k["g"] else 0.0
        print(f"{name:90s} {k['n'] / n:6.1f} {statistics.median(k['d']):7.2f} {sum(k['d']) / n:8.1f} {gap:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
