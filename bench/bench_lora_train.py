#!/usr/bin/env python3
"""LoRA fine-tuning speed of `gemma4 lora` against mlx-lm's trainer on the same checkpoint and data.

Usage: bench/bench_lora_train.py [--model-dir models/bench-lora] [--iters 8] [--batch-size 2]
                                 [--num-layers 4] [--rank 8] [--threads 2] [--bin build/bin/gemma4]

The checkpoint (made once, by mlx-lm itself, into --model-dir): a random 4-bit g64 gemma4_text
model at Gemma 3 270M's layer geometry (hidden 640, MLP 2048, 4 heads of 256, 1 KV head; 6 layers,
5 sliding + 1 full, window 512) with a 32768-token vocabulary, plus the tiny chat tokenizer of the
test fixtures (oracle_common.write_tiny_chat_files). The data: 32 seeded random text records of
about 120 tokens. Both sides train the same LoRA (the last --num-layers layers, every linear module,
rank --rank, Adam, lr 1e-5) for --iters iterations of --batch-size records:
  mlx-lm: mlx_lm.tuner.trainer.train in this process (the model as loaded: bf16 activations, as
          `mlx_lm.lora` runs it), threads limited through OMP/OPENBLAS/MKL variables;
  ours:   `gemma4 lora --threads T` (f32 activations) with --log-file.
Tokens/sec per iteration come from each trainer's own report (steps_per_report 1); the first
iteration (compilation, warm caches) is dropped and the median of the rest is printed with the
ratio ours / mlx-lm.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-dir", type=Path, default=REPO / "models" / "bench-lora")
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--num-layers", type=int, default=4)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bin", type=Path, default=REPO / "build" / "bin" / "gemma4")
    return ap.parse_args()


def make_checkpoint(out: Path) -> None:
    if (out / "config.json").exists() and (out / "tokenizer.json").exists():
        return
    sys.path.insert(0, str(REPO / "tools"))
    import numpy as np
    import mlx.core as mx
    from mlx.utils import tree_unflatten
    import oracle_common as oc
    print(f"making the benchmark checkpoint in {out} (mlx-lm) ...", flush=True)
    cfg = {
        "model_type": "gemma4_text", "hidden_size": 640, "intermediate_size": 2048, "num_attention_heads": 4,
        "num_key_value_heads": 1, "head_dim": 256, "global_head_dim": 512, "rms_norm_eps": 1e-6,
        "vocab_size": 32768, "vocab_size_per_layer_input": 32768, "hidden_size_per_layer_input": 0,
        "num_kv_shared_layers": 0, "use_double_wide_mlp": False, "attention_k_eq_v": False,
        "num_global_key_value_heads": None, "enable_moe_block": False, "sliding_window": 512,
        "final_logit_softcapping": 30.0, "tie_word_embeddings": True, "rope_parameters": oc.rope_parameters(),
        "max_position_embeddings": 131072, "hidden_activation": "gelu_pytorch_tanh", "pad_token_id": 0,
        "eos_token_id": 1, "bos_token_id": 2,
        "layer_types": ["sliding_attention"] * 5 + ["full_attention"], "num_hidden_layers": 6,
    }
    model = oc.build_model(cfg)
    params = oc.random_params(model, np.random.default_rng(0))
    model.update(tree_unflatten(list(params.items())))
    model.set_dtype(mx.bfloat16)
    model, cfg = oc.quantize(model, cfg, 4, 64)
    oc.save_checkpoint(model, cfg, out)
    oc.write_tiny_chat_files(out, cfg["vocab_size"])


def make_data(out: Path) -> None:
    import numpy as np
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    words = "the a cat dog sees runs under over small red blue tree house river stone light".split()
    with open(out / "train.jsonl", "w") as f:
        for _ in range(32):
            f.write(json.dumps({"text": " ".join(rng.choice(words, size=24)) + "."}) + "\n")


def bench_mlx(model_dir: Path, data: Path, a) -> list:
    import numpy as np
    import mlx.core as mx
    import mlx.optimizers as optim
    from mlx_lm.tuner.datasets import CacheDataset, load_dataset
    from mlx_lm.tuner.trainer import TrainingArgs, TrainingCallback, train
    from mlx_lm.tuner.utils import linear_to_lora_layers
    from mlx_lm.utils import load
    mx.set_default_device(mx.cpu)
    model, tok = load(str(model_dir))
    tr, _, _ = load_dataset(types.SimpleNamespace(data=str(data), train=True, test=False, mask_prompt=False), tok)
    np.random.seed(0)
    model.freeze()
    linear_to_lora_layers(model, a.num_layers, {"rank": a.rank, "scale": 20.0, "dropout": 0.0})
    rates = []

    class Cb(TrainingCallback):
        def on_train_loss_report(self, info):
            rates.append(info["tokens_per_second"])
            print(f"  mlx-lm iter {info['iteration']}: {info['tokens_per_second']:.1f} tok/s", flush=True)

    train(model=model, optimizer=optim.Adam(learning_rate=1e-5), train_dataset=CacheDataset(tr),
          args=TrainingArgs(batch_size=a.batch_size, iters=a.iters, steps_per_report=1, steps_per_save=10**9,
                            adapter_file="/tmp/bench_lora_mlx.safetensors"), training_callback=Cb())
    return rates


def bench_ours(model_dir: Path, data: Path, a) -> list:
    log = Path("/tmp/bench_lora_ours.jsonl")
    cmd = [str(a.bin), "lora", "--model", str(model_dir), "--data", str(data), "--adapter-path", "/tmp/bench_lora_ours",
           "--iters", str(a.iters), "--batch-size", str(a.batch_size), "--num-layers", str(a.num_layers),
           "--rank", str(a.rank), "--learning-rate", "1e-5", "--steps-per-report", "1", "--threads", str(a.threads),
           "--log-file", str(log)]
    print("  $ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    rates = [json.loads(x)["tokens_per_sec"] for x in log.read_text().splitlines() if '"train"' in x]
    for i, r in enumerate(rates):
        print(f"  ours   iter {i + 1}: {r:.1f} tok/s")
    return rates


def main() -> int:
    a = parse_args()
    for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[v] = str(a.threads)
    t0 = time.time()
    make_checkpoint(a.model_dir)
    data = a.model_dir.parent / (a.model_dir.name + "-data")
    make_data(data)
    print(f"bench_lora_train: {a.iters} iterations of {a.batch_size} records, last {a.num_layers} layers, "
          f"rank {a.rank}, {a.threads} threads")
    ours = bench_ours(a.model_dir, data, a)
    theirs = bench_mlx(a.model_dir, data, a)
    mo, mt = statistics.median(ours[1:]), statistics.median(theirs[1:])
    print(f"\ntrain tokens/sec (median of iterations 2..{a.iters}): ours {mo:.1f}  mlx-lm {mt:.1f}  "
          f"ratio {mo / mt:.2f}x  ({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
