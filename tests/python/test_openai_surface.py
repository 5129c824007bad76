"""OpenAI-side endpoints beyond chat and completions (issue 18 item 2), with the official `openai`
client where it has a call: `/v1/models/{id}`, and llama-server's / vLLM's `/tokenize` and
`/detokenize`, checked against `gemma4 tokenize` and the prompt sizes the server reports in usage."""
import json
import subprocess

import openai
import pytest

from test_server import STARTER, Server, oai


@pytest.fixture(scope="module")
def srv(gemma4_bin):
    s = Server(gemma4_bin, "--parallel", "2", "--no-prefix-cache", "--model-id", "starter")
    yield s
    s.close()


def test_models_retrieve(srv):
    c = oai(srv)
    m = c.models.retrieve("starter")
    assert m.id == "starter" and m.object == "model"
    with pytest.raises(openai.NotFoundError) as e:
        c.models.retrieve("no-such-model")
    assert "no-such-model" in str(e.value)


def test_tokenize_matches_the_cli_and_usage(srv, gemma4_bin):
    text = "The quick brown fox jumps over the lazy dog."
    cli = json.loads(subprocess.run([str(gemma4_bin), "tokenize", "--model", str(STARTER), text],
                                    capture_output=True, text=True, check=True).stdout)
    status, plain = srv.raw("POST", "/tokenize", {"content": text, "add_special": False})
    assert status == 200 and plain["tokens"] == cli and plain["count"] == len(cli)
    status, full = srv.raw("POST", "/tokenize", {"prompt": text})  # vLLM's field; <bos> by default
    assert status == 200 and full["tokens"][1:] == cli and full["max_model_len"] > 0
    usage = oai(srv).completions.create(model="starter", prompt=text, max_tokens=1, temperature=0).usage
    assert usage.prompt_tokens == full["count"]
    msgs = [{"role": "user", "content": "Name three colors."}]
    status, chat = srv.raw("POST", "/tokenize", {"messages": msgs})
    cu = oai(srv).chat.completions.create(model="starter", messages=msgs, max_tokens=1, temperature=0).usage
    assert status == 200 and chat["count"] == cu.prompt_tokens
    status, back = srv.raw("POST", "/detokenize", {"tokens": cli})
    assert status == 200 and back["content"] == text and back["prompt"] == text


@pytest.mark.parametrize("path,body,param", [
    ("/tokenize", {"content": 5}, "content"),
    ("/tokenize", {}, "content"),
    ("/detokenize", {"tokens": "abc"}, "tokens"),
    ("/detokenize", {"tokens": [1, -1]}, "tokens"),
    ("/detokenize", {"tokens": [1, 10 ** 9]}, "tokens"),
])
def test_tokenize_errors(srv, path, body, param):
    status, payload = srv.raw("POST", path, body)
    assert status == 400 and payload["error"]["param"] == param, payload


def test_n_choices(srv):
    """n choices of one prompt: seeded samples differ by seed, each choice has its index, usage counts
    the prompt once and every choice's tokens; streamed choices carry the same texts."""
    c = oai(srv)
    kw = dict(model="starter", prompt="Once upon a time", max_tokens=8, temperature=1.0, seed=11, n=3)
    r = c.completions.create(**kw)
    assert sorted(ch.index for ch in r.choices) == [0, 1, 2]
    texts = [ch.text for ch in sorted(r.choices, key=lambda ch: ch.index)]
    one = c.completions.create(**{**kw, "n": 1})
    assert texts[0] == one.choices[0].text  # choice i samples with seed + i
    assert r.usage.prompt_tokens == one.usage.prompt_tokens
    assert r.usage.completion_tokens == sum(
        c.completions.create(**{**kw, "n": 1, "seed": 11 + i}).usage.completion_tokens for i in range(3))
    streamed = {}
    for ch in c.completions.create(**kw, stream=True):
        for choice in ch.choices:
            streamed[choice.index] = streamed.get(choice.index, "") + choice.text
    assert [streamed[i] for i in range(3)] == texts
    chat = c.chat.completions.create(model="starter", messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                     temperature=0, n=2)
    assert len(chat.choices) == 2 and chat.choices[0].message.content == chat.choices[1].message.content


def test_ignore_eos_runs_to_max_tokens(srv):
    """vLLM's and llama-server's `ignore_eos` (what serving benchmarks send): the model's end tokens
    no longer stop the answer, which then runs to max_tokens. logit_bias forces <eos> (id 1 of the
    starter's vocabulary) under greedy decoding, so the plain request stops at its first token."""
    c = oai(srv)
    kw = dict(model="starter", prompt="The capital of France is", max_tokens=12, temperature=0, logit_bias={"1": 100})
    short = c.completions.create(**kw)
    assert short.choices[0].finish_reason == "stop" and short.usage.completion_tokens == 1
    full = c.completions.create(**kw, extra_body={"ignore_eos": True})
    assert full.choices[0].finish_reason == "length" and full.usage.completion_tokens == 12
    assert full.choices[0].text == ""  # the end tokens are counted, never written as text
    status, bad = srv.raw("POST", "/v1/completions", {"prompt": "hi", "ignore_eos": "yes"})
    assert status == 400 and bad["error"]["param"] == "ignore_eos", bad
    status, bad = srv.raw("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                           "ignore_eos": True, "response_format": {"type": "json_object"}})
    assert status == 400 and bad["error"]["param"] == "ignore_eos", bad  # a finished grammar admits only the end
