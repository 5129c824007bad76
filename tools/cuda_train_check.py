#!/usr/bin/env python3
"""Checks LoRA training on the GPU (`gemma4 lora --backend cuda`, issue 22 item 2) on a machine with
one, against mlx-lm's own training runs and the host path.

For every case folder of tools/make_lora_train_oracle.py's output given (model/, data/,
init.safetensors, oracle.json with mlx-lm's flags and losses, expected.safetensors with its
adapter), runs the oracle's settings from its starting adapter three times: --backend cpu (f32),
--backend cuda (f32) and --backend cuda --dtype bf16, and checks:
  - cuda f32 and cuda bf16: every reported train and validation loss within 1e-2 relative of
    mlx-lm's (the issue's bound; the host path lands within 2e-4 absolute);
  - cuda bf16 against cuda f32: every loss within 1e-3 relative (the issue's bound);
  - cuda f32 against cpu: every loss within 1e-4 relative (the same f32 function in another sum
    order), reported with the adapters' difference relative to the training's change.
Prints a line per case and run (losses, time, the adapter's change against mlx-lm's) and a verdict
per check; exits 1 if any fails. numpy only (runs in the GPU image).

    python3 tools/cuda_train_check.py --bin build-cuda/bin/gemma4 DIR/lora-train/dense-completions ...
"""
import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import safetensors_np  # noqa: E402

FLAG_KEYS = ["num_layers", "rank", "scale", "optimizer", "learning_rate", "batch_size", "iters",
             "steps_per_eval", "val_batches", "seed", "max_seq_length", "grad_accumulation_steps"]
RUNS = {"cpu": ["--backend", "cpu"], "cuda": ["--backend", "cuda"], "cuda-bf16": ["--backend", "cuda", "--dtype", "bf16"]}


def train(bin_: Path, case: Path, flags: dict, extra: list, out: Path) -> dict:
    log = out / "log.jsonl"
    cmd = [str(bin_), "lora", "--model", str(case / "model"), "--data", str(case / "data"), "--resume-adapter-file",
           str(case / "init.safetensors"), "--adapter-path", str(out / "adapter"), "--log-file", str(log),
           "--steps-per-report", "1", *extra]
    for k in FLAG_KEYS:
        cmd += ["--" + k.replace("_", "-"), str(flags[k])]
    if flags["mask_prompt"]:
        cmd.append("--mask-prompt")
    t = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        return {"error": r.stderr[-2000:]}
    rows = [json.loads(x) for x in log.read_text().splitlines()]
    return {"seconds": time.time() - t,
            "losses": [(x["kind"], x["iteration"], x["loss"]) for x in rows if x["kind"] in ("train", "val")],
            "adapter": safetensors_np.load_file(str(out / "adapter" / "adapters.safetensors"))}


def rel_diff(a: list, b: list) -> float:
    assert [x[:2] for x in a] == [x[:2] for x in b], "the runs report different iterations"
    return max(abs(x[2] - y[2]) / max(abs(y[2]), 1e-12) for x, y in zip(a, b))


def change_diff(got: dict, want: dict, init: dict) -> float:
    """The largest per-tensor |got - want| / |want - init| (norms): adapters' difference relative to the change."""
    return max(float(np.linalg.norm(got[k] - want[k]) / max(np.linalg.norm(want[k] - init[k]), 1e-12)) for k in want)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--bin", type=Path, required=True)
    ap.add_argument("cases", type=Path, nargs="+")
    a = ap.parse_args()
    ok = True
    for case in a.cases:
        oracle = json.loads((case / "oracle.json").read_text())
        mlx = sorted([("train", i, v) for i, v in oracle["train"]] + [("val", i, v) for i, v in oracle["val"]],
                     key=lambda x: (x[1], x[0] == "train"))
        init = safetensors_np.load_file(str(case / "init.safetensors"))
        want = safetensors_np.load_file(str(case / "expected.safetensors"))
        res = {}
        with tempfile.TemporaryDirectory() as tmp:
            for name, extra in RUNS.items():
                out = Path(tmp) / name
                out.mkdir()
                res[name] = train(a.bin, case, oracle["flags"], extra, out)
                r = res[name]
                if "error" in r:
                    print(f"{case.name} {name}: FAILED to run\n{r['error']}")
                    ok = False
                    continue
                r["losses"].sort(key=lambda x: (x[1], x[0] == "train"))
                print(f"{case.name} {name}: {r['seconds']:.1f} s; losses {[round(x[2], 4) for x in r['losses']]}; "
                      f"adapter change vs mlx-lm's {change_diff(r['adapter'], want, init):.2e}")
        if any("error" in r for r in res.values()):
            continue
        checks = [(f"{case.name}: cuda f32 vs mlx-lm", rel_diff(res["cuda"]["losses"], mlx), 1e-2),
                  (f"{case.name}: cuda bf16 vs mlx-lm", rel_diff(res["cuda-bf16"]["losses"], mlx), 1e-2),
                  (f"{case.name}: cuda bf16 vs cuda f32", rel_diff(res["cuda-bf16"]["losses"], res["cuda"]["losses"]),
                   1e-3),
                  (f"{case.name}: cuda f32 vs cpu", rel_diff(res["cuda"]["losses"], res["cpu"]["losses"]), 1e-4)]
        for what, d, bound in checks:
            good = d <= bound
            ok = ok and good
            print(f"  {'PASS' if good else 'FAIL'} {what}: largest relative loss difference {d:.2e} (bound {bound:.0e})")
        print(f"  cuda f32 adapter vs cpu's: {change_diff(res['cuda']['adapter'], res['cpu']['adapter'], init):.2e} "
              "of the change")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
