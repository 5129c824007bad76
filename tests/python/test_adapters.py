"""LoRA adapters per request (`serve --adapter NAME=DIR`, runtime/adapter_set.h): a request's
`model` ("<id>:NAME" or "NAME") picks a mounted adapter, sequences with different adapters run in
the same batched forwards, and each adapter's answers equal a server started with `--adapter-path`
of that adapter alone (greedy, on the CPU backend, which computes a row the same in any batch).
Also: /v1/models lists the adapters, an unknown "<id>:NAME" is a 404, the prefix cache does not
hand one adapter's KV to another (the adapters touch v_proj), and POST /v1/load_lora_adapter /
/v1/unload_lora_adapter change the set at run time, behind --api-key."""
import json
import threading

import numpy as np
import pytest
from safetensors.numpy import save_file

from test_server import KEY, Server

PROMPTS = ["The capital of France is", "List three fruits:", "Once upon a time"]
# The starter model (Gemma 3 270M): hidden 640, 4 query heads and 1 KV head of 256, MLP 2048.
MODULES = {"self_attn.q_proj": (640, 1024), "self_attn.v_proj": (640, 256), "mlp.down_proj": (2048, 640)}


def _adapter(path, seed):
    """A rank-4 adapter on q, v and down of layers 12-17 (mlx-lm's layout), large enough to move
    greedy answers."""
    rng = np.random.default_rng(seed)
    t = {}
    for layer in range(12, 18):
        for m, (i, o) in MODULES.items():
            t[f"model.layers.{layer}.{m}.lora_a"] = (rng.standard_normal((i, 4)) * 0.2).astype(np.float32)
            t[f"model.layers.{layer}.{m}.lora_b"] = (rng.standard_normal((4, o)) * 0.2).astype(np.float32)
    path.mkdir()
    save_file(t, str(path / "adapters.safetensors"))
    (path / "adapter_config.json").write_text(json.dumps(
        {"fine_tune_type": "lora", "num_layers": 6, "lora_parameters": {"rank": 4, "scale": 2.0, "dropout": 0.0}}))
    return path


def _complete(s, prompt, model=None, headers=None):
    body = {"prompt": prompt, "max_tokens": 12, "temperature": 0}
    if model:
        body["model"] = model
    st, out = s.raw("POST", "/v1/completions", body, headers)
    assert st == 200, out
    return out["choices"][0]["text"]


def _reference(gemma4_bin, *extra):
    s = Server(gemma4_bin, "--parallel", "1", *extra)
    try:
        return [_complete(s, p) for p in PROMPTS]
    finally:
        s.close()


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    d = tmp_path_factory.mktemp("adapters")
    return _adapter(d / "a", 1), _adapter(d / "b", 2)


@pytest.fixture(scope="module")
def references(gemma4_bin, adapters):
    a, b = adapters
    return {"base": _reference(gemma4_bin), "a": _reference(gemma4_bin, "--adapter-path", str(a)),
            "b": _reference(gemma4_bin, "--adapter-path", str(b))}


def test_mixed_adapters_in_one_batch_answer_as_each_alone(gemma4_bin, adapters, references):
    a, b = adapters
    assert references["a"] != references["base"] and references["b"] != references["a"]  # the adapters matter
    s = Server(gemma4_bin, "--parallel", "9", "--adapter", f"a={a}", "--adapter", f"b={b}")
    try:
        st, models = s.raw("GET", "/v1/models")
        base_id = models["data"][0]["id"]
        ids = [m["id"] for m in models["data"]]
        assert ids == [base_id, f"{base_id}:a", f"{base_id}:b"], ids
        assert models["data"][1]["parent"] == base_id and models["data"][1]["root"] == str(a)
        st, one = s.raw("GET", f"/v1/models/{base_id}:b")
        assert st == 200 and one["id"] == f"{base_id}:b"
        # All nine at once: base, a (qualified) and b (bare name) for every prompt.
        want, got, threads = {}, {}, []
        for i, p in enumerate(PROMPTS):
            for key, model in (("base", base_id), ("a", f"{base_id}:a"), ("b", "b")):
                want[(key, i)] = references[key][i]
                threads.append(threading.Thread(
                    target=lambda k=(key, i), p=p, m=model: got.__setitem__(k, _complete(s, p, m))))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert got == want
        # The prefix cache now holds each prompt's KV under base, a and b: a follow-up with the same
        # prompt gets its own adapter's KV (base's would change a's answer).
        assert [_complete(s, p, f"{base_id}:a") for p in PROMPTS] == references["a"]
        st, err = s.raw("POST", "/v1/completions", {"prompt": "x", "model": f"{base_id}:nope", "max_tokens": 2})
        assert st == 404 and "nope" in err["error"]["message"], err
        # Any other model name is the base model (clients send their own names).
        assert _complete(s, PROMPTS[0], "gpt-4o") == references["base"][0]
    finally:
        s.close()


