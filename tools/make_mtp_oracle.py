#!/usr/bin/env python3
"""Gemma 4 assistant (MTP) drafters made and run by mlx-vlm's own drafter, with reference drafts.

Usage: tools/make_mtp_oracle.py --fixtures tests/fixtures/generated [--force]

For each case below, writes drafters/FIXTURE-drafter[-copy]/ (under the fixtures directory, apart
from the model fixtures, which the model tests enumerate) holding a drafter
checkpoint as HF / mlx-vlm store it (config.json with model_type gemma4_assistant and the
decoder's text_config; model.safetensors with model.embed_tokens / model.layers.* (q_proj, q_norm,
o_proj, the four layer norms, MLP, layer_scalar) / model.norm / pre_projection / post_projection
and, for ordered-embedding drafters, masked_embedding.centroids + masked_embedding.token_ordering
(int64, as HF stores it)). The module is mlx-vlm 0.7.10's Gemma4AssistantDraftModel with seeded
random weights; the target is the fixture loaded by mlx-lm with f32 parameters.

oracle.npz records:
  ids      int32 [L]       the fixture's prompt + its f32 greedy continuation
  first    int32 []        the first state n below
  drafts   int32 [S, K]    for each n in [first, L): the drafter's K argmax drafts from the state
                           "the target cached ids[:n], the next token is ids[n]" (mlx-vlm's own
                           draft_block, checked equal to the step-by-step loop that records:)
  logits   f32 [S*K, V]    the tied head's logits of every draft step
  states   f32 [S*K, B]    every step's post-projected state
  gen_prompt int32 [P], gen int32 [N], gen_rounds int32 [R, 2] (drafts, accepted)
                           greedy speculative decoding of N tokens (the round loop of mlx-vlm's
                           _mtp_rounds: draft, verify the token and the drafts in one forward,
                           accept while the target's argmax equals the next draft)
  greedy   int32 [N]       the target's plain greedy continuation of gen_prompt (what gen must be)

Window semantics: the drafter's query sits at the target's last cached position p and sees, on
sliding layers, the keys p-W < k <= p (HF Gemma4AssistantForCausalLM's flipped bidirectional
window over the sliding cache). mlx-vlm 0.7.10 maps the query one slot past the end of a wrapped
ring (_local_window_offset) and then drops the window's oldest key; so here the drafter gets
exactly the window's keys and mlx-vlm's mask builder is replaced by "no mask" (every key given is
visible), which is what HF computes. Everything else is mlx-vlm's code.

Skips work when every output exists and the stamp matches.
"""
from __future__ import annotations

import importlib.util
import json
import sys
import time
import types
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import oracle_common as oc  # noqa: E402

import mlx.core as mx  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402


def import_drafter():
    """mlx-vlm's drafter modules without mlx_vlm/__init__.py (which imports its server, audio and
    training stacks): the package objects are created empty and the submodules load as usual."""
    spec = importlib.util.find_spec("mlx_vlm")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("make_mtp_oracle.py: mlx-vlm is not installed (requirements-nodeps.txt)")
    root = Path(list(spec.submodule_search_locations)[0])
    for name in ("mlx_vlm", "mlx_vlm.speculative", "mlx_vlm.speculative.drafters"):
        if name not in sys.modules:
            m = types.ModuleType(name)
            m.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
            sys.modules[name] = m
    from mlx_vlm.speculative.drafters.gemma4_assistant import gemma4_assistant as ga
    from mlx_vlm.speculative.drafters.gemma4_assistant.config import Gemma4AssistantConfig
    # HF's window (see the docstring): the caller passes exactly the visible keys.
    ga.make_drafter_masks = lambda shared, *a, **k: {t: None for t in shared}
    return ga.Gemma4AssistantDraftModel, Gemma4AssistantConfig


# (fixture, output suffix, ordered embeddings, layer types, block size, seed, copy)
# copy: a drafter whose weights make it propose the token it was given again (its embedding rows
# are the target's projected through pre_projection; the attention, MLP and state paths are
# scaled down to perturbations). The fixtures' greedy continuations repeat tokens, so these
# drafts are often accepted: the round loop's accept / roll-back path runs, not only rejections.
CASES = [
    ("dense-q4g64", "drafter", False, ["sliding_attention", "full_attention"], 4, 31, False),
    ("estyle-q4g64", "drafter", True, ["sliding_attention", "sliding_attention", "full_attention"], 3, 32, False),
    ("dense-q4g64", "drafter-copy", False, ["sliding_attention", "full_attention"], 5, 33, True),
]
GEN_TOKENS = 24


def text_model(target):
    return target.language_model.model if hasattr(target, "language_model") else target.model


