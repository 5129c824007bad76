"""`gemma4 lora` made usable (issue 22 item 4). Resuming exactly: every save writes the run's training state
beside the adapter (train/train_state.h); `--resume-adapter-file DIR/NNNNNNN_adapters.safetensors`
or `--resume` continues that run, and Ctrl-C saves the adapter and its state before stopping.

Oracle: the same run uninterrupted. Checked: resuming from a checkpoint taken in the middle of a
gradient accumulation gives the uninterrupted run's adapter byte for byte and the same reports; an
interrupted run exits 130 after saving, and `--resume` finishes it with the uninterrupted adapter; a
state saved by other flags is refused naming the flag; an adapter without a state starts the
optimizer afresh and says so; a damaged state file is refused naming it.
Memory: a batch whose activations and attention weights cannot fit the free memory is refused
before training starts (and before the adapter directory is touched), with both numbers.
"""
from __future__ import annotations

import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from test_lora_train import train_fixtures  # noqa: F401  (the fixture)

CASE = "dense-completions"


def lora(bin_, case_dir: Path, out: Path, *extra, iters=8):
    cmd = [str(bin_), "lora", "--model", str(case_dir / "model"), "--data", str(case_dir / "data"),
           "--adapter-path", str(out), "--iters", str(iters), "--batch-size", "2", "--steps-per-report", "2",
           "--steps-per-eval", "3", "--val-batches", "2", "--learning-rate", "1e-3",
           "--grad-accumulation-steps", "2", "--save-every", "3", *map(str, extra)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def reports(stdout: str, after: int):
    """The loss reports past iteration `after`, without the timings."""
    out = []
    for line in stdout.splitlines():
        m = re.match(r"Iter (\d+): (Val loss [\d.]+|Train loss [\d.]+)", line)
        if m and int(m.group(1)) > after:
            out.append((int(m.group(1)), m.group(2)))
    return out


def test_resume_from_a_checkpoint_is_bit_exact(gemma4_bin, train_fixtures, tmp_path):  # noqa: F811
    d = train_fixtures / CASE
    full = lora(gemma4_bin, d, tmp_path / "full")
    assert full.returncode == 0, full.stderr[-2000:]
    ckpt = tmp_path / "full" / "0000003_adapters.safetensors"
    assert (tmp_path / "full" / "0000003_training_state.bin").exists()
    part = lora(gemma4_bin, d, tmp_path / "part", "--resume-adapter-file", ckpt)
    assert part.returncode == 0, part.stderr[-2000:]
    assert "continuing the run from iteration 3" in part.stderr
    assert (tmp_path / "part" / "adapters.safetensors").read_bytes() == \
        (tmp_path / "full" / "adapters.safetensors").read_bytes()
    assert reports(part.stdout, 3) == reports(full.stdout, 3) and reports(full.stdout, 3)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_resume_on_the_gpu_is_bit_exact(gemma4_bin, train_fixtures, tmp_path, dtype):  # noqa: F811
    """The same on `--backend cuda`: the device's kernels and cuBLAS sum in a fixed order, so a
    resumed run's adapter is the uninterrupted one's byte for byte there too."""
    if shutil.which("nvidia-smi") is None:
        pytest.skip("no GPU here (nvidia-smi missing): the CUDA resume runs on a GPU machine")
    d = train_fixtures / CASE
    gpu = ("--backend", "cuda", "--dtype", dtype)
    full = lora(gemma4_bin, d, tmp_path / "full", *gpu)
    assert full.returncode == 0, full.stderr[-2000:]
    part = lora(gemma4_bin, d, tmp_path / "part", *gpu, "--resume-adapter-file",
                tmp_path / "full" / "0000003_adapters.safetensors")
    assert part.returncode == 0, part.stderr[-2000:]
    assert (tmp_path / "part" / "adapters.safetensors").read_bytes() == \
        (tmp_path / "full" / "adapters.safetensors").read_bytes()
    assert reports(part.stdout, 3) == reports(full.stdout, 3) and reports(full.stdout, 3)


def test_ctrl_c_saves_and_resume_finishes_the_run(gemma4_bin, train_fixtures, tmp_path):  # noqa: F811
    d = train_fixtures / CASE
    iters = 60
    ref = lora(gemma4_bin, d, tmp_path / "ref", iters=iters)
    assert ref.returncode == 0, ref.stderr[-2000:]
    cmd = [str(gemma4_bin), "lora", "--model", str(d / "model"), "--data", str(d / "data"),
           "--adapter-path", str(tmp_path / "int"), "--iters", str(iters), "--batch-size", "2",
           "--steps-per-report", "2", "--steps-per-eval", "3", "--val-batches", "2", "--learning-rate", "1e-3",
           "--grad-accumulation-steps", "2", "--save-every", "3"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in p.stdout:  # interrupt once training is under way
        if line.startswith("Iter 4: Train loss"):
            p.send_signal(signal.SIGINT)
            break
    out, err = p.communicate(timeout=300)
    assert p.returncode == 130, err[-2000:]
    m = re.search(r"Iter (\d+): Interrupted; saved adapter weights and training state", out)
    assert m and int(m.group(1)) < iters, out[-2000:]
    assert (tmp_path / "int" / "training_state.bin").exists()
    rest = lora(gemma4_bin, d, tmp_path / "int", "--resume", iters=iters)
    assert rest.returncode == 0, rest.stderr[-2000:]
    assert f"continuing the run from iteration {m.group(1)}" in rest.stderr
    assert (tmp_path / "int" / "adapters.safetensors").read_bytes() == \
        (tmp_path / "ref" / "adapters.safetensors").read_bytes()


def test_resume_refusals_and_a_fresh_optimizer(gemma4_bin, train_fixtures, tmp_path):  # noqa: F811
    d = train_fixtures / CASE
    assert lora(gemma4_bin, d, tmp_path / "a").returncode == 0
    ckpt = tmp_path / "a" / "0000003_adapters.safetensors"
    other = lora(gemma4_bin, d, tmp_path / "b", "--resume-adapter-file", ckpt, "--batch-size", "1")
    assert other.returncode != 0 and "batch_size: saved 2, now 1" in other.stderr, other.stderr[-1000:]
    (tmp_path / "a" / "0000003_training_state.bin").write_bytes(b"G4TRAIN1garbage")
    bad = lora(gemma4_bin, d, tmp_path / "c", "--resume-adapter-file", ckpt)
    assert bad.returncode != 0 and "0000003_training_state.bin" in bad.stderr, bad.stderr[-1000:]
    (tmp_path / "a" / "0000003_training_state.bin").unlink()
    fresh = lora(gemma4_bin, d, tmp_path / "e", "--resume-adapter-file", ckpt)
    assert fresh.returncode == 0 and "the optimizer starts afresh" in fresh.stderr


def test_a_batch_that_cannot_fit_is_refused_up_front(gemma4_bin, tmp_path):
    import json
    data = tmp_path / "data"
    data.mkdir()
    words = "the quick brown fox jumps over the lazy dog near the river bank".split()
    with open(data / "train.jsonl", "w") as f:
        for i in range(4):
            f.write(json.dumps({"text": " ".join(words[(i + j) % len(words)] for j in range(40000))}) + "\n")
    out = tmp_path / "out"
    r = subprocess.run([str(gemma4_bin), "lora", "--data", str(data), "--adapter-path", str(out), "--iters", "1",
                        "--batch-size", "4", "--max-seq-length", "100000"], capture_output=True, text=True, timeout=600)
    assert r.returncode != 0
    m = re.search(r"a batch of 4 records of up to (\d+) tokens needs about ([\d.]+ [GMT]iB) to train .*; "
                  r"([\d.]+ [GMK]iB) is free", r.stderr)
    assert m, r.stderr[-1000:]
    assert int(m.group(1)) > 30000
    assert "lower --batch-size or --max-seq-length" in r.stderr
    assert not out.exists(), "a refused run wrote its adapter directory"
