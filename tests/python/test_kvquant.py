"""Quantized KV cache (--kv-bits) against mlx-lm's QuantizedKVCache on the fixture checkpoints.

tools/make_kvquant_oracle.py runs mlx-lm's own cache conversion (KVCache.to_quantized after every
model call once the cache holds --quantized-kv-start tokens) and quantized attention
(quantized_scaled_dot_product_attention) over a fixed call schedule; here the engine runs the same
schedule with `gemma4 logits --chunk C --kv-bits B --kv-group-size G --quantized-kv-start S`, on
the reference and the fast cpu backend.

Checks:
  f32:  max|Δlogit| <= max(1e-3, 3 * sens) at every position, where sens is how far mlx-lm's own
        logits move under a 3e-7 relative change of the embedding (oracle C_sens_f32): an 8-bit
        quantizer has boundaries so dense that rounding-level differences upstream flip a few
        codes, and these random models amplify each flip (sens up to 2e-2 here). Quantizing at all
        moves the logits by 0.2 (8-bit) to 8.5 (3-bit) (C_plain_f32), so a missing or mistimed
        conversion, a wrong group or bit width fails, by orders of magnitude except for the 8-bit
        case on dense-q4g64 (3x). The bound is also at least 2 % of that effect (EFFECT_FRAC): the
        cpu backend's own f32 summation order (8-wide AVX2 sums on CPUs without AVX-512) is far
        more than sens's 3e-7 probe, and flipped enough 8-bit codes on estyle-q4g64 for 4.4e-3
        against a 2.3e-3 bound, 1 % of the 0.41 that quantizing moves the logits there; a wrong
        quantizer is off by about the whole effect.
  bf16: MLX accumulates the quantized attention products in bf16 (its CPU quantized matmul runs in
        the activations' type), which the engine does not reproduce bit for bit: max|Δ| against
        mlx-lm's bf16 run must stay within how far that run lies from mlx-lm's own f32 run.
  memory: the full layers' KV shrinks by the expected factor (`bench` JSON kv_bytes).
"""
from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

from conftest import run_oracle_script

CASES = [  # (name, bits, group, start, chunk): tools/make_kvquant_oracle.py CASES
    ("b4g64s0c4", 4, 64, 0, 4),
    ("b8g32s20c1", 8, 32, 20, 1),
    ("b3g64s14c7", 3, 64, 14, 7),
    ("b6g64s20c1", 6, 64, 20, 1),
]
FIXTURES = ["dense-q4g64", "estyle-q4g64"]
F32_FLOOR = 1e-3
SENS_MULT = 3.0
EFFECT_FRAC = 0.02


@pytest.fixture(scope="session")
def kvquant_fixtures(parity_fixtures, repo_root):
    run_oracle_script(repo_root, parity_fixtures, "make_kvquant_oracle.py")
    return parity_fixtures


def _logits(bin_, model_dir, ids, out, dtype, backend, bits, group, start, chunk):
    cmd = [str(bin_), "logits", "--model", str(model_dir), "--ids", ",".join(map(str, ids)),
           "--out", str(out), "--dtype", dtype, "--backend", backend, "--chunk", str(chunk),
           "--kv-bits", str(bits), "--kv-group-size", str(group), "--quantized-kv-start", str(start)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr[-2000:]}"
    return np.load(out)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("fixture", FIXTURES)
def test_kvquant_f32_matches_mlx(gemma4_bin, kvquant_fixtures, parity_report, tmp_path, fixture,
                                 case, backend):
    name, bits, group, start, chunk = case
    with np.load(kvquant_fixtures / fixture / "kvquant.npz") as z:
        ids, ref, plain = z[f"{name}_ids"], z[f"{name}_f32"], z[f"{name}_plain_f32"]
        sens = float(z[f"{name}_sens_f32"])
    got = _logits(gemma4_bin, kvquant_fixtures / fixture, ids, tmp_path / "l.npy", "f32", backend,
                  bits, group, start, chunk)
    assert got.shape == ref.shape
    d = float(np.abs(got - ref).max())
    moved = float(np.abs(ref - plain).max())
    tol = max(F32_FLOOR, SENS_MULT * sens, EFFECT_FRAC * moved)
    ok = d <= tol
    parity_report.append({"fixture": fixture, "check": f"kv{name} {backend}", "ok": ok,
                          "maxdiff": f"{d:.2e}", "tol": f"{tol:.1e}", "quant_moves": f"{moved:.2f}"})
    # A case must tell quantized from plain KV: 8-bit on dense-q4g64 is the weakest (0.20 vs 0.063).
    assert moved > 2 * tol, f"{fixture} {name}: the case does not tell quantized from plain KV"
    assert ok, f"{fixture} {name} ({backend}): max|Δlogit| {d:.3e} > {tol:.1e}"


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("fixture", FIXTURES)
def test_kvquant_bf16_within_mlx_bf16_noise(gemma4_bin, kvquant_fixtures, parity_report, tmp_path,
                                            fixture, case):
    name, bits, group, start, chunk = case
    with np.load(kvquant_fixtures / fixture / "kvquant.npz") as z:
        ids, ref16, ref32 = z[f"{name}_ids"], z[f"{name}_bf16"], z[f"{name}_f32"]
    got = _logits(gemma4_bin, kvquant_fixtures / fixture, ids, tmp_path / "l.npy", "bf16", "cpu",
                  bits, group, start, chunk)
    d = float(np.abs(got - ref16).max())
    noise = float(np.abs(ref16 - ref32).max())
    top1 = float((got.argmax(1) == ref16.argmax(1)).mean())
    parity_report.append({"fixture": fixture, "check": f"kv{name} bf16", "ok": d <= noise,
                          "maxdiff": f"{d:.2f}", "mlx_bf16_vs_f32": f"{noise:.2f}",
                          "top1": f"{top1:.3f}"})
    assert d <= noise, f"{fixture} {name}: bf16 max|Δ| {d:.2f} > mlx's own bf16-f32 gap {noise:.2f}"


def test_kvquant_bad_flags(gemma4_bin, parity_fixtures):
    model = parity_fixtures / "dense-q4g64"
    for flags, msg in [(["--kv-bits", "7"], "--kv-bits"),
                       (["--kv-bits", "4", "--kv-group-size", "48"], "--kv-group-size"),
                       (["--kv-bits", "4", "--kv-group-size", "128"], "does not divide the head_dim"),
                       (["--kv-group-size", "32"], "need --kv-bits"),
                       (["--kv-bits", "4", "--backend", "ggml"], "no quantized KV cache")]:
        r = subprocess.run([str(gemma4_bin), "greedy", "--model", str(model), "--ids", "2,105,7",
                            "--steps", "2", *flags], capture_output=True, text=True, timeout=120)
        if "ggml" in flags and "needs an x86-64 CPU" in r.stderr:
            continue
        assert r.returncode != 0 and msg in r.stderr, (flags, r.stderr)
