#!/usr/bin/env python3
"""LoRA training speed on the GPU: `gemma4 lora --backend cuda` against Hugging Face transformers +
PEFT on the same geometry and settings (issue 22 item 3). Run on the GPU machine.

Geometry: a Gemma 4 variant's (tools/make_synthetic_gemma4_gguf.py VARIANTS; default E4B), random
weights, the synthetic 262144-entry vocabulary.

  ours:  `gemma4 lora --backend cuda` on the variant's synthetic Q4_K_M GGUF (made by
         tools/make_synthetic_gemma4_gguf.py into --gguf when missing), or on --model (an MLX or
         bf16 checkpoint of tools/make_synthetic_gemma4_checkpoint.py); every layer adapted (all
         of its linear modules), rank --rank, Adam, --batch records of --seq tokens (random
         letters, one byte token each, cut by --max-seq-length), --iters iterations. Tokens/s: the
         trainer's own report per iteration (steps_per_report 1). Peak device memory: the largest
         nvidia-smi memory.used during the run, less the reading before it.
  PEFT:  transformers' Gemma4ForCausalLM from the same text config (tools/
         make_synthetic_gemma4_checkpoint.py config_for), bf16 weights (PEFT's 4-bit QLoRA needs
         bitsandbytes, which the GPU image lacks; bf16 weights make PEFT faster, not slower), SDPA
         attention, gradient checkpointing, LoraConfig(r=rank, alpha=2·rank, dropout 0) on the same
         modules, AdamW, one batch of random ids [batch, seq] with labels = ids. Tokens/s: batch ·
         seq / step time (synchronized). Peak: torch.cuda.max_memory_allocated.

Both: the median over iterations 2..N (the first carries compilation and allocation). Prints a
table and the ratio ours / PEFT; --json writes the figures.

    python3 bench/bench_lora_cuda_vs_peft.py --bin build-cuda/bin/gemma4 [--variant e4b] [--seq 2048]
        [--batch 4] [--rank 8] [--iters 6] [--dtype f32|bf16] [--skip-peft] [--skip-ours]

bench/cuda_train_session.sh runs it (and the checks) in one call.

PEFT is not in the GPU image, nor a transformers with Gemma 4 perhaps: carry their wheels (pip
download peft transformers --no-deps) in .whl-train, which bench/cuda_train_session.sh installs.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import string
import subprocess
import sys
import tempfile
import threading
import time
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))

# mlx-lm's LoRA keys on a Gemma 4 layer (model/lora.h kLoraModules), as HF names the modules.
PEFT_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                "per_layer_input_gate", "per_layer_projection"]


def text_config(variant: str) -> dict:
    from make_synthetic_gemma4_checkpoint import config_for
    from make_synthetic_gemma4_gguf import VARIANTS
    v = dict(VARIANTS[variant])
    n = v["n"]
    sliding = [(i % v["period"]) != v["period"] - 1 for i in range(n)]
    return config_for(v, n, v["shared"], sliding, types.SimpleNamespace(format="bf16"), {})["text_config"]


def gpu_memory_used_mib() -> int:
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout.split()
    return int(out[0]) if out else 0


class PeakMemory:
    """The largest nvidia-smi memory.used while the block runs, less the reading before it."""

    def __enter__(self):
        self.base = gpu_memory_used_mib()
        self.peak = self.base
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()
        return self

    def _poll(self):
        while not self.stop.wait(0.2):
            self.peak = max(self.peak, gpu_memory_used_mib())

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        self.mib = self.peak - self.base


def make_data(out: Path, records: int, valid: int, chars: int, seed: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    for name, n in (("train", records), ("valid", valid)):
        with open(out / f"{name}.jsonl", "w") as f:
            for _ in range(n):
                f.write(json.dumps({"text": "".join(rng.choice(string.ascii_lowercase) for _ in range(chars))}) + "\n")


def bench_ours(a, work: Path) -> dict:
    model = a.model
    if model is None:
        model = a.gguf
        if not model.exists():
            print(f"making {model} (tools/make_synthetic_gemma4_gguf.py --variant {a.variant})", flush=True)
            subprocess.run([sys.executable, str(REPO / "tools/make_synthetic_gemma4_gguf.py"), str(model),
                            "--variant", a.variant], check=True, stdout=subprocess.DEVNULL)
    data = work / "data"
    make_data(data, a.batch * max(4, a.iters), a.batch, 2 * a.seq, 7)
    log = work / "ours.jsonl"
    cmd = [str(a.bin), "lora", "--backend", "cuda", "--model", str(model), "--data", str(data),
           "--adapter-path", str(work / "adapter"), "--overwrite", "--num-layers", "-1", "--rank", str(a.rank),
           "--batch-size", str(a.batch), "--max-seq-length", str(a.seq), "--iters", str(a.iters),
           "--steps-per-report", "1", "--steps-per-eval", "1000000", "--val-batches", "1",
           "--save-every", "1000000", "--learning-rate", "1e-5", "--dtype", a.dtype, "--log-file", str(log),
           *a.ours_args.split()]
    print("ours: " + " ".join(cmd), flush=True)
    with PeakMemory() as mem:
        t = time.time()
        r = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.time() - t
    if r.returncode != 0:
        sys.exit(f"gemma4 lora failed ({r.returncode}):\n{r.stderr[-3000:]}")
    rates = [j["tokens_per_sec"] for j in map(json.loads, log.read_text().splitlines()) if j["kind"] == "train"]
    for i, x in enumerate(rates, 1):
        print(f"  ours iter {i}: {x:.1f} tok/s", flush=True)
    return {"tok_s": statistics.median(rates[1:] or rates), "peak_mib": mem.mib, "wall_s": wall, "iters": rates}


def bench_peft(a) -> dict:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    tc = text_config(a.variant)
    tc.pop("model_type", None)
    cfg = Gemma4TextConfig(**tc)
    cfg._attn_implementation = "sdpa"
    cfg.use_cache = False
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Gemma4ForCausalLM(cfg).to(torch.bfloat16)
    model.gradient_checkpointing_enable()
    model.enable_input_require_grads()
    present = {n.split(".")[-1] for n, _ in model.named_modules()}
    targets = [t for t in PEFT_TARGETS if t in present]
    model = get_peft_model(model, LoraConfig(r=a.rank, lora_alpha=2 * a.rank, lora_dropout=0.0,
                                             target_modules=targets))
    # The adapters in f32 (master weights), as ours keeps them.
    for n, p in model.named_parameters():
        if p.requires_grad:
            p.data = p.data.float()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    ids = torch.randint(3, cfg.vocab_size, (a.batch, a.seq), device="cuda")
    torch.cuda.reset_peak_memory_stats()
    rates = []
    for i in range(a.iters):
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        rates.append(a.batch * a.seq / (time.perf_counter() - t))
        print(f"  peft iter {i + 1}: {rates[-1]:.1f} tok/s, loss {loss.item():.3f}", flush=True)
    return {"tok_s": statistics.median(rates[1:] or rates), "peak_mib": torch.cuda.max_memory_allocated() >> 20,
            "iters": rates, "targets": targets}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--bin", type=Path, default=REPO / "build-cuda" / "bin" / "gemma4")
    ap.add_argument("--variant", default="e4b")
    ap.add_argument("--gguf", type=Path, default=None, help="default /tmp/t-VARIANT.gguf")
    ap.add_argument("--model", type=Path, default=None, help="train on this checkpoint instead of the GGUF")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--iters", type=int, default=6)
    ap.add_argument("--dtype", choices=["f32", "bf16"], default=os.environ.get("G4_LORA_DTYPE", "f32"),
                    help="ours: the products' operands (gemma4 lora --dtype)")
    ap.add_argument("--ours-args", default="", help="more flags for gemma4 lora, e.g. '--cuda-bf16-cache 12'")
    ap.add_argument("--skip-ours", action="store_true")
    ap.add_argument("--skip-peft", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    a.gguf = a.gguf or Path(f"/tmp/t-{a.variant}.gguf")
    res = {"variant": a.variant, "seq": a.seq, "batch": a.batch, "rank": a.rank, "iters": a.iters, "dtype": a.dtype}
    with tempfile.TemporaryDirectory() as tmp:
        if not a.skip_ours:
            res["ours"] = bench_ours(a, Path(tmp))
    if not a.skip_peft:
        res["peft"] = bench_peft(a)
    print(f"\n{a.variant}, {a.batch} x {a.seq} tokens, rank {a.rank}, ours --dtype {a.dtype}, "
          f"median of iterations 2..{a.iters}:")
    for k in ("ours", "peft"):
        if k in res:
            print(f"  {k:5s} {res[k]['tok_s']:10.1f} train tok/s   peak device memory {res[k]['peak_mib'] / 1024:.1f} GiB")
    if "ours" in res and "peft" in res:
        print(f"  ours / PEFT: {res['ours']['tok_s'] / res['peft']['tok_s']:.2f}x")
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
