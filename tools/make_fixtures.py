#!/usr/bin/env python3
"""Tiny random Gemma 4 checkpoints + reference outputs, produced by mlx-lm itself.

Usage: tools/make_fixtures.py --out tests/fixtures/generated [--force] [--only NAME,...]

Each fixture is a directory laid out exactly as mlx-lm writes a converted model:
  config.json (with the `quantization` block when quantized), model.safetensors (or shards
  model-0000x-of-0000y.safetensors) and model.safetensors.index.json,
plus `oracle.npz`, computed by loading that directory back with mlx_lm.utils.load_model:
  prompt_ids        int32 [L]      BOS 2 first, then 105 (<start_of_turn>), then random ids
  logits_f32        f32 [L, V]     one forward over the whole prompt, params cast to float32
  logits_bf16       f32 [L, V]     same, checkpoint dtype (bf16) (stored upcast, exact)
  greedy_f32        int32 [S]      greedy ids from mlx_lm.generate.generate_step, f32 params
  greedy_f32_logits f32 [S, V]     the logits each f32 greedy id was picked from
  greedy_bf16       int32 [S]      greedy ids, checkpoint dtype
  greedy_bf16_logits f32 [S, V]    the logits each bf16 greedy id was picked from
  prefill_step_size int32 []       generate_step's prefill chunk (mlx-lm default 2048)
  mlx_chunk_maxdiff_f32 f32 []     max|d| of mlx-lm's own --chunk 5 / --chunk 1 f32 logits vs
                                   its unchunked ones (the floor for the chunking tolerance)
and `fixture.json` describing what the fixture exercises. The bf16 entries are absent for the
unquantized MoE fixtures (moe-bf16, moe-hf): MLX's CPU gather_mm runs in float32 only.
The prompt (length fixed per variant) is the first of up to 6 seeded candidates whose greedy
runs have no near-tie step (top-2 logit gap >= 0.01 in f32, >= 0.07 in bf16), so the engine's
greedy ids can be required to be identical.

Variants (hidden 128, head_dim 32 / global_head_dim 64, vocab 512, sliding window 8 < prompt):
  dense   flat gemma4_text config; attention_k_eq_v with num_global_key_value_heads;
  estyle  nested gemma4 config (text_config); PLE, num_kv_shared_layers, double-wide MLP;
  moe     nested gemma4 config; MoE block (8 experts, top-2) + k_eq_v full layers;
each as bf16, q4g64, q8g32 and `mixed` (per-module overrides with 2/3/5/6/8 bits, g32/g64/g128
and `false` entries). Extra: estyle-q4g64-sharded (tiny shards), moe-hf and estyle-hf (HF naming:
model.language_model.*, experts.gate_up_proj unsanitized, KV-shared layers still carrying k/v).

Deterministic (seeded numpy RNG). Skips work when every output exists and the stamp (hash of this
script, oracle_common.py and the mlx / mlx-lm versions) matches.
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import oracle_common as oc  # noqa: E402

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
from mlx.utils import tree_flatten, tree_unflatten  # noqa: E402
import mlx_lm  # noqa: E402
from mlx_lm.generate import generate_step  # noqa: E402

S_ = "sliding_attention"
F_ = "full_attention"
VOCAB = 512
DECODE_STEPS = 16
PREFILL_STEP = 2048  # mlx_lm.generate default


def text_config(**kw) -> dict:
    base = {
        "model_type": "gemma4_text",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "global_head_dim": 64,
        "rms_norm_eps": 1e-6,
        "vocab_size": VOCAB,
        "vocab_size_per_layer_input": VOCAB,
        "hidden_size_per_layer_input": 0,
        "num_kv_shared_layers": 0,
        "use_double_wide_mlp": False,
        "attention_k_eq_v": False,
        "num_global_key_value_heads": None,
        "enable_moe_block": False,
        "sliding_window": 8,
        "final_logit_softcapping": 30.0,
        "tie_word_embeddings": True,
        "rope_parameters": oc.rope_parameters(),
        "max_position_embeddings": 131072,
        "hidden_activation": "gelu_pytorch_tanh",
        "pad_token_id": 0,
        "eos_token_id": 1,
        "bos_token_id": 2,
    }
    base.update(kw)
    base["num_hidden_layers"] = len(base["layer_types"])
    return base


def nested(tc: dict) -> dict:
    """A multimodal-style config.json as HF / mlx-community ship it (top-level gemma4,
    text settings under text_config); mlx-lm's save_config drops vision_config."""
    return {
        "model_type": "gemma4",
        "architectures": ["Gemma4ForConditionalGeneration"],
        "vocab_size": tc["vocab_size"],
        "text_config": tc,
        "vision_config": {"model_type": "gemma4_vision", "hidden_size": 64},
        "audio_config": None,
        "eos_token_id": [1, 106],
        "image_token_id": 258880,
        "boi_token_id": 255999,
        "tie_word_embeddings": True,
    }


