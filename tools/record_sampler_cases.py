#!/usr/bin/env python3
"""Record reference cases for the sampler chain and the Gemma 4 tool-call parser from mlx-lm.

Writes (both small, committed):
  tests/fixtures/sampler/sampler_cases.json   - mlx-lm logits processors, logsumexp and filters
  tests/fixtures/sampler/gemma4_tool_calls.json - mlx-lm tool_parsers.gemma4.parse_tool_call

Arrays of float32 are stored as base64 of little-endian float32 bytes (exact, compact).
Keep-masks are strings of '0'/'1'. Parameters that the C++ side reads as float32 are chosen to be
exactly representable in float32 so that both sides compute with the same value.

Usage: .venv/bin/python tools/record_sampler_cases.py [--out tests/fixtures/sampler]
"""
import argparse
import base64
import json
import os

import mlx.core as mx
import numpy as np
from mlx_lm.sample_utils import (
    apply_min_p,
    apply_top_k,
    apply_top_p,
    apply_xtc,
    make_logits_processors,
)
from mlx_lm.tool_parsers import gemma4


def f32(x):
    return float(np.float32(x))


def b64(a):
    return base64.b64encode(np.asarray(a, dtype="<f4").tobytes()).decode()


def mask(a):
    return "".join("1" if np.isfinite(v) else "0" for v in np.asarray(a))


