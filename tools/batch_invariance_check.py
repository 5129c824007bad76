#!/usr/bin/env python3
"""Does a sequence get the same tokens alone as inside a batch? Starts `gemma4 serve` on a model,
sends each of N greedy completion requests alone (one after another), then all N at once, and
compares every request's tokens and their logprobs (bit-equal logits give equal logprobs). Prompts
have different lengths, some longer than one forward's row-exact bound (64 rows on CUDA), so in the
batched run prompt chunks meet decode rows, and prompts the lone run left in the prefix cache are
resumed from it.

  tools/batch_invariance_check.py --bin build/bin/gemma4 --model M.gguf [--backend cuda]
      [--streams 16] [--max-tokens 24] [--server-log FILE] [-- extra serve flags, e.g. --batch-invariant on]

Prints one line per request that differs (the first differing position) and a verdict; exit
status 0 when every request matched, 1 when one differed, 2 when the server could not be used or
a request got no answer (each such request is named with its error; --server-log keeps the
server's whole log, which names every request it answered).
Standard library only (it runs on the GPU machine).
"""
from __future__ import annotations

import argparse
import http.client
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time

WORDS = ("river stone lantern copper meadow harbor violet engine pepper quartz signal winter orchard "
         "marble thunder canvas falcon silver garden ember").split()


def prompt(i: int) -> str:
    """Request i's prompt: 3 to ~150 words, so prefill chunks of many sizes."""
    n = 3 + (i * 37) % 150
    return " ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(n))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def complete(port: int, i: int, max_tokens: int) -> list | str:
    """Request i's greedy tokens with their logprobs (equal logits give equal logprobs), or an
    error message."""
    body = {"model": "m", "prompt": prompt(i), "max_tokens": max_tokens, "temperature": 0, "logprobs": 1}
    t0 = time.time()
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        out = json.loads(r.read())
        if r.status != 200:
            return f"HTTP {r.status}: {out}"
        lp = out["choices"][0].get("logprobs") or {}
        if "tokens" not in lp or "token_logprobs" not in lp:
            return "no logprobs in the response"
        return list(zip(lp["tokens"], lp["token_logprobs"]))
    except Exception as e:  # any failure is this request's error, never a silent success
        return f"{type(e).__name__}: {e} (after {time.time() - t0:.1f} s)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--server-log", help="write the server's whole log (stdout and stderr) here")
    ap.add_argument("serve_args", nargs="*", help="extra serve flags (after --)")
    a = ap.parse_args()
    port = free_port()
    cmd = [a.bin, "serve", "--model", a.model, "--backend", a.backend, "--port", str(port),
           "--parallel", str(max(a.streams, 1)), *a.serve_args]
    # The server's output, shown when something fails (all of it in --server-log).
    log = open(a.server_log, "w+") if a.server_log else tempfile.TemporaryFile(mode="w+")
    srv = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True)

    def server_log() -> str:
        log.seek(0)
        return log.read()[-3000:]

    try:
        deadline = time.time() + 600
        while True:
            if srv.poll() is not None:
                print("server exited:", server_log(), file=sys.stderr)
                return 2
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline:
                print("server did not come up in 600 s", file=sys.stderr)
                return 2
            time.sleep(0.5)
        alone = [complete(port, i, a.max_tokens) for i in range(a.streams)]
        together: list = [None] * a.streams
        threads = [threading.Thread(target=lambda i=i: together.__setitem__(i, complete(port, i, a.max_tokens)))
                   for i in range(a.streams)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        died = srv.poll()  # the server's own exit status, if it died during the run
        srv.terminate()
        try:
            srv.wait(timeout=60)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.wait()
    failed = [(i, "alone" if not isinstance(x, list) else "in the batch", x if not isinstance(x, list) else y)
              for i, (x, y) in enumerate(zip(alone, together)) if not isinstance(x, list) or not isinstance(y, list)]
    if failed:
        for i, when, err in failed:
            print(f"request {i} ({when}): error: {err}")
        print(f"server exit status during the run: {died} (None: alive; negative: killed by that signal); "
              f"after it was asked to stop: {srv.returncode} (0: a clean stop)\n"
              f"server log (end):\n{server_log()}")
        return 2
    bad = 0
    for i, (x, y) in enumerate(zip(alone, together)):
        if x != y:
            bad += 1
            at = next((j for j, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
            print(f"request {i} ({len(prompt(i).split())} words): differs from token {at} of {len(x)}")
    print(f"{a.streams - bad} of {a.streams} requests got the same {a.max_tokens} tokens alone and "
          f"in a batch of {a.streams} ({' '.join(a.serve_args) or 'default flags'})")
    if srv.returncode != 0:
        print(f"but the server did not stop cleanly when asked (exit status {srv.returncode})\n"
              f"server log (end):\n{server_log()}")
        return 2
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
