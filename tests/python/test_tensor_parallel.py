"""`--tensor-parallel N`: the model split over N ranks (a thread and a backend each, the in-process
communicator; parallel/tp_model.h), used by every verb as one model, scores and continues a prompt
as the single rank does, and serves.

Oracle: the same binary's single-rank logits in the same run.
- mlx-lm fixtures (dense, E-style, MoE; f32 activations, chunks of 3 tokens so the KV caches of
  every rank are read back): max |difference| <= 1e-5 * max |logit| at 2 and 4 ranks.
- The starter (Gemma 3 270M Q4_K_M, a trained GGUF model) on the exact reference backend: within
  2e-4 * max |logit| and the same top-1 at every position. Its activations reach ~1e4, so f32
  partial sums added in another order move the logits more than on the random fixtures.
- `greedy` on the fixtures: the same tokens as one rank.
- LoRA adapters sharded as their projections: the single rank's logits with the adapter.
- `serve --tensor-parallel 2` (the starter, a KV pool): concurrent completions and chats answered,
  the caches of every rank shared through the prefix cache; the adapter endpoint goes through the group.
- What does not split, and what the sharded path does not take yet, is refused by name; so are GPU
  placement flags (`--devices`, `--collectives nccl`) on host backends.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

IDS = "2,5,17,33,64,100,7,9,12,200,150,3,44"


def _logits(gemma4_bin, out: Path, *args, ok=True):
    r = subprocess.run([str(gemma4_bin), "logits", "--out", str(out), *map(str, args)],
                       capture_output=True, text=True, timeout=600)
    if ok:
        assert r.returncode == 0, f"logits {args} failed:\n{r.stderr[-2000:]}"
        return np.load(out)
    assert r.returncode != 0, f"logits {args} should have failed"
    return r.stderr


@pytest.mark.parametrize("fixture", ["dense-q4g64", "estyle-mixed", "moe-q8g32"])
@pytest.mark.parametrize("ranks", [2, 4])
def test_fixture_logits_match_one_rank(gemma4_bin, parity_fixtures, tmp_path, fixture, ranks):
    model = parity_fixtures / fixture
    common = ["--model", model, "--ids", IDS, "--dtype", "f32", "--chunk", 3]
    one = _logits(gemma4_bin, tmp_path / "one.npy", *common)
    split = _logits(gemma4_bin, tmp_path / "split.npy", *common, "--tensor-parallel", ranks)
    assert split.shape == one.shape
    diff, scale = float(np.abs(split - one).max()), float(np.abs(one).max())
    print(f"{fixture} x{ranks}: max |diff| {diff:.3g}, max |logit| {scale:.3g}")
    assert diff <= 1e-5 * max(1.0, scale)


@pytest.mark.parametrize("ranks", [2, 4])
def test_adapter_logits_match_one_rank(gemma4_bin, parity_fixtures, tmp_path, ranks):
    model = parity_fixtures / "dense-q4g64"
    common = ["--model", model, "--ids", IDS, "--dtype", "f32", "--adapter-path", parity_fixtures / "dense-q4g64-lora"]
    base = _logits(gemma4_bin, tmp_path / "base.npy", "--model", model, "--ids", IDS, "--dtype", "f32")
    one = _logits(gemma4_bin, tmp_path / "one.npy", *common)
    split = _logits(gemma4_bin, tmp_path / "split.npy", *common, "--tensor-parallel", ranks)
    assert float(np.abs(one - base).max()) > 0.1  # the adapter matters
    assert float(np.abs(split - one).max()) <= 1e-5 * max(1.0, float(np.abs(one).max()))


def test_starter_reference_backend_matches_one_rank(gemma4_bin, tmp_path):
    common = ["--backend", "reference", "--dtype", "f32", "--ids", "2,105,2364,107,3689,563"]
    one = _logits(gemma4_bin, tmp_path / "one.npy", *common)
    split = _logits(gemma4_bin, tmp_path / "split.npy", *common, "--tensor-parallel", 2)
    diff, scale = float(np.abs(split - one).max()), float(np.abs(one).max())
    print(f"starter x2 (reference): max |diff| {diff:.3g}, max |logit| {scale:.3g}")
    assert diff <= 2e-4 * scale
    assert (split.argmax(axis=1) == one.argmax(axis=1)).all()


def test_refusals_name_the_cause(gemma4_bin, parity_fixtures, tmp_path):
    model = parity_fixtures / "dense-q4g64"
    err = _logits(gemma4_bin, tmp_path / "x.npy", "--model", model, "--ids", IDS, "--tensor-parallel", 3, ok=False)
    assert "the model's 4 query heads do not split evenly" in err
    err = _logits(gemma4_bin, tmp_path / "x.npy", "--model", model, "--ids", IDS, "--tensor-parallel", 2,
                  "--draft-model", tmp_path, ok=False)
    assert "--tensor-parallel does not take --draft-model yet" in err, err
    err = _logits(gemma4_bin, tmp_path / "x.npy", "--model", model, "--ids", IDS, "--tensor-parallel", 2,
                  "--backend", "ggml", ok=False)
    assert "the cpu, reference and cuda backends, not 'ggml'" in err, err
    # GPU placement and NCCL belong to the cuda backend; a GPU list is checked before anything loads.
    err = _logits(gemma4_bin, tmp_path / "x.npy", "--model", model, "--ids", IDS, "--devices", "0,1", ok=False)
    assert "--devices places ranks on GPUs: it needs --backend cuda" in err, err
    err = _logits(gemma4_bin, tmp_path / "x.npy", "--model", model, "--ids", IDS, "--tensor-parallel", 2,
                  "--collectives", "nccl", ok=False)
    assert "--collectives nccl needs --backend cuda" in err, err
    err = _logits(gemma4_bin, tmp_path / "x.npy", "--model", model, "--ids", IDS, "--devices", "0,-1",
                  "--backend", "cuda", ok=False)
    assert "--devices: expected GPU numbers 0..63 separated by commas, got '0,-1'" in err, err
    err = _logits(gemma4_bin, tmp_path / "x.npy", "--model", model, "--ids", IDS, "--tensor-parallel", 4,
                  "--devices", "0,1", "--backend", "cuda", ok=False)
    assert "--devices lists 2 GPUs for --tensor-parallel 4 (one per rank)" in err, err


@pytest.mark.parametrize("fixture", ["dense-bf16", "moe-q4g64"])
def test_greedy_matches_one_rank(gemma4_bin, parity_fixtures, fixture):
    cmd = [str(gemma4_bin), "greedy", "--model", str(parity_fixtures / fixture), "--ids", IDS, "--steps", "12",
           "--dtype", "f32"]
    one = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    two = subprocess.run(cmd + ["--tensor-parallel", "2"], capture_output=True, text=True, timeout=600)
    assert one.returncode == 0 and two.returncode == 0, two.stderr[-1000:]
    assert one.stdout.strip() and two.stdout.strip() == one.stdout.strip()


def test_serve_with_two_ranks(gemma4_bin):
    from concurrent.futures import ThreadPoolExecutor

    from test_server import Server

    s = Server(gemma4_bin, "--tensor-parallel", "2", "--kv-pool-mb", "64", "--parallel", "3")
    try:
        prompt = {"prompt": "The three largest cities of the region are", "max_tokens": 12, "temperature": 0}
        with ThreadPoolExecutor(3) as ex:
            got = list(ex.map(lambda _: s.raw("POST", "/v1/completions", body=prompt), range(3)))
        for st, body in got:
            assert st == 200, body
            assert body["usage"]["completion_tokens"] > 0 and body["choices"][0]["text"]
        st, again = s.raw("POST", "/v1/completions", body=prompt)
        assert st == 200 and again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # every rank's prefix KV
        texts = {b["choices"][0]["text"] for _, b in got} | {again["choices"][0]["text"]}
        assert len(texts) == 1, texts  # one greedy answer, batched or from the prefix cache
        st, chat = s.raw("POST", "/v1/chat/completions",
                         body={"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8})
        assert st == 200 and chat["choices"][0]["message"]["content"] is not None
        st, err = s.raw("POST", "/v1/load_lora_adapter", body={"lora_name": "x", "lora_path": "/nonexistent"})
        assert st == 400 and "not a directory" in str(err), err  # the loader's own message, through the group
    finally:
        s.close()
