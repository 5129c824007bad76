#!/usr/bin/env python3
"""LoRA training runs made by mlx-lm itself (its datasets, batches, loss, autodiff, optimizers and
training loop), for the `gemma4 lora` tests.

Usage: tools/make_lora_train_oracle.py --fixtures tests/fixtures/generated [--force]

For each case below, writes lora-train/<case>/ (under the fixtures directory):
  model/                 the fixture's config.json + weights, with a tiny chat tokenizer
                         (oracle_common.write_tiny_chat_files) so that jsonl data can be read
  data/{train,valid}.jsonl   seeded random records in the case's format (text, prompt/completion
                         or chat messages; sequences longer than the fixtures' sliding window)
  init.safetensors       the starting adapter (mlx-lm's LoRA layers of the last num_layers layers,
                         lora_a and lora_b both seeded random, so that every gradient is non-zero
                         from the first step), given to both runs as --resume-adapter-file
  expected.safetensors   the adapter after mlx-lm's training run
  oracle.json            the case's settings (the `gemma4 lora` flags) and mlx-lm's reports:
                         train loss of every iteration (steps_per_report 1) and the validation losses;
                         self_divergence: how far mlx-lm's own run moves (losses, adapter) when
                         the starting adapter is scaled by 1 + 1e-6, the noise floor of a comparison
The run is mlx_lm.tuner.trainer.train with mlx-lm's iterate_batches and np.random seeded as
mlx_lm.lora does, the model in float32, and mlx-lm's default_loss given each row's length minus one:
default_loss otherwise also scores the first padding position after every sequence (a pad id 0;
ml-explore/mlx-lm PR 1697), which this runtime does not.
Skips work when every output exists and the stamp (this script + the fixtures' stamp + mlx /
mlx-lm versions) matches.
"""
from __future__ import annotations

import json
import shutil
import sys
import time
import types
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import oracle_common as oc  # noqa: E402

import mlx.core as mx  # noqa: E402
import mlx.optimizers as optim  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402
from mlx_lm.tuner.datasets import CacheDataset, load_dataset  # noqa: E402
from mlx_lm.tuner.trainer import TrainingArgs, TrainingCallback, default_loss, train  # noqa: E402
from mlx_lm.tuner.utils import linear_to_lora_layers  # noqa: E402
from mlx_lm.utils import load  # noqa: E402

