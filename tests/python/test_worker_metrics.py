"""`/metrics` as a worker of the multi-node serving stacks (issue 21): the gauges the Gateway API
Inference Extension's endpoint picker and the SGLang gateway route by (queued and running
requests, KV-cache utilization; under our names and under vLLM's, which those routers read by
default), scraped while requests queue, run and finish; the prefix cache's occupancy; and the
LoRA gauge when the served model carries an adapter."""
import json
import re
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from test_server import KEY, Server


def scrape(s: Server) -> dict:
    """Every unlabelled sample of one /metrics scrape, name -> value, and each name's TYPE."""
    status, text = s.raw("GET", "/metrics")
    assert status == 200, text
    types = dict(re.findall(r"^# TYPE (\S+) (\w+)$", text, re.M))
    values = {m.group(1): float(m.group(2)) for m in re.finditer(r"^([a-zA-Z_:][a-zA-Z0-9_:]*) ([0-9.e+-]+)$", text, re.M)}
    for name in values:
        assert name in types, f"{name} has no # TYPE line"
    values["__text__"] = text
    values["__types__"] = types
    return values


@pytest.fixture(scope="module")
def two_slots(gemma4_bin):
    s = Server(gemma4_bin, "--parallel", "2", "--context", "1024")
    yield s
    s.close()


def test_gauges_follow_requests_through_queue_and_slots(two_slots):
    s = two_slots
    idle = scrape(s)
    for name in ("gemma4_queue_depth", "gemma4_active_sequences", "gemma4_kv_cache_usage_ratio", "vllm:num_requests_waiting",
                 "vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc",
                 "gemma4_kv_cache_tokens", "gemma4_kv_cache_capacity_tokens", "gemma4_prefix_cache_bytes",
                 "gemma4_prefix_cache_entries"):
        assert idle["__types__"][name] == "gauge", name
        assert name in idle, name
    assert idle["vllm:num_requests_running"] == 0 and idle["vllm:num_requests_waiting"] == 0
    assert idle["vllm:kv_cache_usage_perc"] == 0 and idle["gemma4_kv_cache_tokens"] == 0
    assert idle["gemma4_kv_cache_capacity_tokens"] == 2 * 1024  # --parallel x --context
    assert "vllm:lora_requests_info" not in idle["__text__"]  # no adapter on this model

    # Five requests on two slots: two run, three wait, then all finish.
    results = []

    def one(i):
        body = {"prompt": f"Request {i} tells a long story about", "max_tokens": 48, "temperature": 0}
        results.append(s.raw("POST", "/v1/completions", body=body)[0])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(5)]
    for t in threads:
        t.start()
    seen = []
    while any(t.is_alive() for t in threads):
        seen.append(scrape(s))
        time.sleep(0.05)
    for t in threads:
        t.join()
    assert results == [200] * 5
    busy = [m for m in seen if m["vllm:num_requests_running"] > 0]
    assert busy, "no scrape saw a running request"
    assert max(m["vllm:num_requests_running"] for m in seen) == 2  # both slots in use
    assert max(m["vllm:num_requests_waiting"] for m in seen) >= 1  # the others queued
    for m in seen:  # one scrape: our names and vLLM's agree, usage = tokens / capacity, within [0, 1]
        assert m["vllm:num_requests_running"] == m["gemma4_active_sequences"]
        assert m["vllm:num_requests_waiting"] == m["gemma4_queue_depth"]
        assert m["vllm:kv_cache_usage_perc"] == m["gemma4_kv_cache_usage_ratio"] == m["vllm:gpu_cache_usage_perc"]
        assert m["gemma4_kv_cache_usage_ratio"] == pytest.approx(m["gemma4_kv_cache_tokens"] / 2048, abs=1e-6)
        assert 0 <= m["gemma4_kv_cache_usage_ratio"] <= 1
    assert max(m["gemma4_kv_cache_tokens"] for m in busy) > 0

    deadline = time.time() + 10
    while True:  # the gauges settle once the last request has finished
        end = scrape(s)
        if end["vllm:num_requests_running"] == 0 or time.time() > deadline:
            break
        time.sleep(0.05)
    assert end["vllm:num_requests_running"] == 0 and end["vllm:num_requests_waiting"] == 0
    assert end["gemma4_kv_cache_tokens"] == 0 and end["vllm:kv_cache_usage_perc"] == 0
    # Finished sequences leave their KV for later prefixes.
    assert end["gemma4_prefix_cache_entries"] >= 1 and end["gemma4_prefix_cache_bytes"] > 0
    assert end["gemma4_prefix_cache_bytes"] <= end["gemma4_prefix_cache_capacity_bytes"]
    assert end["vllm:prefix_cache_queries_total"] == end["gemma4_prompt_tokens_total"] > 0
    assert end["vllm:prefix_cache_hits_total"] == end["gemma4_prompt_tokens_cached_total"]


def test_lora_gauge_names_the_served_adapter(gemma4_bin, tmp_path):
    """A model served with --adapter-path reports the protocol's LoRA gauge: the adapter is part of
    the served model, so it is always running (max_lora 1), under the served model's id."""
    from safetensors.numpy import save_file
    rng = np.random.default_rng(0)
    save_file({"model.layers.17.self_attn.q_proj.lora_a": (rng.standard_normal((640, 4)) * 0.01).astype(np.float32),
               "model.layers.17.self_attn.q_proj.lora_b": np.zeros((4, 1024), np.float32)},
              str(tmp_path / "adapters.safetensors"))
    (tmp_path / "adapter_config.json").write_text(json.dumps(
        {"fine_tune_type": "lora", "num_layers": 1, "lora_parameters": {"rank": 4, "scale": 2.0, "dropout": 0.0}}))
    s = Server(gemma4_bin, "--parallel", "1", "--adapter-path", str(tmp_path), "--model-id", 'tuned "x"')
    try:
        m = scrape(s)
        assert m["__types__"]["vllm:lora_requests_info"] == "gauge"
        line = re.search(r"^vllm:lora_requests_info\{(.*)\} (\d+)$", m["__text__"], re.M)
        assert line, m["__text__"][-800:]
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', line.group(1)))
        assert labels == {"max_lora": "1", "running_lora_adapters": 'tuned \\"x\\"', "waiting_lora_adapters": ""}
        assert abs(int(line.group(2)) - time.time()) < 60
    finally:
        s.close()
