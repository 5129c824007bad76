#!/usr/bin/env python3
"""Generate test vectors for the GGUF block formats (tests/quant/gguf_dequant_test.cpp).

For each format: random block bytes (with sane f16 scale fields so values are finite), their
dequantization by the reference `gguf.quants.dequantize` (ggml's layouts in numpy), a random f32
activation matrix x [M, cols] and y = x @ W.T computed in float64 by numpy.

Output, in tests/fixtures/gguf_quant/ (little-endian, raw):
  <name>.blocks  uint8   [rows, row_bytes]
  <name>.deq     float32 [rows, cols]
  <name>.x       float32 [M, cols]
  <name>.y       float32 [M, rows]
  manifest.txt   one line per format: name rows cols M
Usage: .venv/bin/python tools/gen_gguf_quant_vectors.py [out_dir]
"""
import pathlib
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

# name, type, rows, cols, byte offsets of f16 scale fields inside a block
FORMATS = [
    ("q4_0", T.Q4_0, 5, 96, [0]),
    ("q5_0", T.Q5_0, 5, 96, [0]),
    ("q8_0", T.Q8_0, 5, 96, [0]),
    ("q4_k", T.Q4_K, 3, 512, [0, 2]),
    ("q5_k", T.Q5_K, 3, 512, [0, 2]),
    ("q6_k", T.Q6_K, 3, 512, [208]),
]
M = 3


def sane_f16(rng, n):
    """f16 values with |v| in [1e-3, 0.25] and random sign (plus a few exact zeros)."""
    mag = np.exp(rng.uniform(np.log(1e-3), np.log(0.25), n))
    v = (mag * rng.choice([-1.0, 1.0], n)).astype(np.float16)
    v[rng.random(n) < 0.03] = 0
    return v


def main():
    out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/gguf_quant")
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20261129)
    lines = []
    for name, qt, rows, cols, f16_offsets in FORMATS:
        bs, bb = GGML_QUANT_SIZES[qt]
        nb = rows * cols // bs
        blocks = rng.integers(0, 256, size=(nb, bb), dtype=np.uint8)
        for off in f16_offsets:
            blocks[:, off:off + 2] = sane_f16(rng, nb).view(np.uint8).reshape(nb, 2)
        data = blocks.reshape(rows, cols // bs * bb)
        deq = dequantize(data, qt).astype(np.float32)
        assert deq.shape == (rows, cols) and np.isfinite(deq).all()
        x = rng.standard_normal((M, cols)).astype(np.float32)
        y = (x.astype(np.float64) @ deq.astype(np.float64).T).astype(np.float32)
        data.tofile(out / f"{name}.blocks")
        deq.tofile(out / f"{name}.deq")
        x.tofile(out / f"{name}.x")
        y.tofile(out / f"{name}.y")
        lines.append(f"{name} {rows} {cols} {M}")
    (out / "manifest.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
