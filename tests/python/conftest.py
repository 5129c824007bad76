"""Shared pytest set-up for the Python test suite.

- `repo_root`: the checkout root (two levels above this file).
- `gemma4_bin`: the CLI under test, build/bin/gemma4 (override with GEMMA4_BIN=/path); tests
  that need it are skipped, with the reason printed, only when it does not exist.
- `parity_fixtures`: tests/fixtures/generated, (re)made by tools/make_fixtures.py if missing or
  stale (the script itself is a no-op when its stamp matches).
- `parity_report`: a list the parity tests append their measured numbers to; printed as a table at
  the end of the run (also without -s), and written to build/parity_report.json.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURES_DIR = REPO_ROOT / "tests" / "fixtures" / "generated"
_REPORT: list = []


def gemma4_path() -> Path:
    env = os.environ.get("GEMMA4_BIN")
    return Path(env) if env else REPO_ROOT / "build" / "bin" / "gemma4"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def gemma4_bin() -> Path:
    p = gemma4_path()
    if not p.exists():
        msg = f"{p} is missing: build it first (make build)"
        print(f"\nSKIP: {msg}")
        pytest.skip(msg)
    return p


@pytest.fixture(scope="session")
def parity_fixtures() -> Path:
    r = subprocess.run([sys.executable, str(REPO_ROOT / "tools" / "make_fixtures.py"),
                        "--out", str(FIXTURES_DIR)], cwd=REPO_ROOT,
                       capture_output=True, text=True, timeout=1200)
    if r.returncode != 0:
        pytest.fail(f"tools/make_fixtures.py failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return FIXTURES_DIR


@pytest.fixture(scope="session")
def parity_report() -> list:
    return _REPORT


def cpu_has_int8_gguf_kernels() -> bool:
    """Whether this CPU runs the cpu backend's int8 GGUF kernels (AVX-512 F, BW, VL with VNNI:
    quant/gguf_act.h cpu_has_avx512_vnni): llama.cpp's 8-bit activation rounding and the row-exact
    batch-invariant kernels. Without them GGUF products are computed in exact f32."""
    try:
        flags = set(open("/proc/cpuinfo").read().split())
    except OSError:
        return False
    return {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= flags


def run_oracle_script(repo_root: Path, fixtures: Path, script: str, timeout: int = 900) -> None:
    """Runs tools/<script> --fixtures DIR (a derived-reference script, a no-op when up to date);
    fails the test session's fixture with its output when it fails."""
    r = subprocess.run([sys.executable, str(repo_root / "tools" / script), "--fixtures", str(fixtures)],
                       capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        pytest.fail(f"{script} failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not _REPORT:
        return
    tr = terminalreporter
    tr.section("parity vs mlx-lm and llama.cpp (measured)")
    for row in sorted(_REPORT, key=lambda r: (r["fixture"], r["check"])):
        extra = "  ".join(f"{k}={v}" for k, v in row.items()
                          if k not in ("fixture", "check", "ok"))
        tr.write_line(f"{'ok  ' if row['ok'] else 'FAIL'} {row['fixture']:24s} "
                      f"{row['check']:18s} {extra}")
    try:
        out = REPO_ROOT / "build" / "parity_report.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(_REPORT, indent=1))
    except OSError:
        pass
