#!/usr/bin/env python3
"""Batch-1 speed of the CUDA backend against Hugging Face transformers on the same GPU, on the
starter model's geometry (Gemma 3 270M: 18 layers, hidden 640, 4 heads of 256, 1 KV head, MLP
2048, vocabulary 262144, sliding window 512).

Ours: `gemma4 bench --backend cuda` on a GGUF (the real starter file, or the same geometry with
random weights from tools/make_synthetic_gguf.py where the real file cannot travel); median of
--repeat processes. Peer: transformers' Gemma3ForCausalLM built from a config of that geometry
(random weights, bf16, eager attention, its KV cache), greedy: prefill = one forward over the
prompt, decode = generate(max_new_tokens=N) minus that, per token; medians of --repeat runs,
each after a warm-up, timed with torch.cuda.synchronize around the region.
Same prompt length and generated tokens for both. Prints a table with the ratios.

    python3 bench/bench_cuda_vs_hf.py --bin build-cuda/bin/gemma4 --gguf MODEL.gguf
"""
import argparse
import json
import statistics
import subprocess
import time


def ours(bin_, gguf, prompt, gen, repeat):
    runs = []
    for _ in range(repeat):
        out = subprocess.run([bin_, "bench", "--model", gguf, "--backend", "cuda", "--prompt-tokens", str(prompt),
                              "--gen-tokens", str(gen)], capture_output=True, text=True, check=True).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
    return (statistics.median(r["prefill_tok_s"] for r in runs), statistics.median(r["decode_tok_s"] for r in runs))


def peer(prompt, gen, repeat):
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    cfg = Gemma3TextConfig(vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
                           num_attention_heads=4, num_key_value_heads=1, head_dim=256, sliding_window=512,
                           query_pre_attn_scalar=256, rope_theta=1e6, max_position_embeddings=32768)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(cfg).to(device="cuda", dtype=torch.bfloat16).eval()
    ids = torch.randint(0, 262144, (1, prompt), device="cuda")

    def timed(fn):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return time.perf_counter() - t

    with torch.inference_mode():
        fwd = lambda: model(ids)  # noqa: E731
        gen_n = lambda: model.generate(ids, max_new_tokens=gen, min_new_tokens=gen, do_sample=False)  # noqa: E731
        fwd(), gen_n()  # warm-up
        pf, dec = [], []
        for _ in range(repeat):
            tp = timed(fwd)
            tg = timed(gen_n)
            pf.append(prompt / tp)
            dec.append((gen - 1) / max(tg - tp, 1e-9))  # the first new token comes with the prefill
    return statistics.median(pf), statistics.median(dec), torch.cuda.get_device_name()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--gen-tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    op, od = ours(a.bin, a.gguf, a.prompt_tokens, a.gen_tokens, a.repeat)
    hp, hd, dev = peer(a.prompt_tokens, a.gen_tokens, a.repeat)
    print(f"{dev}: prompt {a.prompt_tokens}, gen {a.gen_tokens}, batch 1, median of {a.repeat}")
    print(f"{'':16s}{'ours (cuda)':>14s}{'transformers':>14s}{'ours/peer':>11s}")
    print(f"{'prefill tok/s':16s}{op:14.1f}{hp:14.1f}{op / hp:11.2f}")
    print(f"{'decode tok/s':16s}{od:14.1f}{hd:14.1f}{od / hd:11.2f}")


if __name__ == "__main__":
    main()
