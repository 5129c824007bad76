#!/usr/bin/env python3
"""Seed corpora for the libFuzzer harnesses of fuzz/ (make test-fuzz), one folder per harness under
--out, made from the repository's fixtures and from small files written here with the same
libraries the fixtures come from (safetensors, gguf, Pillow):

  safetensors  small files with F32 / BF16 / F16 / quantized-style U32 tensors and metadata
  gguf         tests/fixtures/gguf_gemma4/*.gguf and a small file written with the gguf package
  config       config.json of the generated fixtures (when made) and hand-written variants
  jinja        tests/fixtures/templates/*.jinja and the corpus templates
  tokenizer    text lines of tests/fixtures/tokenizer/corpus.jsonl (odd first byte), the test
               tokenizer's JSON (even first byte)
  requests     OpenAI and Anthropic request bodies (chat, tools, images, tool calls)
  image        tiny PNG / JPEG / GIF / BMP images
"""
from __future__ import annotations

import argparse
import base64
import io
import json
import shutil
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def write(d: Path, name: str, data: bytes | str) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data.encode() if isinstance(data, str) else data)


def safetensors_seeds(d: Path) -> None:
    from safetensors.numpy import save
    write(d, "f32.safetensors", save({"a": np.arange(6, dtype=np.float32).reshape(2, 3)}, {"format": "mlx"}))
    write(d, "mixed.safetensors", save({"w": np.zeros((4, 2), dtype=np.uint32), "s": np.ones((4, 1), dtype=np.float16),
                                        "b": np.ones((4, 1), dtype=np.float16)}))


def gguf_seeds(d: Path) -> None:
    for f in sorted((REPO / "tests/fixtures/gguf_gemma4").glob("*.gguf"))[:2]:
        shutil.copy(f, d / f.name)
    import gguf
    p = d / "small.gguf"
    w = gguf.GGUFWriter(str(p), "gemma3")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_sliding_window(4)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def config_seeds(d: Path) -> None:
    gen = REPO / "tests/fixtures/generated"
    for i, f in enumerate(sorted(gen.glob("*/config.json"))[:8]):
        shutil.copy(f, d / f"fixture{i}.json")
    base = {"model_type": "gemma4_text", "hidden_size": 64, "num_hidden_layers": 4, "intermediate_size": 128,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "global_head_dim": 32,
            "num_kv_shared_layers": 2, "vocab_size": 300, "sliding_window": 8, "hidden_size_per_layer_input": 16,
            "layer_types": ["sliding_attention", "full_attention"] * 2,
            "rope_parameters": {"full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                   "rope_theta": 1e6}, "sliding_attention": {"rope_theta": 1e4}},
            "quantization": {"group_size": 64, "bits": 4, "model.layers.0.mlp.down_proj": False}}
    write(d, "flat.json", json.dumps(base))
    write(d, "nested.json", json.dumps({"model_type": "gemma4", "text_config": base, "vision_config": {}}))
    write(d, "moe.json", json.dumps({**base, "enable_moe_block": True, "num_experts": 4, "top_k_experts": 2,
                                     "moe_intermediate_size": 32}))


def jinja_seeds(d: Path) -> None:
    t = REPO / "tests/fixtures/templates"
    for f in sorted(t.glob("*.jinja")) + sorted((t / "corpus").glob("*"))[:40]:
        if f.is_file():
            shutil.copy(f, d / f.name)
    shutil.copy(REPO / "templates/gemma3_chat.jinja", d / "gemma3_chat.jinja")
    # Reference cycles through namespaces (a 1M-execution run found the first as a leak).
    (d / "namespace_cycle.jinja").write_text(
        "{% set ns = namespace(a=1, l=[]) %}{% set ns.self = ns %}{% set ns.l = [ns, loop] %}"
        "{% for x in [1] %}{% set loop.me = loop %}{% set ns.loops = [loop] %}{% endfor %}{{ ns.self.a }}")
    # Printing the cycle itself (once a stack overflow in repr).
    (d / "namespace_cycle_print.jinja").write_text(
        "{% set ns = namespace(a=0) %}{% set ns.self = ns %}{% set ns.l = [ns] %}{{ ns.self }}{{ ns.l }}")


def tokenizer_seeds(d: Path) -> None:
    lines = (REPO / "tests/fixtures/tokenizer/corpus.jsonl").read_text().splitlines()
    for i, line in enumerate(lines[:60]):
        rec = json.loads(line)
        text = rec.get("text", rec) if isinstance(rec, dict) else rec
        write(d, f"text{i}", b"\x01" + str(text).encode())
    tiny = {"version": "1.0", "added_tokens": [{"id": 0, "content": "<bos>", "special": True, "normalized": False,
                                                "lstrip": False, "rstrip": False, "single_word": False}],
            "normalizer": None, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False},
            "model": {"type": "BPE", "vocab": {"<bos>": 0, "a": 1, "b": 2, "ab": 3}, "merges": ["a b"]}}
    write(d, "tokenizer_json", b"\x00" + json.dumps(tiny).encode())


