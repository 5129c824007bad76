"""tools/safetensors_np.py (the numpy-only safetensors writer the GPU-machine generators use) writes
files the safetensors package reads back: every tensor's dtype, shape and values, and the metadata."""
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import safetensors_np  # noqa: E402

st = pytest.importorskip("safetensors.numpy")


def test_written_files_read_back(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {"b.weight": rng.standard_normal((3, 5)).astype(np.float32), "a.order": np.arange(7, dtype=np.int64),
               "c.codes": rng.integers(0, 2**32, (2, 4), dtype=np.uint32), "d.half": np.ones(3, np.float16)}
    ours = tmp_path / "ours.safetensors"
    safetensors_np.save_file(tensors, str(ours))
    back = st.load_file(str(ours))
    assert sorted(back) == sorted(tensors)
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype and np.array_equal(back[k], v), k
    with_meta = tmp_path / "meta.safetensors"
    safetensors_np.save_file(tensors, str(with_meta), {"format": "mlx"})
    from safetensors import safe_open
    with safe_open(str(with_meta), "np") as f:
        assert f.metadata() == {"format": "mlx"}


def test_an_unnamed_dtype_is_refused(tmp_path):
    with pytest.raises(ValueError, match="x: dtype"):
        safetensors_np.save_file({"x": np.zeros(2, np.complex64)}, str(tmp_path / "x.safetensors"))
