#!/usr/bin/env python3
"""Gemma 4 GGUF test fixtures made by llama.cpp's own converter, with two references
(tests/fixtures/gguf_gemma4/).

People run Gemma 4 from GGUF files that llama.cpp's `convert_hf_to_gguf.py` wrote (architecture
"gemma4": rope_freqs for proportional RoPE, per-layer head counts and widths, fused expert
gate/up, per-layer input tensors, "gemma4" BPE vocabulary). This script makes such files the way
those were made, from tiny random Gemma 4 checkpoints, and records what the reference engines
compute on them:

  stage hf      (project venv: mlx-lm)  for each variant (dense: K=V full layers; estyle: per-layer
                inputs, KV-shared layers, double-wide MLP; moe: 4 experts top-2 beside the dense
                MLP) a Hugging Face checkpoint (HF tensor names, nested config.json, a tiny BPE
                tokenizer with merges, the official chat template) and mlx-lm's float32 logits at
                every prompt position and greedy continuation;
  stage convert (a venv with torch, see below)  llama.cpp's convert_hf_to_gguf.py on each
                checkpoint: bf16 tensors (exactly the checkpoint's values), and one Q8_0 file;
  stage record  (project venv with llama-cpp-python, requirements-peer.txt)  llama.cpp's logits
                at every prompt position (f32 KV cache, no flash attention), its greedy
                continuation, and its tokenization of a few texts.

Output (committed; each file under 1 MB): <name>.gguf, reference.npz (mlx_<variant>,
llama_<name> logits [L, V] float32; mlx_greedy_<variant>, greedy_<name> ids), reference.json
(prompts, llama.cpp's tokenization of TEXTS, settings, versions).

The converter needs torch (it reads checkpoints through torch tensors) and llama.cpp's source of
the pinned llama-cpp-python (requirements-peer.txt). Neither is part of the test path; make them
once with
    python3 -m venv /tmp/convenv && /tmp/convenv/bin/pip install torch==2.9.1 \
        transformers==5.24.0 safetensors==0.8.0 numpy==2.4.6 sentencepiece tokenizers==0.23.3
    pip download --no-binary :all: --no-deps llama-cpp-python==0.3.36 -d /tmp/llsrc  (and unpack)
and run
    .venv/bin/python tools/make_gemma4_gguf_fixtures.py all --python /tmp/convenv/bin/python \
        --llama-src /tmp/llsrc/llama_cpp_python-0.3.36/vendor/llama.cpp
"""
from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "gguf_gemma4"
WORK = Path("/tmp/g4_gguf_gemma4_work")
GREEDY_STEPS = 12
# (file name, variant, converter --outtype)
FILES = [("dense-bf16", "dense", "bf16"), ("estyle-bf16", "estyle", "bf16"),
         ("moe-bf16", "moe", "bf16"), ("estyle-q8_0", "estyle", "q8_0")]
TEXTS = ["Hello world", "the cat sat on the mat.", "  two  spaces,\ttab\nnewline", "naïve café 東京"]
# A few BPE merges for the tiny vocabulary (llama.cpp's "gemma4" tokenizer needs merges).
MERGES = [("\u2581", "t"), ("h", "e"), ("\u2581t", "he"), ("\u2581", "c"), ("a", "t"), ("\u2581c", "at"),
          ("\u2581", "s"), ("\u2581s", "at"), ("\u2581", "o"), ("\u2581o", "n"), ("\u2581", "m"),
          ("\u2581m", "at"), ("l", "l"), ("e", "ll"), ("h", "ell"), ("hell", "o"), ("\u2581", "w"),
          ("o", "r"), ("\u2581w", "or"), ("l", "d"), ("\u2581wor", "ld")]


def variants(mf) -> dict:
    """make_fixtures' three variants at half the width (hidden 64), so that each bf16 file stays
    well under 1 MB."""
    S, F = mf.S_, mf.F_
    small = dict(hidden_size=64, intermediate_size=96, head_dim=16, global_head_dim=32)
    return {
        "dense": dict(seed=111, prompt_len=33, config=mf.text_config(
            layer_types=[S, S, F, S, F], attention_k_eq_v=True, num_global_key_value_heads=1, **small),
            what="K=V full layers (1 global KV head) vs 2 KV heads sliding; proportional RoPE; window 8"),
        "estyle": dict(seed=222, prompt_len=29, config=mf.text_config(
            layer_types=[S, S, F, S, F, S, S, F], hidden_size_per_layer_input=16, num_kv_shared_layers=3,
            use_double_wide_mlp=True, num_key_value_heads=1, **dict(small, intermediate_size=64)),
            what="per-layer inputs (width 16); 3 KV-shared layers; double-wide MLP on shared layers"),
        "moe": dict(seed=333, prompt_len=38, config=mf.text_config(
            layer_types=[S, F, S, F], attention_k_eq_v=True, num_global_key_value_heads=2,
            enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=64, **small),
            what="MoE 4 experts top-2 (I=64) beside the dense MLP; K=V full layers with 2 global KV heads"),
    }


def prompt_ids(spec: dict, attempt: int) -> list:
    rng = np.random.default_rng(spec["seed"] * 1000 + 1 + attempt)
    return [2, 105] + [int(x) for x in rng.integers(3, 500, size=spec["prompt_len"] - 2)]


