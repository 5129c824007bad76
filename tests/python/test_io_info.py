"""`gemma4 info --json` against mlx-lm's own loaded model, on the mlx-lm fixtures.

For every fixture (tools/make_fixtures.py) mlx-lm loads the directory (mlx_lm.utils.load_model:
config nesting, defaults, sanitize, the quantization block with its per-module overrides and
shape inference) and we read back, per layer: attention type, head_dim, KV heads, K=V, which layer's
KV it uses (previous_kvs), MLP width, MoE; per quantizable module: float or (bits, group_size);
and the eos ids. The engine's config/weight resolution must agree on all of them.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from make_fixtures import fixture_list  # noqa: E402

FIXTURES = [f[0] for f in fixture_list()]


def _canonical(path: str) -> str:
    for p in ("language_model.model.", "language_model.", "model."):
        if path.startswith(p):
            return path[len(p):]
    return path


def _mlx_facts(fdir: Path) -> dict:
    import mlx.nn as nn
    from mlx.utils import tree_flatten
    import oracle_common as oc

    model, config = oc.load(fdir)
    tm = model.language_model if hasattr(model, "language_model") else model
    inner = tm.model
    n = len(inner.layers)
    m = n - tm.args.num_kv_shared_layers
    layers = []
    for i, layer in enumerate(inner.layers):
        a = layer.self_attn
        donor = inner.previous_kvs[i]
        layers.append({
            "kind": "full" if layer.layer_type == "full_attention" else "sliding",
            "head_dim": a.head_dim,
            "kv_heads": a.n_kv_heads,
            "k_eq_v": bool(a.use_k_eq_v),
            "kv_source": -1 if i < m else donor,
            "mlp_width": layer.mlp.gate_proj.weight.shape[0],
            "moe": bool(layer.enable_moe),
            "window": 0 if layer.layer_type == "full_attention" else tm.args.sliding_window,
        })
    modules = {}
    quantizable = (nn.Linear, nn.Embedding, nn.QuantizedLinear, nn.QuantizedEmbedding)
    for path, mod in tree_flatten(model.leaf_modules(), is_leaf=lambda x: isinstance(x, nn.Module)):
        name = type(mod).__name__
        if not (isinstance(mod, quantizable) or "SwitchLinear" in name):
            continue
        modules[_canonical(path)] = (mod.bits, mod.group_size) if hasattr(mod, "bits") else "float"
    eos = config.get("eos_token_id")
    eos = [eos] if isinstance(eos, int) else list(eos)
    return {"layers": layers, "modules": modules, "eos": eos, "vocab": tm.args.vocab_size,
            "hidden": tm.args.hidden_size, "softcap": tm.args.final_logit_softcapping}


@pytest.mark.parametrize("name", FIXTURES)
def test_info_matches_mlx_lm(name, gemma4_bin, parity_fixtures):
    fdir = parity_fixtures / name
    r = subprocess.run([str(gemma4_bin), "info", "--json", "--model", str(fdir), "--context", "64"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    ref = _mlx_facts(fdir)
    assert info["hidden_size"] == ref["hidden"]
    assert info["vocab_size"] == ref["vocab"]
    assert info["final_softcap"] == pytest.approx(ref["softcap"] or 0.0)
    assert info["eos_ids"] == ref["eos"]
    assert len(info["layers"]) == len(ref["layers"])
    for i, (got, want) in enumerate(zip(info["layers"], ref["layers"])):
        assert {k: got[k] for k in want} == want, f"layer {i}"
    got_mods = {m["module"]: ("float" if m["format"] in ("f32", "f16", "bf16") else (m["bits"], m["group_size"]))
                for m in info["modules"]}
    assert got_mods == ref["modules"]
    # KV cache: K and V per owning layer, sliding layers capped at the window.
    ctx = info["context"]
    elems = sum(min(ctx, L["window"]) * L["kv_heads"] * L["head_dim"] * 2 if L["window"] else
                ctx * L["kv_heads"] * L["head_dim"] * 2
                for L in ref["layers"] if L["kv_source"] < 0)
    full = sum(ctx * L["kv_heads"] * L["head_dim"] * 2
               for L in ref["layers"] if L["kv_source"] < 0 and not L["window"])
    # --kv-bits b (group 64): full layers as b-bit codes + f32 scale and bias per 64; windows f32
    kvq = {f"kv_bits_{b}": 4 * (elems - full) + full * b // 8 + full // 64 * 8 for b in (8, 4)}
    assert info["kv_cache_bytes"] == {"f32": 4 * elems, "bf16": 2 * elems, **kvq}


# Config variants (no weights): `gemma4 info --config-only --json` against the model mlx-lm builds
# from the same config.json (utils._get_classes + ModelArgs.from_dict, load_config for eos).
S, F = "sliding_attention", "full_attention"
CONFIG_VARIANTS = {
    # Only the required fields: every other value is mlx-lm's default (20 KV-shared layers,
    # sliding_window_pattern 5, double-wide MLP, heads 8 / 1 from the wrapper, softcap 30).
    "nested-minimal": ({"model_type": "gemma4",
                        "text_config": {"hidden_size": 64, "num_hidden_layers": 35, "intermediate_size": 96}},
                       None),
    "flat-keqv-rope": ({"model_type": "gemma4_text", "hidden_size": 64, "num_hidden_layers": 7,
                        "intermediate_size": 80, "num_attention_heads": 4, "num_key_value_heads": 2,
                        "num_global_key_value_heads": 1, "attention_k_eq_v": True, "head_dim": 16,
                        "global_head_dim": 32, "num_kv_shared_layers": 2, "use_double_wide_mlp": False,
                        "hidden_size_per_layer_input": 0, "final_logit_softcapping": None,
                        "layer_types": [S, F, S, S, F, S, F], "sliding_window": 16,
                        "rope_parameters": {
                            "sliding_attention": {"rope_type": "default", "rope_theta": 20000.0},
                            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.5,
                                               "rope_theta": 500000.0, "factor": 8.0}}},
                       None),
    "flat-moe-pattern3": ({"model_type": "gemma4_text", "hidden_size": 64, "num_hidden_layers": 7,
                           "intermediate_size": 48, "num_attention_heads": 2, "num_key_value_heads": 2,
                           "head_dim": 16, "global_head_dim": 16, "sliding_window_pattern": 3,
                           "num_kv_shared_layers": 3, "enable_moe_block": True, "num_experts": 4,
                           "top_k_experts": 2, "moe_intermediate_size": 24, "vocab_size": 100,
                           "hidden_size_per_layer_input": 16, "vocab_size_per_layer_input": 100},
                          None),
    "unified-vocab-gen-eos": ({"model_type": "gemma4_unified", "vocab_size": 1000, "eos_token_id": [1, 106],
                               "text_config": {"hidden_size": 32, "num_hidden_layers": 6,
                                               "intermediate_size": 64, "num_kv_shared_layers": 0,
                                               "vocab_size": 5, "head_dim": 8, "global_head_dim": 16,
                                               "tie_word_embeddings": False,
                                               "layer_types": [S, S, F, S, S, F]}},
                              {"eos_token_id": [1, 106, 50], "temperature": 1.0}),
}


@pytest.mark.parametrize("name", sorted(CONFIG_VARIANTS))
def test_config_matches_mlx_lm(name, gemma4_bin, tmp_path):
    import numpy as np
    from mlx_lm import utils as mlu
    from mlx_lm.models.rope_utils import ProportionalRoPE

    config, gen = CONFIG_VARIANTS[name]
    (tmp_path / "config.json").write_text(json.dumps(config))
    if gen is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps(gen))
    r = subprocess.run([str(gemma4_bin), "info", "--json", "--config-only", "--model", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)

    cfg = mlu.load_config(tmp_path)
    model_cls, args_cls = mlu._get_classes(cfg)
    model = model_cls(args_cls.from_dict(cfg))  # parameters stay lazy (never evaluated)
    tm = model.language_model if hasattr(model, "language_model") else model
    args, inner = tm.args, tm.model
    eos = cfg.get("eos_token_id", None)
    if eos is None:
        eos = 1  # mlx-lm leaves it to the tokenizer; HF Gemma4TextConfig's default eos_token_id
    assert info["eos_ids"] == ([eos] if isinstance(eos, int) else list(eos))
    assert info["vocab_size"] == args.vocab_size
    assert info["hidden_size"] == args.hidden_size
    assert info["num_heads"] == args.num_attention_heads
    assert info["ple_width"] == (args.hidden_size_per_layer_input or 0)
    assert info["final_softcap"] == pytest.approx(args.final_logit_softcapping or 0.0)
    assert info["tie_embeddings"] == args.tie_word_embeddings
    assert (info["num_experts"], info["top_k_experts"], info["moe_width"]) == (
        (args.num_experts, args.top_k_experts, args.moe_intermediate_size) if args.enable_moe_block else (0, 0, 0))
    m = args.num_hidden_layers - args.num_kv_shared_layers
    assert len(info["layers"]) == len(inner.layers)
    for i, (got, layer) in enumerate(zip(info["layers"], inner.layers)):
        a = layer.self_attn
        want = {"kind": "full" if layer.layer_type == F else "sliding", "head_dim": a.head_dim,
                "kv_heads": a.n_kv_heads, "k_eq_v": bool(a.use_k_eq_v),
                "kv_source": -1 if i < m else inner.previous_kvs[i],
                "mlp_width": layer.mlp.gate_proj.weight.shape[0], "moe": bool(layer.enable_moe),
                "window": 0 if layer.layer_type == F else args.sliding_window}
        assert {k: got[k] for k in want} == want, f"layer {i}"
        rope = got["rope"]
        if isinstance(a.rope, ProportionalRoPE):
            assert rope["type"] == "proportional"
            d = a.head_dim
            rot = int(d * rope["partial_factor"])
            ours = rope["factor"] * rope["theta"] ** (np.arange(0, rot, 2, dtype=np.float32) / d)
            ref = np.array(a.rope._freqs)
            assert np.isinf(ref[len(ours):]).all() and len(ref) == d // 2
            np.testing.assert_allclose(ours, ref[:len(ours)], rtol=1e-6)
        else:
            assert rope["type"] == "default"
            assert rope["theta"] == pytest.approx(a.rope.base)