VARIANTS = {
    "dense": dict(
        seed=101,
        config=text_config(
            layer_types=[S_, S_, F_, S_, S_, F_],
            attention_k_eq_v=True,
            num_global_key_value_heads=1,
            num_kv_shared_layers=0,
            use_double_wide_mlp=False,
            hidden_size_per_layer_input=0,
        ),
        nested=False,
        prompt_len=33,
        what="flat gemma4_text; k_eq_v full layers (1 global KV head) vs 2 KV heads sliding; "
             "proportional RoPE; window 8",
    ),
    "estyle": dict(
        seed=202,
        config=text_config(
            layer_types=[S_, S_, F_, S_, S_, F_, S_, F_],
            hidden_size_per_layer_input=64,
            num_kv_shared_layers=3,
            use_double_wide_mlp=True,
            num_key_value_heads=1,
        ),
        nested=True,
        prompt_len=29,
        what="nested gemma4; PLE width 64; 3 KV-shared layers (donors: sliding 4, full 2); "
             "double-wide MLP on shared layers; window 8",
    ),
    "moe": dict(
        seed=303,
        config=text_config(
            layer_types=[S_, S_, F_, S_, F_],
            attention_k_eq_v=True,
            num_global_key_value_heads=2,
            num_key_value_heads=2,
            enable_moe_block=True,
            num_experts=8,
            top_k_experts=2,
            moe_intermediate_size=128,
            intermediate_size=192,
        ),
        nested=True,
        prompt_len=38,
        what="nested gemma4; MoE 8 experts top-2 (expert I=128) in parallel with dense MLP "
             "(I=192); k_eq_v full layers with 2 global KV heads; window 8",
    ),
}

# Mixed precision: per-module overrides keyed by the module path with the wrapper prefix
# removed. Everything not named here gets the default (4-bit g64; router.proj 8-bit g64 from
# the model's own quant_predicate; modules whose input width the group does not divide stay float).
MIXED_OVERRIDES = {
    "embed_tokens": {"group_size": 64, "bits": 6},
    "layers.0.self_attn.q_proj": {"group_size": 32, "bits": 3},
    "layers.0.self_attn.o_proj": {"group_size": 128, "bits": 5},
    "layers.0.mlp.down_proj": {"group_size": 64, "bits": 2},
    "layers.1.self_attn.k_proj": False,
    "layers.1.mlp.gate_proj": {"group_size": 32, "bits": 6},
    "layers.1.mlp.up_proj": {"group_size": 128, "bits": 3},
    "layers.2.self_attn.q_proj": {"group_size": 128, "bits": 8},
    "layers.2.self_attn.k_proj": {"group_size": 32, "bits": 5},
    "layers.2.mlp.down_proj": False,
    "layers.3.self_attn.v_proj": {"group_size": 64, "bits": 3},
    "layers.4.mlp.up_proj": {"group_size": 32, "bits": 2},
    # PLE
    "embed_tokens_per_layer": {"group_size": 32, "bits": 5},
    "per_layer_model_projection": {"group_size": 128, "bits": 3},
    "layers.0.per_layer_input_gate": {"group_size": 64, "bits": 6},
    "layers.1.per_layer_projection": False,
    # MoE
    "layers.0.experts.switch_glu.gate_proj": {"group_size": 64, "bits": 3},
    "layers.0.experts.switch_glu.up_proj": {"group_size": 32, "bits": 6},
    "layers.0.experts.switch_glu.down_proj": {"group_size": 128, "bits": 5},
    "layers.1.router.proj": {"group_size": 32, "bits": 6},
    "layers.2.experts.switch_glu.down_proj": {"group_size": 32, "bits": 8},
}

QUANTS = {
    "bf16": None,
    "q4g64": dict(bits=4, group_size=64),
    "q8g32": dict(bits=8, group_size=32),
    "mixed": dict(bits=4, group_size=64, overrides=MIXED_OVERRIDES),
}


