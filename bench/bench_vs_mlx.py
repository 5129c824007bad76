#!/usr/bin/env python3
"""Prefill / decode speed of the engine against mlx-lm on the same checkpoint.

Usage: bench/bench_vs_mlx.py --model DIR [--prompt-tokens 128] [--gen-tokens 64] [--repeats 3]
                             [--mlx-repeats N] [--threads 2] [--bin build/bin/gemma4]
                             [--our-args "--dtype bf16"]
                             [--json-out bench/out/bench.json] [--skip-mlx | --skip-ours]

mlx-lm side: mlx_lm.utils.load_model (no tokenizer needed) and mlx_lm.generate.generate_step with
a greedy sampler, a fixed seeded prompt (BOS 2 first), default prefill_step_size, EOS ignored (the
generator never stops on its own). Timed like mlx_lm.stream_generate reports it:
  prefill tok/s = prompt tokens / time to the first generated token,
  decode tok/s  = (gen tokens - 1) / time from the first to the last generated token.
One warm-up generation (compiles mx.compile'd functions) is not counted. Peak RSS is the process
maximum (ru_maxrss), model included.

Engine side: `gemma4 bench --model DIR --prompt-tokens P --gen-tokens G --threads T [our-args]`,
one process per repeat; its last stdout line is JSON {prefill_tok_s, decode_tok_s, peak_rss_mb}.

Both sides run with T threads (default 2): the engine through --threads; mlx through
OMP/OPENBLAS/MKL thread variables set before mlx is imported (the pip wheel's CPU backend uses
reference BLAS, so its matmuls are single-threaded whatever they say). Prints the median of each
figure over the repeats and the ratios ours / mlx.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--gen-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--mlx-repeats", type=int, default=None,
                    help="repeats for mlx-lm only (default: --repeats); its CPU quantized "
                         "matmul is slow, ~0.04 tok/s decode at E2B geometry on 2 busy cores")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bin", type=Path, default=REPO / "build" / "bin" / "gemma4")
    ap.add_argument("--our-args", default="", help="extra arguments for `gemma4 bench`")
    ap.add_argument("--json-out", type=Path, default=None)
    ap.add_argument("--skip-mlx", action="store_true")
    ap.add_argument("--skip-ours", action="store_true")
    return ap.parse_args()


def bench_mlx(model_dir: Path, n_prompt: int, n_gen: int, repeats: int) -> list:
    import numpy as np
    import mlx.core as mx
    from mlx_lm.generate import generate_step
    from mlx_lm.utils import load_model

    mx.set_default_device(mx.cpu)
    t = time.time()
    model, config = load_model(model_dir)
    print(f"mlx-lm: loaded {model_dir} in {time.time() - t:.1f}s", flush=True)
    tc = config.get("text_config", config)
    vocab = int(config.get("vocab_size", tc.get("vocab_size")))
    rng = np.random.default_rng(1234)
    ids = [2] + rng.integers(1000, vocab, size=n_prompt - 1).tolist()
    prompt = mx.array(ids, dtype=mx.int32)

    def greedy(lp):
        return mx.argmax(lp, axis=-1)

    def run(n_tokens):
        t0 = time.perf_counter()
        t_first = None
        n = 0
        for tok, _ in generate_step(prompt, model, max_tokens=n_tokens, sampler=greedy):
            if hasattr(tok, "item"):
                tok = tok.item()
            n += 1
            if t_first is None:
                t_first = time.perf_counter()
        t_end = time.perf_counter()
        assert n == n_tokens, f"generate_step yielded {n} tokens, expected {n_tokens}"
        return {"prefill_tok_s": len(ids) / (t_first - t0),
                "decode_tok_s": (n - 1) / (t_end - t_first) if n > 1 else float("nan")}

    run(4)  # warm-up: compiles, allocates
    out = []
    for r in range(repeats):
        res = run(n_gen)
        res["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
        print(f"mlx-lm  run {r + 1}: prefill {res['prefill_tok_s']:8.1f} tok/s  "
              f"decode {res['decode_tok_s']:7.2f} tok/s  peak {res['peak_rss_mb']:.0f} MB",
              flush=True)
        out.append(res)
    return out


def bench_ours(bin_: Path, model_dir: Path, n_prompt: int, n_gen: int, repeats: int,
               threads: int, extra: str) -> list:
    cmd = [str(bin_), "bench", "--model", str(model_dir), "--prompt-tokens", str(n_prompt),
           "--gen-tokens", str(n_gen), "--threads", str(threads)] + shlex.split(extra)
    out = []
    for r in range(repeats):
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        if p.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed (rc {p.returncode}): {p.stderr[-2000:]}")
        lines = [ln for ln in p.stdout.strip().splitlines() if ln.strip().startswith("{")]
        if not lines:
            raise SystemExit(f"{' '.join(cmd)} printed no JSON line: {p.stdout[-500:]}")
        res = json.loads(lines[-1])
        print(f"gemma4  run {r + 1}: prefill {res['prefill_tok_s']:8.1f} tok/s  "
              f"decode {res['decode_tok_s']:7.2f} tok/s  peak {res.get('peak_rss_mb', 0):.0f} MB",
              flush=True)
        out.append(res)
    return out


def median(rows: list, key: str) -> float:
    vals = [r[key] for r in rows if key in r]
    return statistics.median(vals) if vals else float("nan")


def main() -> int:
    args = parse_args()
    for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
              "VECLIB_MAXIMUM_THREADS"):
        os.environ[v] = str(args.threads)
    os.environ["G4_THREADS"] = str(args.threads)
    print(f"model {args.model}, prompt {args.prompt_tokens} tokens, {args.gen_tokens} generated, "
          f"{args.repeats} repeats, {args.threads} threads", flush=True)
    # The engine runs first, while this process is small: Linux carries the parent's RSS
    # high-water mark into a forked child's ru_maxrss across exec, so after mlx-lm has loaded
    # the model the engine's getrusage peak would read as at least mlx-lm's.
    our_rows = [] if args.skip_ours else bench_ours(args.bin, args.model, args.prompt_tokens,
                                                    args.gen_tokens, args.repeats, args.threads,
                                                    args.our_args)
    mlx_repeats = args.mlx_repeats or args.repeats
    mlx_rows = [] if args.skip_mlx else bench_mlx(args.model, args.prompt_tokens,
                                                  args.gen_tokens, mlx_repeats)
    keys = ("prefill_tok_s", "decode_tok_s", "peak_rss_mb")
    summary = {"model": str(args.model), "prompt_tokens": args.prompt_tokens,
               "gen_tokens": args.gen_tokens, "threads": args.threads,
               "repeats": args.repeats, "our_args": args.our_args,
               "mlx": {k: median(mlx_rows, k) for k in keys},
               "ours": {k: median(our_rows, k) for k in keys},
               "mlx_runs": mlx_rows, "our_runs": our_rows}
    summary["ratio_ours_over_mlx"] = {
        k: summary["ours"][k] / summary["mlx"][k]
        for k in keys if mlx_rows and our_rows and summary["mlx"][k]}
    print(f"\n{'median':14s} {'mlx-lm':>12s} {'gemma4':>12s} {'ours/mlx':>9s}")
    for k in keys:
        r = summary["ratio_ours_over_mlx"].get(k, float("nan"))
        print(f"{k:14s} {summary['mlx'][k]:12.2f} {summary['ours'][k]:12.2f} {r:9.2f}")
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
