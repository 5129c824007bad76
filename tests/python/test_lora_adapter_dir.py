"""gemma4 lora never replaces an adapter the user has without being asked (issue 20): an existing
--adapter-path is refused unless --resume (continue it; its LoRA settings must match) or
--overwrite (replace it); and an adapter whose config disagrees with its weights is refused when
loaded. Runs on the starter model with one training iteration."""
from __future__ import annotations

import json
import subprocess

import pytest

from test_server import STARTER


def lora(gemma4_bin, data, out, *extra):
    cmd = [str(gemma4_bin), "lora", "--model", str(STARTER), "--data", str(data), "--adapter-path", str(out),
           "--iters", "1", "--batch-size", "1", "--num-layers", "2", "--rank", "2", "--threads", "2",
           "--steps-per-eval", "1000", "--val-batches", "1", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    if not STARTER.exists():
        pytest.skip(f"starter model {STARTER} is absent (make starter-model)")
    d = tmp_path_factory.mktemp("lora_data")
    (d / "train.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in ("one two three", "four five six")) + "\n")
    (d / "valid.jsonl").write_text(json.dumps({"text": "seven eight"}) + "\n")
    return d


def test_existing_adapter_is_refused_resumed_or_overwritten(gemma4_bin, data, tmp_path):
    out = tmp_path / "adapters"
    first = lora(gemma4_bin, data, out)
    assert first.returncode == 0, first.stderr[-2000:]
    weights = (out / "adapters.safetensors").read_bytes()
    config = (out / "adapter_config.json").read_text()

    again = lora(gemma4_bin, data, out, "--rank", "4")
    assert again.returncode != 0
    assert "already holds an adapter" in again.stderr and "--resume" in again.stderr and "--overwrite" in again.stderr
    assert (out / "adapters.safetensors").read_bytes() == weights, "the refused run touched the weights"
    assert (out / "adapter_config.json").read_text() == config, "the refused run touched the config"

    wrong = lora(gemma4_bin, data, out, "--resume", "--rank", "4")
    assert wrong.returncode != 0 and "lora_parameters.rank 2" in wrong.stderr, wrong.stderr[-1000:]
    assert (out / "adapters.safetensors").read_bytes() == weights

    resumed = lora(gemma4_bin, data, out, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "loading fine-tuned weights from" in resumed.stderr

    replaced = lora(gemma4_bin, data, out, "--overwrite", "--rank", "4")
    assert replaced.returncode == 0, replaced.stderr[-2000:]
    assert json.loads((out / "adapter_config.json").read_text())["lora_parameters"]["rank"] == 4


def test_config_that_disagrees_with_weights_is_refused(gemma4_bin, data, tmp_path):
    out = tmp_path / "adapters"
    assert lora(gemma4_bin, data, out).returncode == 0
    cfg = json.loads((out / "adapter_config.json").read_text())
    for key, value, needle in (("rank", 8, "expected"), ("num_layers", 1, "covers the last 1 layers")):
        bad = json.loads(json.dumps(cfg))
        if key == "rank":
            bad["lora_parameters"]["rank"] = value
        else:
            bad["num_layers"] = value
        (out / "adapter_config.json").write_text(json.dumps(bad))
        r = subprocess.run([str(gemma4_bin), "generate", "--model", str(STARTER), "--adapter-path", str(out),
                            "--threads", "2", "--max-tokens", "1", "hi"], capture_output=True, text=True, timeout=300)
        assert r.returncode != 0 and needle in r.stderr, (key, r.stderr[-1000:])
