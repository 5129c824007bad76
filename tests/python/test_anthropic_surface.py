"""The Anthropic Messages surface with the official `anthropic` client (issue 18 item 3): the stop
sequence that fired is reported, streams carry `ping` events, `message_start` carries the real
prompt size, `/v1/messages/count_tokens` counts what a request would submit, and every path under
/v1/messages answers errors in Anthropic's shape."""
import http.client
import json
import re

import pytest

from test_server import Server, ant

STOPS = ["e", " the", "a", " "]  # one of them fires early in any English-like continuation


@pytest.fixture(scope="module")
def srv(gemma4_bin):
    s = Server(gemma4_bin, "--parallel", "2", "--no-prefix-cache")
    yield s
    s.close()


def test_stop_sequence_is_reported(srv):
    c = ant(srv)
    kw = dict(model="m", max_tokens=64, stop_sequences=STOPS, extra_body={"temperature": 0.0},
              messages=[{"role": "user", "content": "Write a sentence about the sea."}])
    full = c.messages.create(**kw)
    assert full.stop_reason == "stop_sequence" and full.stop_sequence in STOPS, full
    text = "".join(b.text for b in full.content if b.type == "text")
    assert full.stop_sequence not in text  # the text ends before it
    with c.messages.stream(**kw) as s:
        final = s.get_final_message()
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == full.stop_sequence
    plain = c.messages.create(model="m", max_tokens=4, messages=kw["messages"], extra_body={"temperature": 0.0})
    assert plain.stop_sequence is None and plain.stop_reason in ("max_tokens", "end_turn")


def test_count_tokens_and_message_start_carry_the_prompt_size(srv):
    c = ant(srv)
    req = dict(system="You are terse.", messages=[{"role": "user", "content": "Name three colors."}])
    counted = c.messages.count_tokens(model="m", **req).input_tokens
    assert counted > 10
    full = c.messages.create(model="m", max_tokens=2, **req)
    assert full.usage.input_tokens + (full.usage.cache_read_input_tokens or 0) == counted
    longer = c.messages.count_tokens(model="m", system=req["system"],
                                     messages=req["messages"] + [{"role": "assistant", "content": "Red."},
                                                                 {"role": "user", "content": "Two more."}])
    assert longer.input_tokens > counted
    with c.messages.stream(model="m", max_tokens=2, **req) as s:
        starts = [e for e in s if e.type == "message_start"]
    assert starts and starts[0].message.usage.input_tokens == counted


def test_stream_has_pings(srv):
    h = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
    h.request("POST", "/v1/messages", json.dumps({"model": "m", "max_tokens": 3, "stream": True,
                                                  "messages": [{"role": "user", "content": "Hi"}]}),
              {"Content-Type": "application/json"})
    text = h.getresponse().read().decode()
    names = re.findall(r"^event: (\w+)$", text, re.M)
    assert "ping" in names and names[0] == "message_start"
    assert re.search(r'^data: \{"type": ?"ping"\}$', text, re.M)


@pytest.mark.parametrize("method,path,body,status", [
    ("POST", "/v1/messages/count_tokens", b"{not json", 400),
    ("POST", "/v1/messages/count_tokens", {"messages": "hi"}, 400),
    ("GET", "/v1/messages/no-such-thing", None, 404),
    ("POST", "/v1/messages", b"x" * (5 << 20), 413),
])
def test_errors_in_anthropic_shape_on_every_messages_path(srv, method, path, body, status):
    got, payload = srv.raw(method, path, body=body)
    assert got == status, payload
    assert isinstance(payload, dict) and payload.get("type") == "error", payload
    assert set(payload["error"]) >= {"type", "message"} and payload["error"]["message"]
