"""OpenAI's Responses API (issue 18 item 2) with the official openai client against `gemma4 serve`
on the starter model. Greedy answers are checked against /v1/chat/completions on the same
conversation (the oracle: the same prompt through the chat endpoint), for a plain input,
instructions, and a second turn through previous_response_id; the streamed event sequence
against the non-streamed answer; function tools (a forced call, then its output in the next turn);
text.format json_schema; stored responses (GET, DELETE); and the errors."""
import json

import jsonschema
import openai
import pytest

from test_server import Server, oai

ADD = {"type": "object", "additionalProperties": False, "required": ["a", "b"],
       "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9},
                      "b": {"type": "integer", "minimum": 0, "maximum": 9}}}


@pytest.fixture(scope="module")
def srv(gemma4_bin):
    s = Server(gemma4_bin, "--parallel", "4", "--model-id", "starter")
    yield s
    s.close()


def chat_text(c, messages, n=12):
    r = c.chat.completions.create(model="starter", messages=messages, max_tokens=n, temperature=0)
    return r.choices[0].message.content


def test_answers_match_the_chat_endpoint(srv):
    c = oai(srv)
    r = c.responses.create(model="starter", input="Name a color.", max_output_tokens=12, temperature=0)
    assert r.object == "response" and r.status in ("completed", "incomplete") and r.id.startswith("resp_")
    assert r.output_text == chat_text(c, [{"role": "user", "content": "Name a color."}])
    assert r.usage.input_tokens > 0 and 0 < r.usage.output_tokens <= 12
    r2 = c.responses.create(model="starter", instructions="Answer in French.", max_output_tokens=12, temperature=0,
                            input=[{"role": "user", "content": [{"type": "input_text", "text": "Name a color."}]}])
    assert r2.output_text == chat_text(c, [{"role": "system", "content": "Answer in French."},
                                           {"role": "user", "content": "Name a color."}])
    # A second turn: the stored conversation first (the instructions are not carried over).
    r3 = c.responses.create(model="starter", previous_response_id=r2.id, input="And another?", max_output_tokens=12,
                            temperature=0)
    assert r3.previous_response_id == r2.id
    assert r3.output_text == chat_text(c, [{"role": "user", "content": "Name a color."},
                                           {"role": "assistant", "content": r2.output_text},
                                           {"role": "user", "content": "And another?"}])


def test_stream_events(srv):
    c = oai(srv)
    whole = c.responses.create(model="starter", input="Count to five.", max_output_tokens=16, temperature=0)
    events = list(c.responses.create(model="starter", input="Count to five.", max_output_tokens=16, temperature=0,
                                     stream=True))
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"], types
    assert types[-1] in ("response.completed", "response.incomplete"), types
    assert [e.sequence_number for e in events] == list(range(len(events)))
    for t in ("response.output_item.added", "response.content_part.added", "response.output_text.done",
              "response.content_part.done", "response.output_item.done"):
        assert types.count(t) == 1, (t, types)
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text == events[-1].response.output_text


def test_function_tools_round_trip(srv):
    c = oai(srv)
    tools = [{"type": "function", "name": "add", "description": "adds", "parameters": ADD}]
    r = c.responses.create(model="starter", input="What is 2 + 3?", tools=tools, tool_choice="required",
                           parallel_tool_calls=False, max_output_tokens=120, temperature=0.7)
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "add", r.output
    jsonschema.validate(json.loads(calls[0].arguments), ADD)
    r2 = c.responses.create(model="starter", previous_response_id=r.id, tools=tools, max_output_tokens=8,
                            input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "5"}])
    assert r2.status in ("completed", "incomplete") and r2.output[-1].type in ("message", "function_call")


def test_json_schema_format(srv):
    c = oai(srv)
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["n"], "additionalProperties": False}
    r = c.responses.create(model="starter", input="A number as JSON.", max_output_tokens=40, temperature=0.5,
                           text={"format": {"type": "json_schema", "name": "num", "schema": schema, "strict": True}})
    jsonschema.validate(json.loads(r.output_text), schema)


def test_stored_responses_get_and_delete(srv):
    c = oai(srv)
    r = c.responses.create(model="starter", input="Hi.", max_output_tokens=4, temperature=0)
    got = c.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text
    c.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r.id)
    r2 = c.responses.create(model="starter", input="Hi.", max_output_tokens=4, store=False)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r2.id)


@pytest.mark.parametrize("body, status, param", [
    ({"input": "hi", "previous_response_id": "resp_nope"}, 404, "previous_response_id"),
    ({}, 400, "input"),
    ({"input": [{"type": "mystery"}]}, 400, "input[0].type"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, 400, "tools[0]"),
    ({"input": "hi", "max_output_tokens": -3}, 400, "max_output_tokens"),
    ({"input": "hi", "text": {"format": {"type": "yaml"}}}, 400, "text.format.type"),
    ({"input": "hi", "store": "yes"}, 400, "store"),
    ({"input": [{"role": "user", "content": [{"type": "refusal", "refusal": 5}]}]}, 400, "input[0].content[0].refusal"),
])
def test_errors_name_the_field(srv, body, status, param):
    code, resp = srv.raw("POST", "/v1/responses", body)
    assert code == status and resp["error"]["param"] == param, resp
    assert oai(srv).responses.create(model="starter", input="ok", max_output_tokens=2)  # still serving
