#!/usr/bin/env python3
"""Writes tests/fixtures/quant/mlx_affine_vectors.bin: MLX affine quantization vectors made by
mlx.core.quantize / mlx.core.dequantize itself, for every bits x group size x scale dtype.

Each record packs a fixed random 8x128 matrix (rows 6 and 7 are all-negative / all-positive so both
scale signs occur). Layout (little-endian):
  magic b"G4QV0001", u32 record count, then per record:
  u32 bits, u32 group_size, u32 rows, u32 cols, u32 dtype (0 f32, 1 f16, 2 bf16)
  weight  u32[rows, cols*bits/32]          (mx.quantize)
  scales  dtype[rows, cols/group]          (mx.quantize)
  biases  dtype[rows, cols/group]          (mx.quantize)
  deq_f32 f32[rows, cols]   mx.dequantize with scales/biases cast to f32 (exact casts)
  deq_t   dtype[rows, cols] mx.dequantize in the scales' own dtype (omitted for f32)

Also writes tests/fixtures/quant/mlx_quantize_vectors.bin: what mlx.core.quantize makes of a fixed
f32 input (the run-time quantizer of the KV cache, quant/affine_quantize.h, must match it bit for
bit), for every bits x group size, from the f32 input and from the input cast to bf16:
  magic b"G4QQ0001", u32 rows, u32 cols, f32 input[rows, cols], u32 record count, then per record:
  u32 bits, u32 group_size, u32 bf16 (1: quantized from bf16(input); scales/biases are bf16 values)
  codes   u32[rows, cols*bits/32]
  scales  f32[rows, cols/group]  (exact upcast when bf16)
  biases  f32[rows, cols/group]
Rows 0-5 are K-like activations of different scales; row 6 holds a constant group and a group
of zeros (q0 == 0 in MLX's algorithm), row 7 mixes signs with a dominant negative value.
Run: .venv/bin/python tools/gen_quant_vectors.py
"""
import pathlib
import struct

import mlx.core as mx
import numpy as np

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "quant" / "mlx_affine_vectors.bin"
DTYPES = [(mx.float32, 0), (mx.float16, 1), (mx.bfloat16, 2)]


def raw(a: mx.array) -> bytes:
    if a.dtype == mx.bfloat16:
        return np.array(a.view(mx.uint16)).tobytes()
    return np.array(a).tobytes()


def main() -> None:
    rng = np.random.default_rng(1234)
    w = rng.standard_normal((8, 128)).astype(np.float32)
    w[6] = -np.abs(w[6]) - 0.5
    w[7] = np.abs(w[7]) + 0.5
    records = []
    for dt, code in DTYPES:
        for bits in (2, 3, 4, 5, 6, 8):
            for g in (32, 64, 128):
                wm = mx.array(w).astype(dt)
                q, s, b = mx.quantize(wm, group_size=g, bits=bits)
                d32 = mx.dequantize(q, s.astype(mx.float32), b.astype(mx.float32), group_size=g, bits=bits)
                rec = struct.pack("<5I", bits, g, w.shape[0], w.shape[1], code)
                rec += raw(q) + raw(s) + raw(b) + raw(d32.astype(mx.float32))
                if dt != mx.float32:
                    rec += raw(mx.dequantize(q, s, b, group_size=g, bits=bits))
                records.append(rec)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_bytes(b"G4QV0001" + struct.pack("<I", len(records)) + b"".join(records))
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes, {len(records)} records)")


QOUT = OUT.parent / "mlx_quantize_vectors.bin"


def main_quantize() -> None:
    rng = np.random.default_rng(4321)
    x = (rng.standard_normal((8, 128)) * np.array([0.01, 0.1, 1, 3, 10, 100, 1, 1])[:, None])
    x = x.astype(np.float32)
    x[6, :32] = 0.75
    x[6, 32:64] = 0.0
    x[7, 5] = -40.0
    records = []
    for in_bf16 in (0, 1):
        xm = mx.array(x).astype(mx.bfloat16) if in_bf16 else mx.array(x)
        for bits in (2, 3, 4, 5, 6, 8):
            for g in (32, 64, 128):
                q, sc, bi = mx.quantize(xm, group_size=g, bits=bits)
                rec = struct.pack("<3I", bits, g, in_bf16)
                rec += raw(q) + raw(sc.astype(mx.float32)) + raw(bi.astype(mx.float32))
                records.append(rec)
    QOUT.write_bytes(b"G4QQ0001" + struct.pack("<2I", *x.shape) + x.tobytes()
                     + struct.pack("<I", len(records)) + b"".join(records))
    print(f"wrote {QOUT} ({QOUT.stat().st_size} bytes, {len(records)} records)")


if __name__ == "__main__":
    main()
    main_quantize()
