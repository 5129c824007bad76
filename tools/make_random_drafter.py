#!/usr/bin/env python3
"""A Gemma 4 assistant (MTP) drafter checkpoint with seeded random weights, for any target.

Usage: tools/make_random_drafter.py --out DIR --backbone D --vocab V --head-dim H
                                    [--global-head-dim G] [--window W] [--hidden 64] [--layers 2]
                                    [--block-size 4] [--seed 0]

Writes DIR/config.json (model_type gemma4_assistant; the decoder's last layer is full attention,
the others sliding; --ordered: a centroid-routed head) and DIR/model.safetensors in HF's names, f32. Its proposals are noise: it is
for exercising --draft-model end to end on a real target (the server tests run it on the starter
model), where no trained drafter can be downloaded; mlx-vlm-checked drafters for the fixture
targets come from tools/make_mtp_oracle.py. Needs only numpy (tools/safetensors_np.py writes the file),
so it also runs on the lent GPU machine.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from safetensors_np import save_file  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--backbone", required=True, type=int, help="the target's hidden size")
    ap.add_argument("--vocab", required=True, type=int)
    ap.add_argument("--head-dim", required=True, type=int, help="the target's sliding-layer head size")
    ap.add_argument("--global-head-dim", type=int, help="the target's full-layer head size (default: --head-dim)")
    ap.add_argument("--window", type=int, default=512, help="the target's sliding window")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--block-size", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ordered", action="store_true",
                    help="a centroid-routed head as the E2B/E4B drafters have (2048 clusters, top 32)")
    a = ap.parse_args()
    gd = a.global_head_dim or a.head_dim
    types = ["sliding_attention"] * (a.layers - 1) + ["full_attention"]
    heads, inter, d = 4, 2 * a.hidden, a.hidden
    cfg = {
        "model_type": "gemma4_assistant", "backbone_hidden_size": a.backbone, "block_size": a.block_size,
        "use_ordered_embeddings": bool(a.ordered), "num_centroids": 2048, "centroid_intermediate_top_k": 32,
        "tie_word_embeddings": True,
        "text_config": {
            "model_type": "gemma4_text", "hidden_size": d, "intermediate_size": inter, "num_hidden_layers": a.layers,
            "layer_types": types, "num_attention_heads": heads, "num_key_value_heads": 1, "head_dim": a.head_dim,
            "global_head_dim": gd, "sliding_window": a.window, "vocab_size": a.vocab,
            "hidden_size_per_layer_input": 0, "num_kv_shared_layers": a.layers, "rms_norm_eps": 1e-6,
            "rope_parameters": {
                "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
                "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}},
        },
    }
    rng = np.random.default_rng(a.seed)

    def mat(rows, cols):
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    w = {"model.embed_tokens.weight": (rng.standard_normal((a.vocab, d)) / np.sqrt(d)).astype(np.float32),
         "model.norm.weight": norm(d), "pre_projection.weight": mat(d, 2 * a.backbone),
         "post_projection.weight": mat(a.backbone, d)}
    for i, t in enumerate(types):
        hd = gd if t == "full_attention" else a.head_dim
        p = f"model.layers.{i}."
        w[p + "self_attn.q_proj.weight"] = mat(heads * hd, d)
        w[p + "self_attn.o_proj.weight"] = mat(d, heads * hd)
        w[p + "self_attn.q_norm.weight"] = 0.5 * norm(hd)
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm"):
            w[p + n + ".weight"] = norm(d)
        w[p + "mlp.gate_proj.weight"] = mat(inter, d)
        w[p + "mlp.up_proj.weight"] = mat(inter, d)
        w[p + "mlp.down_proj.weight"] = mat(d, inter)
        w[p + "layer_scalar"] = np.array([0.9], dtype=np.float32)
    if a.ordered:
        w["masked_embedding.centroids.weight"] = mat(2048, d)
        w["masked_embedding.token_ordering"] = rng.permutation(a.vocab).astype(np.int64)
    a.out.mkdir(parents=True, exist_ok=True)
    save_file(w, str(a.out / "model.safetensors"))
    (a.out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    print(f"wrote {a.out} ({sum(v.nbytes for v in w.values()) / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