# name, fixture, data format, flags (the `gemma4 lora` flags this run uses; mlx-lm's names)
CASES = [
    ("dense-completions", "dense-q4g64", "completions",
     dict(num_layers=4, rank=4, scale=2.0, optimizer="adam", learning_rate=1e-3, batch_size=2, iters=6,
          steps_per_eval=3, val_batches=2, seed=3, mask_prompt=True, max_seq_length=2048,
          grad_accumulation_steps=1)),
    ("estyle-chat", "estyle-q4g64", "chat",
     dict(num_layers=-1, rank=4, scale=1.5, optimizer="adamw", learning_rate=1e-3, batch_size=3, iters=6,
          steps_per_eval=4, val_batches=-1, seed=5, mask_prompt=False, max_seq_length=2048,
          grad_accumulation_steps=2)),
    ("dense-text-sgd", "dense-bf16", "text",
     dict(num_layers=6, rank=4, scale=3.0, optimizer="sgd", learning_rate=0.01, batch_size=2, iters=4,
          steps_per_eval=2, val_batches=1, seed=7, mask_prompt=False, max_seq_length=40,
          grad_accumulation_steps=1)),
    # Routed experts between trained layers: adapters on attention and the dense MLP only (mlx-lm's
    # keys), the router and the experts frozen, as `gemma4 lora` trains MoE models.
    ("moe-chat", "moe-q4g64", "chat",
     dict(num_layers=-1, rank=4, scale=1.5, optimizer="adam", learning_rate=1e-3, batch_size=2, iters=6,
          steps_per_eval=3, val_batches=2, seed=9, mask_prompt=False, max_seq_length=2048,
          grad_accumulation_steps=1,
          lora_keys=["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                     "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"])),
]

WORDS = ("the a cat dog sees runs under over small red blue tree house river stone light "
         "quick slow bird sings near far old new").split()


def sentence(rng, lo, hi):
    return " ".join(rng.choice(WORDS, size=int(rng.integers(lo, hi)))) + "."


def write_data(out: Path, fmt: str, rng) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", 9), ("valid", 5)):
        with open(out / f"{split}.jsonl", "w") as f:
            for _ in range(n):
                if fmt == "text":
                    rec = {"text": sentence(rng, 4, 14)}
                elif fmt == "completions":
                    rec = {"prompt": sentence(rng, 2, 6), "completion": sentence(rng, 2, 8)}
                else:
                    msgs = [{"role": "user", "content": sentence(rng, 2, 5)},
                            {"role": "assistant", "content": sentence(rng, 2, 6)}]
                    if rng.random() < 0.5:
                        msgs = [{"role": "system", "content": sentence(rng, 2, 4)}] + msgs
                    rec = {"messages": msgs}
                f.write(json.dumps(rec) + "\n")


def corrected_loss(model, batch, lengths):
    """mlx-lm's default_loss over each row's real targets only (length - 1: see the docstring)."""
    return default_loss(model, batch, lengths - mx.array([0, 1]))


class Recorder(TrainingCallback):
    def __init__(self):
        self.train, self.val = [], []

    def on_train_loss_report(self, info):
        self.train.append([info["iteration"], info["train_loss"]])

    def on_val_loss_report(self, info):
        self.val.append([info["iteration"] + 1, info["val_loss"]])  # mlx-lm reports it - 1


def run_case(fixtures: Path, name: str, fixture: str, fmt: str, flags: dict) -> str:
    out = fixtures / "lora-train" / name
    if out.exists():
        shutil.rmtree(out)
    mdir = out / "model"
    mdir.mkdir(parents=True)
    for f in (fixtures / fixture).iterdir():
        if f.name == "config.json" or f.name.startswith("model"):
            shutil.copy(f, mdir / f.name)
    cfg = json.loads((mdir / "config.json").read_text())
    oc.write_tiny_chat_files(mdir, cfg.get("text_config", cfg)["vocab_size"])
    rng = np.random.default_rng(flags["seed"] + 100)
    write_data(out / "data", fmt, rng)

    init = None
    runs = []
    for perturb in (0.0, 1e-6):  # the second run measures how much the run itself amplifies f32 noise
        model, tokenizer = load(str(mdir))
        model.set_dtype(mx.float32)
        args = types.SimpleNamespace(data=str(out / "data"), train=True, test=False, mask_prompt=flags["mask_prompt"])
        train_set, valid_set, _ = load_dataset(args, tokenizer)
        np.random.seed(flags["seed"])  # as mlx_lm.lora's run()
        mx.random.seed(flags["seed"])
        model.freeze()
        lp = {"rank": flags["rank"], "scale": flags["scale"], "dropout": 0.0}
        if "lora_keys" in flags:
            lp["keys"] = flags["lora_keys"]
        linear_to_lora_layers(model, flags["num_layers"], lp)
        if init is None:
            init = {}
            for k, v in tree_flatten(model.trainable_parameters()):
                bound = 1.0 / np.sqrt(v.shape[0]) if k.endswith("lora_a") else 0.05
                init[k] = rng.uniform(-bound, bound, size=v.shape).astype(np.float32)
            mx.save_safetensors(str(out / "init.safetensors"), {k: mx.array(v) for k, v in init.items()})
        model.load_weights([(k, mx.array(v * np.float32(1 + perturb))) for k, v in init.items()], strict=False)
        opt_cls = {"adam": optim.Adam, "adamw": optim.AdamW, "sgd": optim.SGD}[flags["optimizer"]]
        opt = opt_cls(learning_rate=flags["learning_rate"])
        adapter = out / ("expected.safetensors" if perturb == 0 else "perturbed.safetensors")
        targs = TrainingArgs(batch_size=flags["batch_size"], iters=flags["iters"], val_batches=flags["val_batches"],
                             steps_per_report=1, steps_per_eval=flags["steps_per_eval"], steps_per_save=10**9,
                             adapter_file=str(adapter), max_seq_length=flags["max_seq_length"],
                             grad_accumulation_steps=flags["grad_accumulation_steps"])
        rec = Recorder()
        train(model=model, optimizer=opt, train_dataset=CacheDataset(train_set), val_dataset=CacheDataset(valid_set),
              args=targs, loss=corrected_loss, training_callback=rec)
        runs.append((rec, dict(tree_flatten(model.trainable_parameters()))))
    (rec, final), (rec2, final2) = runs
    (out / "perturbed.safetensors").unlink()
    moved = max(float(np.abs(np.array(v) - init[k]).max()) for k, v in final.items())
    self_adapter = max(float(np.abs(np.array(v) - np.array(final2[k])).max()) for k, v in final.items())
    self_loss = max(abs(a[1] - b[1]) for a, b in zip(rec.train + rec.val, rec2.train + rec2.val))
    (out / "oracle.json").write_text(json.dumps(
        {"format": fmt, "flags": flags, "train": rec.train, "val": rec.val, "adapter_moved": moved,
         "self_divergence": {"loss": self_loss, "adapter": self_adapter}}, indent=1) + "\n")
    return (f"  {name:18s} {len(init) // 2} modules, train loss {rec.train[0][1]:.3f} -> {rec.train[-1][1]:.3f}, "
            f"adapter moved {moved:.3f}; a 1e-6 change of the start moves the losses by {self_loss:.1e}, "
            f"the adapter by {self_adapter:.1e}")


def main() -> int:
    args = oc.derived_args(__doc__)
    stamp = oc.derived_stamp(Path(__file__), args.fixtures)
    stamp_file = args.fixtures / ".stamp-lora-train"
    outs = [args.fixtures / "lora-train" / c[0] / "oracle.json" for c in CASES]
    if oc.up_to_date(args, stamp_file, outs, stamp):
        print(f"lora training oracle: up to date ({len(CASES)} runs)")
        return 0
    t0 = time.time()
    for name, fixture, fmt, flags in CASES:
        print(run_case(args.fixtures, name, fixture, fmt, flags), flush=True)
    stamp_file.write_text(stamp + "\n")
    print(f"lora training oracle: {len(CASES)} runs in {time.time() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