def drafter_config(tcfg: dict, ordered: bool, layer_types, block: int) -> dict:
    t = tcfg.get("text_config", tcfg)
    vocab = tcfg.get("vocab_size", t["vocab_size"])
    return {
        "model_type": "gemma4_assistant",
        "backbone_hidden_size": t["hidden_size"],
        "use_ordered_embeddings": ordered,
        "num_centroids": 16,
        "centroid_intermediate_top_k": 4,
        "tie_word_embeddings": True,
        "block_size": block,
        "text_config": {
            "model_type": "gemma4_text",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": len(layer_types),
            "layer_types": layer_types,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "head_dim": t["head_dim"],
            "global_head_dim": t["global_head_dim"],
            "sliding_window": t["sliding_window"],
            "rope_parameters": t.get("rope_parameters", oc.rope_parameters()),
            "vocab_size": vocab,
            "vocab_size_per_layer_input": vocab,
            "hidden_size_per_layer_input": 0,
            "num_kv_shared_layers": len(layer_types),
            "use_double_wide_mlp": False,
            "rms_norm_eps": 1e-6,
            "final_logit_softcapping": 30.0,
            "tie_word_embeddings": True,
        },
    }


def make_drafter(Model, Config, cfg: dict, out: Path, seed: int, target=None):
    drafter = Model(Config.from_dict(cfg))
    rng = np.random.default_rng(seed)
    params = oc.random_params(drafter, rng)
    V = cfg["text_config"]["vocab_size"]
    if target is not None:  # the copy drafter (see CASES)
        B, d = cfg["backbone_hidden_size"], cfg["text_config"]["hidden_size"]
        E = np.array(text_model(target).embed_tokens(mx.arange(V)).astype(mx.float32))  # [V, B]
        proj = rng.standard_normal((d, B)) / np.sqrt(B)
        # [E_t·√B, h] -> 4·proj·e + a small part of the state h (|h| ~ 3·√B after the final norm)
        pre = np.concatenate([4 * proj / np.sqrt(B), 0.005 * rng.standard_normal((d, B)) / np.sqrt(B)], axis=1)
        params["pre_projection.weight"] = mx.array(pre.astype(np.float32))
        params["model.embed_tokens.weight"] = mx.array((E @ proj.T).astype(np.float32))
        for k in list(params):
            if k.endswith("post_attention_layernorm.weight") or k.endswith("post_feedforward_layernorm.weight"):
                params[k] = params[k] * 0.02  # the layers' outputs pass these norms last
    if cfg["use_ordered_embeddings"]:
        params["masked_embedding.token_ordering"] = mx.array(rng.permutation(V).astype(np.int64))
    drafter.load_weights(list(drafter.sanitize(dict(params)).items()))
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), params)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return drafter


def shared_kv(target, cache, n: int, window: int) -> dict:
    """The target's KV of its last layer of each type after caching n tokens in one call, as the
    drafter sees it: every key of a full layer, the last `window` keys of a sliding one."""
    tm = text_model(target)
    out = {}
    for i, layer in enumerate(tm.layers):
        c = cache[tm.previous_kvs[i]]
        k, v = c.state[0], c.state[1]
        k, v = k[..., :n, :], v[..., :n, :]
        if layer.layer_type == "sliding_attention":
            k, v = k[..., -window:, :], v[..., -window:, :]
        out[layer.layer_type] = (k, v)
    return out


def prefill(target, ids):
    """Fresh cache holding ids; returns (cache, final-normed hidden [1, n, d])."""
    cache = target.make_cache()
    h = text_model(target)(mx.array(ids, dtype=mx.int32)[None], cache=cache)
    mx.eval(h)
    return cache, h


def head(target, h):
    tm = text_model(target)
    logits = tm.embed_tokens.as_linear(h)
    cap = 30.0
    return mx.tanh(logits / cap) * cap


def draft_from(drafter, target, ids, n, K, window, ordered):
    """Drafts K tokens from state n (see the docstring); returns (drafts, logits, states)."""
    cache, h = prefill(target, ids[:n])
    shared = shared_kv(target, cache, n, window)
    drafter.set_shared_kv(shared, n, position=n - 1, kv_valid_len=n)
    hidden = h[:, n - 1:n, :]
    tok, h_prev = ids[n], hidden
    drafts, logits, states = [], [], []
    pos = mx.array([[n - 1]])
    for _ in range(K):
        emb = drafter._input_embed(mx.array([[tok]], dtype=mx.int32)) * drafter._input_embed_scale
        last, hn = drafter._forward_hidden(mx.concatenate([emb, h_prev], axis=-1), shared, pos)
        lg = drafter.model.embed_tokens.as_linear(hn)
        if ordered:
            tok = int(drafter.masked_embedding.argmax(hn, drafter.model.embed_tokens.weight).item())
        else:
            tok = int(mx.argmax(lg[0, -1]).item())
        drafts.append(tok)
        logits.append(np.array(lg[0, -1].astype(mx.float32)))
        states.append(np.array(last[0, -1].astype(mx.float32)))
        h_prev = last
    own = drafter.draft_block(ids[n], hidden, None, K + 1, lambda x: mx.argmax(x[:, -1], axis=-1)[:, None],
                              greedy=True)
    own = [int(x) for x in np.array(own).reshape(-1)]
    assert own == drafts, f"state {n}: draft_block {own} != step loop {drafts}"
    return drafts, logits, states


