#!/usr/bin/env python3
"""A synthetic 4-bit g64 Gemma 4 checkpoint at E2B geometry, written by mlx-lm, for benchmarks.

Usage: tools/make_bench_checkpoint.py --out DIR [--layers N] [--seed S]

Geometry (spec §1.4, E2B): hidden 1536, (4 sliding + 1 full) layer pattern, 8 heads, 1 KV head,
head_dim 256 / global_head_dim 512, MLP 6144 (12288 double-wide on KV-shared layers), PLE
width 256, vocab 262144, sliding window 512, proportional RoPE on full layers, softcap 30; nested
`gemma4` config as the real multimodal checkpoints ship it. With 35 layers (default) 20 are
KV-shared; with --layers N fewer layers of the same geometry are built and the number of shared
layers is scaled (20/35 of N, leaving at least one full layer among the non-shared ones).

Weights are random (norms 1 ± 0.1, matrices N(0, 1/in)) and go through mlx-lm's own
quantize_model (4-bit, g64) and save_model / save_config, except the two vocabulary tables
(262144 x 1536 and 262144 x N*256), which are drawn directly as random 4-bit codes with
constant bf16 scales/biases (same layout; quantizing 2.5e9 floats would take many minutes).
Memory: parameters stay lazy until quantized, layer by layer, so the peak is about the 4-bit
model plus one layer in f32 (~2.5 GB at 35 layers) instead of the f32 model (~20 GB).
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import oracle_common as oc  # noqa: E402

import numpy as np  # noqa: E402
import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
from mlx.utils import tree_flatten, tree_unflatten  # noqa: E402
import mlx_lm.utils as mlu  # noqa: E402

GROUP, BITS = 64, 4


def e2b_config(n_layers: int) -> dict:
    pattern = ["sliding_attention"] * 4 + ["full_attention"]
    layer_types = (pattern * (n_layers // 5 + 1))[:n_layers]
    shared = round(n_layers * 20 / 35)
    first_full = layer_types.index("full_attention") if "full_attention" in layer_types else None
    # Both layer types need a donor among the non-shared layers.
    while shared > 0 and (first_full is None or n_layers - shared <= first_full):
        shared -= 1
    tc = {
        "model_type": "gemma4_text",
        "hidden_size": 1536,
        "num_hidden_layers": n_layers,
        "intermediate_size": 6144,
        "num_attention_heads": 8,
        "num_key_value_heads": 1,
        "head_dim": 256,
        "global_head_dim": 512,
        "rms_norm_eps": 1e-6,
        "vocab_size": 262144,
        "vocab_size_per_layer_input": 262144,
        "hidden_size_per_layer_input": 256,
        "num_kv_shared_layers": shared,
        "use_double_wide_mlp": True,
        "attention_k_eq_v": False,
        "enable_moe_block": False,
        "sliding_window": 512,
        "final_logit_softcapping": 30.0,
        "tie_word_embeddings": True,
        "layer_types": layer_types,
        "rope_parameters": oc.rope_parameters(),
        "max_position_embeddings": 131072,
        "hidden_activation": "gelu_pytorch_tanh",
        "pad_token_id": 0,
        "eos_token_id": 1,
        "bos_token_id": 2,
    }
    return {
        "model_type": "gemma4",
        "architectures": ["Gemma4ForConditionalGeneration"],
        "vocab_size": 262144,
        "text_config": tc,
        "eos_token_id": [1, 106],
        "tie_word_embeddings": True,
    }


def random_quantized_table(rows: int, dims: int, std: float, key) -> tuple:
    """A random 4-bit g64 table in MLX affine layout, made directly: packed codes are uniform
    random bits (each 4-bit code uniform in 0..15), scale = std / sqrt(255/12) and bias =
    -7.5 * scale per group (both bf16), so the dequantized values have mean 0 and std `std`.
    Quantizing 2.35e9 random floats (the 35-layer PLE table) costs minutes on two cores; the
    bench only needs the layout and magnitudes, not a particular distribution."""
    rng = np.random.default_rng(key)
    words = mx.array(rng.integers(0, 2**32, size=(rows, dims * BITS // 32), dtype=np.uint32))
    scale = std / (255.0 / 12.0) ** 0.5
    scales = mx.full((rows, dims // GROUP), scale, dtype=mx.bfloat16)
    biases = mx.full((rows, dims // GROUP), -7.5 * scale, dtype=mx.bfloat16)
    out = (words, scales, biases)
    mx.eval(out)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--layers", type=int, default=35)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    mx.set_default_device(mx.cpu)
    t0 = time.time()
    mx.random.seed(args.seed)
    config = e2b_config(args.layers)
    tc = config["text_config"]
    d, n, p, vocab = tc["hidden_size"], tc["num_hidden_layers"], 256, tc["vocab_size"]
    print(f"E2B geometry, {n} layers ({tc['num_kv_shared_layers']} KV-shared), "
          f"vocab {vocab}: building lazily", flush=True)

    model = oc.build_model(config)  # parameters are lazy random arrays; nothing allocated yet
    lm = model.language_model.model

    # Vocabulary tables first, made directly in 4-bit form (see random_quantized_table).
    table_keys = [args.seed * 10 + 1, args.seed * 10 + 2]
    for ti, (name, dims, std) in enumerate((("embed_tokens", d, 1.0 / d ** 0.5),
                                            ("embed_tokens_per_layer", n * p, 0.25))):
        t1 = time.time()
        qe = nn.QuantizedEmbedding(vocab, dims, GROUP, BITS)
        qe.weight, qe.scales, qe.biases = random_quantized_table(vocab, dims, std, table_keys[ti])
        setattr(lm, name, qe)
        print(f"  {name}: [{vocab}, {dims}] quantized in {time.time() - t1:.1f}s", flush=True)

    # Random norms around 1 (still lazy), then bf16, then mlx-lm's quantize_model on the rest
    # (QuantizedEmbedding has no to_quantized, so the two tables are left as they are).
    upd = []
    for k, v in tree_flatten(model.parameters()):
        if k.endswith("norm.weight"):
            upd.append((k, 1.0 + 0.1 * mx.random.normal(v.shape)))
    model.update(tree_unflatten(upd))
    model.set_dtype(mx.bfloat16, predicate=lambda t: t == mx.float32)
    model, qconfig = oc.quantize(model, config, BITS, GROUP)
    # The loader needs the default block only; the tables were quantized with the same g/b.
    for i, layer in enumerate(lm.layers):
        mx.eval(layer.parameters())
        if i % 5 == 4 or i == n - 1:
            print(f"  layers 0..{i} quantized ({time.time() - t0:.0f}s)", flush=True)
    mx.eval(model.parameters())

    oc.save_checkpoint(model, qconfig, args.out)
    total = sum(f.stat().st_size for f in args.out.glob("*.safetensors"))
    print(f"wrote {args.out} ({total / 2**30:.2f} GiB) in {time.time() - t0:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