def fixture_list():
    """(name, variant, quant, extra) for every fixture."""
    out = []
    for v in VARIANTS:
        for q in QUANTS:
            out.append((f"{v}-{q}", v, q, {}))
    out.append(("estyle-q4g64-sharded", "estyle", "q4g64", {"max_shard_bytes": 96 * 1024}))
    out.append(("moe-hf", "moe", "bf16", {"hf": True}))
    out.append(("estyle-hf", "estyle", "bf16", {"hf": True}))
    return out


def full_config(variant: str) -> dict:
    spec = VARIANTS[variant]
    tc = copy.deepcopy(spec["config"])
    return nested(tc) if spec["nested"] else tc


def build_bf16_model(variant: str):
    """The variant's model with seeded random weights, cast to bf16 (what a converter starts from)."""
    spec = VARIANTS[variant]
    config = full_config(variant)
    model = oc.build_model(config)
    rng = np.random.default_rng(spec["seed"])
    params = oc.random_params(model, rng)
    model.update(tree_unflatten(list(params.items())))
    model.set_dtype(mx.bfloat16)
    mx.eval(model.parameters())
    return model, config


def make_overrides(table):
    def f(path, module):
        lp = oc.local_path(path)
        if lp in table:
            r = table[lp]
            if r is False:
                return False
            if module.weight.shape[-1] % r["group_size"] != 0:
                raise ValueError(f"override {lp}: group {r['group_size']} does not divide "
                                 f"{module.weight.shape[-1]}")
            return r
        return None
    return f


def hf_weights(model, config, rng) -> dict:
    """The bf16 weights renamed the way an HF Gemma4ForConditionalGeneration checkpoint names
    them (the inverse of mlx-lm's gemma4.Model.sanitize + gemma4_text.Model.sanitize):
    'language_model.model.X' -> 'model.language_model.X'; experts switch_glu gate/up stacked
    into experts.gate_up_proj [E, 2I, d], down into experts.down_proj [E, d, I]; KV-shared
    layers get k_proj/v_proj/k_norm tensors (which the loader must drop); plus vision-tower
    and embed_vision tensors (which the loader must ignore)."""
    w = dict(tree_flatten(model.parameters()))
    out = {}
    tc = config["text_config"]
    for k, v in w.items():
        assert k.startswith("language_model.model."), k
        rest = k[len("language_model.model."):]
        if ".experts.switch_glu.up_proj.weight" in rest:
            continue
        if ".experts.switch_glu.gate_proj.weight" in rest:
            base = rest.replace(".switch_glu.gate_proj.weight", "")
            up = w[k.replace("gate_proj", "up_proj")]
            out[f"model.language_model.{base}.gate_up_proj"] = mx.concatenate([v, up], axis=-2)
            continue
        if ".experts.switch_glu.down_proj.weight" in rest:
            base = rest.replace(".switch_glu.down_proj.weight", "")
            out[f"model.language_model.{base}.down_proj"] = v
            continue
        out[f"model.language_model.{rest}"] = v
    n, shared = tc["num_hidden_layers"], tc["num_kv_shared_layers"]
    d = tc["hidden_size"]
    for i in range(n - shared, n):
        full = tc["layer_types"][i] == F_
        hd = tc["global_head_dim"] if full else tc["head_dim"]
        kvh = tc["num_key_value_heads"]
        pre = f"model.language_model.layers.{i}.self_attn"
        out[f"{pre}.k_proj.weight"] = mx.array(
            rng.standard_normal((kvh * hd, d)).astype(np.float32)).astype(mx.bfloat16)
        out[f"{pre}.v_proj.weight"] = mx.array(
            rng.standard_normal((kvh * hd, d)).astype(np.float32)).astype(mx.bfloat16)
        out[f"{pre}.k_norm.weight"] = mx.ones((hd,), dtype=mx.bfloat16)
    out["model.vision_tower.patch_embedder.input_proj.weight"] = mx.zeros((64, 48), mx.bfloat16)
    out["model.embed_vision.embedding_projection.weight"] = mx.zeros((d, 64), mx.bfloat16)
    return dict(sorted(out.items()))


