#!/usr/bin/env python3
"""Writes a random-weight Gemma 4 safetensors checkpoint at a real variant's geometry (E2B, E4B,
26B-A4B, 31B) in MLX affine form (any bits / group size, optionally mixed per module) or in plain
bf16, for speed measurements of the formats people load besides GGUF.

numpy only (no mlx, no torch, no safetensors package), so it runs on the lent GPU machine, where
the files are made (they are gigabytes; a call carries 64 MiB). The geometry is the one table in
tools/make_synthetic_gemma4_gguf.py (VARIANTS), so the GGUF and safetensors files of a variant have
the same shapes. Tensor names, shapes and the nested config follow the mlx-lm Gemma 4 checkpoints
(the committed mlx-lm fixtures have the same key set at tiny size): `language_model.model.*`,
KV-shared layers without k/v projections, full K=V layers without v_proj, MoE experts stacked as
`experts.switch_glu.{gate,up,down}_proj` [E, rows, cols] with the router at 8 bits (mlx-lm's
quantization predicate).

Values: matrices have standard deviation 1/sqrt(cols) after dequantization (MLX affine: uniform
random codes, scale = std / sqrt((2^b^2 - 1) / 12), bias = -scale (2^b - 1) / 2 per group, bf16);
norms 1 +- 0.1 with q/k norms of hd^-1/4 and a layer scalar of 0.5, as the GGUF generator chooses.
Bytes are drawn from one random pool at random offsets (drawing 10^10 fresh values would take
many minutes); every tensor still differs from every other.

    python3 tools/make_synthetic_gemma4_checkpoint.py OUT_DIR --variant e4b --format mlx --bits 4 --group 64
    python3 tools/make_synthetic_gemma4_checkpoint.py OUT_DIR --variant e4b --format bf16
    ... --format mlx --bits 4 --mixed 6   (v_proj and down_proj at 6 bits on llama.cpp's use_more_bits layers)
"""
import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import safetensors_np  # noqa: E402
from make_synthetic_gemma4_gguf import HD_F, HD_S, VARIANTS, VOCAB, use_more_bits  # noqa: E402

