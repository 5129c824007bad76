#!/usr/bin/env python3
"""Chat-template corpus: conversations + the text jinja2 renders for them, as transformers does.

Writes, under tests/fixtures/templates/ (or --out):
  corpus/NNN_<name>.json   one conversation each: {"messages": [...], "tools": [...] | null}
  expected.jsonl           one line per (template, conversation, thinking, generation prompt):
                           {"template", "case", "thinking", "add_generation_prompt",
                            "text" | "error"}

The reference render is transformers' own pipeline (`reference_render` below):
_normalize_chat_messages, then render_jinja_template (which aliases reasoning fields and uses
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with HF's tojson,
raise_exception, strftime_now). tests/python/test_chat_template.py imports this module and
compares `gemma4 render` against it byte for byte.

Usage: .venv/bin/python tools/make_template_corpus.py [--out DIR]
"""
import argparse
import copy
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_OUT = os.path.join(ROOT, "tests", "fixtures", "templates")

# Template files (in the fixtures folder) and the settings each is rendered with.
TEMPLATES = {
    "gemma4.jinja": {"thinking": [None, True, False], "generation": [True, False]},
    "gemma3.jinja": {"thinking": [None], "generation": [True, False]},
    "features.jinja": {"thinking": [None], "generation": [True]},
}
BOS, EOS = "<bos>", "<eos>"


def reference_render(template, messages, tools=None, thinking=None, add_generation_prompt=True,
                     bos_token=BOS, eos_token=EOS, extra=None):
    """tokenizer.apply_chat_template(messages, tools, tokenize=False, ...) minus the tokenizer."""
    import logging
    logging.getLogger("transformers").setLevel(logging.ERROR)
    from transformers.utils.chat_template_utils import _normalize_chat_messages, render_jinja_template

    kwargs = {"bos_token": bos_token, "eos_token": eos_token}
    if thinking is not None:
        kwargs["enable_thinking"] = thinking
    kwargs.update(extra or {})
    conv = _normalize_chat_messages(copy.deepcopy(messages))
    out, _ = render_jinja_template(conversations=[conv], tools=copy.deepcopy(tools), chat_template=template,
                                   add_generation_prompt=add_generation_prompt, **kwargs)
    return out[0]


# ---------------------------------------------------------------- tools

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. 'Paris'"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Temperature unit"}},
        "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search_docs", "description": "Search the knowledge base.\nReturns ranked passages.",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string", "description": "Free text"},
        "filters": {"type": "object", "description": "Optional filters", "properties": {
            "lang": {"type": "string", "enum": ["en", "fr", "de"]},
            "date": {"type": "object", "properties": {
                "from": {"type": "string", "description": "ISO date"},
                "to": {"type": "string", "nullable": True}}, "required": ["from"]},
            "tags": {"type": "array", "items": {"type": "string"}}},
            "required": ["lang"]},
        "limit": {"type": "integer", "description": "Max results"},
        "threshold": {"type": "number"}},
        "required": ["query", "limit"]},
    "response": {"type": "object", "description": "Ranked passages"}}}
CREATE_EVENT = {"type": "function", "function": {
    "name": "create_event", "description": "Create calendar events with attendees.",
    "parameters": {"type": "object", "properties": {
        "events": {"type": "array", "description": "Events to create", "items": {
            "type": "object", "properties": {
                "title": {"type": "string"},
                "start": {"type": "string", "description": "RFC 3339"},
                "attendees": {"type": "array", "items": {"type": "object", "properties": {
                    "email": {"type": "string"}, "optional": {"type": "boolean"}}, "required": ["email"]}},
                "priority": {"type": "string", "enum": ["low", "normal", "high"]}},
            "required": ["title", "start"]}},
        "notify": {"type": "boolean", "description": "Send invitations"},
        "metadata": {"type": "object", "description": "Free-form key/values"}},
        "required": ["events"]}}}
