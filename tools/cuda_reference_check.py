#!/usr/bin/env python3
"""CUDA backend against the exact f32 reference backend on a GGUF (the lent GPU machine).

Runs `gemma4 greedy` on the cpu and cuda backends from one prompt, then `gemma4 logits` on the
cuda, cpu and reference backends over the prompt and the cpu continuation, and prints the max
|dlogit| of cuda and of cpu against the reference (the cpu backend quantizes activations for its
integer GGUF kernels, as llama.cpp does; the cuda backend computes in f32 throughout). Where the
two greedy runs part, it prints both candidates' logits (a near tie or an error). Exits 1 when
cuda's max |dlogit| exceeds --tol times the logits' scale.

    python3 tools/cuda_reference_check.py --bin build-cuda/bin/gemma4 --gguf MODEL.gguf
"""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--prompt", default="tok500 tok600 tok700 tok800")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--tol", type=float, default=1e-4, help="relative to max |reference logit|")
    a = ap.parse_args()

    def run(*args):
        out = subprocess.run([a.bin, *args], capture_output=True, text=True, check=True).stdout.strip().splitlines()
        return out[-1] if out else ""

    prompt = [2] + json.loads(run("tokenize", "--model", a.gguf, a.prompt))
    ids = ",".join(map(str, prompt))
    greedy = {be: json.loads(run("greedy", "--model", a.gguf, "--backend", be, "--ids", ids, "--steps", str(a.steps)))
              for be in ("cpu", "cuda")}
    k = next((i for i in range(a.steps) if greedy["cpu"][i] != greedy["cuda"][i]), a.steps)
    print(f"greedy: cpu and cuda identical for {k} of {a.steps} steps")
    seq = ",".join(map(str, prompt + greedy["cpu"][:k]))
    with tempfile.TemporaryDirectory() as tmp:
        logits = {}
        for be in ("reference", "cpu", "cuda"):
            run("logits", "--model", a.gguf, "--backend", be, "--ids", seq, "--out", f"{tmp}/{be}.npy")
            logits[be] = np.load(Path(tmp) / f"{be}.npy")
    ref = logits["reference"]
    scale = float(np.abs(ref).max())
    if k < a.steps:
        x, y = greedy["cpu"][k], greedy["cuda"][k]
        print(f"step {k}: cpu picks {x}, cuda {y}; reference logits {ref[-1, x]:.6f} vs {ref[-1, y]:.6f}")
    worst = {}
    for be in ("cpu", "cuda"):
        worst[be] = float(np.abs(logits[be] - ref).max())
        print(f"{be} vs reference, {ref.shape[0]} positions: max |dlogit| {worst[be]:.2e} (logit scale {scale:.2f})")
    ok = worst["cuda"] <= a.tol * scale
    print("cuda within tolerance" if ok else f"cuda above {a.tol:g} x scale")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
