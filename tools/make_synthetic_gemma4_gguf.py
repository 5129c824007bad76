#!/usr/bin/env python3
"""Writes a Gemma 4 GGUF at a real variant's geometry (E2B, E4B, 26B-A4B, 31B) with random weights
in a Q4_K_M-like mix, for speed measurements against llama.cpp on the same file.

No real Gemma 4 weights can be fetched on these machines, and the lent GPU machine takes 64 MiB per
call, so the benchmark files are made where they run. Metadata keys, tensor names and shapes are
the ones llama.cpp's convert_hf_to_gguf.py writes for architecture gemma4 (the committed
tests/fixtures/gguf_gemma4 files, made by that converter, have the same key set at tiny size);
the geometry comes from HF's convert_gemma4_weights.py variants (shared/docs/gemma4-spec.md §1.4).

Types follow llama-quantize's Q4_K_M choices: Q4_K everywhere, Q6_K for the tied embedding and
for attn_v / ffn_down on the layers `use_more_bits` picks; a row length that 256 does not divide
falls back as llama.cpp does (Q4_K -> Q5_0, Q6_K -> Q8_0); norms, router, scales and rope_freqs
stay f32. Block bytes are random, with f16 scales that keep |weight| under ~0.1. A stand-in "gemma4" BPE vocabulary of the
real size (special tokens at the real ids, 256 byte tokens, "tok<i>") lets llama.cpp load it.
Needs numpy and the `gguf` package.

    python3 tools/make_synthetic_gemma4_gguf.py OUT.gguf --variant e2b [--layers N] [--seed 0]
"""
import argparse
import sys
import time
from pathlib import Path

import numpy as np

VOCAB = 262144
# HF convert_gemma4_weights.py _VARIANTS (shared/docs/gemma4-spec.md §1.4).
VARIANTS = {
    "e2b": dict(d=1536, n=35, period=5, heads=8, kv_s=1, kv_f=1, k_eq_v=False, ff=6144, double_wide=True,
                ple=256, shared=20, window=512, ctx=131072),
    "e4b": dict(d=2560, n=42, period=6, heads=8, kv_s=2, kv_f=2, k_eq_v=False, ff=10240, double_wide=False,
                ple=256, shared=18, window=512, ctx=131072),
    "26b-a4b": dict(d=2816, n=30, period=6, heads=16, kv_s=8, kv_f=2, k_eq_v=True, ff=2112, double_wide=False,
                    ple=0, shared=0, window=1024, ctx=262144, experts=128, top_k=8, expert_ff=704),
    "31b": dict(d=5376, n=60, period=6, heads=32, kv_s=16, kv_f=4, k_eq_v=True, ff=21504, double_wide=False,
                ple=0, shared=0, window=1024, ctx=262144),
}
HD_S, HD_F = 256, 512
# ggml type -> (values per block, bytes per block, byte offsets of f16 scale fields)
BLOCKS = {8: (32, 34, [0]), 6: (32, 22, [0]), 12: (256, 144, [0, 2]), 14: (256, 210, [208])}
Q4_K, Q6_K, Q5_0, Q8_0 = 12, 14, 6, 8
FALLBACK = {Q4_K: Q5_0, Q6_K: Q8_0}
# The largest |code x sub-scale| a block's f16 scale multiplies: Q4_K 15 x 63 (6-bit scales; dmin
# likewise), Q6_K 32 x 128 (int8 scales), Q8_0 127, Q5_0 16.
MAX_CODE_PRODUCT = {Q4_K: 945.0, Q6_K: 4096.0, Q8_0: 127.0, Q5_0: 16.0}


def use_more_bits(i: int, n: int) -> bool:  # llama-quant.cpp
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