def speculative_generate(drafter, target, prompt, N, K, window, ordered):
    """Greedy speculative decoding of N tokens; returns (tokens, [(drafted, accepted) per round])."""
    _, h = prefill(target, prompt)
    out = [int(mx.argmax(head(target, h)[0, -1]).item())]
    rounds = []
    while len(out) < N:
        ctx = prompt + out
        n = len(ctx) - 1
        k = min(K, N - len(out) - 1)
        drafts = draft_from(drafter, target, ctx, n, k, window, ordered)[0] if k > 0 else []
        cache, _ = prefill(target, ctx[:n])
        verify = mx.array([ctx[n]] + drafts, dtype=mx.int32)[None]
        lg = head(target, text_model(target)(verify, cache=cache))
        got = [int(x) for x in np.array(mx.argmax(lg[0], axis=-1))]
        emitted = []
        for j, t in enumerate(got):
            emitted.append(t)
            if j == len(drafts) or t != drafts[j]:
                break
        rounds.append((len(drafts), len(emitted) - 1))
        out += emitted
    return out[:N], rounds


def plain_greedy(target, prompt, N):
    out = []
    ctx = list(prompt)
    for _ in range(N):
        _, h = prefill(target, ctx)
        t = int(mx.argmax(head(target, h)[0, -1]).item())
        out.append(t)
        ctx.append(t)
    return out


def main() -> int:
    args = oc.derived_args(__doc__)
    stamp = oc.derived_stamp(Path(__file__), args.fixtures)
    stamp_file = args.fixtures / ".stamp-mtp"
    outputs = [args.fixtures / "drafters" / f"{c[0]}-{c[1]}" / "oracle.npz" for c in CASES]
    if oc.up_to_date(args, stamp_file, outputs, stamp):
        print(f"mtp oracle: up to date ({len(CASES)} drafters)")
        return 0
    Model, Config = import_drafter()
    t0 = time.time()
    for name, suffix, ordered, layer_types, block, seed, copy in CASES:
        fdir = args.fixtures / name
        out = args.fixtures / "drafters" / f"{name}-{suffix}"
        target, tcfg = oc.load(fdir)
        target.set_dtype(mx.float32)
        cfg = drafter_config(tcfg, ordered, layer_types, block)
        drafter = make_drafter(Model, Config, cfg, out, seed, target if copy else None)
        drafter.bind(target)
        window = cfg["text_config"]["sliding_window"]
        with np.load(fdir / "oracle.npz") as z:
            ids = [int(x) for x in z["prompt_ids"]] + [int(x) for x in z["greedy_f32"]]
        K = block - 1
        first = 1
        drafts, logits, states = [], [], []
        for n in range(first, len(ids)):
            d, lg, st = draft_from(drafter, target, ids, n, K, window, ordered)
            drafts.append(d)
            logits += lg
            states += st
        prompt = [int(x) for x in np.load(fdir / "oracle.npz")["prompt_ids"]]
        gen, rounds = speculative_generate(drafter, target, prompt, GEN_TOKENS, K, window, ordered)
        greedy = plain_greedy(target, prompt, GEN_TOKENS)
        assert gen == greedy, f"{name}: speculative {gen} != greedy {greedy}"
        np.savez(out / "oracle.npz", ids=np.array(ids, dtype=np.int32), first=np.int32(first),
                 drafts=np.array(drafts, dtype=np.int32), logits=np.stack(logits), states=np.stack(states),
                 gen_prompt=np.array(prompt, dtype=np.int32), gen=np.array(gen, dtype=np.int32),
                 gen_rounds=np.array(rounds, dtype=np.int32), greedy=np.array(greedy, dtype=np.int32))
        acc = sum(r[1] for r in rounds)
        print(f"  {name}-{suffix:14s} {len(layer_types)} layers, K={K}, ordered={ordered}; "
              f"{len(ids) - first} states; generation: {len(rounds)} rounds, {acc} drafts accepted", flush=True)
    stamp_file.write_text(stamp + "\n")
    print(f"mtp oracle: {len(CASES)} drafters in {time.time() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