CALC = {"type": "function", "function": {
    "name": "calculator", "description": "  Evaluate an arithmetic expression.  ",
    "parameters": {"type": "object", "properties": {
        "expression": {"type": "string"},
        "precision": {"type": ["integer", "null"], "description": "Digits"},
        "mode": {"type": "array", "items": {"type": ["string", "null"], "enum": ["exact", "approx"]}}},
        "required": ["expression"]}}}
NO_PARAMS = {"type": "function", "function": {"name": "get_time", "description": "Current UTC time."}}
LOOSE_OBJECT = {"type": "function", "function": {
    "name": "set_config", "description": "Set options.",
    "parameters": {"type": "object", "properties": {
        "options": {"type": "object", "description": "Options without a properties key",
                    "verbose": {"type": "boolean"}, "level": {"type": "integer", "description": "1-5"}}}}}}
ALL_TOOLS = [WEATHER, SEARCH, CREATE_EVENT, CALC, NO_PARAMS, LOOSE_OBJECT]

# ---------------------------------------------------------------- conversations

TEXTS = [
    "Hi! What's the weather like in Paris today?",
    "  Explain quicksort in two sentences.  ",
    "Translate to French: \"Good morning, my friend.\"",
    "日本語で自己紹介してください。",
    "Emoji test 🎉🚀 — with an em dash and café.",
    "Line one\nLine two\n\n  indented line three\n",
    "Backslashes \\n are not newlines; tabs\there.",
    "What is 0.1 + 0.2, and why isn't it 0.3?",
    "<b>HTML</b> & 'quotes' \"doubled\" {{ not jinja }} {% neither %}",
    "",
]
ANSWERS = [
    "The weather in Paris is sunny, 21 °C.",
    "Quicksort picks a pivot and partitions the array.\nThen it recurses on both halves.",
    "Bonjour, mon ami.",
    "<|channel>thought\nThe user wants a greeting.<channel|>Hello! I am a model.",
    "First part.<|channel>hidden reasoning<channel|> Second part.",
    "  padded answer  ",
    "It is 0.30000000000000004 in binary floating point.",
]


def user(text):
    return {"role": "user", "content": text}


def assistant(text, **kw):
    m = {"role": "assistant", "content": text}
    m.update(kw)
    return m


def tool_call(name, arguments, call_id=None, as_string=False):
    tc = {"type": "function", "function": {"name": name,
                                           "arguments": json.dumps(arguments) if as_string else arguments}}
    if call_id:
        tc["id"] = call_id
    return tc