def stage_hf() -> None:
    sys.path.insert(0, str(ROOT / "tools"))
    import mlx.core as mx
    from mlx.utils import tree_unflatten
    import make_fixtures as mf
    import oracle_common as oc

    mx.set_default_device(mx.cpu)
    WORK.mkdir(parents=True, exist_ok=True)
    refs, meta = {}, {"variants": {}}
    specs = variants(mf)
    for variant in sorted({v for _, v, _ in FILES}):
        spec = specs[variant]
        config = mf.nested(copy.deepcopy(spec["config"]))  # HF checkpoints are nested
        model = oc.build_model(config)
        rng = np.random.default_rng(spec["seed"])
        model.update(tree_unflatten(list(oc.random_params(model, rng).items())))
        model.set_dtype(mx.bfloat16)
        mx.eval(model.parameters())
        d = WORK / variant
        d.mkdir(parents=True, exist_ok=True)
        weights = mf.hf_weights(model, config, np.random.default_rng(spec["seed"] + 7))
        mx.save_safetensors(str(d / "model.safetensors"), weights, metadata={"format": "pt"})
        (d / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        write_tokenizer(d, config["vocab_size"])
        model.set_dtype(mx.float32)  # the bf16 values, computed in f32 as ggml does
        # The first prompt whose every position has its two best logits 0.01 apart (no near-tie
        # for an engine that is right to within rounding).
        for attempt in range(8):
            ids = prompt_ids(spec, attempt)
            logits = oc.chunked_logits(model, ids).astype(np.float32)
            top2 = np.sort(logits, axis=-1)[:, -2:]
            if float((top2[:, 1] - top2[:, 0]).min()) >= 0.01:
                break
        refs[f"mlx_{variant}"] = logits
        greedy = []
        for _ in range(GREEDY_STEPS):  # argmax continuation, the whole sequence recomputed each step
            greedy.append(int(np.argmax(oc.chunked_logits(model, ids + greedy)[-1])))
        refs[f"mlx_greedy_{variant}"] = np.array(greedy, dtype=np.int32)
        meta["variants"][variant] = {"prompt_ids": ids, "what": spec["what"]}
        print(f"hf: {variant}: {len(weights)} tensors, prompt {len(ids)} ids", flush=True)
    import mlx_lm
    meta["mlx_lm"] = mlx_lm.__version__
    np.savez(WORK / "mlx_ref.npz", **refs)
    (WORK / "mlx_ref.json").write_text(json.dumps(meta, indent=1) + "\n")


def write_tokenizer(d: Path, vocab_size: int) -> None:
    """oracle_common's tiny Gemma-style vocabulary, with MERGES added in its unused slots."""
    import oracle_common as oc
    oc.write_tiny_chat_files(d, vocab_size)
    tj = json.loads((d / "tokenizer.json").read_text())
    vocab = tj["model"]["vocab"]
    free = sorted((i for t, i in vocab.items() if t.startswith("<unused")), reverse=True)
    for a, b in MERGES:
        if a + b in vocab:
            continue
        slot = free.pop()
        old = next(t for t, i in vocab.items() if i == slot)
        del vocab[old]
        vocab[a + b] = slot
    tj["model"]["merges"] = [[a, b] for a, b in MERGES]
    (d / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False))


def stage_convert(python: str, llama_src: Path) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    env_path = str(llama_src / "gguf-py")
    for name, variant, outtype in FILES:
        out = OUT / f"{name}.gguf"
        cmd = [python, str(llama_src / "convert_hf_to_gguf.py"), str(WORK / variant),
               "--outtype", outtype, "--outfile", str(out)]
        print("convert:", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin",
                                             "HF_HUB_OFFLINE": "1"})
        print(f"convert: {out.name}: {out.stat().st_size} bytes", flush=True)


def stage_record() -> None:
    import llama_cpp

    meta = json.loads((WORK / "mlx_ref.json").read_text())
    refs = dict(np.load(WORK / "mlx_ref.npz"))
    meta["llama_cpp_python"] = llama_cpp.__version__
    meta["settings"] = {"n_ctx": 256, "n_batch": 256, "type_k": "f32", "type_v": "f32", "flash_attn": False}
    meta["files"] = {}
    for name, variant, outtype in FILES:
        path = OUT / f"{name}.gguf"
        llm = llama_cpp.Llama(model_path=str(path), n_ctx=256, n_batch=256, n_threads=2, logits_all=True,
                              type_k=0, type_v=0, flash_attn=False, verbose=False)
        ids = meta["variants"][variant]["prompt_ids"]
        llm.reset()
        llm.eval(ids)
        refs[f"llama_{name}"] = np.array(llm.scores[:len(ids)], dtype=np.float32)
        greedy = []
        cur = list(ids)
        for _ in range(GREEDY_STEPS):
            nxt = int(np.argmax(llm.scores[len(cur) - 1]))
            greedy.append(nxt)
            llm.eval([nxt])
            cur.append(nxt)
        refs[f"greedy_{name}"] = np.array(greedy, dtype=np.int32)
        toks = {t: llm.tokenize(t.encode(), add_bos=True, special=True) for t in TEXTS}
        meta["files"][name] = {"variant": variant, "outtype": outtype, "tokenize": toks}
        print(f"record: {name}: logits {refs[f'llama_{name}'].shape}, greedy {greedy}", flush=True)
        del llm
    np.savez_compressed(OUT / "reference.npz", **refs)
    (OUT / "reference.json").write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("stage", choices=["hf", "convert", "record", "all"])
    ap.add_argument("--python", default="/tmp/convenv/bin/python", help="interpreter with torch")
    ap.add_argument("--llama-src", type=Path, help="llama.cpp source of the pinned llama-cpp-python")
    a = ap.parse_args()
    if a.stage in ("hf", "all"):
        stage_hf()
    if a.stage in ("convert", "all"):
        if not a.llama_src:
            ap.error("--llama-src is required for the convert stage")
        stage_convert(a.python, a.llama_src)
    if a.stage in ("record", "all"):
        stage_record()
    return 0


if __name__ == "__main__":
    sys.exit(main())
