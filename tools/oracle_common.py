"""Shared helpers for the mlx-lm oracle scripts (make_fixtures.py, make_bench_checkpoint.py,
bench_vs_mlx.py).

Everything here drives mlx-lm's OWN code paths (model classes, quantize_model, save_model,
save_config, load_model, generate_step); nothing re-implements the model. The engine is compared
against what these functions produce.
"""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Callable, Dict, Optional, Union

import numpy as np
import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten

import mlx_lm.utils as mlu
from mlx_lm.models import gemma4, gemma4_text


def rope_parameters() -> dict:
    """The rope block every real Gemma 4 config.json spells out (spec §1.2)."""
    return {
        "full_attention": {
            "partial_rotary_factor": 0.25,
            "rope_theta": 1000000.0,
            "rope_type": "proportional",
        },
        "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
    }


def build_model(config: dict) -> nn.Module:
    """Builds the mlx-lm model class that mlx-lm's loader would pick for this config.json
    (gemma4 wrapper for a nested config, gemma4_text for a flat one)."""
    if config["model_type"] == "gemma4":
        return gemma4.Model(gemma4.ModelArgs.from_dict(copy.deepcopy(config)))
    if config["model_type"] == "gemma4_text":
        return gemma4_text.Model(gemma4_text.ModelArgs.from_dict(copy.deepcopy(config)))
    raise ValueError(f"unsupported model_type {config['model_type']}")


def local_path(path: str) -> str:
    """Module path with the wrapper prefix removed: 'language_model.model.layers.0.mlp' and
    'model.layers.0.mlp' both give 'layers.0.mlp'."""
    for p in ("language_model.model.", "model."):
        if path.startswith(p):
            return path[len(p):]
    return path


def random_params(model: nn.Module, rng: np.random.Generator, emb_std_mult: float = 1.0,
                  final_norm_mult: float = 3.0, post_norm_mult: float = 1.5) -> dict:
    """Random float32 values for every parameter of `model`, shaped like the originals.

    - RMSNorm weights ~ 1 + 0.2 N(0,1) (Gemma 4 has no (1+w): a wrong form shows at once);
      q_norm is halved (~0.5 + 0.1 N): with SDPA scale 1.0 and unit-RMS q, k the attention
      scores would have std sqrt(D) and the softmax becomes so peaky that rounding noise is
      amplified ~1000x; at half scale a 1e-6 weight perturbation moves logits by ~2e-4;
    - layer_scalar ~ U(0.6, 1.2); router.scale, per_expert_scale ~ U(0.5, 1.5);
    - embed_tokens ~ N(0, (emb_std_mult/sqrt(d))^2): h0 = E*sqrt(d) is O(emb_std_mult) and the tied
      head gives logits with std ~ emb_std_mult, well inside the softcap 30 but not flat;
    - every other matrix ~ N(0, 1/in) so activations stay O(1).
    """
    out = {}
    for name, p in tree_flatten(model.parameters()):
        shape = p.shape
        if name.endswith("norm.weight") or name.endswith("layernorm.weight") \
                or re.search(r"layernorm(_\d)?\.weight$", name):
            v = 1.0 + 0.2 * rng.standard_normal(shape)
            if name.endswith("q_norm.weight"):
                v = 0.5 * v
            elif name.endswith("model.norm.weight"):
                v = final_norm_mult * v
            elif re.search(r"post_[a-z_]*norm(_\d)?\.weight$", name):
                v = post_norm_mult * v
        elif name.endswith("layer_scalar"):
            v = rng.uniform(0.6, 1.2, shape)
        elif name.endswith("router.scale") or name.endswith("per_expert_scale"):
            v = rng.uniform(0.5, 1.5, shape)
        elif name.endswith("embed_tokens.weight"):
            v = rng.standard_normal(shape) * (emb_std_mult / np.sqrt(shape[-1]))
        elif name.endswith("embed_tokens_per_layer.weight"):
            v = rng.standard_normal(shape) * (1.0 / np.sqrt(16.0))
        else:
            v = rng.standard_normal(shape) * (1.0 / np.sqrt(shape[-1]))
        out[name] = mx.array(v.astype(np.float32))
    return out


def quantize(model: nn.Module, config: dict, bits: int, group_size: int,
             overrides: Optional[Callable[[str, nn.Module], Union[bool, dict, None]]] = None):
    """mlx-lm's own quantize_model. `overrides(path, module)` may return a to_quantized kwargs
    dict, False (kept in float; recorded as a `false` entry in the block, as OptiQ-style converters
    write it), or None (fall back to the model's own quant_predicate, which forces router.proj to
    8-bit g64). Returns the new config with the `quantization` block."""
    base_pred = model.quant_predicate
    disabled = []

    def pred(path, module):
        if overrides is not None:
            r = overrides(path, module)
            if r is False:
                disabled.append(path)
                return False
            if r is not None:
                return dict(r)
        return base_pred(path, module)

    model, qconfig = mlu.quantize_model(model, config, group_size, bits, quant_predicate=pred)
    for p in disabled:
        qconfig["quantization"][p] = False
    qconfig["quantization_config"] = qconfig["quantization"]
    return model, qconfig