def hand_written():
    """Named conversations covering every feature the brief lists."""
    c = []
    c.append(("single_user", [user(TEXTS[0])], None))
    c.append(("system_user", [{"role": "system", "content": "You are terse."}, user(TEXTS[1])], None))
    c.append(("developer_user", [{"role": "developer", "content": "  Follow the style guide.\n"}, user(TEXTS[2])], None))
    c.append(("system_parts", [{"role": "system", "content": [{"type": "text", "text": "Part A."}, {"type": "text", "text": " Part B "}]},
                               user(TEXTS[3])], None))
    c.append(("multi_turn", [user(TEXTS[0]), assistant(ANSWERS[0]), user(TEXTS[1]), assistant(ANSWERS[1]), user(TEXTS[2])], None))
    c.append(("multi_turn_system", [{"role": "system", "content": "Be kind."}, user(TEXTS[4]), assistant(ANSWERS[2]),
                                    user(TEXTS[5])], None))
    c.append(("unicode", [user(TEXTS[3]), assistant("こんにちは！🎌"), user(TEXTS[4])], None))
    c.append(("whitespace", [user(TEXTS[5]), assistant(ANSWERS[5]), user("\n\n  \t")], None))
    c.append(("escapes", [user(TEXTS[6]), assistant("Indeed: \\t and \\\\."), user(TEXTS[8])], None))
    c.append(("empty_user", [user("")], None))
    c.append(("assistant_last", [user(TEXTS[7]), assistant(ANSWERS[6])], None))
    c.append(("strip_thinking_in_content", [user("Say hi"), assistant(ANSWERS[3]), user("Again"), assistant(ANSWERS[4])], None))
    c.append(("image_first", [user([{"type": "image"}, {"type": "text", "text": "What is in this picture?"}])], None))
    c.append(("image_between", [user([{"type": "text", "text": "Compare"}, {"type": "image", "url": "a.png"},
                                      {"type": "text", "text": "with"}, {"type": "image"}])], None))
    c.append(("image_multi_turn", [{"role": "system", "content": "Describe images."},
                                   user([{"type": "image"}, {"type": "text", "text": " A cat? "}]),
                                   assistant([{"type": "text", "text": "Yes, a cat."}]),
                                   user([{"type": "text", "text": "And this?"}, {"type": "image"}])], None))
    c.append(("audio_video_parts", [user([{"type": "audio"}, {"type": "text", "text": "Transcribe."}, {"type": "video"}])], None))
    c.append(("tools_only_declared", [user(TEXTS[0])], [WEATHER]))
    c.append(("tools_all_declared", [{"role": "system", "content": "Use tools wisely."}, user("Plan my week.")], ALL_TOOLS))
    c.append(("tools_empty_list", [user("No tools here.")], []))
    # Tool calls, arguments as dict, OpenAI-style tool responses with ids.
    c.append(("tool_call_dict_args", [
        user(TEXTS[0]),
        assistant(None, tool_calls=[tool_call("get_weather", {"city": "Paris", "unit": "celsius"}, "call_1")]),
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21, \"sky\": \"sunny\"}"},
        assistant(ANSWERS[0])], [WEATHER]))
    c.append(("tool_call_string_args", [
        user(TEXTS[0]),
        assistant("", tool_calls=[tool_call("get_weather", {"city": "Zürich"}, "c9", as_string=True)]),
        {"role": "tool", "tool_call_id": "c9", "content": "18 degrees"}], [WEATHER]))
    c.append(("tool_response_dict", [
        user("Search for jinja docs"),
        assistant(None, tool_calls=[tool_call("search_docs", {"query": "jinja", "limit": 3, "threshold": 0.25,
                                                              "filters": {"lang": "en", "tags": ["a", "b"],
                                                                          "date": {"from": "2024-01-01", "to": None}}},
                                              "s1")]),
        {"role": "tool", "tool_call_id": "s1", "content": {"results": [{"title": "Templates", "score": 0.9},
                                                                       {"title": "Filters", "score": 1e-7}],
                                                           "total": 2, "exact": False}}], ALL_TOOLS))
    c.append(("tool_response_parts", [
        user("Time?"),
        assistant(None, tool_calls=[tool_call("get_time", {}, "t1")]),
        {"role": "tool", "tool_call_id": "t1", "content": [{"type": "text", "text": "12:00"}, {"type": "text", "text": " UTC"}]},
        assistant("It is noon UTC.")], [NO_PARAMS]))
    c.append(("parallel_tool_calls", [
        user("Weather in Paris and Tokyo?"),
        assistant(None, tool_calls=[tool_call("get_weather", {"city": "Paris"}, "p"),
                                    tool_call("get_weather", {"city": "Tokyo", "unit": "fahrenheit"}, "t")]),
        {"role": "tool", "tool_call_id": "p", "content": "sunny"},
        {"role": "tool", "tool_call_id": "t", "content": "rainy"},
        assistant("Paris is sunny, Tokyo rainy."), user("Thanks!")], [WEATHER]))
    c.append(("tool_response_by_name", [
        user("Weather?"),
        assistant(None, tool_calls=[tool_call("get_weather", {"city": "Oslo"})]),
        {"role": "tool", "name": "get_weather", "content": "cold"}], [WEATHER]))
    c.append(("tool_call_without_response", [
        user("Weather?"), assistant(None, tool_calls=[tool_call("get_weather", {"city": "Rome"}, "r1")])], [WEATHER]))
    c.append(("tool_call_nested_args", [
        user("Book a meeting"),
        assistant("Booking now.", tool_calls=[tool_call("create_event", {
            "events": [{"title": "Sync", "start": "2025-01-02T10:00:00Z", "priority": "high",
                        "attendees": [{"email": "a@x.org", "optional": False}, {"email": "b@x.org", "optional": True}]}],
            "notify": True, "metadata": {"room": 42, "ratio": 1.5, "big": 2 ** 63 - 1, "neg": -0.0, "none": None}}, "e1")]),
        {"role": "tool", "tool_call_id": "e1", "content": {"created": 1, "ids": ["evt_1"]}},
        assistant("Done.")], ALL_TOOLS))
    c.append(("legacy_tool_responses", [
        user("Weather?"),
        {"role": "assistant", "content": "Checking.", "tool_calls": [tool_call("get_weather", {"city": "Lima"})],
         "tool_responses": [{"name": "get_weather", "response": {"temp": 25}}, {"response": "plain text"}]},
        user("And tomorrow?")], [WEATHER]))
    c.append(("reasoning_content_tool_turn", [
        user("Weather in Paris?"),
        assistant(None, reasoning_content="I should call get_weather with city=Paris.",
                  tool_calls=[tool_call("get_weather", {"city": "Paris"}, "w")]),
        {"role": "tool", "tool_call_id": "w", "content": "sunny"},
        assistant("Sunny!", reasoning_content="The tool said sunny.")], [WEATHER]))
    c.append(("reasoning_field", [
        user("2+2?"), assistant("4", reasoning="Simple arithmetic."), user("3+3?")], None))
    c.append(("thinking_field", [
        user("Capital of France?"),
        assistant(None, thinking="Recall geography.", tool_calls=[tool_call("search_docs", {"query": "capital of France", "limit": 1}, "q")]),
        {"role": "tool", "tool_call_id": "q", "content": "Paris"}], ALL_TOOLS))
    c.append(("reasoning_before_last_user", [
        user("Hi"), assistant("Hello", reasoning_content="greet back",
                              tool_calls=[tool_call("get_time", {}, "x")]),
        {"role": "tool", "tool_call_id": "x", "content": "09:00"}, user("Bye")], [NO_PARAMS]))
    c.append(("consecutive_assistants", [user("Go"), assistant("Part 1."), assistant("Part 2.")], None))
    c.append(("null_fields", [{"role": "system", "content": "S", "name": None}, user("U"),
                              assistant("A", tool_calls=None, reasoning_content=None)], None))
    c.append(("numbers_in_args", [
        user("calc"),
        assistant(None, tool_calls=[tool_call("calculator", {"expression": "1/3", "precision": 12,
                                                             "mode": ["exact", None], "scale": 2.5e-10,
                                                             "flags": {"b": True, "a": False}}, "k")]),
        {"role": "tool", "tool_call_id": "k", "content": {"value": 0.3333333333333333, "int": 7, "list": [1, 2.0, "3"]}}],
        [CALC]))
    c.append(("gemma3_bad_alternation", [user("a"), user("b")], None))
    c.append(("gemma3_tool_roles", [user("x"), assistant("y"), {"role": "tool", "content": "z"}], None))
    return c