class Writer:
    def __init__(self, w, rng, gguf):
        self.w, self.rng, self.gguf, self.bytes = w, rng, gguf, 0
        self.decode_bytes = 0.0  # bytes one decode step reads (decode_read_bytes)

    def quant(self, name: str, rows: int, cols: int, qtype: int, count: int = 1, read: float = 1.0):
        """A [count x] rows x cols matrix (ggml ne = {cols, rows[, count]}) of random blocks."""
        if cols % BLOCKS[qtype][0]:
            qtype = FALLBACK[qtype]
        per, nbytes, f16_at = BLOCKS[qtype]
        nb = rows * count * cols // per
        raw = self.rng.integers(0, 256, size=(nb, nbytes), dtype=np.uint8)
        # Scales chosen so that |weight| <= ~0.1 like a trained model's (random codes at full-range
        # scales give weights of several units: activations blow up and the softcapped logits
        # saturate at +-30, where no two engines agree on anything).
        top = 0.1 / MAX_CODE_PRODUCT[qtype]
        for off in f16_at:  # |scale| in [top/4, top], random sign
            s = self.rng.uniform(top / 4, top, nb) * self.rng.choice([-1, 1], nb)
            raw[:, off:off + 2] = s.astype(np.float16).view(np.uint8).reshape(nb, 2)
        shape = (count, rows, cols // per * nbytes) if count > 1 else (rows, cols // per * nbytes)
        self.w.add_tensor(name, raw.reshape(shape), raw_dtype=self.gguf.GGMLQuantizationType(qtype))
        self.bytes += raw.size
        self.decode_bytes += read * raw.size

    def f32(self, name: str, values: np.ndarray):
        self.w.add_tensor(name, values.astype(np.float32))
        self.bytes += values.size * 4
        self.decode_bytes += values.size * 4

    def norm(self, name: str, n: int, scale: float = 1.0):
        self.f32(name, scale * (1.0 + 0.1 * self.rng.standard_normal(n)))


def add_vocab(w):
    special = ["<pad>", "<eos>", "<bos>", "<unk>"]
    tokens = special + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"tok{i}" for i in range(len(tokens), VOCAB - 3)] + ["tok1", "0", "tok10"]
    types = [3] * 3 + [2] + [6] * 256 + [1] * (VOCAB - 260)
    w.add_tokenizer_model("gemma4")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * VOCAB)
    w.add_token_types(types)
    w.add_token_merges(["tok1 0"])
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_add_space_prefix(False)
    w.add_add_bos_token(True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--variant", choices=sorted(VARIANTS), default="e2b")
    ap.add_argument("--layers", type=int, default=0, help="keep only the first N layers (0: all)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    import gguf

    v = dict(VARIANTS[a.variant])
    n_full = v["n"]
    n = a.layers or n_full
    shared = max(0, v["shared"] - (n_full - n))  # truncation removes shared layers first
    first_shared = n - shared
    d, H, P = v["d"], v["heads"], v["ple"]
    sliding = [(i % v["period"]) != v["period"] - 1 for i in range(n)]
    ff = [v["ff"] * (2 if v["double_wide"] and i >= first_shared else 1) for i in range(n)]
    kv = [v["kv_s"] if s else v["kv_f"] for s in sliding]
    moe = "experts" in v

    t0 = time.time()
    w = gguf.GGUFWriter(a.out, "gemma4")
    A = "gemma4."
    w.add_string("general.name", f"synthetic gemma-4-{a.variant}")
    w.add_uint32(A + "block_count", n)
    w.add_uint32(A + "context_length", v["ctx"])
    w.add_uint32(A + "embedding_length", d)
    w.add_array(A + "feed_forward_length", ff) if len(set(ff)) > 1 else w.add_uint32(A + "feed_forward_length", ff[0])
    w.add_uint32(A + "attention.head_count", H)
    w.add_array(A + "attention.head_count_kv", kv) if len(set(kv)) > 1 else w.add_uint32(A + "attention.head_count_kv", kv[0])
    w.add_float32(A + "rope.freq_base", 1e6)
    w.add_float32(A + "rope.freq_base_swa", 1e4)
    w.add_float32(A + "attention.layer_norm_rms_epsilon", 1e-6)
    w.add_uint32(A + "attention.key_length", HD_F)
    w.add_uint32(A + "attention.value_length", HD_F)
    w.add_uint32(A + "attention.key_length_swa", HD_S)
    w.add_uint32(A + "attention.value_length_swa", HD_S)
    w.add_uint32(A + "rope.dimension_count", HD_F)
    w.add_uint32(A + "rope.dimension_count_swa", HD_S)
    w.add_float32(A + "final_logit_softcapping", 30.0)
    w.add_uint32(A + "attention.sliding_window", v["window"])
    w.add_array(A + "attention.sliding_window_pattern", sliding)
    w.add_uint32(A + "attention.shared_kv_layers", shared)
    w.add_uint32(A + "embedding_length_per_layer_input", P)
    if moe:
        w.add_uint32(A + "expert_count", v["experts"])
        w.add_uint32(A + "expert_used_count", v["top_k"])
        w.add_uint32(A + "expert_feed_forward_length", v["expert_ff"])
    add_vocab(w)

    t = Writer(w, np.random.default_rng(a.seed), gguf)
    rot = HD_F // 2 // 4  # partial_rotary_factor 0.25 of the 256 pairs
    t.f32("rope_freqs.weight", np.array([1.0] * rot + [1e30] * (HD_F // 2 - rot)))
    t.quant("token_embd.weight", VOCAB, d, Q6_K)
    t.norm("output_norm.weight", d)
    if P:
        t.quant("per_layer_token_embd.weight", VOCAB, n * P, Q4_K, read=0.0)  # one row per token
        t.quant("per_layer_model_proj.weight", n * P, d, Q4_K)
        t.norm("per_layer_proj_norm.weight", P)
    for i in range(n):
        b = f"blk.{i}."
        hd = HD_S if sliding[i] else HD_F
        more = use_more_bits(i, n)
        t.norm(b + "attn_norm.weight", d)
        t.quant(b + "attn_q.weight", H * hd, d, Q4_K)
        # Gemma 4 attends with scale 1: q/k norm weights of hd^-1/4 give q.k the spread of a
        # 1/sqrt(hd)-scaled product (weights of 1 make every softmax one-hot and the model chaotic).
        t.norm(b + "attn_q_norm.weight", hd, hd ** -0.25)
        if i < first_shared:
            t.quant(b + "attn_k.weight", kv[i] * hd, d, Q4_K)
            if not (v["k_eq_v"] and not sliding[i]):
                t.quant(b + "attn_v.weight", kv[i] * hd, d, Q6_K if more else Q4_K)
            t.norm(b + "attn_k_norm.weight", hd, hd ** -0.25)
        t.quant(b + "attn_output.weight", d, H * hd, Q4_K)
        t.norm(b + "post_attention_norm.weight", d)
        t.norm(b + "ffn_norm.weight", d)
        t.quant(b + "ffn_gate.weight", ff[i], d, Q4_K)
        t.quant(b + "ffn_up.weight", ff[i], d, Q4_K)
        t.quant(b + "ffn_down.weight", d, ff[i], Q6_K if more else Q4_K)
        t.norm(b + "post_ffw_norm.weight", d)
        t.f32(b + "layer_output_scale.weight", np.array([0.5]))
        if moe:
            E, I = v["experts"], v["expert_ff"]
            t.f32(b + "ffn_gate_inp.weight", 0.05 * t.rng.standard_normal((E, d)))
            t.norm(b + "ffn_gate_inp.scale", d)
            t.quant(b + "ffn_gate_up_exps.weight", 2 * I, d, Q4_K, count=E, read=v["top_k"] / E)
            t.quant(b + "ffn_down_exps.weight", d, I, Q6_K if more else Q4_K, count=E, read=v["top_k"] / E)
            t.f32(b + "ffn_down_exps.scale", 1.0 + 0.1 * t.rng.standard_normal(E))
            t.norm(b + "pre_ffw_norm_2.weight", d)
            t.norm(b + "post_ffw_norm_1.weight", d)
            t.norm(b + "post_ffw_norm_2.weight", d)
        if P:
            t.quant(b + "inp_gate.weight", P, d, Q4_K)
            t.quant(b + "proj.weight", d, P, Q4_K)
            t.norm(b + "post_norm.weight", d)
        print(f"\rlayer {i + 1}/{n}  {t.bytes / 2**30:.2f} GiB", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()
    print(f"wrote {a.out}: gemma-4-{a.variant}, {n} layers, {Path(a.out).stat().st_size / 2**30:.2f} GiB "
          f"in {time.time() - t0:.0f} s")
    print(f"decode_read_bytes {t.decode_bytes:.0f} (weights one decode step reads: all but the per-layer "
          f"embedding table, of which one row, and the routed {v.get('top_k', 0)} experts' share)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
