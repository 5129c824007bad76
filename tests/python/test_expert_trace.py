"""The MoE expert trace (`--trace-experts FILE.jsonl`) and its summary (`gemma4 info --experts`).

Oracle: the router's own scores, written by `logits --tap-dir` (router_scores.L.npy, [tokens, E]
per MoE layer) in the same run: every traced token's experts at every layer must be that layer's
top-k of its scores, in descending order of score. Also checked: one line per token with its
position and id, weights positive and finite, the file appended to (two runs, two headers), the
summary's counts adding up, and clear errors for a dense model and for a malformed trace.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

IDS = [2, 5, 17, 33, 64, 100, 7, 9, 12, 200, 150, 3, 44, 90]  # within the fixtures' vocabulary


def _run(cmd, ok=True):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600)
    if ok:
        assert r.returncode == 0, f"{cmd} failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    return r


def _trace(gemma4_bin, model: Path, trace: Path, taps: Path, tmp: Path):
    _run([gemma4_bin, "logits", "--model", model, "--ids", ",".join(map(str, IDS)), "--out", tmp / "l.npy",
          "--dtype", "f32", "--tap-dir", taps, "--trace-experts", trace])


def test_trace_is_the_routers_top_k(gemma4_bin, parity_fixtures, tmp_path):
    model = parity_fixtures / "moe-q4g64"
    taps = tmp_path / "taps"
    taps.mkdir()
    trace = tmp_path / "experts.jsonl"
    _trace(gemma4_bin, model, trace, taps, tmp_path)
    lines = [json.loads(s) for s in trace.read_text().splitlines() if s.strip()]
    head, rows = lines[0], lines[1:]
    assert head["trace"] == "gemma4-experts" and head["version"] == 1
    E, K, layers = head["n_experts"], head["top_k"], head["moe_layers"]
    cfg = json.loads((model / "config.json").read_text())
    tc = cfg.get("text_config", cfg)
    assert (E, K) == (tc["num_experts"], tc["top_k_experts"])
    assert layers, "no MoE layer in the header"
    vocab = np.load(tmp_path / "l.npy").shape[1]
    assert vocab > 0
    assert len(rows) == len(IDS), "one line per token"
    assert [r["pos"] for r in rows] == list(range(len(IDS)))
    assert [r["token"] for r in rows] == IDS
    assert all(r["step"] == 0 and r["seq"] == 0 for r in rows)
    for li, layer in enumerate(layers):
        scores = np.load(taps / f"router_scores.{layer}.npy").reshape(len(IDS), E)
        for t, r in enumerate(rows):
            want = [int(e) for e in np.argsort(-scores[t], kind="stable")[:K]]
            assert r["experts"][li] == want, f"layer {layer} token {t}: traced {r['experts'][li]}, top-{K} {want}"
            w = r["weights"][li]
            assert len(w) == K and all(np.isfinite(w)) and all(x > 0 for x in w), f"layer {layer} token {t}: {w}"


def test_trace_appends_and_info_summarizes(gemma4_bin, parity_fixtures, tmp_path):
    model = parity_fixtures / "moe-q4g64"
    trace = tmp_path / "experts.jsonl"
    for i in range(2):
        taps = tmp_path / f"taps{i}"
        taps.mkdir()
        _trace(gemma4_bin, model, trace, taps, tmp_path)
    text = _run([gemma4_bin, "info", "--experts", trace]).stdout
    assert "2 runs" in text and "imbalance" in text and "never chosen" in text, text
    summary = json.loads(_run([gemma4_bin, "info", "--experts", trace, "--json"]).stdout)
    assert len(summary["runs"]) == 2
    for run in summary["runs"]:
        assert run["tokens"] == len(IDS)
        for layer in run["layers"]:
            assert sum(layer["counts"]) == len(IDS) * run["top_k"]
            assert layer["experts_used"] + len(layer["cold"]) == run["n_experts"]
            assert layer["imbalance"] >= 1.0


def test_trace_errors_are_clear(gemma4_bin, parity_fixtures, tmp_path):
    dense = parity_fixtures / "dense-q4g64"
    r = _run([gemma4_bin, "logits", "--model", dense, "--ids", "2,105", "--out", tmp_path / "l.npy",
              "--trace-experts", tmp_path / "t.jsonl"], ok=False)
    assert r.returncode != 0 and "no MoE layers" in r.stderr, r.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"trace":"gemma4-experts","version":1,"n_experts":8,"top_k":2,"moe_layers":[0]}\n'
                   '{"experts":[[1,99]]}\n')
    r = _run([gemma4_bin, "info", "--experts", bad], ok=False)
    assert r.returncode == 1 and f"{bad}:2:" in r.stderr and "expert id" in r.stderr, r.stderr
    bad.write_text('{"trace":7}\n')
    r = _run([gemma4_bin, "info", "--experts", bad], ok=False)
    assert r.returncode == 1 and f"{bad}:1:" in r.stderr, r.stderr
    r = _run([gemma4_bin, "info", "--experts", tmp_path / "missing.jsonl"], ok=False)
    assert r.returncode == 1 and "cannot read" in r.stderr, r.stderr
