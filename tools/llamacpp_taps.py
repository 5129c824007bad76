#!/usr/bin/env python3
"""Layer-by-layer comparison of our engine with llama.cpp on one token sequence (a diagnostic;
not part of the tests).

llama.cpp side: llama-cpp-python's low-level API with an eval callback (cb_eval) that copies every
contiguous f32 tensor of the graph by name (`ffn_gate-3`, `l_out-17`, ...). Our side:
`gemma4 logits --tap-dir` (the taps of model.cpp). Prints, per layer and pair of matching
intermediates, how many elements differ and max |Δ| / max |x|, so the first layer and op where
the two engines part is visible; with `--backend ggml` every cell should read 0. Needs
requirements-peer.txt (llama-cpp-python). Same settings as tools/record_llamacpp.py: f32 KV cache,
no flash attention, one batch.

    .venv/bin/python tools/llamacpp_taps.py --ids 2,818,5279,529,7001,563 [--backend ggml]
"""
import argparse
import ctypes as C
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

# ours (tap name, per layer) -> llama.cpp node "<name>-<layer>@<op>" (names repeat across ops:
# Qcur-3 is the matmul, the reshape and the rope output)
PAIRS = [("q_normed", "Qcur_normed-{}@MUL"), ("q_roped", "Qcur-{}@ROPE"), ("k_roped", "Kcur-{}@ROPE"),
         ("v_normed", "Vcur-{}@MUL_MAT"), ("attn", "kqv_out-{}@CONT"), ("attn_residual", "sa_out-{}@ADD"),
         ("mlp_in", "ffn_norm-{}@MUL"), ("mlp_gate", "ffn_gate-{}@MUL_MAT"), ("mlp_up", "ffn_up-{}@MUL_MAT"),
         ("mlp_act", "ffn_geglu-{}@GEGLU"), ("mlp_out", "ffn_out-{}@MUL_MAT"), ("layer_out", "l_out-{}@ADD")]


class GgmlTensor(C.Structure):  # ggml.h `struct ggml_tensor` (GGML_MAX_DIMS 4, MAX_SRC 10)
    _fields_ = [("type", C.c_int), ("buffer", C.c_void_p), ("ne", C.c_int64 * 4),
                ("nb", C.c_size_t * 4), ("op", C.c_int), ("op_params", C.c_int32 * 16),
                ("flags", C.c_int32), ("src", C.c_void_p * 10), ("view_src", C.c_void_p),
                ("view_offs", C.c_size_t), ("data", C.c_void_p), ("name", C.c_char * 64),
                ("extra", C.c_void_p), ("padding", C.c_char * 8)]


def llamacpp_tensors(model: str, ids: list[int], threads: int) -> dict[str, np.ndarray]:
    """Every contiguous f32 node of llama.cpp's graph for one batch, keyed "<name>@<op>"."""
    import llama_cpp as L
    base = C.CDLL(str(Path(L.__file__).parent / "lib" / "libggml-base.so"))
    base.ggml_op_desc.restype = C.c_char_p
    base.ggml_op_desc.argtypes = [C.c_void_p]
    got: dict[str, np.ndarray] = {}

    def cb(ptr, ask, _ud):
        if ask:
            return True
        t = C.cast(ptr, C.POINTER(GgmlTensor)).contents
        ne, nb = list(t.ne), list(t.nb)
        contiguous = nb[0] == 4 and nb[1] == 4 * ne[0] and nb[2] == nb[1] * ne[1] and nb[3] == nb[2] * ne[2]
        name = t.name.decode(errors="replace") + "@" + base.ggml_op_desc(ptr).decode()
        if t.type == 0 and t.data and contiguous and name not in got:  # GGML_TYPE_F32
            n = ne[0] * ne[1] * ne[2] * ne[3]
            got[name] = np.ctypeslib.as_array(C.cast(t.data, C.POINTER(C.c_float)), shape=(n,)).copy()
        return True

    L.llama_backend_init()
    model_p = L.llama_model_load_from_file(model.encode(), L.llama_model_default_params())
    if not model_p:
        sys.exit(f"llama.cpp could not load {model}")
    cp = L.llama_context_default_params()
    cp.n_ctx = cp.n_batch = cp.n_ubatch = 512
    cp.n_threads = cp.n_threads_batch = threads
    cp.flash_attn_type = 0  # disabled
    cp.type_k = cp.type_v = 0  # f32 KV cache
    callback = L.ggml_backend_sched_eval_callback(cb)
    cp.cb_eval = callback
    ctx = L.llama_init_from_model(model_p, cp)
    arr = (C.c_int32 * len(ids))(*ids)
    if L.llama_decode(ctx, L.llama_batch_get_one(arr, len(ids))) != 0:
        sys.exit("llama_decode failed")
    L.llama_free(ctx)
    L.llama_model_free(model_p)
    return got


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ids", required=True, help="token ids, e.g. 2,818,5279")
    ap.add_argument("--model", help="GGUF file (default: the starter model)")
    ap.add_argument("--bin", default=str(ROOT / "build" / "bin" / "gemma4"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--backend", default="cpu", help="our backend: cpu (default) or ggml")
    a = ap.parse_args()
    ids = [int(x) for x in a.ids.split(",")]
    model = a.model
    if not model:
        from starter_model import ensure_starter_model
        model = str(ensure_starter_model())
    theirs = llamacpp_tensors(model, ids, a.threads)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([a.bin, "logits", "--model", model, "--ids", a.ids, "--out", f"{tmp}/l.npy",
                        "--tap-dir", tmp, "--threads", str(a.threads), "--backend", a.backend], check=True)
        ours = {p.stem: np.load(p).reshape(-1) for p in Path(tmp).glob("*.npy")}
        ours["logits"] = np.load(f"{tmp}/l.npy").reshape(-1)
    print(f"{len(ids)} tokens; per intermediate: elements that differ / max |ours - llama.cpp| / max |llama.cpp|")
    print("layer " + " ".join(f"{o:>14}" for o, _ in PAIRS))
    layer = 0
    while f"layer_out.{layer}" in ours or f"q_normed.{layer}" in ours:
        cells = []
        for o, t in PAIRS:
            x, y = ours.get(f"{o}.{layer}"), theirs.get(t.format(layer))
            if x is None or y is None or x.size != y.size:
                cells.append(f"{'-':>14}")
            else:
                rel = np.abs(x - y).max() / max(np.abs(y).max(), 1e-30)
                cells.append(f"{int((x != y).sum()):5d}/{rel:8.1e}")
        print(f"{layer:5d} " + " ".join(cells))
        layer += 1
    lg = theirs.get("result_output@MUL_MAT")  # llama.cpp computes the last position's logits only
    if lg is not None:
        x = ours["logits"][-lg.size:]
        print(f"last-position logits: {int((x != lg).sum())} of {lg.size} differ, max |Δ| {np.abs(x - lg).max():.3g}")

if __name__ == "__main__":
    main()
