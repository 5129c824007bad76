"""KV events (issue 21 item 2): `serve --kv-events-endpoint` publishes the prefix cache's blocks over
ZeroMQ in the format vLLM publishes and llm-d's KV-cache indexer decodes (server/kv_event_publisher.h):
3-part messages [topic, 8-byte big-endian sequence, msgpack payload], payload [ts, events, 0],
events as tagged arrays. Oracle: the prompt's own token ids (`/tokenize`), block by block.

Checked: AllBlocksCleared at start (fetched through the replay endpoint, which a late subscriber
uses); a finished request's blocks stored with its tokens, chained hashes and no parent; a
follow-up prompt sharing the prefix stores only its new blocks, with the shared block as parent;
evictions from a small prefix cache remove exactly blocks stored before, and never one a live
entry still holds; `/metrics` counts the blocks held; bad endpoints and flags are refused.
"""
from __future__ import annotations

import socket
import subprocess
import time

import msgpack
import pytest
import zmq

from test_server import Server

BLOCK = 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def decode(parts):
    assert len(parts) == 3, parts
    topic, seq, payload = parts
    assert len(seq) == 8
    batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    assert isinstance(batch, list) and len(batch) == 3, batch
    ts, events, dp_rank = batch
    assert isinstance(ts, float) and abs(ts - time.time()) < 600 and dp_rank == 0
    for e in events:
        assert e[0] in ("BlockStored", "BlockRemoved", "AllBlocksCleared"), e
        assert len(e) == {"BlockStored": 8, "BlockRemoved": 3, "AllBlocksCleared": 1}[e[0]], e
    return topic.decode(), int.from_bytes(seq, "big"), events


class Events:
    """A SUB socket on the server's endpoint, and its REQ replay socket."""

    def __init__(self, pub_port: int, replay_port: int):
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.connect(f"tcp://127.0.0.1:{pub_port}")
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.replay_port = replay_port
        self.seen = []  # (topic, seq, event)

    def replay(self, start: int):
        """Every kept batch from `start` on: a DEALER (several answers to one request) sends
        [empty, start] as a REQ socket would; each answer is [empty, sequence, payload], and
        sequence -1 with an empty payload ends them."""
        req = self.ctx.socket(zmq.DEALER)
        req.connect(f"tcp://127.0.0.1:{self.replay_port}")
        req.send_multipart([b"", start.to_bytes(8, "big")])
        out = []
        while True:
            assert req.poll(10000), "no replay answer"
            empty, seq, payload = req.recv_multipart()
            assert empty == b""
            if int.from_bytes(seq, "big", signed=True) == -1:
                assert payload == b""
                break
            out.append((int.from_bytes(seq, "big"), msgpack.unpackb(payload, raw=False)))
        req.close(linger=0)
        return out

    def wait_for(self, pred, timeout=30.0):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.sub.poll(200):
                topic, seq, events = decode(self.sub.recv_multipart())
                self.seen += [(topic, seq, e) for e in events]
            got = [e for _, _, e in self.seen if pred(e)]
            if got:
                return got
        raise AssertionError(f"no matching event within {timeout} s; seen: {self.seen[-5:]}")

    def close(self):
        self.ctx.destroy(linger=0)


@pytest.fixture(scope="module")
def srv(gemma4_bin):
    pub, rep = free_port(), free_port()
    s = Server(gemma4_bin, "--kv-events-endpoint", f"tcp://*:{pub}", "--kv-events-replay", f"tcp://*:{rep}",
               "--kv-events-block-size", str(BLOCK), "--parallel", "2", "--max-tokens", "8")
    ev = Events(pub, rep)
    time.sleep(0.3)  # the subscription reaches the server (ZeroMQ's slow joiner)
    yield s, ev
    ev.close()
    s.close()


def complete(s, prompt):
    st, body = s.raw("POST", "/v1/completions", body={"prompt": prompt, "max_tokens": 8, "temperature": 0})
    assert st == 200, body
    st, tok = s.raw("POST", "/tokenize", body={"prompt": prompt})
    assert st == 200, tok
    return tok["tokens"]


