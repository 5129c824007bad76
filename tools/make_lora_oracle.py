#!/usr/bin/env python3
"""LoRA adapters made and applied by mlx-lm itself, with reference logits, on fixture checkpoints.

Usage: tools/make_lora_oracle.py --fixtures tests/fixtures/generated [--force]

For each fixture below, writes FIXTURE-lora/ (beside the fixture) holding what `mlx_lm.lora`
writes after training: adapter_config.json (fine_tune_type lora, num_layers, lora_parameters
{rank, scale, dropout}) and adapters.safetensors (every lora_a / lora_b of the converted layers).
The adapter comes from mlx-lm's own linear_to_lora_layers (default keys: every linear module of
the last `num_layers` layers: attention q/k/v/o, MLP gate/up/down, per-layer-input gate and
projection), with seeded random lora_a and lora_b (mlx-lm starts lora_b at zero, which would
change nothing). Then the adapter is loaded back through mlx_lm.utils.load_model + load_adapters
(the path `mlx_lm.generate --adapter-path` takes) and FIXTURE-lora/oracle.npz records:
  ids         int32 [L]    the fixture's prompt followed by its f32 greedy continuation
  f32         f32 [L, V]   logits, one forward over all ids, f32 parameters
  f32_chunk4  f32 [L, V]   the same ids in calls of 4 tokens sharing one cache (decode path)
  bf16        f32 [L, V]   logits with the checkpoint's bf16 parameters
  plain_f32   f32 [L, V]   the fixture without the adapter (how much the adapter moves logits)
Skips work when every output exists and the stamp (this script + the fixtures' stamp + mlx /
mlx-lm versions) matches.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import oracle_common as oc  # noqa: E402

import mlx.core as mx  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402
from mlx_lm.tuner.utils import linear_to_lora_layers, load_adapters  # noqa: E402

# (fixture, num_layers, rank, scale, seed)
CASES = [
    ("dense-q4g64", 4, 4, 2.0, 11),
    ("estyle-q4g64", 8, 8, 1.5, 12),
    ("dense-bf16", 6, 4, 3.0, 13),
]


logits = oc.chunked_logits


def make_adapter(fdir: Path, out: Path, num_layers: int, rank: int, scale: float, seed: int):
    model, _ = oc.load(fdir)
    model.freeze()
    params = {"rank": rank, "scale": scale, "dropout": 0.0}
    linear_to_lora_layers(model, num_layers, params)
    rng = np.random.default_rng(seed)
    lora = {k: v for k, v in tree_flatten(model.trainable_parameters())}
    new = {}
    for k, v in lora.items():  # lora_a ~ U(-1/sqrt(in), 1/sqrt(in)) as mlx-lm; lora_b random too
        bound = 1.0 / np.sqrt(v.shape[0]) if k.endswith("lora_a") else 0.05
        new[k] = mx.array(rng.uniform(-bound, bound, size=v.shape).astype(np.float32))
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "adapters.safetensors"), new)
    with open(out / "adapter_config.json", "w") as f:
        json.dump({"fine_tune_type": "lora", "num_layers": num_layers, "lora_parameters": params}, f, indent=2)
    return sorted(new)


def main() -> int:
    args = oc.derived_args(__doc__)
    stamp = oc.derived_stamp(Path(__file__), args.fixtures)
    stamp_file = args.fixtures / ".stamp-lora"
    if oc.up_to_date(args, stamp_file, [args.fixtures / f"{c[0]}-lora" / "oracle.npz" for c in CASES], stamp):
        print(f"lora oracle: up to date ({len(CASES)} adapters)")
        return 0
    t0 = time.time()
    for name, num_layers, rank, scale, seed in CASES:
        fdir = args.fixtures / name
        out = args.fixtures / f"{name}-lora"
        names = make_adapter(fdir, out, num_layers, rank, scale, seed)
        with np.load(fdir / "oracle.npz") as z:
            ids = z["prompt_ids"].tolist() + z["greedy_f32"].tolist()
        res = {"ids": np.array(ids, dtype=np.int32)}
        m32, _ = oc.load(fdir)
        m32.set_dtype(mx.float32)
        res["plain_f32"] = logits(m32, ids)
        load_adapters(m32, str(out))
        m32.set_dtype(mx.float32)
        res["f32"] = logits(m32, ids)
        res["f32_chunk4"] = logits(m32, ids, 4)
        m16, _ = oc.load(fdir)
        load_adapters(m16, str(out))
        res["bf16"] = logits(m16, ids)
        np.savez(out / "oracle.npz", **res)
        moved = float(np.abs(res["f32"] - res["plain_f32"]).max())
        print(f"  {name:14s} {len(names)} adapter tensors (e.g. {names[0]}); the adapter moves logits "
              f"by up to {moved:.2f}", flush=True)
    stamp_file.write_text(stamp + "\n")
    print(f"lora oracle: {len(CASES)} adapters in {time.time() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