def write_checkpoint(name, variant, quant, extra, fdir: Path) -> dict:
    model, config = build_bf16_model(variant)
    q = QUANTS[quant]
    if extra.get("hf"):
        rng = np.random.default_rng(VARIANTS[variant]["seed"] + 7)
        fdir.mkdir(parents=True, exist_ok=True)
        weights = hf_weights(model, config, rng)
        mx.save_safetensors(str(fdir / "model.safetensors"), weights, metadata={"format": "pt"})
        cfg = copy.deepcopy(config)  # HF keeps vision_config; mlx-lm ignores unknown keys
        with open(fdir / "config.json", "w") as f:
            json.dump(cfg, f, indent=2)
        return cfg
    if q is not None:
        ov = make_overrides(q["overrides"]) if "overrides" in q else None
        model, config = oc.quantize(model, config, q["bits"], q["group_size"], ov)
    oc.save_checkpoint(model, config, fdir, max_shard_bytes=extra.get("max_shard_bytes"))
    return config


def prompt_ids(variant: str, attempt: int = 0) -> list:
    spec = VARIANTS[variant]
    rng = np.random.default_rng(spec["seed"] * 1000 + 1 + attempt)
    rest = rng.integers(3, VOCAB, size=spec["prompt_len"] - 2).tolist()
    return [2, 105] + [int(x) for x in rest]


full_logits = oc.chunked_logits


def greedy(model, ids, steps):
    """mlx_lm.generate.generate_step with an argmax sampler; a logits processor records the raw
    (softcapped) logits each token was picked from."""
    seen = []

    def capture(tokens, logits):
        seen.append(logits)
        return logits

    toks = []
    gen = generate_step(mx.array(ids, dtype=mx.int32), model, max_tokens=steps,
                        sampler=lambda lp: mx.argmax(lp, axis=-1),
                        logits_processors=[capture], prefill_step_size=PREFILL_STEP)
    for tok, _ in gen:
        toks.append(int(tok.item() if hasattr(tok, "item") else tok))
    lg = mx.concatenate(seen[:steps], axis=0).astype(mx.float32)
    mx.eval(lg)
    return np.array(toks, dtype=np.int32), np.array(lg)


# A greedy step whose two best logits are closer than this is a near-tie (bf16: one ulp or less at |logit| in [8, 16)): an engine that is
# correct to within rounding may pick either token. Prompts are chosen (deterministically, first
# attempt that passes) so that no reference greedy step is a near-tie.
MIN_GAP = {"f32": 0.01, "bf16": 0.07}
MAX_ATTEMPTS = 6


def top2_gap(logits: np.ndarray) -> float:
    s = np.sort(logits, axis=-1)
    return float((s[:, -1] - s[:, -2]).min())


def write_oracle(fdir: Path, variant: str, fixed_attempt=None) -> dict:
    m16, _ = oc.load(fdir)  # exactly as mlx-lm loads it
    m32, _ = oc.load(fdir)
    m32.set_dtype(mx.float32)  # float params -> f32; packed uint32 stays; scales upcast exactly
    has_bf16 = True
    best = None
    attempts = range(MAX_ATTEMPTS) if fixed_attempt is None else [fixed_attempt]
    for attempt in attempts:
        ids = prompt_ids(variant, attempt)
        res = {"prompt_ids": np.array(ids, dtype=np.int32)}
        res["greedy_f32"], res["greedy_f32_logits"] = greedy(m32, ids, DECODE_STEPS)
        gaps = {"f32": top2_gap(res["greedy_f32_logits"])}
        if gaps["f32"] < MIN_GAP["f32"] and fixed_attempt is None and best is not None:
            continue
        if has_bf16:
            try:
                res["greedy_bf16"], res["greedy_bf16_logits"] = greedy(m16, ids, DECODE_STEPS)
                gaps["bf16"] = top2_gap(res["greedy_bf16_logits"])
            except RuntimeError as e:
                # MLX's CPU gather_mm (unquantized experts) runs in float32 only, so an
                # unquantized MoE checkpoint has no bf16-mode reference on this machine.
                if "GatherMM" not in str(e):
                    raise
                print(f"  {fdir.name}: no bf16 reference ({e})", flush=True)
                has_bf16 = False
        ok = all(gaps[k] >= MIN_GAP[k] for k in gaps)
        score = min(gaps[k] / MIN_GAP[k] for k in gaps)
        if best is None or score > best[0]:
            best = (score, attempt, res, gaps)
        if ok:
            break
    _, attempt, res, gaps = best
    ids = res["prompt_ids"].tolist()
    res["logits_f32"] = full_logits(m32, ids)
    # How far mlx-lm's own chunked prefill (5 tokens, then 1 token at a time) lands from its own
    # unchunked forward in f32: the parity test's chunking tolerance is never tighter than this.
    res["mlx_chunk_maxdiff_f32"] = np.array(max(
        float(np.abs(full_logits(m32, ids, c) - res["logits_f32"]).max()) for c in (5, 1)),
        dtype=np.float32)
    if has_bf16:
        res["logits_bf16"] = full_logits(m16, ids)
    res["prefill_step_size"] = np.array(PREFILL_STEP, dtype=np.int32)
    for k in ("logits_bf16", "logits_f32", "greedy_f32_logits", "greedy_bf16_logits"):
        if k in res and not np.isfinite(res[k]).all():
            raise RuntimeError(f"{fdir.name}: non-finite values in {k}")
    np.savez(fdir / "oracle.npz", **res)
    lf = res["logits_f32"]
    return {"prompt_len": len(ids), "prompt_attempt": attempt,
            "greedy_min_top2_gap": gaps,
            "logit_std": float(lf.std()),
            "mlx_chunk_maxdiff_f32": float(res["mlx_chunk_maxdiff_f32"]),
            "logit_absmax": float(np.abs(lf).max()),
            "has_bf16": has_bf16,
            "bf16_vs_f32_maxdiff": float(np.abs(res["logits_bf16"] - lf).max())
            if has_bf16 else None,
            "greedy_f32": res["greedy_f32"].tolist(),
            "greedy_bf16": res["greedy_bf16"].tolist() if has_bf16 else None}


