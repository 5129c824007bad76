"""The safetensors file format written with numpy alone (no safetensors package: the lent GPU
machine's image lacks it, and the generators that run there need only numpy).

A file is an 8-byte little-endian header length, a JSON header (name -> dtype, shape, byte offsets
into the data that follows; "__metadata__" -> strings) padded with spaces to a multiple of 8, then
the tensors' bytes in header order. `header()` builds the first two parts for tensors whose bytes
are written later (a generator streaming gigabytes); `save_file()` writes whole arrays.
"""
from __future__ import annotations

import json
import struct

import numpy as np

DTYPES = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.int64): "I64",
          np.dtype(np.int32): "I32", np.dtype(np.uint32): "U32", np.dtype(np.uint8): "U8", np.dtype(np.int8): "I8"}


def header(entries, metadata: dict | None = None) -> bytes:
    """entries: (name, dtype string as safetensors spells it, shape, byte count) in file order.
    Returns the length prefix and the padded JSON header."""
    h, off = ({"__metadata__": metadata} if metadata else {}), 0
    for name, dt, shape, nbytes in entries:
        h[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + nbytes]}
        off += nbytes
    hj = json.dumps(h, separators=(",", ":")).encode()
    hj += b" " * (-len(hj) % 8)
    return struct.pack("<Q", len(hj)) + hj


def save_file(tensors: dict, path: str, metadata: dict | None = None) -> None:
    """Writes tensors (name -> numpy array of a dtype in DTYPES) to path, as
    safetensors.numpy.save_file does."""
    arrays = [(name, np.ascontiguousarray(a)) for name, a in tensors.items()]
    for name, a in arrays:
        if a.dtype not in DTYPES:
            raise ValueError(f"{name}: dtype {a.dtype} has no safetensors name here")
    with open(path, "wb") as f:
        f.write(header([(n, DTYPES[a.dtype], a.shape, a.nbytes) for n, a in arrays], metadata))
        for _, a in arrays:
            f.write(a.tobytes())


def load_file(path: str) -> dict:
    """Every tensor of a safetensors file whose dtype numpy has (F32, F16, I64, I32, U32, U8, I8)."""
    names = {v: k for k, v in DTYPES.items()}
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    h = json.loads(data[8:8 + n])
    out = {}
    for name, t in h.items():
        if name == "__metadata__" or t["dtype"] not in names:
            continue
        s, e = t["data_offsets"]
        out[name] = np.frombuffer(data[8 + n + s:8 + n + e], dtype=names[t["dtype"]]).reshape(t["shape"])
    return out
