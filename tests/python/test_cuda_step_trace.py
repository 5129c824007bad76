"""tools/cuda_step_trace.py on a small Nsight Systems kernel trace written here: steps cut at the
embedding kernel, the decode steps (the most common kernel count) summarized per kernel with their
launches, durations and the gaps between kernels (negative where programmatic dependent launch
overlapped them)."""
from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "cuda_step_trace.py"

EMBED = "void g4::cuda::(anonymous namespace)::embed_kernel<(g4::WFormat)7, (bool)1, __nv_bfloat16>(g4::cuda::DevWeight, const int *, float, __nv_bfloat16 *)"
GEMV = ("void g4::cuda::(anonymous namespace)::q8_gemv_kernel<(g4::WFormat)7, (int)0, (int)0, (int)1, (int)0>"
        "(g4::cuda::MatArgs, g4::cuda::Q8Act, int)")
NORM = "void g4::cuda::(anonymous namespace)::post_add_prepare_kernel(const void *, const float *, float, float, void *, bool, int, const float *, float, g4::cuda::Q8Act)"


def write_trace(path: Path) -> None:
    """A prefill step of 5 kernels, then three decode steps of 4: embed 2 us, GEMV 10 us, post-norm
    5 us starting 1 us before the GEMV ends (PDL), GEMV 10 us after a 2 us gap."""
    rows, t = [], 0
    for _ in range(5):  # prefill
        rows.append((t, 50_000, GEMV if rows else EMBED))
        t += 60_000
    for _ in range(3):
        t += 300_000
        rows.append((t, 2_000, EMBED))
        rows.append((t + 3_000, 10_000, GEMV))
        rows.append((t + 12_000, 5_000, NORM))
        rows.append((t + 19_000, 10_000, GEMV))
        t += 29_000
    rows.append((t + 5_000, 1_000, "[CUDA memcpy Device-to-Host]"))
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Start (ns)", "Duration (ns)", "CorrId", "Name"])
        for i, (s, d, n) in enumerate(rows):
            w.writerow([s, d, i, n])


def test_decode_steps_summarized(tmp_path):
    trace = tmp_path / "trace_cuda_gpu_trace.csv"
    write_trace(trace)
    r = subprocess.run([sys.executable, str(TOOL), str(trace), "--steps", "3"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "4 steps; 3 summarized, 4 kernels each" in out
    assert "step span us: 29.0 29.0 29.0" in out
    assert "kernel time us: 27.0 27.0 27.0 | gaps us: 2.0 2.0 2.0" in out  # 1 - 1 + 2
    lines = {l.split()[0]: l.split()[1:] for l in out.splitlines()[4:]}
    gemv = lines["q8_gemv_kernel<F7,"]
    # Two a step, 10 us each, gaps 1 and 2 us; on the step's path 13 - 2 and 29 - 17 us.
    assert gemv[-5:] == ["2.0", "10.00", "20.0", "1.50", "23.0"]
    # Started 1 us before the GEMV ended (PDL): 5 us long, 4 us of it on the path.
    assert lines["post_add_prepare_kernel"] == ["1.0", "5.00", "5.0", "-1.00", "4.0"]
    assert out.splitlines()[4].startswith("q8_gemv_kernel")  # listed by path time


def test_two_embeddings_open_one_step(tmp_path):
    """E2B / E4B open a step with two embedding kernels (the tokens', the per-layer inputs'):
    the second does not cut a step of its own."""
    trace = tmp_path / "trace.csv"
    write_trace(trace)
    rows = list(csv.DictReader(trace.open(newline="")))
    with trace.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Start (ns)", "Duration (ns)", "CorrId", "Name"])
        for r in rows:
            w.writerow([r["Start (ns)"], r["Duration (ns)"], r["CorrId"], r["Name"]])
            if r["Name"] == EMBED:  # a second embedding right after the first
                w.writerow([int(r["Start (ns)"]) + 1_000, 1_000, r["CorrId"], EMBED.replace("(g4::WFormat)7", "(g4::WFormat)9")])
    r = subprocess.run([sys.executable, str(TOOL), str(trace), "--steps", "3"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "4 steps; 3 summarized, 5 kernels each" in r.stdout


def test_cupti_trace_form_reads_the_same(tmp_path):
    """tools/cupti_trace (LD_PRELOAD, for machines without nsys) writes three columns, the name
    quoted with quotes doubled: the same summary as the nsys CSV of the same kernels."""
    nsys = tmp_path / "nsys.csv"
    write_trace(nsys)
    cupti = tmp_path / "cupti.csv"
    with nsys.open(newline="") as f, cupti.open("w") as out:
        out.write("Start (ns),Duration (ns),Name\n")
        for r in csv.DictReader(f):
            if not r["Name"].startswith("[CUDA"):  # CUPTI's kernel records only
                out.write('%s,%s,"%s"\n' % (r["Start (ns)"], r["Duration (ns)"], r["Name"].replace('"', '""')))
    runs = [subprocess.run([sys.executable, str(TOOL), str(t), "--steps", "3"], capture_output=True, text=True)
            for t in (nsys, cupti)]
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    assert runs[0].stdout.splitlines()[1:] == runs[1].stdout.splitlines()[1:]


def test_empty_trace_is_an_error(tmp_path):
    trace = tmp_path / "empty.csv"
    trace.write_text("Start (ns),Duration (ns),CorrId,Name\n")
    r = subprocess.run([sys.executable, str(TOOL), str(trace)], capture_output=True, text=True)
    assert r.returncode == 1 and "no kernels" in r.stderr


def test_steps_cut_after_the_sampling_kernel(tmp_path):
    """With an argmax closing each step, a step holds the copy launched before its embedding, and
    the host's gap between two replays is not part of any step's span."""
    copy = "g4::cuda::(anonymous namespace)::copy_bytes_kernel(const unsigned char *, unsigned long, unsigned char *)"
    argmax = "g4::cuda::(anonymous namespace)::argmax_kernel(const float *, int, unsigned long long *, unsigned int *, int *)"
    rows, t = [], 0
    for _ in range(3):
        t += 500_000  # the host between replays
        rows += [(t, 1_000, copy), (t + 1_000, 2_000, EMBED), (t + 3_000, 10_000, GEMV), (t + 13_000, 1_000, argmax)]
        t += 14_000
    trace = tmp_path / "trace.csv"
    with trace.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Start (ns)", "Duration (ns)", "Name"])
        w.writerows(rows)
    r = subprocess.run([sys.executable, str(TOOL), str(trace), "--steps", "2"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "3 steps; 2 summarized, 4 kernels each" in r.stdout
    assert "step span us: 14.0 14.0" in r.stdout


def test_timeline_lists_a_step_in_order(tmp_path):
    """--timeline N: the last summarized step's first N kernels with start, end and path time."""
    trace = tmp_path / "trace.csv"
    write_trace(trace)
    r = subprocess.run([sys.executable, str(TOOL), str(trace), "--steps", "3", "--timeline", "3"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    tail = r.stdout.splitlines()[-4:]
    assert tail[0].split() == ["start", "us", "end", "us", "path", "us", "kernel"]
    assert [l.split()[:3] for l in tail[1:]] == [["0.00", "2.00", "2.00"], ["3.00", "13.00", "11.00"],
                                                ["12.00", "17.00", "4.00"]]
    assert tail[3].split()[3] == "post_add_prepare_kernel"