def save_checkpoint(model: nn.Module, config: dict, out_dir: Path,
                    max_shard_bytes: Optional[int] = None) -> None:
    """mlx-lm's own save_model + save_config. With `max_shard_bytes`, mlx-lm's size-based
    sharding runs with a tiny limit (its make_shards takes whole GB only, so the same greedy
    split is applied with a byte limit), producing model-0000x-of-0000y.safetensors + index."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if max_shard_bytes is None:
        mlu.save_model(out_dir, model)
    else:
        orig = mlu.make_shards

        def tiny_shards(weights, max_file_size_gb=None):
            shards, size = [], 0
            for k, v in weights.items():
                if not shards or size + v.nbytes > max_shard_bytes:
                    shards.append({})
                    size = 0
                shards[-1][k] = v
                size += v.nbytes
            return shards

        mlu.make_shards = tiny_shards
        try:
            mlu.save_model(out_dir, model)
        finally:
            mlu.make_shards = orig
    mlu.save_config(copy.deepcopy(config), out_dir / "config.json")


def load(path: Path):
    """mlx-lm's own loader (sanitize, quantization block, strict weight check)."""
    model, config = mlu.load_model(Path(path))
    return model, config


def chunked_logits(model, ids, chunk=None, after_call=None) -> np.ndarray:
    """Logits [L, V] (f32) of every position of `ids` with a fresh mlx-lm cache (make_cache): one
    forward over all ids, or consecutive forwards of `chunk` tokens sharing the cache;
    after_call(cache), when given, runs after every forward (it may replace cache entries)."""
    cache = model.make_cache()
    step = chunk or len(ids)
    outs = []
    for i in range(0, len(ids), step):
        o = model(mx.array(ids[i:i + step], dtype=mx.int32)[None], cache=cache)
        o = o[0].astype(mx.float32)
        mx.eval(o)
        outs.append(np.array(o))
        if after_call:
            after_call(cache)
    return np.concatenate(outs, axis=0)


def derived_stamp(script: Path, fixtures: Path) -> str:
    """The stamp of a script that derives references from the fixtures in `fixtures`: its own
    text, the mlx / mlx-lm versions and the fixtures' stamp (regenerated checkpoints need new
    references)."""
    import hashlib
    import mlx_lm
    h = hashlib.sha256(Path(script).read_bytes())
    h.update(f"mlx={mx.__version__} mlx_lm={mlx_lm.__version__}".encode())
    st = Path(fixtures) / ".stamp"
    h.update(st.read_bytes() if st.exists() else b"")
    return h.hexdigest()


def up_to_date(args, stamp_file: Path, outputs, stamp: str) -> bool:
    """Whether a derived-reference script has nothing to do: no --force, every output exists and
    stamp_file holds `stamp` (derived_stamp)."""
    return (not args.force and all(Path(o).exists() for o in outputs) and stamp_file.exists()
            and stamp_file.read_text().strip() == stamp)


def derived_args(doc: str):
    """--fixtures DIR [--force], the command line of the scripts that derive references."""
    import argparse
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--fixtures", required=True, type=Path)
    ap.add_argument("--force", action="store_true", help="regenerate even if the stamp matches")
    args = ap.parse_args()
    mx.set_default_device(mx.cpu)
    return args


# Special tokens of the tiny chat vocabulary (ids 500...): the Gemma 4 names the template writes.
TINY_SPECIALS_START = 500
TINY_SPECIALS = ["<|image|>", "<|image>", "<image|>", "<|turn>", "<turn|>", "<|channel>", "<channel|>",
                 "<|tool_call>", "<tool_call|>", "<|\"|>", "<|think|>", "<mask>"]


def write_tiny_chat_files(out: Path, vocab_size: int) -> None:
    """tokenizer.json / tokenizer_config.json / chat_template.jinja of a tiny Gemma-style BPE
    vocabulary (made with the tokenizers library) for a fixture of `vocab_size` >= 512 ids: <pad>
    <eos> <bos> <unk>, the 256 byte tokens, "▁", letters, digits and punctuation as single
    characters (no merges), unused fillers, then the Gemma 4 special tokens TINY_SPECIALS from id
    TINY_SPECIALS_START; the official Gemma 4 chat template."""
    from tokenizers import Tokenizer, decoders, models, normalizers, AddedToken
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for ch in "\u2581abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,?!:;'-_()\n":
        vocab.setdefault(ch, len(vocab))
    while len(vocab) < TINY_SPECIALS_START:
        vocab[f"<unused{len(vocab)}>"] = len(vocab)
    for t in TINY_SPECIALS:
        vocab[t] = len(vocab)
    assert len(vocab) <= vocab_size
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True, fuse_unk=False))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in
                            ["<pad>", "<eos>", "<bos>", "<unk>"] + TINY_SPECIALS])
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}) + "\n")
    tpl = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "templates" / "gemma4.jinja"
    (out / "chat_template.jinja").write_text(tpl.read_text())