def generated(rng, n):
    """Seeded random multi-turn conversations mixing the features above."""
    out = []
    for i in range(n):
        msgs = []
        tools = rng.choice([None, [WEATHER], [WEATHER, CALC], ALL_TOOLS, [SEARCH, NO_PARAMS]])
        if rng.random() < 0.5:
            msgs.append({"role": rng.choice(["system", "developer"]),
                         "content": rng.choice(["You are helpful.", "  Answer in French. ",
                                                [{"type": "text", "text": "Be brief."}]])})
        for turn in range(rng.randint(1, 4)):
            if rng.random() < 0.2:
                msgs.append(user([{"type": "image"}, {"type": "text", "text": rng.choice(TEXTS)}]))
            else:
                msgs.append(user(rng.choice(TEXTS)))
            last = turn == 3 or rng.random() < 0.3
            if last and rng.random() < 0.5:
                break
            if tools and rng.random() < 0.5:
                t = rng.choice(tools)["function"]
                args = {"city": rng.choice(["Paris", "Tōkyō", "New \"York\""]), "n": rng.randint(-5, 5),
                        "x": rng.choice([0.5, 1e-5, 123456789.0, True, None, ["a", {"b": 1}]])}
                cid = f"call_{i}_{turn}"
                kw = {}
                if rng.random() < 0.4:
                    kw["reasoning_content"] = rng.choice(["Think step by step.", "Need a tool\nfor this."])
                msgs.append(assistant(rng.choice([None, "", "Let me check."]),
                                      tool_calls=[tool_call(t["name"], args, cid, as_string=rng.random() < 0.3)], **kw))
                msgs.append({"role": "tool", "tool_call_id": cid,
                             "content": rng.choice(["ok", {"status": "done", "value": rng.randint(0, 99)},
                                                    [{"type": "text", "text": "part"}]])})
                if rng.random() < 0.5:
                    msgs.append(assistant(rng.choice(ANSWERS)))
            else:
                kw = {"reasoning_content": "hidden thoughts"} if rng.random() < 0.2 else {}
                msgs.append(assistant(rng.choice(ANSWERS), **kw))
        out.append((f"random_{i:02d}", msgs, tools))
    return out


