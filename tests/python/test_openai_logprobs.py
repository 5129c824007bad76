"""`logprobs` / `top_logprobs` on the OpenAI endpoints (issue 18 item 2), with the official client:
the reported values are the model's log-softmax at each generated position (mlx-lm's `logprobs`:
after the logits processors, before temperature and the filters), checked against `gemma4 logits`
on the same ids with the server's kernels (--batch-invariant on); chat's entries spell out the
answer; streamed chunks carry the same entries as the whole answer."""
import json
import subprocess

import numpy as np
import openai
import pytest

from test_server import STARTER, Server, oai

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def srv(gemma4_bin):
    s = Server(gemma4_bin, "--parallel", "2", "--no-prefix-cache", "--model-id", "starter")
    yield s
    s.close()


def log_softmax(row):
    m = row.max()
    return row - (m + np.log(np.exp(row - m).sum()))


def test_completion_logprobs_match_the_models_distribution(srv, gemma4_bin, tmp_path):
    c = oai(srv)
    r = c.completions.create(model="starter", prompt=PROMPT, max_tokens=4, temperature=0, logprobs=5)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == r.usage.completion_tokens
    assert "".join(lp.tokens) == r.choices[0].text
    assert lp.text_offset == list(np.cumsum([0] + [len(t) for t in lp.tokens[:-1]]))
    prompt_ids = srv.raw("POST", "/tokenize", {"prompt": PROMPT})[1]["tokens"]
    gen = json.loads(subprocess.run([str(gemma4_bin), "greedy", "--model", str(STARTER), "--ids", json.dumps(prompt_ids),
                                     "--steps", "4", "--batch-invariant", "on"],
                                    capture_output=True, text=True, check=True).stdout)
    gen = gen["ids"] if isinstance(gen, dict) else gen
    gen = gen[-4:] if len(gen) > 4 else gen
    ids = prompt_ids + gen
    out = tmp_path / "logits.npy"
    subprocess.run([str(gemma4_bin), "logits", "--model", str(STARTER), "--ids", json.dumps(ids), "--out", str(out),
                    "--batch-invariant", "on"], check=True, capture_output=True)
    logits = np.load(out)
    for i, tok in enumerate(gen):
        ref = log_softmax(logits[len(prompt_ids) - 1 + i].astype(np.float64))
        assert abs(lp.token_logprobs[i] - ref[tok]) < 2e-3, (i, lp.token_logprobs[i], ref[tok])
        got_top = sorted(lp.top_logprobs[i].values(), reverse=True)
        want_top = np.sort(ref)[::-1][:5]
        assert len(got_top) == 5 and np.allclose(got_top, want_top, atol=2e-3), (got_top, want_top)
        assert lp.token_logprobs[i] == pytest.approx(got_top[0], abs=1e-6)  # greedy: the most likely


def test_chat_logprobs_spell_the_answer_and_stream_alike(srv):
    c = oai(srv)
    kw = dict(model="starter", messages=[{"role": "user", "content": "Name a color."}], max_tokens=6, temperature=0,
              logprobs=True, top_logprobs=3)
    full = c.chat.completions.create(**kw)
    entries = full.choices[0].logprobs.content
    assert len(entries) == full.usage.completion_tokens
    assert "".join(e.token for e in entries) == full.choices[0].message.content
    for e in entries:
        assert len(e.top_logprobs) == 3 and e.logprob <= 0
        assert e.logprob == pytest.approx(e.top_logprobs[0].logprob, abs=1e-6)
        assert bytes(e.bytes) == e.token.encode()
    streamed = []
    for ch in c.chat.completions.create(**kw, stream=True):
        if ch.choices and ch.choices[0].logprobs and ch.choices[0].logprobs.content:
            streamed.extend(ch.choices[0].logprobs.content)
    assert [e.token for e in streamed] == [e.token for e in entries]
    assert np.allclose([e.logprob for e in streamed], [e.logprob for e in entries], atol=1e-5)
    plain = c.chat.completions.create(**{k: v for k, v in kw.items() if k not in ("logprobs", "top_logprobs")})
    assert plain.choices[0].logprobs is None


def test_sampled_tokens_report_their_logprobs(srv):
    r = oai(srv).completions.create(model="starter", prompt=PROMPT, max_tokens=8, temperature=1.0, seed=3,
                                    logprobs=2, extra_body={"top_k": 40})
    lp = r.choices[0].logprobs
    assert len(lp.token_logprobs) == r.usage.completion_tokens
    assert all(v <= 0 for v in lp.token_logprobs)
    for v, alts in zip(lp.token_logprobs, lp.top_logprobs):  # a drawn token is at most the most likely
        assert v <= max(alts.values()) + 1e-6


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21},
     "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": 3}, "logprobs"),
    ("/v1/completions", {"prompt": "x", "logprobs": 21}, "logprobs"),
    ("/v1/completions", {"prompt": "x", "logprobs": True}, "logprobs"),
])
def test_logprobs_errors(srv, path, body, param):
    status, payload = srv.raw("POST", path, body)
    assert status == 400 and payload["error"]["param"] == param, payload
