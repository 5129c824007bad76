"""`gemma4 render` against transformers' apply_chat_template rendering (jinja2), byte for byte.

Covers the official Gemma 4 template, Gemma 3's template and a feature-exercise template over the
conversations of tools/make_template_corpus.py, every thinking / generation-prompt setting, through
both the --batch mode and the single-file flags (--template, --model, --messages, --tools,
--thinking, --no-generation-prompt). The reference is rendered live here, so a stale
expected.jsonl cannot hide a mismatch; expected.jsonl is also checked to be current.
"""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import make_template_corpus as corpus  # noqa: E402

FIXTURES = os.path.join(ROOT, "tests", "fixtures", "templates")
BIN = os.environ.get("GEMMA4_BIN", os.path.join(ROOT, "build", "bin", "gemma4"))

pytestmark = pytest.mark.skipif(not os.path.exists(BIN), reason=f"{BIN} not built")


def _template(name):
    with open(os.path.join(FIXTURES, name), encoding="utf-8") as f:
        return f.read()


def _all_cases():
    return list(corpus.cases(FIXTURES))


@pytest.fixture(scope="module")
def batch_results(tmp_path_factory):
    cases = _all_cases()
    path = tmp_path_factory.mktemp("render") / "cases.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for tname, _, msgs, tools, thinking, gen in cases:
            f.write(json.dumps({"template": os.path.join(FIXTURES, tname), "messages": msgs, "tools": tools,
                                "thinking": thinking, "add_generation_prompt": gen,
                                "bos_token": corpus.BOS, "eos_token": corpus.EOS}, ensure_ascii=False) + "\n")
    out = subprocess.run([BIN, "render", "--batch", str(path)], capture_output=True, check=True)
    lines = out.stdout.decode("utf-8").splitlines()
    assert len(lines) == len(cases)
    return {(c[0], c[1], c[4], c[5]): json.loads(line) for c, line in zip(cases, lines)}


def test_corpus_size():
    convs = corpus.conversations()
    assert len(convs) >= 50
    kinds = json.dumps([m for _, msgs, _ in convs for m in msgs])
    for needle in ['"developer"', '"tool_calls"', '"tool"', '"image"', '"reasoning_content"']:
        assert needle in kinds


@pytest.mark.parametrize("tname", list(corpus.TEMPLATES))
def test_batch_matches_jinja2(batch_results, tname):
    template = _template(tname)
    checked = mismatches = 0
    first_diff = None
    for t, case, msgs, tools, thinking, gen in _all_cases():
        if t != tname:
            continue
        ref = corpus.render_case(template, msgs, tools, thinking, gen)
        got = batch_results[(t, case, thinking, gen)]
        checked += 1
        if "error" in ref:
            ok = "error" in got
        else:
            ok = got.get("text") == ref["text"]
        if not ok:
            mismatches += 1
            if first_diff is None:
                first_diff = (case, thinking, gen, ref, got)
    assert checked > 50
    assert mismatches == 0, f"{mismatches}/{checked} differ; first: {first_diff}"


def test_expected_jsonl_is_current():
    rows = [json.loads(l) for l in open(os.path.join(FIXTURES, "expected.jsonl"), encoding="utf-8")]
    cases = _all_cases()
    assert len(rows) == len(cases)
    templates = {t: _template(t) for t in corpus.TEMPLATES}
    for row, (tname, case, msgs, tools, thinking, gen) in list(zip(rows, cases))[::7]:
        assert (row["template"], row["case"]) == (tname, case)
        ref = corpus.render_case(templates[tname], msgs, tools, thinking, gen)
        assert row.get("text") == ref.get("text")


def _run(args):
    return subprocess.run([BIN, "render", *args], capture_output=True)


@pytest.mark.parametrize("tname,case,thinking,gen", [
    ("gemma4.jinja", "020_tool_call_string_args", True, True),
    ("gemma4.jinja", "018_tools_empty_list", None, False),
    ("gemma4.jinja", "023_parallel_tool_calls", False, True),
    ("gemma3.jinja", "014_image_multi_turn", None, True),
    ("gemma3.jinja", "004_multi_turn", None, False),
])
def test_single_file_flags(tmp_path, tname, case, thinking, gen):
    path = os.path.join(FIXTURES, "corpus", case + ".json")
    conv = json.load(open(path, encoding="utf-8"))
    # Messages and tools in separate files, the way the flags take them.
    mfile, tfile = tmp_path / "m.json", tmp_path / "t.json"
    mfile.write_text(json.dumps(conv["messages"], ensure_ascii=False), encoding="utf-8")
    args = ["--template", os.path.join(FIXTURES, tname), "--messages", str(mfile)]
    if conv["tools"] is not None:
        tfile.write_text(json.dumps(conv["tools"]), encoding="utf-8")
        args += ["--tools", str(tfile)]
    if thinking is not None:
        args += ["--thinking", "on" if thinking else "off"]
    if not gen:
        args += ["--no-generation-prompt"]
    out = _run(args)
    assert out.returncode == 0, out.stderr
    ref = corpus.reference_render(_template(tname), conv["messages"], conv["tools"], thinking, gen)
    assert out.stdout.decode("utf-8") == ref
    # The combined {"messages", "tools"} file gives the same text.
    args2 = [a if a != str(mfile) else path for a in args]
    if "--tools" in args2:
        i = args2.index("--tools")
        del args2[i:i + 2]
    assert _run(args2).stdout == out.stdout


def test_model_dir(tmp_path):
    """--model DIR: chat_template.jinja wins; else tokenizer_config.json's chat_template, bos/eos."""
    msgs = [{"role": "user", "content": "Hello"}]
    (tmp_path / "m.json").write_text(json.dumps(msgs))
    cfg_template = "{{ bos_token }}[{{ messages[0].content }}]{{ eos_token }}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": cfg_template, "bos_token": {"content": "<B>"}, "eos_token": "<E>"}))
    out = _run(["--model", str(tmp_path), "--messages", str(tmp_path / "m.json")])
    assert out.returncode == 0, out.stderr
    assert out.stdout.decode() == corpus.reference_render(cfg_template, msgs, bos_token="<B>", eos_token="<E>")
    (tmp_path / "chat_template.jinja").write_text(_template("gemma4.jinja"))
    out = _run(["--model", str(tmp_path), "--messages", str(tmp_path / "m.json")])
    assert out.stdout.decode() == corpus.reference_render(_template("gemma4.jinja"), msgs, bos_token="<B>",
                                                          eos_token="<E>")


def test_errors_name_the_line(tmp_path):
    (tmp_path / "m.json").write_text(json.dumps([{"role": "user", "content": "x"}]))
    bad = tmp_path / "bad.jinja"
    bad.write_text("line one\n{% if true %}\n{% include 'other.jinja' %}\n{% endif %}\n")
    out = _run(["--template", str(bad), "--messages", str(tmp_path / "m.json")])
    assert out.returncode != 0
    err = out.stderr.decode()
    assert "line 3" in err and "include" in err and str(bad) in err
    # raise_exception from Gemma 3's template (roles must alternate) is an error, as in jinja2.
    (tmp_path / "m2.json").write_text(json.dumps([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]))
    out = _run(["--template", os.path.join(FIXTURES, "gemma3.jinja"), "--messages", str(tmp_path / "m2.json")])
    assert out.returncode != 0 and b"Conversation roles must alternate" in out.stderr
