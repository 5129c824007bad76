#!/usr/bin/env python3
"""Reference logits with a quantized KV cache, computed by mlx-lm on the fixture checkpoints.

Usage: tools/make_kvquant_oracle.py --fixtures tests/fixtures/generated [--force]

For each (fixture, case) below, writes FIXTURE/kvquant.npz with, per case name C:
  C_ids        int32 [L]     the fixture's prompt followed by its f32 greedy continuation
  C_f32        f32 [L, V]    logits of every position, f32 parameters
  C_bf16       f32 [L, V]    same with the checkpoint's bf16 parameters (MLX stores the cache's
                             scales and biases in bf16 then)
  C_plain_f32  f32 [L, V]    the same schedule WITHOUT KV quantization (how much quantizing moves
                             the logits: a test's tolerance must be far below this)
  C_sens_f32   f32 []        how far mlx-lm's own C_f32 moves when the embedding scales are
                             scaled by 1 +- 3e-7 (max over both): rounding-level changes upstream
                             flip codes that sit at a rounding boundary of the quantizer, and these
                             random models amplify each flip (8-bit: up to ~0.07). An engine whose
                             f32 arithmetic differs from MLX's by rounding cannot be closer than this.
Schedule (what `gemma4 logits --chunk CHUNK --kv-bits BITS --kv-group-size GROUP
--quantized-kv-start START` runs): the ids go through the model in consecutive calls of CHUNK
tokens sharing one cache (model.make_cache()); after every call, as mlx_lm.generate's
maybe_quantize_kv_cache does, each cache whose offset is >= START is replaced by
cache.to_quantized(GROUP, BITS) (mlx-lm's QuantizedKVCache; attention through its
quantized_scaled_dot_product_attention).

Two deviations from stock mlx-lm 0.32.2, which cannot run a quantized cache on Gemma 4 at all:
  - only KVCache entries (full-attention layers) are converted: RotatingKVCache.to_quantized
    raises NotImplementedError, so sliding-window layers keep their float cache;
  - a KV-shared layer whose donor cache is quantized receives the donor's quantized (codes,
    scales, biases) triples with cache=None, and mlx-lm would hand them to
    mx.fast.scaled_dot_product_attention (an error); here they go to mlx-lm's own
    quantized_scaled_dot_product_attention with the donor's bits and group size.
Both are exactly what the engine implements (src/model/kv_cache.h).
Skips work when every output exists and the stamp (this script, the fixtures' stamp, mlx / mlx-lm
versions) matches.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import oracle_common as oc  # noqa: E402

import mlx.core as mx  # noqa: E402
from mlx.utils import tree_flatten, tree_unflatten  # noqa: E402
import mlx_lm.models.gemma4_text as g4t  # noqa: E402
from mlx_lm.models.base import quantized_scaled_dot_product_attention  # noqa: E402
from mlx_lm.models.cache import KVCache  # noqa: E402

# (name, bits, group, start, chunk): start 0 quantizes after the first call; a later start
# converts a cache that already holds rows, here exactly when a call ends on it (so converting
# one call late shows); chunk 1 is the decode path.
CASES = [
    ("b4g64s0c4", 4, 64, 0, 4),
    ("b8g32s20c1", 8, 32, 20, 1),
    ("b3g64s14c7", 3, 64, 14, 7),
    ("b6g64s20c1", 6, 64, 20, 1),
]
FIXTURES = ["dense-q4g64", "estyle-q4g64"]

_active = {"bits": None, "group": None}
_orig_sdpa = g4t.scaled_dot_product_attention


def _sdpa(queries, keys, values, cache, scale, mask, sinks=None):
    if isinstance(keys, (tuple, list)) and not hasattr(cache, "bits"):  # KV-shared layer, quantized donor
        return quantized_scaled_dot_product_attention(
            queries, keys, values, scale=scale, mask=mask,
            group_size=_active["group"], bits=_active["bits"])
    return _orig_sdpa(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)


g4t.scaled_dot_product_attention = _sdpa


def run_schedule(model, ids, bits, group, start, chunk):
    _active.update(bits=bits, group=group)

    def quantize(cache):  # maybe_quantize_kv_cache, full-attention caches only (see above)
        if bits:
            for e, c in enumerate(cache):
                if isinstance(c, KVCache) and c.offset >= start:
                    cache[e] = c.to_quantized(group_size=group, bits=bits)

    return oc.chunked_logits(model, ids, chunk, after_call=quantize)


def sensitivity(model, ids, spec, ref) -> float:
    """max|Δ| of the schedule's logits under a rounding-level perturbation of the embedding."""
    key = next(k for k, _ in tree_flatten(model.parameters()) if k.endswith("embed_tokens.scales"))
    orig = dict(tree_flatten(model.parameters()))[key]
    worst = 0.0
    for f in (1 + 3e-7, 1 - 3e-7):
        model.update(tree_unflatten([(key, orig * f)]))
        worst = max(worst, float(np.abs(run_schedule(model, ids, *spec) - ref).max()))
    model.update(tree_unflatten([(key, orig)]))
    return worst


def main() -> int:
    args = oc.derived_args(__doc__)
    want = oc.derived_stamp(Path(__file__), args.fixtures)
    stamp_file = args.fixtures / ".stamp-kvquant"
    if oc.up_to_date(args, stamp_file, [args.fixtures / f / "kvquant.npz" for f in FIXTURES], want):
        print(f"kvquant oracle: up to date ({len(FIXTURES)} fixtures)")
        return 0
    t0 = time.time()
    for name in FIXTURES:
        fdir = args.fixtures / name
        with np.load(fdir / "oracle.npz") as z:
            ids = z["prompt_ids"].tolist() + z["greedy_f32"].tolist()
        m16, _ = oc.load(fdir)
        m32, _ = oc.load(fdir)
        m32.set_dtype(mx.float32)
        res = {}
        for case, bits, group, start, chunk in CASES:
            res[f"{case}_ids"] = np.array(ids, dtype=np.int32)
            res[f"{case}_f32"] = run_schedule(m32, ids, bits, group, start, chunk)
            res[f"{case}_bf16"] = run_schedule(m16, ids, bits, group, start, chunk)
            res[f"{case}_plain_f32"] = run_schedule(m32, ids, 0, group, start, chunk)
            sens = sensitivity(m32, ids, (bits, group, start, chunk), res[f"{case}_f32"])
            res[f"{case}_sens_f32"] = np.array(sens, dtype=np.float32)
            moved = float(np.abs(res[f"{case}_f32"] - res[f"{case}_plain_f32"]).max())
            print(f"  {name:14s} {case:12s} quantizing moves logits by up to {moved:.3f}; "
                  f"rounding sensitivity {sens:.2e}", flush=True)
        np.savez(fdir / "kvquant.npz", **res)
    stamp_file.write_text(want + "\n")
    print(f"kvquant oracle: {len(FIXTURES)} fixtures x {len(CASES)} cases in {time.time() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
