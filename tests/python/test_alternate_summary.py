"""tools/alternate_summary.py on RUN lines as bench/cuda_alternate.sh writes them: medians per
variant and build in first-seen order, the change against the first build, runs without a figure
shown and left out of the medians."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "alternate_summary.py"

RUNS = """\
noise that is not a run
RUN e4b base 317.4 3118.0
RUN e4b new 322.9 3074.5
RUN e4b base 316.2 3116.0
RUN e4b new 320.4 3088.7
RUN e4b new - -
RUN 31b base 95.0 10494.3
RUN 31b new 98.7 10095.6
RUN 31b broken - -
"""


def run_tool(tmp_path: Path, text: str) -> subprocess.CompletedProcess:
    f = tmp_path / "alternate.txt"
    f.write_text(text)
    return subprocess.run([sys.executable, str(TOOL), str(f)], capture_output=True, text=True)


def rows(out: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in out.splitlines()[2:]]


def test_medians_and_changes_per_variant(tmp_path):
    r = run_tool(tmp_path, RUNS)
    assert r.returncode == 0, r.stderr
    got = rows(r.stdout)
    assert [g[:2] for g in got] == [["e4b", "base"], ["e4b", "new"], ["31b", "base"], ["31b", "new"],
                                    ["31b", "broken"]]
    e4b_base, e4b_new, b31_base, b31_new, b31_broken = got
    assert e4b_base[2:] == ["3118.0 / 3116.0", "3117.0", "", "316.8"]
    # median of 3074.5 and 3088.7 (the run without a figure counts in no median)
    assert e4b_new[2:] == ["3074.5 / 3088.7 / -", "3081.6", "-1.1 %", "321.6"]
    assert b31_new[3:5] == ["10095.6", "-3.8 %"]
    assert b31_broken[2:] == ["-", "-", "-", "-"]
    assert b31_base[4] == ""


def test_no_runs_is_an_error(tmp_path):
    r = run_tool(tmp_path, "nothing here\n")
    assert r.returncode != 0
    assert "no RUN lines" in r.stderr
