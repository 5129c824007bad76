#!/usr/bin/env python3
"""Writes a GGUF with the starter model's exact geometry and weight formats but random weights.

For speed measurements where the real file cannot go (the lent GPU machine takes 64 MiB per call;
the starter GGUF is 240 MB): architecture metadata and the tensor table (names, shapes, ggml
types: Q8_0 embedding, Q5_0/Q8_0 attention, Q4_K/Q6_K down projections, ...) come from the
committed manifest tests/fixtures/llamacpp/gguf_manifest.json; block bytes are random with sane
f16 scales, norm weights small. No tokenizer (the bench verb needs none), unless --vocab asks for a
stand-in SentencePiece vocabulary of the real size (special tokens at the real ids, 256 byte
tokens, the rest "tok<i>"): llama.cpp loads no model without one. Needs numpy and the `gguf`
package.

    python3 tools/make_synthetic_gguf.py OUT.gguf [--seed 0] [--vocab]
"""
import argparse
import json
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "tests" / "fixtures" / "llamacpp" / "gguf_manifest.json"

# ggml type -> (values per block, bytes per block, byte offsets of f16 scale fields)
BLOCKS = {8: (32, 34, [0]), 6: (32, 22, [0]), 2: (32, 18, [0]), 12: (256, 144, [0, 2]),
          13: (256, 176, [0, 2]), 14: (256, 210, [208])}
INT_KEYS = ("context_length", "embedding_length", "block_count", "feed_forward_length",
            "attention.head_count", "attention.head_count_kv", "attention.key_length",
            "attention.value_length", "attention.sliding_window")


def random_blocks(rng, ggml_type: int, n_values: int) -> np.ndarray:
    per, nbytes, f16_at = BLOCKS[ggml_type]
    nb = n_values // per
    raw = rng.integers(0, 256, size=(nb, nbytes), dtype=np.uint8)
    for off in f16_at:  # |scale| in [1e-3, 2e-2], random sign
        s = (np.exp(rng.uniform(np.log(1e-3), np.log(2e-2), nb)) * rng.choice([-1, 1], nb)).astype(np.float16)
        raw[:, off:off + 2] = s.view(np.uint8).reshape(nb, 2)
    return raw.reshape(-1)


def add_standin_vocab(w, gguf, m):
    n = next(t["ne"][1] for t in m["tensors"] if t["name"] == "token_embd.weight")
    special = ["<pad>", "<eos>", "<bos>", "<unk>"]
    tokens = special + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"tok{i}" for i in range(len(tokens), n - 3)] + ["tok1", "0", "tok10"]  # one merge's pieces
    types = [3] * 3 + [2] + [6] * 256 + [1] * (n - 260)  # control, unknown, byte, normal
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * n)
    w.add_token_types(types)
    w.add_token_merges(["tok1 0"])  # our loader wants merges with a 'llama' vocabulary (llama.cpp ignores them)
    w.add_pad_token_id(0)
    w.add_eos_token_id(1)
    w.add_bos_token_id(2)
    w.add_unk_token_id(3)
    w.add_add_bos_token(True)
    w.add_add_space_prefix(False)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocab", action="store_true", help="add a stand-in vocabulary (for llama.cpp)")
    a = ap.parse_args()
    import gguf

    m = json.loads(MANIFEST.read_text())
    kv = m["kv"]
    arch = kv["general.architecture"]["value"]
    rng = np.random.default_rng(a.seed)
    w = gguf.GGUFWriter(a.out, arch)
    for k in INT_KEYS:
        w.add_uint32(f"{arch}.{k}", int(kv[f"{arch}.{k}"]["value"]))
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", float(kv[f"{arch}.attention.layer_norm_rms_epsilon"]["value"]))
    w.add_float32(f"{arch}.rope.freq_base", float(kv[f"{arch}.rope.freq_base"]["value"]))
    w.add_string("general.name", "synthetic " + kv["general.name"]["value"])
    if a.vocab:
        add_standin_vocab(w, gguf, m)
    for t in m["tensors"]:
        ne = t["ne"]  # ggml order: ne[0] = values per row
        n = int(np.prod(ne))
        if t["type"] == 0:  # F32 norm weights
            w.add_tensor(t["name"], (rng.standard_normal(n) * 0.1).astype(np.float32).reshape(list(reversed(ne))))
        else:
            per, nbytes, _ = BLOCKS[t["type"]]
            rows = n // ne[0]
            data = random_blocks(rng, t["type"], n).reshape(rows, ne[0] // per * nbytes)
            w.add_tensor(t["name"], data, raw_dtype=gguf.GGMLQuantizationType(t["type"]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {a.out}: {len(m['tensors'])} tensors, {Path(a.out).stat().st_size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
