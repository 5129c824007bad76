"""Constrained decoding (issue 18 item 1) with the official openai client against `gemma4 serve` on
the starter model: `response_format` json_schema (strict) over 200 generated schemas (objects,
arrays, enums, nested objects, $ref into $defs, anyOf, string format uuid, patterns,
integer ranges):
every answer parses and validates against its schema (jsonschema, with format checks) and ends at
the turn end, not the token limit. Also json_object, llama-server's `grammar` (GBNF) and
`json_schema` fields, a cached schema's second request, and the 400s for a malformed schema, an
unknown response_format type and two constraints at once."""
import json
import random
import re
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest

from test_server import Server, oai

N_SCHEMAS = 200
NAMES = ["id", "name", "title", "kind", "city", "count", "score", "tags", "items", "owner", "date", "email", "active",
         "level", "note", "code", "price", "size", "color", "parts"]


def gen_value(rng: random.Random, depth: int, defs: dict) -> dict:
    """A random schema for one value; strings, arrays and integers are bounded so that a finished
    answer is always reachable within the token limit."""
    kinds = ["string", "integer", "boolean", "enum", "format", "pattern", "const", "null_or"]
    if depth < 2 and rng.random() < 0.5:
        kinds += ["object", "array", "ref", "anyof"]
    k = rng.choice(kinds)
    if k == "string":
        return {"type": "string", "maxLength": rng.randint(1, 8)}
    if k == "integer":
        lo = rng.randint(-50, 50)
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(0, 500)}
    if k == "boolean":
        return {"type": "boolean"}
    if k == "enum":
        return {"enum": rng.sample(["red", "green", "blue", 1, 2, True, None, "x y", "ünï"], rng.randint(1, 4))}
    if k == "format":
        # Formats of bounded length only: an email's local part has none, and a sampled base model
        # can spell one until max_tokens (as with any engine). Not ipv4: XGrammar's ipv4 admits
        # leading zeros ("010"), which jsonschema's checker (Python's ipaddress) refuses, and not
        # date: year 0000 is valid RFC 3339 but not for Python's date (README).
        return {"type": "string", "format": "uuid"}
    if k == "pattern":
        return {"type": "string", "pattern": rng.choice(["^[a-z]{2,5}$", "^[A-Z][0-9]{3}$", "^(yes|no)$"])}
    if k == "const":
        return {"const": rng.choice(["fixed", 7, False])}
    if k == "null_or":
        return {"type": ["string", "null"], "maxLength": 6}
    if k == "object":
        return gen_object(rng, depth + 1, defs)
    if k == "array":
        lo = rng.randint(0, 1)
        return {"type": "array", "items": gen_value(rng, depth + 1, defs), "minItems": lo, "maxItems": lo + rng.randint(0, 1)}
    if k == "ref":  # the name is taken before the definition is made: no definition refers to itself
        name = f"Def{len(defs)}"
        defs[name] = None
        defs[name] = gen_object(rng, depth + 1, defs)
        return {"$ref": f"#/$defs/{name}"}
    return {"anyOf": [gen_value(rng, depth + 1, defs), gen_value(rng, depth + 1, defs)]}


def gen_object(rng: random.Random, depth: int, defs: dict) -> dict:
    names = rng.sample(NAMES, rng.randint(1, 2 if depth else 3))
    props = {n: gen_value(rng, depth, defs) for n in names}
    return {"type": "object", "properties": props, "required": names, "additionalProperties": False}


def gen_schema(seed: int) -> dict:
    rng = random.Random(seed)
    defs: dict = {}
    s = gen_object(rng, 0, defs)
    if defs:
        s["$defs"] = defs
    return s


@pytest.fixture(scope="module")
def srv(gemma4_bin):
    # 16 slots: on a 2-core CPU a decode step costs about as much for 16 rows as for one.
    s = Server(gemma4_bin, "--parallel", "16", "--max-queue", "64", "--model-id", "starter")
    yield s
    s.close()


def ask(c, schema, seed):
    r = c.chat.completions.create(
        model="starter", messages=[{"role": "user", "content": "Describe a thing as JSON."}], max_tokens=300,
        temperature=0.8, seed=seed,
        response_format={"type": "json_schema", "json_schema": {"name": "thing", "schema": schema, "strict": True}})
    return r.choices[0]


def test_generated_schemas_all_parse_and_validate(srv):
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=1800)
    schemas = [gen_schema(i) for i in range(N_SCHEMAS)]
    with ThreadPoolExecutor(32) as ex:
        choices = list(ex.map(lambda i: ask(c, schemas[i], i), range(N_SCHEMAS)))
    failures = []
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    for i, (schema, ch) in enumerate(zip(schemas, choices)):
        try:
            value = json.loads(ch.message.content)
            jsonschema.validate(value, schema, cls=jsonschema.Draft202012Validator, format_checker=checker)
            assert ch.finish_reason == "stop", ch.finish_reason
        except Exception as e:  # noqa: BLE001 - collected, reported together
            failures.append((i, str(e)[:200], ch.message.content[:200], json.dumps(schema)[:300]))
    kinds = sorted({f[1].split("\n")[0][:60] for f in failures})
    assert not failures, f"{len(failures)}/{N_SCHEMAS} failed ({kinds}); first: {failures[:3]}"