SHARD_BYTES = 4 << 30
POOL_BYTES = 64 << 20


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """f32 -> bf16 bit patterns (round to nearest even), as uint16."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


class Pool:
    """Random bytes to slice tensors from: a tensor of n bytes is the pool read from a random
    offset, wrapping around."""

    def __init__(self, rng):
        self.rng = rng
        self.bytes = rng.integers(0, 256, size=POOL_BYTES, dtype=np.uint8)

    def take(self, n: int) -> np.ndarray:
        out = np.empty(n, dtype=np.uint8)
        at, pos = 0, int(self.rng.integers(0, POOL_BYTES))
        while at < n:
            k = min(n - at, POOL_BYTES - pos)
            out[at:at + k] = self.bytes[pos:pos + k]
            at, pos = at + k, 0
        return out


class Tensors:
    """The checkpoint's tensors as (name, dtype, shape, make) in file order; make() returns the
    tensor's bytes."""

    def __init__(self, args, pool, rng):
        self.a, self.pool, self.rng, self.items, self.qover = args, pool, rng, [], {}
        self.read = {}  # module -> share of it one decode step reads (default 1)

    def norm(self, name, n, scale=1.0):
        self.items.append((name, "BF16", [n], lambda: bf16_bits(scale * (1 + 0.1 * self.rng.standard_normal(n)))))

    def scalar(self, name, values):
        v = np.asarray(values, dtype=np.float32)
        self.items.append((name, "BF16", list(v.shape), lambda: bf16_bits(v)))

    def matrix(self, module, rows, cols, count=1, bits=None, read=1.0):
        """module.weight [count x] rows x cols: quantized (with .scales/.biases) or bf16; a decode
        step reads `read` of it."""
        self.read[module] = read
        lead = [count] if count > 1 else []
        std = cols ** -0.5
        if self.a.format == "bf16":
            def make():
                # bf16 patterns: random sign and mantissa, exponent e0 or e0 + 1 (|w| in [std/4, std))
                raw = self.pool.take(2 * rows * cols * count).view(np.uint16)
                e0 = np.uint16(int(np.floor(np.log2(std))) + 127 - 2)
                return (raw & np.uint16(0x807F)) | ((e0 + ((raw >> np.uint16(7)) & np.uint16(1))) << np.uint16(7))
            self.items.append((module + ".weight", "BF16", lead + [rows, cols], make))
            return
        bits = bits or self.a.bits
        g = self.a.group
        if cols % g or (cols * bits) % 32:
            sys.exit(f"{module}: {cols} columns do not take {bits}-bit groups of {g}")
        if bits != self.a.bits:
            self.qover[module] = {"group_size": g, "bits": bits}
        words = cols * bits // 32
        self.items.append((module + ".weight", "U32", lead + [rows, words],
                           lambda: self.pool.take(4 * rows * words * count)))
        scale = std / (((1 << bits) ** 2 - 1) / 12.0) ** 0.5
        groups = rows * (cols // g) * count
        for part, value in (("scales", scale), ("biases", -scale * ((1 << bits) - 1) / 2)):
            # each group's scale within +-10 % of the nominal one (bias follows), so rows differ
            self.items.append((f"{module}.{part}", "BF16", lead + [rows, cols // g],
                               lambda value=value: bf16_bits(value * (1 + 0.1 * self.rng.uniform(-1, 1, groups)))))


def config_for(v: dict, n: int, shared: int, sliding: list, args, qover: dict) -> dict:
    tc = {
        "model_type": "gemma4_text", "hidden_size": v["d"], "num_hidden_layers": n,
        "intermediate_size": v["ff"], "num_attention_heads": v["heads"], "num_key_value_heads": v["kv_s"],
        "num_global_key_value_heads": v["kv_f"], "head_dim": HD_S, "global_head_dim": HD_F,
        "rms_norm_eps": 1e-6, "vocab_size": VOCAB, "vocab_size_per_layer_input": VOCAB,
        "hidden_size_per_layer_input": v["ple"], "num_kv_shared_layers": shared,
        "use_double_wide_mlp": v["double_wide"], "attention_k_eq_v": v["k_eq_v"],
        "enable_moe_block": "experts" in v, "sliding_window": v["window"], "final_logit_softcapping": 30.0,
        "tie_word_embeddings": True,
        "layer_types": ["sliding_attention" if s else "full_attention" for s in sliding],
        "rope_parameters": {
            "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
        },
        "max_position_embeddings": v["ctx"], "hidden_activation": "gelu_pytorch_tanh",
        "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2,
    }
    if "experts" in v:
        tc.update(num_experts=v["experts"], top_k_experts=v["top_k"], moe_intermediate_size=v["expert_ff"])
    c = {"model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"], "vocab_size": VOCAB,
         "text_config": tc, "eos_token_id": [1, 106], "tie_word_embeddings": True}
    if args.format == "mlx":
        q = {"group_size": args.group, "bits": args.bits, "mode": "affine"}
        q.update({"language_model.model." + k: o for k, o in qover.items()})
        c["quantization"] = q
        c["quantization_config"] = dict(q)
    return c


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("out", type=Path)
    ap.add_argument("--variant", choices=sorted(VARIANTS), default="e4b")
    ap.add_argument("--format", choices=["mlx", "bf16"], default="mlx")
    ap.add_argument("--bits", type=int, choices=[2, 3, 4, 5, 6, 8], default=4)
    ap.add_argument("--group", type=int, choices=[32, 64, 128], default=64)
    ap.add_argument("--mixed", type=int, choices=[5, 6, 8], default=0,
                    help="v_proj and down_proj at this many bits on the use_more_bits layers")
    ap.add_argument("--layers", type=int, default=0, help="keep only the first N layers (0: all)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.out.exists() and any(a.out.iterdir()):
        sys.exit(f"{a.out}: exists and is not empty (choose a new folder)")
    t0 = time.time()
    rng = np.random.default_rng(a.seed)
    v = dict(VARIANTS[a.variant])
    n_full = v["n"]
    n = a.layers or n_full
    shared = max(0, v["shared"] - (n_full - n))  # truncation removes shared layers first
    first_shared = n - shared
    d, H, P = v["d"], v["heads"], v["ple"]
    sliding = [(i % v["period"]) != v["period"] - 1 for i in range(n)]
    ff = [v["ff"] * (2 if v["double_wide"] and i >= first_shared else 1) for i in range(n)]
    kv = [v["kv_s"] if s else v["kv_f"] for s in sliding]

    t = Tensors(a, Pool(rng), rng)
    m = "language_model.model."
    t.matrix(m + "embed_tokens", VOCAB, d)
    t.norm(m + "norm.weight", d)
    if P:
        t.matrix(m + "embed_tokens_per_layer", VOCAB, n * P, read=0.0)  # one row per token
        t.matrix(m + "per_layer_model_projection", n * P, d)
        t.norm(m + "per_layer_projection_norm.weight", P)
    for i in range(n):
        b = f"{m}layers.{i}."
        hd = HD_S if sliding[i] else HD_F
        more = a.mixed if a.mixed and use_more_bits(i, n) else None
        for nm in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                   "post_feedforward_layernorm"):
            t.norm(b + nm + ".weight", d)
        t.scalar(b + "layer_scalar", [0.5])
        t.matrix(b + "self_attn.q_proj", H * hd, d)
        t.norm(b + "self_attn.q_norm.weight", hd, hd ** -0.25)
        if i < first_shared:
            t.matrix(b + "self_attn.k_proj", kv[i] * hd, d)
            if not (v["k_eq_v"] and not sliding[i]):
                t.matrix(b + "self_attn.v_proj", kv[i] * hd, d, bits=more)
            t.norm(b + "self_attn.k_norm.weight", hd, hd ** -0.25)
        t.matrix(b + "self_attn.o_proj", d, H * hd)
        t.matrix(b + "mlp.gate_proj", ff[i], d)
        t.matrix(b + "mlp.up_proj", ff[i], d)
        t.matrix(b + "mlp.down_proj", d, ff[i], bits=more)
        if "experts" in v:
            E, I = v["experts"], v["expert_ff"]
            t.matrix(b + "router.proj", E, d, bits=8 if a.format == "mlx" else None)
            t.norm(b + "router.scale", d)
            t.norm(b + "router.per_expert_scale", E)
            share = v["top_k"] / E
            t.matrix(b + "experts.switch_glu.gate_proj", I, d, count=E, read=share)
            t.matrix(b + "experts.switch_glu.up_proj", I, d, count=E, read=share)
            t.matrix(b + "experts.switch_glu.down_proj", d, I, count=E, bits=more, read=share)
            for nm in ("pre_feedforward_layernorm_2", "post_feedforward_layernorm_1", "post_feedforward_layernorm_2"):
                t.norm(b + nm + ".weight", d)
        if P:
            t.matrix(b + "per_layer_input_gate", P, d)
            t.matrix(b + "per_layer_projection", d, P)
            t.norm(b + "post_per_layer_input_norm.weight", d)

    # Shards of at most SHARD_BYTES, in order, with mlx-lm's index file.
    size = {"BF16": 2, "U32": 4}
    shards, cur, cur_bytes = [], [], 0
    for it in t.items:
        nb = size[it[1]] * int(np.prod(it[2]))
        if cur and cur_bytes + nb > SHARD_BYTES:
            shards.append(cur)
            cur, cur_bytes = [], 0
        cur.append((it, nb))
        cur_bytes += nb
    shards.append(cur)
    a.out.mkdir(parents=True, exist_ok=True)
    weight_map, total, done, shown = {}, sum(nb for s in shards for _, nb in s), 0, 0.0
    for si, shard in enumerate(shards):
        fname = "model.safetensors" if len(shards) == 1 else f"model-{si + 1:05d}-of-{len(shards):05d}.safetensors"
        for (name, _, _, _), _ in shard:
            weight_map[name] = fname
        with open(a.out / fname, "wb") as f:
            f.write(safetensors_np.header([(name, dt, shape, nb) for (name, dt, shape, _), nb in shard], {"format": "mlx"}))
            for (name, _, _, make), nb in shard:
                data = np.ascontiguousarray(make()).view(np.uint8).reshape(-1)
                assert data.size == nb, name
                f.write(data.tobytes())
                done += nb
                if time.time() - shown > 0.5 or done == total:
                    shown = time.time()
                    print(f"\r{done / 2**30:.2f} / {total / 2**30:.2f} GiB", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    (a.out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    (a.out / "config.json").write_text(json.dumps(config_for(v, n, shared, sliding, a, t.qover), indent=1))
    form = "bf16" if a.format == "bf16" else f"mlx {a.bits}-bit g{a.group}" + (f" (mixed {a.mixed})" if a.mixed else "")
    print(f"wrote {a.out}: gemma-4-{a.variant} {form}, {n} layers, {total / 2**30:.2f} GiB in {time.time() - t0:.0f} s")
    read = sum(size[dt] * int(np.prod(shape)) * t.read.get(name.rsplit(".", 1)[0], 1.0)
               for name, dt, shape, _ in t.items)
    print(f"decode_read_bytes {read:.0f} (weights one decode step reads: all but the per-layer embedding "
          f"table, of which one row, and the routed experts' share)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
