"""Two `gemma4 serve` workers behind a real router on this machine (issue 21): the SGLang model
gateway (`sglang-router` from PyPI, a Rust router with a cache-aware policy), driven by
bench/load_test.py with sessions that share long prompt prefixes. Checks that requests are spread
over both workers, that cache-aware routing serves more prompt tokens from the workers' prefix
caches than round robin on the same shape of load, and that killing one worker loses no request
that had not started (the router takes the dead worker out and sends them to the live one).
Figures are printed (pytest -s)."""
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from test_server import Server

REPO = Path(__file__).resolve().parents[2]
LOAD_TEST = REPO / "bench" / "load_test.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Router:
    def __init__(self, workers: list[str], policy: str):
        pytest.importorskip("sglang_router", reason="sglang-router (requirements.txt) is not installed")
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = tempfile.TemporaryFile()
        # A worker that refuses a connection opens its circuit breaker at the first failure, and
        # health checks run every second, so a retried request goes to the live worker.
        cmd = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
               "--port", self.url.rsplit(":", 1)[1], "--worker-urls", *workers, "--policy", policy,
               "--log-level", "warn", "--cb-failure-threshold", "1", "--health-check-interval-secs", "1"]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log)
        deadline = time.time() + 90
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
            if self.proc.poll() is not None:
                break
        self.close()
        self.log.seek(0)
        raise RuntimeError("router did not start:\n" + self.log.read().decode(errors="replace")[-3000:])

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def load(router: Router, workers: list[str], seed: str, tmp: Path) -> dict:
    """One load_test.py round through the router: 4 clients, 3 requests each, 4 sessions."""
    out = tmp / f"load-{seed}.json"
    r = subprocess.run([sys.executable, str(LOAD_TEST), "--url", router.url, "--workers", ",".join(workers),
                        "--clients", "4", "--requests", "3", "--max-tokens", "8", "--temperature", "0",
                        "--sessions", "4", "--prefix-words", "100", "--prefix-seed", seed, "--no-warmup",
                        "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    row = json.loads(out.read_text())[0]
    print(f"\n{seed}: {json.dumps(row)}")
    return row


def worker(gemma4_bin) -> Server:
    return Server(gemma4_bin, "--parallel", "2", "--threads", "1")


@pytest.fixture(scope="module")
def pair(gemma4_bin):
    ws = [worker(gemma4_bin), worker(gemma4_bin)]
    yield ws
    for w in ws:
        w.close()


def test_cache_aware_routing_spreads_load_and_reuses_prefixes(pair, tmp_path):
    urls = [w.url for w in pair]
    rows = {}
    for policy in ("cache_aware", "round_robin"):
        r = Router(urls, policy)
        try:
            rows[policy] = load(r, urls, policy, tmp_path)  # the seed gives each policy fresh prefixes
        finally:
            r.close()
    ca, rr = rows["cache_aware"], rows["round_robin"]
    for row in (ca, rr):
        assert row["errors"] == 0 and row["requests"] == 12, row
        assert sum(row["worker_requests"]) == 12
    assert all(n > 0 for n in ca["worker_requests"]), ca  # both workers take requests
    print(f"\ncached prompt tokens: cache-aware {ca['cached_tokens']} of {ca['prompt_tokens']}, "
          f"round robin {rr['cached_tokens']} of {rr['prompt_tokens']}")
    assert ca["cached_tokens"] > rr["cached_tokens"], (ca, rr)


def test_killing_a_worker_loses_no_request_that_had_not_started(gemma4_bin, tmp_path):
    a, b = worker(gemma4_bin), worker(gemma4_bin)
    r = None
    try:
        urls = [a.url, b.url]
        r = Router(urls, "round_robin")
        before = load(r, urls, "before", tmp_path)
        assert before["errors"] == 0 and all(n > 0 for n in before["worker_requests"]), before
        b.proc.kill()  # no drain: the worker is gone
        b.proc.wait(30)
        after = load(r, [a.url], "after", tmp_path)
        assert after["errors"] == 0 and after["requests"] == 12, after
        assert after["worker_requests"] == [12]  # all of them on the live worker
    finally:
        if r:
            r.close()
        a.close()
        b.close()
