#!/usr/bin/env python3
"""Record llama.cpp's view of the starter GGUF as test fixtures (tests/fixtures/llamacpp/).

llama.cpp is the independent reference engine for GGUF files. Needs llama-cpp-python
(requirements-peer.txt; it builds llama.cpp from source, so it is kept out of requirements.txt):
    (see requirements-peer.txt for the CMAKE_ARGS: native build with AMX off)

For each prompt (raw text, one in the Gemma 3 chat format) it stores:
  - token ids from llama.cpp's tokenizer (add BOS, parse special tokens),
  - logits at every prompt position (logits_all=True): top-64 ids and values plus the argmax,
  - the greedy (argmax) 64-token continuation, decoded one token at a time, never stopping at EOS.
The context uses an f32 KV cache and no flash attention, so that llama.cpp's own storage
rounding is as small as it can be. Output:
  llamacpp_ref.json  prompts, ids, continuations, settings, llama.cpp version
  llamacpp_ref.npz   top_ids[P, 64] int32, top_vals[P, 64] float32, argmax[P] int32 with the
                     positions of all prompts concatenated (offsets in the json)
  gguf_manifest.json the file's metadata and tensor table as read by the `gguf` package (the
                     reference for the C++ reader's test on the real file); `--manifest-only`
                     writes only this (no llama-cpp-python needed).
"""
import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "llamacpp"
TOP_K = 64
STEPS = 64

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "1, 2, 3, 5, 8, 13, 21,",
    "<start_of_turn>user\nWrite a haiku about the ocean.<end_of_turn>\n<start_of_turn>model\n",
    "Translate to German: The weather is nice today and we are going for a walk.\nGerman:",
    "Les fleurs du jardin sont très belles au printemps. Elles",
    "Q: What is the boiling point of water at sea level in Celsius?\nA:",
    "  Leading spaces,\ttabs and\n\nblank lines — plus unicode: naïve café, 東京, emoji 🙂.",
    "In machine learning, a transformer is a deep learning architecture that relies on the "
    "attention mechanism. Compared to recurrent neural networks, transformers",
]


def starter_path() -> str:
    env = os.environ.get("GEMMA4_MODEL")
    if env:
        return env
    sys.path.insert(0, str(ROOT / "tools"))
    from starter_model import ensure_starter_model
    return str(ensure_starter_model())


def _jsonable(v):
    if isinstance(v, (np.generic,)):
        return v.item()
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return v