def test_start_clears_and_replay_serves_late_subscribers(srv):
    s, ev = srv
    batches = ev.replay(0)
    assert batches and batches[0][0] == 0
    assert batches[0][1][1] == [["AllBlocksCleared"]]


def test_finished_request_stores_its_blocks_and_a_follow_up_chains(srv):
    s, ev = srv
    first = "The history of the lighthouse keepers on the northern coast begins"
    ids = complete(s, first)
    stored = ev.wait_for(lambda e: e[0] == "BlockStored" and e[3][:BLOCK] == ids[:BLOCK])[0]
    _, hashes, parent, tokens, block_size, lora_id, medium, lora_name = stored
    assert block_size == BLOCK and lora_id is None and lora_name is None and medium == "CPU"
    assert parent is None  # the chain starts at the first block
    assert len(tokens) == len(hashes) * BLOCK and len(set(hashes)) == len(hashes)
    whole = len(ids) // BLOCK * BLOCK
    assert tokens[:whole] == ids[:whole], "the stored blocks hold the prompt's tokens"
    topic = ev.seen[-1][0]
    assert topic.startswith("kv@") and topic.count("@") == 2

    # The same prefix and more: only the new blocks, chained to a block of the first entry.
    follow = first + " with a storm in the winter of the year the great ship was lost"
    ids2 = complete(s, follow)
    shared = 0
    while shared < min(len(ids), len(ids2)) and ids[shared] == ids2[shared]:
        shared += 1
    later = ev.wait_for(lambda e: e[0] == "BlockStored" and e[2] is not None and e[2] in hashes)[0]
    k = hashes.index(later[2]) + 1  # blocks of the first entry kept as the prefix
    assert k <= shared // BLOCK
    assert later[3][:BLOCK] == ids2[k * BLOCK:(k + 1) * BLOCK]
    assert not set(later[1]) & set(hashes)


def test_evictions_remove_only_blocks_no_entry_holds(gemma4_bin):
    pub, rep = free_port(), free_port()
    s = Server(gemma4_bin, "--kv-events-endpoint", f"tcp://*:{pub}", "--kv-events-replay", f"tcp://*:{rep}",
               "--kv-events-block-size", str(BLOCK), "--parallel", "1", "--prefix-cache-mb", "40")
    ev = Events(pub, rep)
    try:
        time.sleep(0.3)
        for i in range(6):
            complete(s, f"Story number {i}: the {['red', 'blue', 'green', 'gold', 'grey', 'white'][i]} fox ran far")
        time.sleep(1.0)
        held = set()
        for _, batch in ev.replay(0):
            for e in batch[1]:
                if e[0] == "BlockStored":
                    assert not set(e[1]) & held, "a block stored twice without a removal between"
                    held |= set(e[1])
                elif e[0] == "BlockRemoved":
                    assert set(e[1]) <= held, "a removal of a block never stored"
                    held -= set(e[1])
                else:
                    held.clear()
        removed = [e for _, b in ev.replay(0) for e in b[1] if e[0] == "BlockRemoved"]
        assert removed, "a 40 MiB prefix cache evicted nothing in 6 requests"
        assert s.metric("gemma4_kv_events_blocks") == len(held)
        assert s.metric("gemma4_kv_events_batches_dropped_total") == 0
    finally:
        ev.close()
        s.close()


def test_flags_are_checked(gemma4_bin):
    for args, msg in [(["--kv-events-replay", "tcp://*:1"], "need --kv-events-endpoint"),
                      (["--kv-events-endpoint", "tcp://*:1", "--no-prefix-cache"], "drop --no-prefix-cache"),
                      (["--kv-events-endpoint", "bogus://x"], "cannot connect to bogus://x")]:
        r = subprocess.run([str(gemma4_bin), "serve", "--port", "0", *args], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode != 0 and msg in r.stderr, (args, r.stderr[-500:])
