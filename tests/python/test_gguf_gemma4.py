"""Gemma 4 GGUF files (architecture "gemma4", as llama.cpp's convert_hf_to_gguf.py writes them),
checked against mlx-lm and llama.cpp on files that converter made.

Fixtures: tests/fixtures/gguf_gemma4/ (tools/make_gemma4_gguf_fixtures.py): three tiny random
Gemma 4 checkpoints converted by llama.cpp's own converter -- dense (K=V full layers, proportional
RoPE read from rope_freqs, per-layer KV head counts and head dims), estyle (per-layer inputs,
KV-shared layers, double-wide MLP) and moe (4 experts top-2 beside the dense MLP, fused gate/up
expert tensors, per-expert scales) as bf16, and estyle also as Q8_0; with mlx-lm's float32 logits
and greedy run on the same (bf16) weights and llama.cpp's logits, greedy runs and tokenization.

Checks, with bounds set from measurement:
  - logits at every prompt position within MLX_TOL of mlx-lm's (measured 1.3e-2 .. 3.9e-2: the
    file computes GELU through ggml's f16 table, as llama.cpp does) with the same argmax
    everywhere, on the cpu and reference backends; greedy 12-token runs identical to mlx-lm's;
  - llama.cpp: argmax agreement >= LLAMA_TOP1 at the prompt positions of every file, and the
    distance to llama.cpp no larger than llama.cpp's own distance to mlx-lm (plus 10 %): ggml
    rounds activations to bf16 (Q8_0 for the Q8_0 file) before each matmul, which moves its
    logits up to 0.3 from mlx-lm's on the dense files and flips a near-tied expert choice on the
    MoE file; the runtime does not imitate that rounding (its cpu backend reads bf16 weights
    exactly);
  - tokenization from the file's "gemma4" BPE vocabulary identical to llama.cpp's;
  - the chat template the file carries renders (gemma4 render --model F.gguf), and run chats;
  - malformed metadata is refused with a message naming the key or tensor.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "gguf_gemma4"
MLX_TOL = 0.06
LLAMA_TOP1 = 0.94
GREEDY_STEPS = 12

META = json.loads((FIX / "reference.json").read_text())
REF = np.load(FIX / "reference.npz")
FILES = sorted(META["files"])
BF16 = [n for n in FILES if META["files"][n]["outtype"] == "bf16"]


def prompt(name: str) -> list:
    return META["variants"][META["files"][name]["variant"]]["prompt_ids"]


def run(gemma4_bin, *args, ok=True, timeout=120):
    r = subprocess.run([str(gemma4_bin), *map(str, args)], capture_output=True, text=True, timeout=timeout)
    if ok and r.returncode != 0:
        pytest.fail(f"gemma4 {' '.join(map(str, args))} failed ({r.returncode}):\n{r.stderr[-2000:]}")
    return r


def logits(gemma4_bin, name, backend, tmp_path) -> np.ndarray:
    out = tmp_path / f"{name}-{backend}.npy"
    run(gemma4_bin, "logits", "--model", FIX / f"{name}.gguf", "--ids", ",".join(map(str, prompt(name))),
        "--out", out, "--backend", backend, "--threads", 2)
    return np.load(out)


@pytest.mark.parametrize("backend", ["cpu", "reference"])
@pytest.mark.parametrize("name", BF16)
def test_logits_match_mlx_lm(gemma4_bin, name, backend, tmp_path, parity_report):
    x = logits(gemma4_bin, name, backend, tmp_path)
    m = REF[f"mlx_{META['files'][name]['variant']}"]
    assert x.shape == m.shape
    d = float(np.abs(x - m).max())
    parity_report.append({"fixture": f"gguf/{name}", "check": f"mlx-lm ({backend})", "ok": d <= MLX_TOL,
                          "max_abs": round(d, 5), "top1": float((x.argmax(-1) == m.argmax(-1)).mean())})
    assert d <= MLX_TOL, f"{name} ({backend}): max |logit - mlx-lm| = {d:.3g} > {MLX_TOL}"
    assert (x.argmax(-1) == m.argmax(-1)).all()


@pytest.mark.parametrize("name", BF16)
def test_greedy_matches_mlx_lm(gemma4_bin, name):
    r = run(gemma4_bin, "greedy", "--model", FIX / f"{name}.gguf", "--ids", ",".join(map(str, prompt(name))),
            "--steps", GREEDY_STEPS)
    want = REF[f"mlx_greedy_{META['files'][name]['variant']}"].tolist()
    assert json.loads(r.stdout) == want


@pytest.mark.parametrize("name", FILES)
def test_logits_near_llama_cpp(gemma4_bin, name, tmp_path, parity_report):
    x = logits(gemma4_bin, name, "cpu", tmp_path)
    ll = REF[f"llama_{name}"]
    top1 = float((x.argmax(-1) == ll.argmax(-1)).mean())
    d = float(np.abs(x - ll).max())
    parity_report.append({"fixture": f"gguf/{name}", "check": "llama.cpp (cpu)", "ok": top1 >= LLAMA_TOP1,
                          "max_abs": round(d, 4), "top1": round(top1, 3)})
    assert top1 >= LLAMA_TOP1, f"{name}: argmax agreement with llama.cpp {top1:.3f} < {LLAMA_TOP1}"
    if name in BF16:
        own = float(np.abs(ll - REF[f"mlx_{META['files'][name]['variant']}"]).max())
        assert d <= 1.1 * own, f"{name}: |ours - llama.cpp| {d:.3g} exceeds llama.cpp's own distance to mlx-lm {own:.3g}"


@pytest.mark.parametrize("name", FILES)
def test_tokenization_matches_llama_cpp(gemma4_bin, name):
    for text, want in META["files"][name]["tokenize"].items():
        r = run(gemma4_bin, "tokenize", "--model", FIX / f"{name}.gguf", "--special", "--bos", text)
        assert json.loads(r.stdout) == want, text


def test_info_reads_the_architecture(gemma4_bin):
    out = run(gemma4_bin, "info", "--model", FIX / "estyle-bf16.gguf").stdout
    rows = [ln.split() for ln in out.splitlines() if ln.strip()[:1].isdigit() and ("sliding" in ln or "full" in ln)]
    assert [r[1] for r in rows] == ["sliding", "sliding", "full", "sliding", "full", "sliding", "sliding", "full"]
    assert [r[6] if r[5] == "layer" else "own" for r in rows] == ["own"] * 5 + ["3", "3", "4"]
    assert "proportional" in out and "partial=0.25" in out
    out = run(gemma4_bin, "info", "--model", FIX / "moe-bf16.gguf").stdout
    assert "(K=V)" in out and "experts.switch_glu.gate_proj" in out


def test_chat_template_from_the_file(gemma4_bin, tmp_path):
    msgs = tmp_path / "m.json"
    msgs.write_text(json.dumps({"messages": [{"role": "user", "content": "Hi"}]}))
    r = run(gemma4_bin, "render", "--model", FIX / "moe-bf16.gguf", "--messages", msgs)
    assert r.stdout.startswith("<bos><|turn>user\nHi<turn|>\n<|turn>model\n"), r.stdout
    r = run(gemma4_bin, "run", "--model", FIX / "estyle-bf16.gguf", "--max-tokens", 4, "--seed", 1, "Hello")
    assert "prompt:" in r.stderr and "decode:" in r.stderr


# --- malformed files -------------------------------------------------------------------------

def rewrite(src: Path, dst: Path, drop_keys=(), set_keys=None, tensor_fn=None, drop_tensors=()) -> None:
    """Copies a GGUF file through the gguf package, dropping or replacing metadata keys, dropping
    tensors and (tensor_fn(name, array) -> array) changing tensor data."""
    import gguf
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), arch="gemma4")
    set_keys = set_keys or {}
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in drop_keys:
            continue
        if key in set_keys:
            continue
        t = f.types[0]
        sub = f.types[-1] if t == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, f.contents(), t, sub)
    for key, (val, vt, sub) in set_keys.items():
        w.add_key_value(key, val, vt, sub)
    for t in r.tensors:
        if t.name in drop_tensors:
            continue
        data = np.array(t.data)
        if tensor_fn:
            data = tensor_fn(t.name, data)
        w.add_tensor(t.name, data, raw_dtype=t.tensor_type)  # shape from the data (bytes for bf16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_rewritten_copy_still_loads(gemma4_bin, tmp_path):
    """The rewrite helper itself keeps a file valid (so the refusals below are about the change)."""
    dst = tmp_path / "copy.gguf"
    rewrite(FIX / "dense-bf16.gguf", dst)
    ids = ",".join(map(str, prompt("dense-bf16")))
    a, b = tmp_path / "a.npy", tmp_path / "b.npy"
    run(gemma4_bin, "logits", "--model", FIX / "dense-bf16.gguf", "--ids", ids, "--out", a)
    run(gemma4_bin, "logits", "--model", dst, "--ids", ids, "--out", b)
    assert np.array_equal(np.load(a), np.load(b))


def _bad_cases():
    import gguf
    V = gguf.GGUFValueType
    still = lambda name, a: np.where(a == 1.0, np.float32(0.5), a) if name == "rope_freqs.weight" else a  # noqa: E731
    return [
        ("no-pattern", dict(drop_keys=["gemma4.attention.sliding_window_pattern"]),
         "gemma4.attention.sliding_window_pattern is missing"),
        ("short-pattern", dict(set_keys={"gemma4.attention.sliding_window_pattern": ([True, False], V.ARRAY, V.BOOL)}),
         "sliding_window_pattern has 2 values, expected 5"),
        ("rope-freqs", dict(tensor_fn=still), "rope_freqs.weight[0] = 0.5"),
        ("shared-all", dict(set_keys={"gemma4.attention.shared_kv_layers": (5, V.UINT32, None)}),
         "shared_kv_layers = 5 leaves no layer"),
        ("kv-heads", dict(set_keys={"gemma4.attention.head_count_kv": (3, V.UINT32, None)}),
         "3 KV heads do not divide 4 query heads"),
        ("rot-swa", dict(set_keys={"gemma4.rope.dimension_count_swa": (8, V.UINT32, None)}),
         "rope.dimension_count_swa = 8 differs from the head dim 16"),
    ]


@pytest.mark.parametrize("case", range(6))
def test_malformed_metadata_is_refused(gemma4_bin, tmp_path, case):
    tag, kw, message = _bad_cases()[case]
    dst = tmp_path / f"{tag}.gguf"
    rewrite(FIX / "dense-bf16.gguf", dst, **kw)
    r = run(gemma4_bin, "logits", "--model", dst, "--ids", "2,3,4", "--out", tmp_path / "x.npy", ok=False)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert message in r.stderr and str(dst) in r.stderr, r.stderr


def test_missing_expert_tensor_is_refused(gemma4_bin, tmp_path):
    """A MoE layer whose fused gate/up tensor is gone: the separate gate tensor is named."""
    dst = tmp_path / "moe-broken.gguf"
    rewrite(FIX / "moe-bf16.gguf", dst, drop_tensors={"blk.1.ffn_gate_up_exps.weight"})
    r = run(gemma4_bin, "logits", "--model", dst, "--ids", "2,3", "--out", tmp_path / "x.npy", ok=False)
    assert r.returncode != 0 and "missing tensor blk.1.ffn_gate_exps.weight" in r.stderr, r.stderr


def test_image_input_is_refused_clearly(gemma4_bin, tmp_path):
    """GGUF vision towers ship as separate mmproj files, which are not read: --image says so."""
    from PIL import Image
    img = tmp_path / "x.png"
    Image.new("RGB", (32, 32), (200, 10, 10)).save(img)
    r = run(gemma4_bin, "run", "--model", FIX / "estyle-bf16.gguf", "--image", img, "--max-tokens", 2, "hi", ok=False)
    assert r.returncode != 0 and "no vision encoder" in r.stderr and "mmproj" in r.stderr, r.stderr