def write_manifest(model: str, out: Path) -> None:
    """Metadata and tensor table as the `gguf` package reads them."""
    import gguf

    r = gguf.GGUFReader(model)
    kv = {}
    for name, field in r.fields.items():
        types = [t.name for t in field.types]
        entry = {"types": types}
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            n = len(field.data)
            entry["count"] = n
            if n and field.types[-1] != gguf.GGUFValueType.ARRAY:
                vals = field.contents()
                pick = sorted({0, 1, n // 2, n - 1} & set(range(n)))
                entry["samples"] = {str(i): _jsonable(vals[i]) for i in pick}
        else:
            entry["value"] = _jsonable(field.contents())
        kv[name] = entry
    tensors = []
    for t in r.tensors:
        tensors.append({
            "name": t.name,
            "type": int(t.tensor_type),
            "ne": [int(x) for x in t.shape],  # gguf-py lists dims in ggml order (ne[0] first)
            "offset": int(t.data_offset - r.data_offset),
            "nbytes": int(t.n_bytes),
        })
    manifest = {
        "file": os.path.basename(model),
        "size": os.path.getsize(model),
        "data_offset": int(r.data_offset),
        "alignment": int(r.alignment),
        "kv": kv,
        "tensors": tensors,
    }
    (out / "gguf_manifest.json").write_text(json.dumps(manifest, indent=0, ensure_ascii=False) + "\n")


def record(model: str, out: Path, threads: int) -> None:
    import llama_cpp
    from llama_cpp import Llama

    max_len = 0
    llm = Llama(model_path=model, n_ctx=512, n_batch=512, n_ubatch=512, n_threads=threads,
                n_threads_batch=threads, logits_all=True, flash_attn=False,
                type_k=0, type_v=0,  # GGML_TYPE_F32 KV cache
                seed=0, verbose=False)
    records = []
    tops, vals, amax = [], [], []
    offset = 0
    for text in PROMPTS:
        ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)
        llm.reset()
        llm.eval(ids)
        logits = np.array(llm.scores[: len(ids)], dtype=np.float32)  # [L, V]
        top = np.argsort(-logits, axis=1, kind="stable")[:, :TOP_K].astype(np.int32)
        tops.append(top)
        vals.append(np.take_along_axis(logits, top, axis=1).astype(np.float32))
        amax.append(np.argmax(logits, axis=1).astype(np.int32))
        # Greedy continuation, one token per eval (decode path).
        cont, gaps = [], []
        row = logits[-1]
        for _ in range(STEPS):
            nxt = int(np.argmax(row))
            two = np.partition(row, -2)[-2:]
            cont.append(nxt)
            gaps.append(round(float(two[1] - two[0]), 5))  # llama.cpp's own top-1 - top-2 margin
            llm.eval([nxt])
            row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        max_len = max(max_len, len(ids) + STEPS)
        records.append({
            "text": text,
            "ids": [int(i) for i in ids],
            "offset": offset,
            "greedy": cont,
            "greedy_gaps": gaps,
            "greedy_text": llm.detokenize(cont).decode("utf-8", "replace"),
        })
        offset += len(ids)
        print(f"{len(ids):4d} tokens  argmax-top1 {int(amax[-1][-1])}  -> "
              f"{records[-1]['greedy_text'][:60]!r}", file=sys.stderr)
    np.savez_compressed(out / "llamacpp_ref.npz", top_ids=np.concatenate(tops),
                        top_vals=np.concatenate(vals), argmax=np.concatenate(amax))
    meta = {
        "model": os.path.basename(model),
        "llama_cpp_python": llama_cpp.__version__,
        "settings": {"n_threads": threads, "kv_cache": "f32", "flash_attn": False,
                     "add_bos": True, "parse_special": True, "top_k": TOP_K, "steps": STEPS,
                     "greedy": "argmax, one token per decode step, EOS not special-cased"},
        "eos_ids": [int(llm.token_eos())],
        "prompts": records,
    }
    (out / "llamacpp_ref.json").write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n")


def numpy_reference_logits(model: str, prompts_ids):
    """An independent f32 Gemma 3 forward pass in numpy over weights dequantized by the `gguf`
    package (mirrors llama.cpp src/models/gemma3.cpp op by op, but with exact f32 matmuls where
    llama.cpp quantizes activations to Q8 for its dot products). Used by --numpy-check to measure
    how far llama.cpp itself is from exact arithmetic, which sets the parity test's bound."""
    import gguf
    from gguf.quants import dequantize

    r = gguf.GGUFReader(model)
    f = {k: v.contents() for k, v in r.fields.items()
         if not k.startswith("tokenizer.") and r.fields[k].types[0] != gguf.GGUFValueType.ARRAY}
    W = {t.name: t for t in r.tensors}

    def w(name):
        t = W[name]
        return np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)

    d = f["gemma3.embedding_length"]; N = f["gemma3.block_count"]
    H = f["gemma3.attention.head_count"]; Hk = f["gemma3.attention.head_count_kv"]
    D = f["gemma3.attention.key_length"]; eps = f["gemma3.attention.layer_norm_rms_epsilon"]
    win = f["gemma3.attention.sliding_window"]; base_g = f["gemma3.rope.freq_base"]
    E = w("token_embd.weight")  # [V, d]

    def rms(x, g):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g

    def rope(x, pos, base):  # x [L, h, D], NEOX half split
        half = D // 2
        inv = base ** (-np.arange(half, dtype=np.float64) * 2.0 / D)
        ang = pos[:, None].astype(np.float64) * inv[None, :]
        c = np.cos(ang).astype(np.float32)[:, None, :]
        s = np.sin(ang).astype(np.float32)[:, None, :]
        a, b = x[..., :half], x[..., half:]
        return np.concatenate([a * c - b * s, a * s + b * c], axis=-1)

    def gelu(x):
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))

    layers = []
    for i in range(N):
        p = f"blk.{i}."
        layers.append({k: w(p + k + ".weight") for k in (
            "attn_norm", "attn_q", "attn_k", "attn_v", "attn_q_norm", "attn_k_norm", "attn_output",
            "post_attention_norm", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down", "post_ffw_norm")})
    out_norm = w("output_norm.weight")
    results = []
    for ids in prompts_ids:
        L = len(ids)
        pos = np.arange(L)
        x = E[np.array(ids)] * np.float32(np.sqrt(d))
        for i in range(N):
            lw = layers[i]
            sliding = i % 6 < 5
            base = 10000.0 if sliding else base_g
            h = rms(x, lw["attn_norm"])
            q = (h @ lw["attn_q"].T).reshape(L, H, D)
            k = (h @ lw["attn_k"].T).reshape(L, Hk, D)
            v = (h @ lw["attn_v"].T).reshape(L, Hk, D)
            q = rope(rms(q, lw["attn_q_norm"]), pos, base) * np.float32(1 / np.sqrt(D))
            k = rope(rms(k, lw["attn_k_norm"]), pos, base)
            rep = H // Hk
            k = np.repeat(k, rep, axis=1); v = np.repeat(v, rep, axis=1)
            s = np.einsum("qhd,khd->hqk", q, k)
            qi, ki = np.meshgrid(pos, pos, indexing="ij")
            mask = ki > qi
            if sliding:
                mask |= (qi - ki) >= win
            s = np.where(mask[None], -np.inf, s)
            s = np.exp(s - s.max(-1, keepdims=True)); s /= s.sum(-1, keepdims=True)
            o = np.einsum("hqk,khd->qhd", s, v).reshape(L, H * D) @ lw["attn_output"].T
            x = x + rms(o, lw["post_attention_norm"])
            h = rms(x, lw["ffn_norm"])
            m = (gelu(h @ lw["ffn_gate"].T) * (h @ lw["ffn_up"].T)) @ lw["ffn_down"].T
            x = x + rms(m, lw["post_ffw_norm"])
        results.append(rms(x, out_norm) @ E.T)
    return results


def numpy_check(out: Path, model: str) -> None:
    meta = json.loads((out / "llamacpp_ref.json").read_text())
    ref = np.load(out / "llamacpp_ref.npz")
    logits = numpy_reference_logits(model, [p["ids"] for p in meta["prompts"]])
    worst, agree, total, sq = 0.0, 0, 0, []
    for p, lg in zip(meta["prompts"], logits):
        o, n = p["offset"], len(p["ids"])
        ids = ref["top_ids"][o:o + n]
        vals = ref["top_vals"][o:o + n]
        mine = np.take_along_axis(lg, ids, axis=1)
        dlt = np.abs(mine - vals)
        worst = max(worst, float(dlt.max()))
        sq.append(dlt.ravel())
        agree += int((np.argmax(lg, axis=1) == ref["argmax"][o:o + n]).sum())
        total += n
    allv = np.concatenate(sq)
    print(f"numpy f32 vs llama.cpp over top-{TOP_K}: max |dlogit| {worst:.4f}, "
          f"mean {allv.mean():.4f}, p99 {np.percentile(allv, 99):.4f}; "
          f"top-1 agreement {agree}/{total}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="GGUF file (default: the starter model)")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--manifest-only", action="store_true")
    ap.add_argument("--numpy-check", action="store_true",
                    help="compare an exact-f32 numpy forward pass with the recorded logits")
    a = ap.parse_args()
    model = a.model or starter_path()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.numpy_check:
        numpy_check(out, model)
        return
    write_manifest(model, out)
    if not a.manifest_only:
        record(model, out, a.threads)
    print(out)


if __name__ == "__main__":
    main()
