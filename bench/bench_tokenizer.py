#!/usr/bin/env python3
"""Encode throughput: our tokenizer (`gemma4 tokenize --stats`, encode time only, one thread) against
Hugging Face `tokenizers` (Tokenizer.encode, one thread), on the tokenizer test corpus.

    .venv/bin/python bench/bench_tokenizer.py [--bin build/bin/gemma4] [--repeat 5]

Two workloads: the corpus concatenated into one text (joined with "\\n"), and the corpus as 2,483
separate strings (--jsonl vs a Python loop of encode calls); special-token text is parsed on both sides (HF default). Prints MB/s for both sides and the ratio
ours/HF. Times are CPU time of the encode calls (thread CPU for ours, process CPU for HF with one
Rayon thread), best of --repeat, so that a busy machine does not distort the ratio. Also checks that both produce the same ids. The reference tokenizer.json is made from the
starter GGUF by tools/gguf_to_tokenizer_json.py.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "tools"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAYON_NUM_THREADS", "1")


def ours(bin_path, model, args, repeat):
    best, ids = None, None
    for _ in range(repeat):
        p = subprocess.run([bin_path, "tokenize", "--model", model, "--stats", "--special"] + args,
                           capture_output=True, check=True)
        stats = json.loads(p.stderr.decode().strip().splitlines()[-1])
        if best is None or stats["cpu_seconds"] < best["cpu_seconds"]:
            best = stats
        ids = [json.loads(line) for line in p.stdout.decode().split("\n") if line]
    return best, ids


def hf_time(fn, repeat):
    best, out = None, None
    for _ in range(repeat):
        t0 = time.process_time()
        out = fn()
        dt = time.process_time() - t0
        best = dt if best is None else min(best, dt)
    return best, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin", "gemma4"))
    ap.add_argument("--corpus", default=os.path.join(ROOT, "tests", "fixtures", "tokenizer", "corpus.jsonl"))
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()

    import gguf_to_tokenizer_json as conv
    from tokenizers import Tokenizer

    gguf_path = conv.starter_gguf()
    hf_dir = os.path.join(ROOT, "tests", "fixtures", "generated", "tokenizer", "gemma3-270m")
    hf_json = conv.convert(gguf_path, hf_dir)
    hf = Tokenizer.from_file(hf_json)

    with open(a.corpus, encoding="utf-8") as f:
        texts = [json.loads(line) for line in f]
    joined = "\n".join(texts)
    nbytes_joined = len(joined.encode("utf-8"))
    nbytes_lines = sum(len(t.encode("utf-8")) for t in texts)

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        joined_path = os.path.join(tmp, "joined.txt")
        with open(joined_path, "w", encoding="utf-8", newline="") as f:
            f.write(joined)
        t_hf, hf_ids = hf_time(lambda: hf.encode(joined, add_special_tokens=False).ids, a.repeat)
        t_hf_l, hf_lines = hf_time(lambda: [hf.encode(t, add_special_tokens=False).ids for t in texts], a.repeat)
        for source, model in (("tokenizer.json", hf_json), ("gguf", gguf_path)):
            s_j, ids_j = ours(a.bin, model, ["--file", joined_path], a.repeat)
            s_l, ids_l = ours(a.bin, model, ["--jsonl", a.corpus], a.repeat)
            results[source] = {
                "joined": {"ours_MBps": nbytes_joined / s_j["cpu_seconds"] / 1e6, "hf_MBps": nbytes_joined / t_hf / 1e6,
                           "ratio": t_hf / s_j["cpu_seconds"], "same_ids": ids_j[0] == hf_ids},
                "lines": {"ours_MBps": nbytes_lines / s_l["cpu_seconds"] / 1e6, "hf_MBps": nbytes_lines / t_hf_l / 1e6,
                          "ratio": t_hf_l / s_l["cpu_seconds"], "same_ids": ids_l == hf_lines},
            }
    out = {"corpus_strings": len(texts), "joined_bytes": nbytes_joined, "results": results}
    print(json.dumps(out, indent=1))
    for source, r in results.items():
        for wl, v in r.items():
            print(f"{source:15s} {wl:6s} ours {v['ours_MBps']:7.2f} MB/s  hf {v['hf_MBps']:7.2f} MB/s  "
                  f"ratio {v['ratio']:.2f}x  same ids: {v['same_ids']}", file=sys.stderr)


if __name__ == "__main__":
    main()