def generated_plain(rng, n):
    """Seeded random user/assistant alternations (what Gemma 3's template accepts)."""
    out = []
    for i in range(n):
        msgs = []
        if rng.random() < 0.5:
            msgs.append({"role": "system", "content": rng.choice(["Reply in English.", "  Pirate voice.\n"])})
        for turn in range(rng.randint(1, 5)):
            if rng.random() < 0.25:
                parts = [{"type": "image"}, {"type": "text", "text": rng.choice(TEXTS)}]
                rng.shuffle(parts)
                msgs.append(user(parts))
            else:
                msgs.append(user(rng.choice(TEXTS)))
            if rng.random() < 0.8:
                kw = {"reasoning_content": "thoughts " + str(turn)} if rng.random() < 0.2 else {}
                msgs.append(assistant(rng.choice(ANSWERS), **kw))
        out.append((f"plain_{i:02d}", msgs, None))
    return out


def conversations():
    return hand_written() + generated(random.Random(1234), 24) + generated_plain(random.Random(99), 16)


def cases(template_dir):
    """Every (template name, case name, conversation, thinking, generation) the tests check."""
    for tname, settings in TEMPLATES.items():
        for idx, (cname, msgs, tools) in enumerate(conversations()):
            for thinking in settings["thinking"]:
                for gen in settings["generation"]:
                    yield tname, f"{idx:03d}_{cname}", msgs, tools, thinking, gen


def render_case(template_text, msgs, tools, thinking, gen):
    try:
        return {"text": reference_render(template_text, msgs, tools, thinking, gen)}
    except Exception as e:  # jinja2 TemplateError (raise_exception) and friends
        return {"error": f"{type(e).__name__}: {e}"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=DEFAULT_OUT)
    args = ap.parse_args()
    corpus = os.path.join(args.out, "corpus")
    os.makedirs(corpus, exist_ok=True)
    convs = conversations()
    for idx, (cname, msgs, tools) in enumerate(convs):
        with open(os.path.join(corpus, f"{idx:03d}_{cname}.json"), "w", encoding="utf-8") as f:
            json.dump({"messages": msgs, "tools": tools}, f, ensure_ascii=False)
    templates = {t: open(os.path.join(args.out, t), encoding="utf-8").read() for t in TEMPLATES}
    n = errors = 0
    with open(os.path.join(args.out, "expected.jsonl"), "w", encoding="utf-8") as f:
        for tname, case, msgs, tools, thinking, gen in cases(args.out):
            r = render_case(templates[tname], msgs, tools, thinking, gen)
            errors += "error" in r
            row = {"template": tname, "case": case, "thinking": thinking, "add_generation_prompt": gen, **r}
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    print(f"{len(convs)} conversations, {n} renders ({errors} raise) -> {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