def tiny_png() -> bytes:
    from PIL import Image
    b = io.BytesIO()
    Image.new("RGBA", (3, 2), (10, 200, 30, 128)).save(b, "PNG")
    return b.getvalue()


def requests_seeds(d: Path) -> None:
    img = "data:image/png;base64," + base64.b64encode(tiny_png()).decode()
    bodies = [
        {"messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi <start_of_turn>"}],
         "max_tokens": 5, "temperature": 0.5, "stop": ["\n"], "logit_bias": {"3": 1}},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "see"},
                                                   {"type": "image_url", "image_url": {"url": img}}]}]},
        {"messages": [{"role": "user", "content": "w?"},
                      {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {
                          "name": "get", "arguments": "{\"city\": \"Paris\"}"}}]},
                      {"role": "tool", "tool_call_id": "c1", "content": "sunny"}],
         "tools": [{"type": "function", "function": {"name": "get", "parameters": {
             "type": "object", "properties": {"city": {"type": "string"}}}}}], "stream": True},
        {"prompt": "Once upon", "max_tokens": 3},
        {"max_tokens": 8, "system": [{"type": "text", "text": "sys"}], "thinking": {"type": "enabled"},
         "messages": [{"role": "user", "content": [{"type": "text", "text": "q"},
                                                   {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                                "data": base64.b64encode(tiny_png()).decode()}}]},
                      {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm"},
                                                        {"type": "tool_use", "id": "t", "name": "f", "input": {"x": [1, 2]}}]},
                      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "ok"}]}],
         "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}]},
    ]
    for i, b in enumerate(bodies):
        write(d, f"body{i}.json", json.dumps(b))


def image_seeds(d: Path) -> None:
    from PIL import Image
    im = Image.new("RGB", (5, 4), (200, 10, 60))
    for fmt, kw in (("PNG", {}), ("JPEG", {"quality": 80}), ("GIF", {}), ("BMP", {})):
        b = io.BytesIO()
        im.save(b, fmt, **kw)
        write(d, f"tiny.{fmt.lower()}", b.getvalue())
    b = io.BytesIO()
    im.convert("L").save(b, "JPEG", progressive=True)
    write(d, "grey_progressive.jpg", b.getvalue())
    write(d, "rgba.png", tiny_png())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    out = Path(ap.parse_args().out)
    for name, fn in (("safetensors", safetensors_seeds), ("gguf", gguf_seeds), ("config", config_seeds),
                     ("jinja", jinja_seeds), ("tokenizer", tokenizer_seeds), ("requests", requests_seeds),
                     ("image", image_seeds)):
        d = out / name
        d.mkdir(parents=True, exist_ok=True)
        fn(d)
        print(f"{name}: {len(list(d.iterdir()))} seeds")


if __name__ == "__main__":
    main()