def stamp_value() -> str:
    h = hashlib.sha256()
    here = Path(__file__).resolve().parent
    for f in (here / "make_fixtures.py", here / "oracle_common.py"):
        h.update(f.read_bytes())
    h.update(f"mlx={mx.__version__} mlx_lm={mlx_lm.__version__}".encode())
    return h.hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--force", action="store_true", help="regenerate even if the stamp matches")
    ap.add_argument("--only", default="", help="comma-separated fixture names")
    args = ap.parse_args()

    mx.set_default_device(mx.cpu)
    out: Path = args.out
    fixtures = fixture_list()
    if args.only:
        keep = set(args.only.split(","))
        fixtures = [f for f in fixtures if f[0] in keep]
    stamp = stamp_value()
    stamp_file = out / ".stamp"
    complete = all((out / n / "oracle.npz").exists() for n, *_ in fixtures)
    if not args.force and not args.only and complete and stamp_file.exists() \
            and stamp_file.read_text().strip() == stamp:
        print(f"fixtures: up to date in {out} ({len(fixtures)} fixtures)")
        return 0

    out.mkdir(parents=True, exist_ok=True)
    if stamp_file.exists():
        stamp_file.unlink()
    t_all = time.time()
    index = {}
    chosen = {}  # (variant, quant) -> prompt attempt; the sharded / HF copies reuse it
    for done, (name, variant, quant, extra) in enumerate(fixtures):
        t0 = time.time()
        fdir = out / name
        if fdir.exists():
            shutil.rmtree(fdir)
        config = write_checkpoint(name, variant, quant, extra, fdir)
        info = write_oracle(fdir, variant, chosen.get((variant, quant)))
        chosen.setdefault((variant, quant), info["prompt_attempt"])
        info.update({"name": name, "variant": variant, "quant": quant,
                     "sharded": "max_shard_bytes" in extra, "hf_names": bool(extra.get("hf")),
                     "what": VARIANTS[variant]["what"], "decode_steps": DECODE_STEPS,
                     "nested_config": config.get("model_type") == "gemma4"})
        with open(fdir / "fixture.json", "w") as f:
            json.dump(info, f, indent=2)
        index[name] = {k: info[k] for k in ("variant", "quant", "prompt_len")}
        files = sorted(p.name for p in fdir.iterdir())
        elapsed = time.time() - t_all
        left = elapsed / (done + 1) * (len(fixtures) - done - 1)  # progress: count, elapsed, time left
        print(f"[{done + 1:2d}/{len(fixtures)} {elapsed:6.1f}s, ~{left:4.0f}s left] {name:24s} {time.time() - t0:5.1f}s  "
              f"logit std {info['logit_std']:.2f} absmax {info['logit_absmax']:.1f}  "
              f"prompt try {info['prompt_attempt']} gaps {info['greedy_min_top2_gap']}  "
              f"bf16-f32 maxdiff {info['bf16_vs_f32_maxdiff']}  files={len(files)}", flush=True)
    if not args.only:
        with open(out / "index.json", "w") as f:
            json.dump(index, f, indent=2)
        stamp_file.write_text(stamp + "\n")
    print(f"fixtures: {len(fixtures)} written to {out} in {time.time() - t_all:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