def make_logits(rng, V, kind):
    """Random logits of a few shapes: gaussian, peaked, ties, -inf entries."""
    if kind == "gauss":
        x = rng.normal(0, 3, V)
    elif kind == "peaked":
        x = rng.normal(0, 1, V)
        x[rng.integers(V)] += 12
        x[rng.integers(V)] += 9
    elif kind == "ties":
        x = np.round(rng.normal(0, 2, V) * 2) / 2  # many exact ties
    elif kind == "neginf":
        x = rng.normal(0, 3, V)
        x[rng.choice(V, V // 5, replace=False)] = -np.inf
    elif kind == "flat":
        x = rng.normal(0, 0.3, V)
    else:
        raise ValueError(kind)
    return x.astype(np.float32)


def mx_logprobs(logits):
    x = mx.array(logits)[None]
    return x - mx.logsumexp(x, axis=-1, keepdims=True)


def to_np(a):
    return np.array(a[0] if a.ndim == 2 else a, dtype=np.float32)


def record_sampler(rng):
    processors, filters, chains, greedy = [], [], [], []
    kinds = ["gauss", "peaked", "ties", "neginf", "flat"]
    sizes = [50, 97, 256, 1000]

    # Logits processors: bias, repetition, presence, frequency (with duplicates in history,
    # history longer than the context window, negative and positive logits).
    for i in range(12):
        V = sizes[i % len(sizes)]
        x = make_logits(rng, V, kinds[i % len(kinds)])
        x[np.isinf(x)] = -30.0  # keep processors' arithmetic finite
        hist = rng.integers(0, min(V, 40), size=int(rng.integers(0, 45))).tolist()
        nb = int(rng.integers(0, 5))
        bias = {int(t): f32(rng.normal(0, 4)) for t in rng.choice(V, nb, replace=False)}
        p = dict(
            logit_bias=bias,
            repetition_penalty=[None, f32(1.3), f32(0.75), f32(2.0)][i % 4],
            repetition_context_size=[20, 20, 7, 64][i % 4],
            presence_penalty=[None, f32(0.5), f32(-1.25)][i % 3],
            presence_context_size=[20, 5, 30][i % 3],
            frequency_penalty=[f32(0.375), None, f32(1.5)][i % 3],
            frequency_context_size=[20, 11, 3][i % 3],
        )
        procs = make_logits_processors(**p)
        out = mx.array(x)[None]
        toks = mx.array(hist, dtype=mx.int32)
        for proc in procs:
            out = proc(toks, out)
        processors.append(
            dict(
                V=V,
                logits=b64(x),
                history=hist,
                logit_bias=[[k, v] for k, v in bias.items()],
                repetition_penalty=p["repetition_penalty"] or 0.0,
                repetition_context_size=p["repetition_context_size"],
                presence_penalty=p["presence_penalty"] or 0.0,
                presence_context_size=p["presence_context_size"],
                frequency_penalty=p["frequency_penalty"] or 0.0,
                frequency_context_size=p["frequency_context_size"],
                expected=b64(to_np(out)),
            )
        )

    # Single filters on logprobs.
    for i in range(30):
        V = sizes[i % len(sizes)]
        kind = kinds[(i // 2) % len(kinds)]
        x = make_logits(rng, V, kind)
        lp = mx_logprobs(x)
        which = ["top_p", "min_p", "top_k", "xtc", "min_p_keep"][i % 5]
        case = dict(V=V, kind=kind, logits=b64(x), logprobs=b64(to_np(lp)), filter=which)
        if which == "top_p":
            p = f32([0.9, 0.5, 0.95, 0.1, 0.99, 0.7][i % 6])
            out = apply_top_p(lp, p)
            case["top_p"] = p
        elif which in ("min_p", "min_p_keep"):
            p = f32([0.05, 0.2, 0.5, 0.01][i % 4])
            keep = 1 if which == "min_p" else int([3, 10, 40][i % 3])
            out = apply_min_p(lp, p, keep)
            case.update(min_p=p, min_tokens_to_keep=keep)
        elif which == "top_k":
            k = int([1, 5, 20, 40][i % 4])
            out = apply_top_k(lp, k)
            case["top_k"] = k
        else:
            thr = f32([0.1, 0.05, 0.2][i % 3])
            specials = [int(t) for t in rng.choice(V, 3, replace=False)]
            out = apply_xtc(lp, 1.0, thr, specials)  # probability 1: always applied
            case.update(xtc_threshold=thr, xtc_special_tokens=specials)
        case["kept"] = mask(to_np(out))
        filters.append(case)

    # Whole chain as make_sampler runs it: top_p -> min_p -> top_k (temperature > 0).
    for i in range(16):
        V = sizes[i % len(sizes)]
        kind = kinds[i % len(kinds)]
        x = make_logits(rng, V, kind)
        lp = mx_logprobs(x)
        top_p = f32([0.9, 1.0, 0.6, 0.95][i % 4])
        min_p = f32([0.0, 0.05, 0.1, 0.02][(i // 2) % 4])
        keep = int([1, 4][i % 2])
        top_k = int([0, 10, 3, 50][(i // 3) % 4])
        out = lp
        if 0 < top_p < 1:
            out = apply_top_p(out, top_p)
        if min_p != 0:
            out = apply_min_p(out, min_p, keep)
        if top_k > 0:
            out = apply_top_k(out, top_k)
        chains.append(
            dict(V=V, kind=kind, logits=b64(x), top_p=top_p, min_p=min_p,
                 min_tokens_to_keep=keep, top_k=top_k, kept=mask(to_np(out)))
        )

    # Greedy: argmax of logprobs (ties -> first index).
    for i in range(6):
        V = sizes[i % len(sizes)]
        x = make_logits(rng, V, ["ties", "neginf", "gauss"][i % 3])
        if i % 2 == 0:
            x[V // 3] = x[2 * V // 3] = np.max(x) + 1  # a tie for the maximum
        greedy.append(dict(V=V, logits=b64(x), argmax=int(mx.argmax(mx_logprobs(x), axis=-1).item())))

    return dict(processors=processors, filters=filters, chains=chains, greedy=greedy)


S = '<|"|>'
TOOL_BLOCKS = [
    # (block text between <|tool_call> and <tool_call|>)
    "call:get_weather{location:" + S + "Paris" + S + "}",
    "call:get_weather{location:" + S + "Paris, France" + S + ",unit:" + S + "celsius" + S + "}",
    "call:noargs{}",
    "call:nums{a:1,b:-2,c:3.5,d:-0.25,e:1e3,f:-2.5E-3,g:0}",
    "call:lits{a:true,b:false,c:null}",
    "call:nested{cfg:{depth:2,inner:{x:" + S + "y" + S + "}},list:[1,2,{k:" + S + "v" + S + "}]}",
    "call:arr{items:[" + S + "a" + S + "," + S + "b,c" + S + "],empty:[],eo:{}}",
    "call:braces{code:" + S + "int f() { return 1; }" + S + "}",
    "call:quotes{text:" + S + 'He said "hi", then: {ok}' + S + "}",
    "call:newlines{text:" + S + "line1\nline2\n\tindented" + S + "}",
    "call:colons{url:" + S + "http://x.y:80/a?b=c,d" + S + ",n:2}",
    "call:unicode{city:" + S + "Zürich 東京" + S + "}",
    "call:backslash{path:" + S + "C:\\temp\\new" + S + "}",
    "call:dash-name{x:1}",
    "call:under_score_1{x_1:" + S + "" + S + "}",
    "call:qkeys{" + S + "quoted key" + S + ":1,plain:2}",
    "call:first{a:1}call:second{b:" + S + "two" + S + "}",
    "call:jsonstr{a:\"plain json string\"}",
    "call:lt{expr:" + S + "a < b <| c" + S + "}",
    "call:deep{a:[[1,[2,[3]]],{b:{c:{d:[]}}}]}",
    # malformed: mlx-lm raises ValueError / JSONDecodeError
    "call:bad{location:Paris}",
    "call:unclosed{a:1",
    "call:trailing{a:1,}",
    "not a call at all",
    "call:badstr{a:" + S + "unterminated}",
]


def record_tool_calls():
    cases = []
    for block in TOOL_BLOCKS:
        try:
            r = gemma4.parse_tool_call(block)
            calls = r if isinstance(r, list) else [r]
            cases.append(dict(block=block, ok=True,
                              calls=[dict(name=c["name"], arguments=c["arguments"]) for c in calls]))
        except (ValueError, json.JSONDecodeError) as e:
            cases.append(dict(block=block, ok=False, error=type(e).__name__))
    return dict(source="mlx_lm.tool_parsers.gemma4.parse_tool_call", cases=cases)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/sampler")
    ap.add_argument("--seed", type=int, default=20261129)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rng = np.random.default_rng(a.seed)
    with open(os.path.join(a.out, "sampler_cases.json"), "w") as f:
        json.dump(record_sampler(rng), f, separators=(",", ":"))
    with open(os.path.join(a.out, "gemma4_tool_calls.json"), "w") as f:
        json.dump(record_tool_calls(), f, indent=1, ensure_ascii=False)
    for n in ("sampler_cases.json", "gemma4_tool_calls.json"):
        print(n, os.path.getsize(os.path.join(a.out, n)), "bytes")


if __name__ == "__main__":
    main()
