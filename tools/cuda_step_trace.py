#!/usr/bin/env python3
"""Where a decode step's device time goes, from an Nsight Systems kernel trace.

Input: the CSV that `nsys stats -r cuda_gpu_trace -f csv` writes for a run of `gemma4 bench`
profiled with `nsys profile -t cuda --cuda-graph-trace=node` (graph replays traced kernel by
kernel, so the times are those of the kernels inside the step's graph, with programmatic dependent
launch overlapping them, not of each kernel alone as Nsight Compute measures), or the CSV that
tools/cupti_trace's LD_PRELOAD library writes in the same columns on machines without nsys.
bench/cuda_step_trace.sh runs all of it on the GPU machine.

Steps are cut after each kernel whose name matches --step-end (greedy sampling's argmax closes
every step of `gemma4 bench`), or, in a trace without one, where a kernel matching --step-start
begins (the token embedding opens every forward). The last --steps steps with the most common kernel count (the decode steps) are
summarized: per kernel name, its launches per step, median duration, time per step, and the median
gap from the end of the kernel before it to its start (negative: it started before that kernel
ended, as PDL allows), and its time on the step's path (how far its end moves past the ends before
it: a kernel launched early waits inside its own duration, so durations overlap and add up to more
than the step; the path times add up to the step's span); then the step's span from first start to
last end, the sum of kernel times and the sum of gaps. Kernels are listed by path time.
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
    """Steps cut before each kernel matching start_pattern, except one right after another match
    (E2B / E4B open a step with two embeddings: the tokens' and the per-layer inputs')."""
    starts = re.compile(start_pattern)
    steps, cur, prev_starts = [], [], False
    for r in rows:
        is_start = bool(starts.search(r[2]))
        if is_start and cur and not prev_starts:
            steps.append(cur)
            cur = []
        prev_starts = is_start
        cur.append(r)
    if cur:
        steps.append(cur)
    return steps


def split_steps_at_end(rows, end_pattern):
    """Steps cut after each kernel matching end_pattern (the token's sampling, which closes every
    step): what a step launches before its embedding (the staged tables' copy) stays in it, and
    the host's time between two graph replays falls between steps, not inside one."""
    ends = re.compile(end_pattern)
    steps, cur = [], []
    for r in rows:
        cur.append(r)
        if ends.search(r[2]):
            steps.append(cur)
            cur = []
    return steps


def on_path(step):
    """Each kernel of a step as (start, duration, name, path, gap), in ns. path: how far it moves the
    latest end of the kernels before it (a kernel launched early under PDL waits inside its
    duration; what it adds to the step is its end past the ends before it); these sum to the
    step's span. gap: its start less that latest end (None for the first)."""
    prev_end = None
    for t, d, name in step:
        yield t, d, name, max(0, t + d - (prev_end if prev_end is not None else t)), \
            (t - prev_end if prev_end is not None else None)
        prev_end = max(prev_end if prev_end is not None else 0, t + d)


def summarize(steps, keep):
    counts = collections.Counter(len(s) for s in steps)
    common = counts.most_common(1)[0][0]
    chosen = [s for s in steps if len(s) == common][-keep:]
    per = collections.defaultdict(lambda: {"d": [], "g": [], "p": [], "n": 0})
    spans, sums, gaps = [], [], []
    for s in chosen:
        spans.append((max(t + d for t, d, _ in s) - s[0][0]) / 1e3)
        sums.append(sum(d for _, d, _ in s) / 1e3)
        g_total = 0.0
        for t, d, n, path, gap in on_path(s):
            k = per[short_name(n)]
            k["d"].append(d / 1e3)
            k["n"] += 1
            k["p"].append(path / 1e3)
            if gap is not None:
                k["g"].append(gap / 1e3)
                g_total += gap / 1e3
        gaps.append(g_total)
    return common, chosen, per, spans, sums, gaps


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", help="nsys stats -r cuda_gpu_trace -f csv output")
    ap.add_argument("--step-end", default="argmax_kernel",
                    help="regex of the kernel that closes a step (greedy sampling); where none matches, --step-start")
    ap.add_argument("--step-start", default="embed_kernel", help="regex of the kernel that opens a step")
    ap.add_argument("--steps", type=int, default=4, help="decode steps summarized (the last ones)")
    ap.add_argument("--timeline", type=int, default=0, metavar="N",
                    help="also the last summarized step's first N kernels in order: start, end, path time")
    args = ap.parse_args(argv)
    rows = read_kernels(args.csv)
    if not rows:
        print(f"{args.csv}: no kernels in the trace", file=sys.stderr)
        return 1
    ends = re.compile(args.step_end)
    if any(ends.search(r[2]) for r in rows):
        steps = split_steps_at_end(rows, args.step_end)
    else:
        steps = split_steps(rows, args.step_start)
    common, chosen, per, spans, sums, gaps = summarize(steps, args.steps)
    n = len(chosen)
    print(f"{len(steps)} steps; {n} summarized, {common} kernels each")
    print("step span us: " + " ".join(f"{x:.1f}" for x in spans))
    print("kernel time us: " + " ".join(f"{x:.1f}" for x in sums) +
          " | gaps us: " + " ".join(f"{x:.1f}" for x in gaps))
    print(f"{'kernel':90s} {'n/step':>6s} {'med us':>7s} {'us/step':>8s} {'med gap':>8s} {'path us/step':>12s}")
    for name, k in sorted(per.items(), key=lambda kv: -sum(kv[1]["p"])):
        gap = statistics.median(k["g"]) if k["g"] else 0.0
        print(f"{name:90s} {k['n'] / n:6.1f} {statistics.median(k['d']):7.2f} {sum(k['d']) / n:8.1f} {gap:8.2f}"
              f" {sum(k['p']) / n:12.1f}")
    if args.timeline > 0:
        print_timeline(chosen[-1], args.timeline)
    return 0


def print_timeline(step, count):
    """A step's first `count` kernels in launch order, times from the step's first start (us): how
    one layer's kernels follow and overlap each other."""
    t0 = step[0][0]
    print(f"{'start us':>9s} {'end us':>9s} {'path us':>8s}  kernel")
    for t, d, name, path, _ in on_path(step[:count]):
        print(f"{(t - t0) / 1e3:9.2f} {(t + d - t0) / 1e3:9.2f} {path / 1e3:8.2f}  {short_name(name)}")


if __name__ == "__main__":
    sys.exit(main())