def test_adapters_mount_and_unmount_at_run_time(gemma4_bin, adapters, references, tmp_path):
    a, b = adapters
    s = Server(gemma4_bin, "--parallel", "4", "--api-key", KEY, "--adapter", f"a={a}")
    auth = {"Authorization": f"Bearer {KEY}"}
    try:
        st, _ = s.raw("POST", "/v1/load_lora_adapter", {"lora_name": "b", "lora_path": str(b)})
        assert st == 401
        st, out = s.raw("POST", "/v1/load_lora_adapter", {"lora_name": "b", "lora_path": str(b)}, auth)
        assert st == 200, out
        assert [_complete(s, p, "b", auth) for p in PROMPTS] == references["b"]
        st, out = s.raw("POST", "/v1/load_lora_adapter", {"lora_name": "b", "lora_path": str(a)}, auth)
        assert st == 400 and "already mounted" in out["error"]["message"], out
        st, out = s.raw("POST", "/v1/load_lora_adapter", {"lora_name": "c", "lora_path": str(tmp_path / "none")}, auth)
        assert st == 400 and "adapter 'c'" in out["error"]["message"], out
        st, out = s.raw("POST", "/v1/load_lora_adapter", {"lora_name": "bad/name", "lora_path": str(a)}, auth)
        assert st == 400 and "adapter name" in out["error"]["message"], out
        st, out = s.raw("POST", "/v1/unload_lora_adapter", {"lora_name": "a"}, auth)
        assert st == 200, out
        st, models = s.raw("GET", "/v1/models", headers=auth)
        assert [m["id"].split(":")[-1] for m in models["data"][1:]] == ["b"]
        st, out = s.raw("POST", "/v1/unload_lora_adapter", {"lora_name": "a"}, auth)
        assert st == 404, out
        # The name is free again: mounted anew (the old mount's prefix-cache entries are not its).
        st, out = s.raw("POST", "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": str(b)}, auth)
        assert st == 200, out
        assert _complete(s, PROMPTS[0], "a", auth) == references["b"][0]
        st, metrics = s.raw("GET", "/metrics", headers=auth)
        assert 'endpoint="/v1/load_lora_adapter",status="200"' in metrics
        gauge = next(l for l in metrics.splitlines() if l.startswith("vllm:lora_requests_info{"))
        assert 'max_lora="2"' in gauge and ':a,' in gauge and gauge.count(":b") == 1, gauge
    finally:
        s.close()


def test_bad_adapter_flags_fail_at_start(gemma4_bin, tmp_path):
    import subprocess
    from test_server import STARTER
    for flag, msg in (("noequals", "expected NAME=DIR"), (f"x={tmp_path / 'absent'}", "adapter 'x'")):
        r = subprocess.run([str(gemma4_bin), "serve", "--model", str(STARTER), "--port", "0", "--adapter", flag],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode != 0 and msg in r.stderr, r.stderr


def test_official_clients_pick_adapters(gemma4_bin, adapters, references):
    """The pinned openai and anthropic clients: models.list / models.retrieve show the adapters, and
    a completion or message naming one runs with it."""
    from test_server import ant, oai
    a, b = adapters
    s = Server(gemma4_bin, "--parallel", "2", "--api-key", KEY, "--adapter", f"a={a}", "--adapter", f"b={b}")
    try:
        oc = oai(s, KEY)
        ids = [m.id for m in oc.models.list().data]
        base_id = ids[0]
        assert ids[1:] == [f"{base_id}:a", f"{base_id}:b"]
        assert oc.models.retrieve(f"{base_id}:b").id == f"{base_id}:b"
        r = oc.completions.create(model=f"{base_id}:b", prompt=PROMPTS[1], max_tokens=12, temperature=0)
        assert r.choices[0].text == references["b"][1]
        msgs = [{"role": "user", "content": "Say something."}]
        ac = ant(s, KEY)
        per_model = {m: ac.messages.create(model=m, max_tokens=8, extra_body={"temperature": 0.0},
                                           messages=msgs).content[0].text
                     for m in (base_id, "a", f"{base_id}:a")}
        assert per_model["a"] == per_model[f"{base_id}:a"] != per_model[base_id]
    finally:
        s.close()