def test_masks_applied_where_the_logits_are_give_the_host_answers(gemma4_bin, monkeypatch):
    """On a GPU a grammar's mask is applied to the logits there (Backend::mask_logits) and only the
    sampled ids come back (greedy: the argmax; top_k: the k candidates). G4_DEVICE_SAMPLING=1 runs
    that path on the CPU backend: the same answers as the host path (the mask on the copied logits),
    greedy and top-k sampled with seeds, and every answer validates."""
    schemas = [gen_schema(100 + i) for i in range(8)]

    def answers(device):
        if device:
            monkeypatch.setenv("G4_DEVICE_SAMPLING", "1")
        else:
            monkeypatch.delenv("G4_DEVICE_SAMPLING", raising=False)
        s = Server(gemma4_bin, "--parallel", "8", "--model-id", "starter")
        try:
            c = oai(s)

            def one(i):
                kw = {"temperature": 0} if i % 2 else {"temperature": 0.8, "seed": i, "extra_body": {"top_k": 40}}
                r = c.chat.completions.create(
                    model="starter", messages=[{"role": "user", "content": "Describe a thing as JSON."}],
                    max_tokens=200, response_format={"type": "json_schema", "json_schema": {
                        "name": "t", "schema": schemas[i], "strict": True}}, **kw)
                return r.choices[0].message.content
            with ThreadPoolExecutor(8) as ex:
                out = list(ex.map(one, range(len(schemas))))
            _, metrics = s.raw("GET", "/metrics")
            return out, metrics
        finally:
            s.close()

    host, _ = answers(False)
    device, metrics = answers(True)
    assert device == host
    for schema, text in zip(schemas, device):
        jsonschema.validate(json.loads(text), schema)
    tokens = float(re.search(r"^gemma4_grammar_tokens_total (\S+)$", metrics, re.M).group(1))
    assert tokens >= len(schemas) * 4, metrics  # the constrained tokens were counted on the device path


def test_json_object_and_llama_server_fields(srv):
    c = oai(srv)
    # Any JSON: its strings are unbounded, so a sampled answer may run to max_tokens; a finished one
    # parses, a cut one has at least begun a JSON value (never free text).
    r = c.chat.completions.create(model="starter", messages=[{"role": "user", "content": "A JSON object please."}],
                                  max_tokens=120, temperature=0.7, seed=1, response_format={"type": "json_object"})
    text = r.choices[0].message.content
    if r.choices[0].finish_reason == "stop":
        json.loads(text)
    else:
        assert text.lstrip()[:1] in ("{", "["), text
    # llama-server's GBNF `grammar` on completions: the answer is one of the grammar's words.
    code, body = srv.raw("POST", "/v1/completions", {"prompt": "The answer is", "max_tokens": 8, "temperature": 0.9,
                                                     "seed": 3, "grammar": 'root ::= ("yes" | "no" | "maybe") "."'})
    assert code == 200 and re.fullmatch(r"(yes|no|maybe)\.", body["choices"][0]["text"]), body
    # llama-server's top-level json_schema, and the same schema again (compiled once, cached).
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["n"],
              "additionalProperties": False}
    for _ in range(2):
        code, body = srv.raw("POST", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "n?"}], "max_tokens": 50, "json_schema": schema})
        assert code == 200, body
        jsonschema.validate(json.loads(body["choices"][0]["message"]["content"]), schema)


@pytest.mark.parametrize("extra, field", [
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "no-such-type"}}}},
     "response_format"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"response_format": {"type": "json_object"}, "grammar": "root ::= \"a\""}, "grammar"),
    ({"grammar": "root ::= = broken"}, "grammar"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": [1, 2]}}},
     "response_format.json_schema.schema"),
])
def test_bad_constraints_are_400_naming_the_field(srv, extra, field):
    code, body = srv.raw("POST", "/v1/chat/completions",
                         {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **extra})
    assert code == 400, body
    assert body["error"]["param"] == field, body
    c = oai(srv)  # and the server keeps serving
    assert c.chat.completions.create(model="starter", messages=[{"role": "user", "content": "hi"}], max_tokens=2)


def test_openai_client_raises_bad_request_for_a_bad_schema(srv):
    c = oai(srv)
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model="starter", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                  response_format={"type": "json_schema", "json_schema": {"name": "x",
                                                                                          "schema": {"type": 5}}})
