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
    assert info["kv_cache_bytes"] == {"f32": 4 * elems, "bf16": 2 * elems}
