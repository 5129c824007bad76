"""LoRA adapters (--adapter-path) against mlx-lm applying the same adapter.

tools/make_lora_oracle.py builds each adapter with mlx-lm's own linear_to_lora_layers (default
keys: every linear module of the last num_layers layers), saves it as `mlx_lm.lora` does
(adapter_config.json + adapters.safetensors), loads it back through mlx_lm's load_adapters and
records the logits. Here `gemma4 logits --adapter-path DIR` runs the same ids.

Checks: f32 max|Δlogit| <= 1e-3 over one forward and over calls of 4 tokens (the decode path), on
the reference and the cpu backend; bf16 top-1 >= 99 % and mean KL <= 1e-3 (test_parity's bf16
bounds; measured: identical logits). The adapters move the logits by 5.5 to 13.7, so an adapter
left out, applied twice or to the wrong module fails by orders of magnitude. Broken adapters
are refused with one line naming the file and tensor.
"""
from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest

from conftest import run_oracle_script

FIXTURES = ["dense-q4g64", "estyle-q4g64", "dense-bf16"]
F32_TOL = 1e-3


@pytest.fixture(scope="session")
def lora_fixtures(parity_fixtures, repo_root):
    run_oracle_script(repo_root, parity_fixtures, "make_lora_oracle.py")
    return parity_fixtures


def _logits(bin_, model, adapter, ids, out, dtype, backend, chunk=None):
    cmd = [str(bin_), "logits", "--model", str(model), "--adapter-path", str(adapter),
           "--ids", ",".join(map(str, ids)), "--out", str(out), "--dtype", dtype, "--backend", backend]
    if chunk:
        cmd += ["--chunk", str(chunk)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr[-2000:]}"
    return np.load(out)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("fixture", FIXTURES)
def test_lora_f32_matches_mlx(gemma4_bin, lora_fixtures, parity_report, tmp_path, fixture, backend):
    with np.load(lora_fixtures / f"{fixture}-lora" / "oracle.npz") as z:
        ids, ref, chunked, plain = z["ids"], z["f32"], z["f32_chunk4"], z["plain_f32"]
    moved = float(np.abs(ref - plain).max())
    assert moved > 100 * F32_TOL
    for key, want, chunk in (("one forward", ref, None), ("chunks of 4", chunked, 4)):
        got = _logits(gemma4_bin, lora_fixtures / fixture, lora_fixtures / f"{fixture}-lora", ids,
                      tmp_path / "l.npy", "f32", backend, chunk)
        d = float(np.abs(got - want).max())
        parity_report.append({"fixture": fixture, "check": f"lora {backend} {key}", "ok": d <= F32_TOL,
                              "maxdiff": f"{d:.2e}", "adapter_moves": f"{moved:.2f}"})
        assert d <= F32_TOL, f"{fixture} ({backend}, {key}): max|Δlogit| {d:.3e}"


@pytest.mark.parametrize("fixture", FIXTURES)
def test_lora_bf16_matches_mlx(gemma4_bin, lora_fixtures, parity_report, tmp_path, fixture):
    with np.load(lora_fixtures / f"{fixture}-lora" / "oracle.npz") as z:
        ids, ref = z["ids"], z["bf16"]
    got = _logits(gemma4_bin, lora_fixtures / fixture, lora_fixtures / f"{fixture}-lora", ids,
                  tmp_path / "l.npy", "bf16", "cpu")
    top1 = float((got.argmax(1) == ref.argmax(1)).mean())
    lp = lambda x: x - np.log(np.exp(x - x.max(1, keepdims=True)).sum(1, keepdims=True)) - x.max(1, keepdims=True)
    pr, pg = lp(ref.astype(np.float64)), lp(got.astype(np.float64))
    kl = float((np.exp(pr) * (pr - pg)).sum(1).mean())
    d = float(np.abs(got - ref).max())
    ok = top1 >= 0.99 and kl <= 1e-3
    parity_report.append({"fixture": fixture, "check": "lora bf16", "ok": ok, "top1": f"{top1:.3f}",
                          "kl": f"{kl:.1e}", "maxdiff": f"{d:.2e}"})
    assert ok, (top1, kl)


def _broken(tmp_path, src, name, cfg_edit=None, tensors_edit=None):
    import mlx.core as mx
    out = tmp_path / name
    shutil.copytree(src, out)
    if cfg_edit:
        cfg = json.loads((out / "adapter_config.json").read_text())
        cfg_edit(cfg)
        (out / "adapter_config.json").write_text(json.dumps(cfg))
    if tensors_edit:
        w = dict(mx.load(str(out / "adapters.safetensors")))
        tensors_edit(w)
        mx.save_safetensors(str(out / "adapters.safetensors"), w)
    return out


def test_lora_broken_adapters_are_refused(gemma4_bin, lora_fixtures, tmp_path):
    import mlx.core as mx
    model = lora_fixtures / "dense-q4g64"
    good = lora_fixtures / "dense-q4g64-lora"
    cases = [
        (_broken(tmp_path, good, "dora", cfg_edit=lambda c: c.update(fine_tune_type="dora")), "DoRA adapters are not supported"),
        (_broken(tmp_path, good, "noscale", cfg_edit=lambda c: c["lora_parameters"].pop("scale")), "lora_parameters.scale"),
        (_broken(tmp_path, good, "router", tensors_edit=lambda w: w.update({
            "model.layers.5.router.proj.lora_a": mx.zeros((128, 4))})), "router.proj.lora_a: not a LoRA weight"),
        (_broken(tmp_path, good, "lonely", tensors_edit=lambda w: w.pop("model.layers.5.mlp.up_proj.lora_b")),
         "layers.5.mlp.up_proj has lora_a but no lora_b"),
        (_broken(tmp_path, good, "shape", tensors_edit=lambda w: w.update({
            "model.layers.5.mlp.up_proj.lora_a": mx.zeros((128, 3))})), "expected [128, 4]"),
        (_broken(tmp_path, good, "kv", tensors_edit=lambda w: w.update({   # layer 5 is K=V: no v_proj
            "model.layers.5.self_attn.v_proj.lora_a": mx.zeros((128, 4)),
            "model.layers.5.self_attn.v_proj.lora_b": mx.zeros((4, 64))})), "has no such module"),
        (tmp_path / "absent", "not a directory"),
    ]
    for adapter, msg in cases:
        r = subprocess.run([str(gemma4_bin), "greedy", "--model", str(model), "--adapter-path", str(adapter),
                            "--ids", "2,105,7", "--steps", "2"], capture_output=True, text=True, timeout=120)
        assert r.returncode != 0 and msg in r.stderr, (adapter.name, r.stderr)
