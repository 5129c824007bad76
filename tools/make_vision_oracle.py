#!/usr/bin/env python3
"""Tiny Gemma 4 image+text checkpoints made and run by mlx-vlm's own gemma4 model, with images and
HF's own image preprocessing, for the vision-input tests.

Usage: tools/make_vision_oracle.py --fixtures tests/fixtures/generated [--force]

Writes vision/<case>/ (under the fixtures directory, apart from the text fixtures the model tests
enumerate): config.json (model_type gemma4 with text_config and vision_config, image / boi / eoi
token ids inside the tiny vocabulary), model.safetensors (mlx-vlm's names: language_model.model.*,
vision_tower.*, embed_vision.*; f32, seeded random), images (PNG) and oracle.npz:
  <image>_pixels     f32 [patches, 768]   HF Gemma4ImageProcessorPil's pixel_values (real patches)
  <image>_positions  i32 [patches, 2]     its image_position_ids (x, y)
  <image>_pooled     f32 [soft, d_v]      mlx-vlm vision_tower output (pooled, ·√d_v, standardized)
  <image>_features   f32 [soft, d_text]   mlx-vlm embed_vision(vision_tower(...))
  ids                i32 [L]              a prompt: text, boi, soft × image, eoi for each image, text
  logits             f32 [L, V]           mlx-vlm Model(ids, pixel_values, image_position_ids)
  logits_wide2       f32 [L, V]           the same with wide2.png (same size, other content) first
  logits_causal      f32 [L, V]           (bidi) the same without the image-block overlay
The "clipped" case is also a chat model: tokenizer.json (a tiny Gemma-style BPE vocabulary:
bytes, characters and the Gemma 4 special tokens, made with the tokenizers library), the official
Gemma 4 chat template, and in oracle.npz:
  chat_ids           i32 [C]              the template's rendering (transformers' renderer) of one
                                          user turn holding wide.png and CHAT_TEXT, tokenized, with
                                          the image token expanded to boi + soft × image + eoi
  chat_greedy        i32 [<= 10]          mlx-vlm's greedy continuation (stops at <eos> / <turn|>)
  max_soft_tokens    i32                  the processor's budget
The text model is the E-style fixture's architecture (PLE, KV sharing; causal, as E2B/E4B) for
"clipped" (clipped linears, E2B/E4B style) and "standardize"; "bidi" is 26B/31B style: the dense
K=V fixture's text model with use_bidirectional_attention = "vision" and a standardizing encoder;
"unified" is the 12B's encoder-free embedder (mlx-vlm's gemma4_unified model and processor; see
unified_case).
"""
from __future__ import annotations

import copy
import importlib.util
import json
import re
import sys
import time
import types
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import oracle_common as oc  # noqa: E402

import mlx.core as mx  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402


def import_mlx_vlm_gemma4():
    """mlx-vlm's gemma4 model package without mlx_vlm/__init__.py (see make_mtp_oracle.py)."""
    if "mlx_vlm" in sys.modules:  # stubbed already
        root = Path(sys.modules["mlx_vlm"].__path__[0])
    else:
        spec = importlib.util.find_spec("mlx_vlm")
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit("make_vision_oracle.py: mlx-vlm is not installed (requirements-nodeps.txt)")
        root = Path(list(spec.submodule_search_locations)[0])
    for name in ("mlx_vlm", "mlx_vlm.models"):
        if name not in sys.modules:
            m = types.ModuleType(name)
            m.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
            sys.modules[name] = m
    from mlx_vlm.models.gemma4 import gemma4 as g
    from mlx_vlm.models.gemma4.config import ModelConfig, TextConfig, VisionConfig
    return g.Model, ModelConfig, TextConfig, VisionConfig


IMAGE_TOKEN, BOI, EOI = oc.TINY_SPECIALS_START, oc.TINY_SPECIALS_START + 1, oc.TINY_SPECIALS_START + 2
SPECIALS = oc.TINY_SPECIALS
write_chat_files = oc.write_tiny_chat_files
CHAT_TEXT = "What is in this picture?"
CHAT_STEPS = 10
MAX_SOFT = 70

# (name, vision_config overrides, seed, text fixture, bidirectional image blocks)
CASES = [
    ("clipped", {"use_clipped_linears": True, "standardize": False}, 41, "estyle-q4g64", False),
    ("standardize", {"use_clipped_linears": False, "standardize": True, "num_key_value_heads": 1}, 42,
     "estyle-q4g64", False),
    # 26B/31B style: K=V full layers, sliding window 8 (shorter than an image), and
    # use_bidirectional_attention = "vision": each image's tokens attend to each other.
    ("bidi", {"use_clipped_linears": False, "standardize": True}, 43, "dense-q4g64", True),
]


