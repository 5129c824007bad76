#!/usr/bin/env python3
"""The cost of constrained decoding per token, against the decode step it rides on (issue 18 item 1:
goal <= 5 %). Sends --requests chat requests with a JSON Schema response_format (one at a time, so
each step carries one constrained sequence) to `gemma4 serve` and reads the server's counters:
gemma4_grammar_seconds_total / gemma4_grammar_tokens_total (filling and applying the token mask,
advancing the matcher) against gemma4_engine_step_seconds_total / gemma4_engine_steps_total. --concurrency C sends them C at a time (server --parallel C), so each
step carries C constrained sequences; the share of the step is then the mask time of a step.

  bench/bench_grammar.py --spawn build/bin/gemma4 [--model M] [--backend cpu|cuda] [--requests 8] [--top-k 64]
      [--concurrency 1]
  bench/bench_grammar.py --url http://127.0.0.1:8080

--top-k K samples with that bound (on a GPU the mask is then applied there and k candidates come
back: Backend::mask_logits; without one the logits come to the host). The same requests without
the schema run first, so the step time with and without constraints is printed too.
"""
from __future__ import annotations

import argparse
import http.client
import json
import re
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlparse

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 24},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 4},
    "count": {"type": "integer", "minimum": 0, "maximum": 1000},
    "kind": {"enum": ["river", "stone", "lantern"]}},
    "required": ["name", "tags", "count", "kind"], "additionalProperties": False}


def request(url, method, path, body=None):
    u = urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    c.request(method, path, body=json.dumps(body) if body is not None else None,
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read().decode()
    c.close()
    return r.status, data


def counters(url):
    text = request(url, "GET", "/metrics")[1]
    out = {}
    for name in ("gemma4_grammar_seconds_total", "gemma4_grammar_tokens_total", "gemma4_engine_step_seconds_total",
                 "gemma4_engine_steps_total"):
        m = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.M)
        out[name] = float(m.group(1)) if m else 0.0
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url")
    ap.add_argument("--spawn", help="a gemma4 binary to start a server with")
    ap.add_argument("--model", default="")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--top-k", type=int, default=0, help="the requests' top_k (0: none)")
    ap.add_argument("--chat-template", default="", help="for a model without one (the synthetic GGUF files)")
    ap.add_argument("--concurrency", type=int, default=1, help="requests in flight at once (and the server's slots)")
    a = ap.parse_args()
    proc = None
    url = a.url
    if a.spawn:
        cmd = [a.spawn, "serve", "--port", "0", "--parallel", str(a.concurrency), "--backend", a.backend]
        if a.model:
            cmd += ["--model", a.model]
        if a.chat_template:
            cmd += ["--chat-template", a.chat_template]
        elif not a.model:  # the starter (a base model) chats through the bundled Gemma 3 template
            cmd += ["--chat-template", str(Path(__file__).resolve().parents[1] / "templates/gemma3_chat.jinja")]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        for line in proc.stdout:
            m = re.match(r"ready: (http://\S+)", line)
            if m:
                url = m.group(1)
                break
    def run(constrained):
        before = counters(url)
        t0 = time.time()

        def one(i):
            body = {"messages": [{"role": "user", "content": "Describe an object as JSON."}],
                    "max_tokens": a.max_tokens, "temperature": 0.7, "seed": i}
            if a.top_k:
                body["top_k"] = a.top_k
            if constrained:
                body["response_format"] = {"type": "json_schema",
                                           "json_schema": {"name": "o", "schema": SCHEMA, "strict": True}}
            status, text = request(url, "POST", "/v1/chat/completions", body)
            if status != 200:
                raise SystemExit(f"request failed ({status}): {text[:300]}")

        with ThreadPoolExecutor(max(1, a.concurrency)) as ex:
            list(ex.map(one, range(a.requests)))
        after = counters(url)
        return time.time() - t0, {k: after[k] - before[k] for k in after}

    try:
        _, p = run(False)
        plain_step = p["gemma4_engine_step_seconds_total"] / max(p["gemma4_engine_steps_total"], 1)
        wall, d = run(True)
        per_tok = d["gemma4_grammar_seconds_total"] / max(d["gemma4_grammar_tokens_total"], 1)
        per_step = d["gemma4_engine_step_seconds_total"] / max(d["gemma4_engine_steps_total"], 1)
        share = d["gemma4_grammar_seconds_total"] / max(d["gemma4_engine_step_seconds_total"], 1e-9)
        print(f"backend {a.backend}, top_k {a.top_k or 'none'}, {a.concurrency} at a time: "
              f"{int(d['gemma4_grammar_tokens_total'])} constrained tokens in {wall:.1f} s; mask + accept "
              f"{1e6 * per_tok:.1f} us per token, step {1e3 * per_step:.2f} ms: {100 * share:.2f} % of the steps' "
              f"time; unconstrained step {1e3 * plain_step:.2f} ms (constrained {100 * (per_step / plain_step - 1):+.1f} %)")
    finally:
        if proc:
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    main()
