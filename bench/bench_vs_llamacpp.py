#!/usr/bin/env python3
"""Our engine vs llama.cpp (llama-cpp-python, requirements-peer.txt) on the same GGUF file, the
same 128-token prompt and the same thread count.

Prints, per engine, the medians over --repeat fresh processes of: prefill tok/s, decode tok/s
(greedy, --gen tokens, no stop), time to first token from process start, and the ratios
ours / llama.cpp. Each process runs prefill + decode once (a cold start each time).

  ours:      build/bin/gemma4 bench --model GGUF --prompt-tokens 128 --gen-tokens 64 --threads 2
             -> one JSON line {prefill_tok_s, decode_tok_s, ttft_s, peak_rss_mb, ...}
  llama.cpp: a child Python process; ttft counts from just before the parent starts it, so it
             includes the Python interpreter and `import llama_cpp` (reported separately too).

The prompt is the one `gemma4 bench` builds (src/cli/cmd_bench.cpp): BOS followed by ids from the
LCG s = s*1664525 + 1013904223 (mod 2^32), id = 1000 + (s >> 8) % (V - 1000), s0 = 12345.
llama.cpp runs with its defaults for CPU inference (f16 KV cache, flash attention auto), as a user
would run it.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, sys, time
t_import = time.time()
import numpy as np
import llama_cpp
from llama_cpp import Llama
model, n_prompt, n_gen, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
t_start = float(sys.argv[5])
llm = Llama(model_path=model, n_ctx=n_prompt + n_gen + 8, n_batch=512, n_ubatch=512,
            n_threads=threads, n_threads_batch=threads, logits_all=False, verbose=False)
V = llm.n_vocab()
s = 12345
prompt = []
for i in range(n_prompt):
    s = (s * 1664525 + 1013904223) & 0xFFFFFFFF
    prompt.append(1000 + (s >> 8) % max(1, V - 1000))
prompt[0] = llm.token_bos()
def last_logits():
    p = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(p, shape=(V,))
t0 = time.time()
llm.eval(prompt)
nxt = int(np.argmax(last_logits()))
t1 = time.time()
for _ in range(n_gen):
    llm.eval([nxt])
    nxt = int(np.argmax(last_logits()))
t2 = time.time()
print(json.dumps({"prefill_tok_s": n_prompt / (t1 - t0), "decode_tok_s": n_gen / (t2 - t1),
                  "ttft_s": t1 - t_start, "ttft_inproc_s": t1 - t_import,
                  "load_s": t0 - t_import}))
"""


def run_ours(binary: str, model: str, n_prompt: int, n_gen: int, threads: int) -> dict:
    cmd = [binary, "bench", "--model", model, "--prompt-tokens", str(n_prompt),
           "--gen-tokens", str(n_gen), "--threads", str(threads)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        sys.exit(f"ours failed (rc {r.returncode}): {' '.join(cmd)}\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def run_llamacpp(model: str, n_prompt: int, n_gen: int, threads: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    t_start = time.time()
    r = subprocess.run([sys.executable, "-c", CHILD, model, str(n_prompt), str(n_gen),
                        str(threads), repr(t_start)], capture_output=True, text=True,
                       timeout=900, env=env)
    if r.returncode != 0:
        sys.exit(f"llama.cpp child failed (rc {r.returncode}):\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def median(rows, key):
    return statistics.median(row[key] for row in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="GGUF file (default: the starter model)")
    ap.add_argument("--bin", default=str(ROOT / "build" / "bin" / "gemma4"))
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--gen-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="print one JSON line at the end")
    a = ap.parse_args()
    model = a.model or os.environ.get("GEMMA4_MODEL")
    if not model:
        sys.path.insert(0, str(ROOT / "tools"))
        from starter_model import ensure_starter_model
        model = str(ensure_starter_model())
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        sys.exit("llama-cpp-python is missing: CMAKE_ARGS=... .venv/bin/pip install -r "
                 "requirements-peer.txt (see that file)")
    if not Path(a.bin).exists():
        sys.exit(f"{a.bin} is missing: make build")

    ours, ref = [], []
    for i in range(a.repeat):  # interleaved so that machine noise hits both alike
        ours.append(run_ours(a.bin, model, a.prompt_tokens, a.gen_tokens, a.threads))
        ref.append(run_llamacpp(model, a.prompt_tokens, a.gen_tokens, a.threads))
        print(f"run {i + 1}/{a.repeat}: ours {ours[-1]['prefill_tok_s']:.1f}/"
              f"{ours[-1]['decode_tok_s']:.1f} tok/s, llama.cpp {ref[-1]['prefill_tok_s']:.1f}/"
              f"{ref[-1]['decode_tok_s']:.1f} tok/s (prefill/decode)", file=sys.stderr)

    res = {"model": os.path.basename(model), "threads": a.threads,
           "prompt_tokens": a.prompt_tokens, "gen_tokens": a.gen_tokens, "repeat": a.repeat}
    print(f"{os.path.basename(model)}: prompt {a.prompt_tokens}, gen {a.gen_tokens}, "
          f"threads {a.threads}, median of {a.repeat} processes")
    print(f"{'':22s}{'ours':>12s}{'llama.cpp':>12s}{'ours/llama':>12s}")
    for key, label, higher_better in (("prefill_tok_s", "prefill tok/s", True),
                                      ("decode_tok_s", "decode tok/s", True),
                                      ("ttft_s", "ttft s (from start)", False)):
        o, l = median(ours, key), median(ref, key)
        res[key] = {"ours": o, "llamacpp": l, "ratio": o / l}
        print(f"{label:22s}{o:12.3f}{l:12.3f}{o / l:12.2f}")
    res["llamacpp_ttft_inproc_s"] = median(ref, "ttft_inproc_s")
    res["ours_peak_rss_mb"] = median(ours, "peak_rss_mb")
    print(f"(llama.cpp ttft after `import llama_cpp`: {res['llamacpp_ttft_inproc_s']:.3f} s; "
          f"ours peak RSS {res['ours_peak_rss_mb']:.0f} MB)")
    if a.json:
        print(json.dumps(res))


if __name__ == "__main__":
    main()