def text_config(fixtures: Path, name: str, bidi: bool) -> dict:
    cfg = json.loads((fixtures / name / "config.json").read_text())
    tc = copy.deepcopy(cfg.get("text_config", cfg))
    for k in ("quantization", "quantization_config"):
        tc.pop(k, None)
    tc["model_type"] = "gemma4_text"
    if bidi:
        tc["use_bidirectional_attention"] = "vision"
    return tc


def vision_config(over: dict) -> dict:
    vc = {"model_type": "gemma4_vision", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 16, "patch_size": 16,
          "pooling_kernel_size": 3, "position_embedding_size": 64, "default_output_length": MAX_SOFT,
          "rms_norm_eps": 1e-6, "rope_parameters": {"rope_theta": 100.0, "rope_type": "default"}}
    vc.update(over)
    return vc


def images(rng: np.random.Generator):
    """Synthetic RGB images with structure (gradients, blocks, noise) in sizes that need both
    down- and up-scaling and a thin one that hits the processor's 0-side rule."""
    out = {}
    for name, (h, w) in {"wide": (181, 343), "tall": (412, 97), "small": (40, 61), "thin": (20, 900),
                         "wide2": (181, 343)}.items():
        y, x = np.mgrid[0:h, 0:w]
        img = np.stack([(x * 255 // max(w - 1, 1)), (y * 255 // max(h - 1, 1)), ((x // 7 + y // 5) % 2) * 200], -1)
        img = img + rng.integers(0, 40, size=img.shape)
        if name == "wide2":  # the same size as "wide", other content: as many soft tokens
            img = img[::-1, ::-1] // 2 + 60
        out[name] = np.clip(img, 0, 255).astype(np.uint8)
    return out


def random_weights(model, rng):
    """oc.random_params for every tensor; the ClippableLinear bounds (0-d) clip part of the
    activations: inputs to [-2, 2], outputs to [-1.5, 1.5]."""
    bound = {"input_min": -2.0, "input_max": 2.0, "output_min": -1.5, "output_max": 1.5}
    params = {name: mx.array(bound[name.rsplit(".", 1)[1]], dtype=mx.float32)
              for name, p in tree_flatten(model.parameters()) if p.ndim == 0}
    params.update(oc.random_params(_WithoutScalars(model), rng))
    return params


class _WithoutScalars:
    """model.parameters() without the 0-d clip bounds (oc.random_params shapes by the last dim)."""

    def __init__(self, model):
        self.model = model

    def parameters(self):
        from mlx.utils import tree_unflatten
        return tree_unflatten([(k, v) for k, v in tree_flatten(self.model.parameters()) if v.ndim > 0])


def chat_oracle(model, out: Path, proc, pv, pos, soft: int):
    """The rendered, tokenized, expanded chat prompt with wide.png and mlx-vlm's greedy reply."""
    import make_template_corpus as corpus
    from tokenizers import Tokenizer
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": CHAT_TEXT}]}]
    text = corpus.reference_render((out / "chat_template.jinja").read_text(), msgs, None, False, True)
    raw = Tokenizer.from_file(str(out / "tokenizer.json")).encode(text, add_special_tokens=False).ids
    ids = []
    for t in raw:
        ids += [BOI] + [IMAGE_TOKEN] * soft + [EOI] if t == IMAGE_TOKEN else [t]
    stops = {1, IMAGE_TOKEN + SPECIALS.index("<turn|>")}
    reply = []
    for _ in range(CHAT_STEPS):
        lg = model(mx.array(ids + reply, dtype=mx.int32)[None], pixel_values=[mx.array(pv)],
                   image_position_ids=[mx.array(pos)])
        t = int(mx.argmax(getattr(lg, "logits", lg)[0, -1]).item())
        reply.append(t)
        if t in stops:
            break
    return np.array(ids, dtype=np.int32), np.array(reply, dtype=np.int32)


def import_mlx_vlm_unified():
    import_mlx_vlm_gemma4()  # the package stubs
    from mlx_vlm.models.gemma4_unified import gemma4_unified as gu
    from mlx_vlm.models.gemma4_unified.config import ModelConfig, TextConfig, VisionConfig
    from mlx_vlm.models.gemma4_unified.processing_gemma4_unified import Gemma4UnifiedImageProcessor
    return gu.Model, ModelConfig, TextConfig, VisionConfig, Gemma4UnifiedImageProcessor


def unified_case(fixtures: Path, root: Path) -> str:
    """The 12B's encoder-free embedder (gemma4_unified) over the dense K=V text model, with
    mlx-vlm's own model and image processor. The text model is causal here: mlx-vlm 0.7.10's
    gemma4_unified Model does not pass mm_token_type_ids to its text model, so it never applies the
    image-block overlay (the 26B-style "bidi" case checks that overlay through mlx-vlm's gemma4)."""
    from PIL import Image
    Model, ModelConfig, TextConfig, VisionConfig, Processor = import_mlx_vlm_unified()
    rng = np.random.default_rng(44)
    tc = text_config(fixtures, "dense-q4g64", False)
    vc = {"model_type": "gemma4_unified_vision", "patch_size": 16, "pooling_kernel_size": 3, "model_patch_size": 48,
          "mm_embed_dim": 48, "mm_posemb_size": 64, "num_soft_tokens": MAX_SOFT, "rms_norm_eps": 1e-6,
          "output_proj_dims": 48}
    cfg = {"model_type": "gemma4_unified", "text_config": tc, "vision_config": vc, "audio_config": None,
           "vocab_size": tc["vocab_size"], "image_token_id": IMAGE_TOKEN, "boi_token_id": BOI, "eoi_token_id": EOI,
           "vision_soft_tokens_per_image": MAX_SOFT, "tie_word_embeddings": True, "eos_token_id": [1]}
    model = Model(ModelConfig(text_config=TextConfig.from_dict(tc), vision_config=VisionConfig.from_dict(vc),
                              audio_config=None, image_token_id=IMAGE_TOKEN, boi_token_id=BOI, eoi_token_id=EOI,
                              vocab_size=tc["vocab_size"]))
    params = oc.random_params(model, rng)
    for k in params:  # LayerNorms near identity, small biases
        if re.search(r"(ln\d|pos_norm)\.weight$", k):
            params[k] = mx.array((1.0 + 0.2 * rng.standard_normal(params[k].shape)).astype(np.float32))
        elif k.endswith(".bias"):
            params[k] = mx.array((0.1 * rng.standard_normal(params[k].shape)).astype(np.float32))
    model.load_weights(list(params.items()))
    out = root / "unified"
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), params)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    proc = Processor(max_soft_tokens=MAX_SOFT)
    rec = {"max_soft_tokens": np.int32(MAX_SOFT)}
    ids, pvs, poss = [2, 17, 33], [], []
    for iname, arr in images(rng).items():
        if iname == "thin":
            continue
        Image.fromarray(arr).save(out / f"{iname}.png")
        data, n = proc.preprocess([Image.open(out / f"{iname}.png")])
        pv, pos = data["pixel_values"][0], data["image_position_ids"][0]
        n = int(n[0])
        rec[f"{iname}_pixels"] = pv[:n].astype(np.float32)
        rec[f"{iname}_positions"] = pos[:n].astype(np.int32)
        emb = model.vision_embedder(mx.array(pv[None]), mx.array(pos[None]))
        rec[f"{iname}_pooled"] = np.array(emb[0, :n].astype(mx.float32))
        rec[f"{iname}_features"] = np.array(model.get_image_features(mx.array(pv[None]), mx.array(pos[None]))
                                            .astype(mx.float32))
        if iname in ("wide", "small"):
            ids += [BOI] + [IMAGE_TOKEN] * n + [EOI, 40 + len(pvs)]
            pvs.append(pv)
            poss.append(pos)
    ids += [45, 46]
    lg = model(mx.array(ids, dtype=mx.int32)[None], pixel_values=mx.array(np.stack(pvs)),
               image_position_ids=mx.array(np.stack(poss)))
    rec["ids"] = np.array(ids, dtype=np.int32)
    rec["logits"] = np.array(getattr(lg, "logits", lg)[0].astype(mx.float32))
    np.savez(out / "oracle.npz", **rec)
    return f"  unified      {len(ids)} prompt tokens, soft tokens per image " \
           f"{[rec[k].shape[0] for k in rec if k.endswith('_features')]}"


def main() -> int:
    args = oc.derived_args(__doc__)
    stamp = oc.derived_stamp(Path(__file__), args.fixtures)
    root = args.fixtures / "vision"
    stamp_file = root / ".stamp"
    if oc.up_to_date(args, stamp_file, [root / c[0] / "oracle.npz" for c in CASES] + [root / "unified" / "oracle.npz"],
                     stamp):
        print(f"vision oracle: up to date ({len(CASES)} cases)")
        return 0
    Model, ModelConfig, TextConfig, VisionConfig = import_mlx_vlm_gemma4()
    from PIL import Image
    from transformers.models.gemma4 import Gemma4ImageProcessorPil
    proc = Gemma4ImageProcessorPil(max_soft_tokens=MAX_SOFT)
    t0 = time.time()
    for name, over, seed, text_fixture, bidi in CASES:
        rng = np.random.default_rng(seed)
        tc, vc = text_config(args.fixtures, text_fixture, bidi), vision_config(over)
        cfg = {"model_type": "gemma4", "text_config": tc, "vision_config": vc, "audio_config": None,
               "vocab_size": tc["vocab_size"], "image_token_id": IMAGE_TOKEN, "boi_token_id": BOI,
               "eoi_token_id": EOI, "vision_soft_tokens_per_image": MAX_SOFT, "tie_word_embeddings": True,
               "eos_token_id": [1]}
        mcfg = ModelConfig(text_config=TextConfig.from_dict(tc), vision_config=VisionConfig.from_dict(vc),
                           image_token_id=IMAGE_TOKEN, boi_token_id=BOI, eoi_token_id=EOI,
                           vocab_size=tc["vocab_size"])
        model = Model(mcfg)
        params = random_weights(model, rng)
        model.load_weights(list(params.items()))
        out = root / name
        out.mkdir(parents=True, exist_ok=True)
        mx.save_safetensors(str(out / "model.safetensors"), params)
        (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        rec = {"max_soft_tokens": np.int32(MAX_SOFT)}
        ids = [2, 17, 33]
        pixels_all, pos_all = [], []
        for iname, arr in images(rng).items():
            Image.fromarray(arr).save(out / f"{iname}.png")
            pim = Image.open(out / f"{iname}.png")
            p = proc(images=[pim], return_tensors="np")
            pv, pos = p["pixel_values"][0], p["image_position_ids"][0]
            n_real = int((pos[:, 0] >= 0).sum())
            rec[f"{iname}_pixels"] = pv[:n_real].astype(np.float32)
            rec[f"{iname}_positions"] = pos[:n_real].astype(np.int32)
            pooled = model.vision_tower(mx.array(pv[None]), mx.array(pos[None]))
            feats = model.embed_vision(pooled)
            rec[f"{iname}_pooled"] = np.array(pooled[0].astype(mx.float32))
            rec[f"{iname}_features"] = np.array(feats[0].astype(mx.float32))
            if iname in ("wide", "small"):  # the prompt holds these two
                soft = int(p["num_soft_tokens_per_image"][0])
                assert soft == rec[f"{iname}_features"].shape[0]
                ids += [BOI] + [IMAGE_TOKEN] * soft + [EOI, 40 + len(pixels_all)]
                pixels_all.append(pv)
                pos_all.append(pos)
        ids += [45, 46]

        def run(pixels, positions, blocks=bidi):
            kw = {"mm_token_type_ids": mx.array([[int(t == IMAGE_TOKEN) for t in ids]], dtype=mx.int32)} if blocks else {}
            lg = model(mx.array(ids, dtype=mx.int32)[None], pixel_values=[mx.array(x) for x in pixels],
                       image_position_ids=[mx.array(x) for x in positions], **kw)
            return np.array(getattr(lg, "logits", lg)[0].astype(mx.float32))
        rec["ids"] = np.array(ids, dtype=np.int32)
        rec["logits"] = run(pixels_all, pos_all)
        if bidi:
            rec["logits_causal"] = run(pixels_all, pos_all, blocks=False)
        if name == "clipped":
            write_chat_files(out, tc["vocab_size"])
            rec["chat_ids"], rec["chat_greedy"] = chat_oracle(model, out, proc, pixels_all[0], pos_all[0],
                                                              rec["wide_features"].shape[0])
        p2 = proc(images=[Image.open(out / "wide2.png")], return_tensors="np")
        rec["logits_wide2"] = run([p2["pixel_values"][0], pixels_all[1]], [p2["image_position_ids"][0], pos_all[1]])
        np.savez(out / "oracle.npz", **rec)
        print(f"  {name:12s} {len(ids)} prompt tokens, soft tokens per image "
              f"{[rec[k].shape[0] for k in rec if k.endswith('_features')]}", flush=True)
    print(unified_case(args.fixtures, root), flush=True)
    stamp_file.write_text(stamp + "\n")
    print(f"vision oracle: {len(CASES) + 1} cases in {time.time() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
