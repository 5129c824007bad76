"""Small Jinja snippets rendered by `gemma4 render --batch` and by jinja2 (transformers' pipeline).

Each snippet isolates one construct (whitespace control, scoping, filters, tests, Python value
printing, errors). Where jinja2 raises, our renderer must fail too; otherwise the bytes must match.
"""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import make_template_corpus as corpus  # noqa: E402

BIN = os.environ.get("GEMMA4_BIN", os.path.join(ROOT, "build", "bin", "gemma4"))
pytestmark = pytest.mark.skipif(not os.path.exists(BIN), reason=f"{BIN} not built")

MESSAGES = [{"role": "system", "content": " sys "}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Yo", "reasoning_content": "hmm"}]
KW = {"n": 3, "f": 2.5, "s": "Hello World", "l": [3, 1, 2], "d": {"b": 1, "a": [1, {"x": None}], "C": "c"},
      "e": [], "u8": "héllo wörld ✓", "t": True, "nested": {"k": {"k2": [{"name": "a", "v": 2}, {"name": "b", "v": 1}]}}}

SNIPPETS = [
    # whitespace control, trim_blocks, lstrip_blocks
    "a\n{% if true %}\nb\n{% endif %}\nc\n",
    "a\n  {% if true %}\n  b\n  {% endif %}\nc",
    "a  {%- if true -%}  b  {%- endif -%}  c",
    "a\n    {%+ if true %}x{% endif %}\n",
    "a\n{% if true +%}\nb{% endif %}",
    "  {{ 'x' }}  \n  {{- 'y' -}}  \n  z",
    "{# c #}\nafter\n  {# indented comment #}\nend\n\n",
    "{#- strip -#}   x   {#- again #}\n y",
    "a\u00a0\u3000 {%- if true -%} \u2003\n b{% endif %}\n\u00a0\u00a0{% if true %}c{% endif %}",
    "line\r\nwindows\r\n{% if true %}\r\nx\r\n{% endif %}\r\n",
    "trailing newline kept once?\n\n",
    "{% for i in l %}\n  - {{ i }}\n{% endfor %}\n",
    "{% for i in l -%}\n  {{ i }}\n{%- endfor %}",
    "{% raw -%}  {{ x }}  {%- endraw %}|",
    "{{ {'a': {'b': 1}} }}",
    # scoping
    "{% set x = 1 %}{% for i in l %}{% set x = i %}{{ x }}{% endfor %}{{ x }}",
    "{% set ns = namespace(v=0) %}{% for i in l %}{% set ns.v = ns.v + i %}{% endfor %}{{ ns.v }}",
    "{% macro m(a, b=2, c='z') %}{{ a }}{{ b }}{{ c }}{% endmacro %}{{ m(1) }}{{ m(1, 3) }}{{ m(1, c='q') }}{{ m(a=5, b=none) }}",
    "{% macro outer(x) %}[{{ inner(x * 2) }}]{% endmacro %}{% macro inner(y) %}{{ y }}{% endmacro %}{{ outer(4) }}",
    "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}",
    "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(b=1) }}",
    "{% macro m() %}{{ n }}{% endmacro %}{% set n = 7 %}{{ m() }}",
    "{% set a, b = [1, 2] %}{{ a }}{{ b }}",
    "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
    "{% for k, v in d | dictsort %}{{ k }}={{ v }};{% endfor %}",
    "{% for x in l if x > 1 %}{{ loop.index }}/{{ loop.length }}:{{ x }} {% endfor %}",
    "{% for x in e %}no{% else %}else{% endfor %}",
    "{% for x in l %}{{ loop.previtem }}-{{ loop.nextitem }}|{% endfor %}",
    "{% for c in 'abc' %}{{ c }}{{ loop.revindex }}{% endfor %}",
    "{% for k in d %}{{ k }}{% endfor %}",
    "{% for i in range(3) %}{% for j in range(2) %}{{ loop.index }}{% endfor %}{{ loop.index }} {% endfor %}",
    "{% set x %}  block {{ n }}  {% endset %}[{{ x }}]",
    "{% for m in messages %}{{ m.role }}:{{ m.content | trim }}|{{ m.thinking }}|{% endfor %}",
    # expressions
    "{{ n + f }} {{ n - 5 }} {{ n * f }} {{ n / 2 }} {{ n // 2 }} {{ n % 2 }} {{ n ** 3 }} {{ -n }} {{ 2 ** -1 }}",
    "{{ 'a' ~ n ~ none ~ t }} {{ 'ab' * 2 }} {{ l + [4] }} {{ s[0] }}{{ s[-1] }}{{ s[::2] }}{{ l[::-1] }}{{ l[5:] }}",
    "{{ 1 < 2 < 3 }} {{ 3 > 2 > 5 }} {{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' != 'b' }} {{ [1] == [1.0] }}",
    "{{ n if n > 5 else 'small' }} {{ 'yes' if t }}|{{ 'no' if not t }}|",
    "{{ none or 0 or '' or 'last' }} {{ 1 and 2 and 3 }} {{ 0 and x.y }}",
    "{{ 'ell' in s }} {{ 'b' in d }} {{ 9 not in l }} {{ none in [none] }}",
    "{{ (1, 2) }} {{ () }} {{ (1,) }} {{ [(1, 2)] }}",
    "{{ 0.1 }} {{ 1.0 }} {{ 1e16 }} {{ 1e15 }} {{ 123456789.123 }} {{ 1e-4 }} {{ 1e-5 }} {{ -0.0 }} {{ 3.0e2 }} {{ 1_000 }}",
    "{{ 'it\\'s' }} {{ \"a\\\"b\" }} {{ 'tab\\tnl\\nuni\\u00e9\\x41' }} {{ ['it\\'s', 'a\"b', 'n\\n', 'é'] }}",
    "{{ d }} {{ l }} {{ e }} {{ t }} {{ none }} {{ f }} {{ [none, true, 1.5, 'x'] }}",
    "{{ s.upper() }} {{ s.lower() }} {{ s.title() }} {{ s.split() }} {{ s.split('o') }} {{ s.split('o', 1) }} {{ s.rsplit('o', 1) }}",
    "{{ '  x  '.strip() }}|{{ 'xxyxx'.strip('x') }}|{{ '  x'.lstrip() }}|{{ 'x  '.rstrip() }}|{{ s.startswith('He') }}{{ s.endswith(('x', 'ld')) }}",
    "{{ s.replace('l', 'L') }} {{ s.replace('l', 'L', 1) }} {{ s.find('o') }} {{ s.count('l') }} {{ u8.find('w') }} {{ u8 | length }}",
    "{{ d.get('a') }} {{ d.get('zz') }} {{ d.get('zz', 5) }} {{ d.keys() | list }} {{ d.values() | list }} {{ d['C'] }} {{ d.C }}",
    "{{ nested.k.k2[0].name }} {{ nested['k']['k2'][1]['v'] }} {{ nested.k.k2 | map(attribute='name') | list }}",
    "{{ nested.k.k2 | sort(attribute='v') | map(attribute='name') | join(',') }} {{ nested.k.k2 | selectattr('v', 'gt', 1) | list }}",
    "{{ nested.k.k2 | rejectattr('name', 'equalto', 'a') | map(attribute='v') | first }} {{ l | select('odd') | list }} {{ l | reject('odd') | list }}",
    "{{ d.missing }}|{{ d.missing is defined }}|{{ l[10] is defined }}|{{ none.attr is defined }}",
    "{{ d.missing.deeper }}",
    "{{ undefined_var }}|{{ undefined_var | default('dflt') }}|{{ '' | default('e', true) }}|{{ none | default('n') }}",
    "{{ undefined_var + 1 }}",
    "{{ 'a' + 1 }}",
    "{{ 1 / 0 }}",
    "{{ l < 3 }}",
    # filters
    "{{ l | length }} {{ s | count }} {{ d | length }} {{ l | first }} {{ l | last }} {{ l | sum }} {{ l | max }} {{ l | min }}",
    "{{ l | sort }} {{ l | sort(reverse=true) }} {{ ['b', 'A', 'a'] | sort }} {{ ['b', 'A', 'a'] | sort(case_sensitive=true) }} {{ l | reverse | list }}",
    "{{ [1, 2, 1, 'a', 'A'] | unique | list }} {{ s | list }} {{ d | list }} {{ l | join('-') }} {{ [1, none, 'x'] | join }}",
    "{{ d | dictsort }} {{ d | dictsort(true) }} {{ {'b': 2, 'a': 3} | dictsort(by='value') }} {{ d | items | list }}",
    "{{ d | tojson }} {{ d | tojson(indent=2) }} {{ u8 | tojson }} {{ u8 | tojson(ensure_ascii=true) }} {{ l | tojson(indent='>') }}",
    "{{ d | tojson(sort_keys=true, separators=(',', ':')) }} {{ f | tojson }} {{ 1e100 | tojson }} {{ 'a\"\\\\/\\n' | tojson }}",
    "{{ s | upper }} {{ s | lower }} {{ 'hello wORLD-foo(bar' | title }} {{ 'hELLO' | capitalize }} {{ '  a b  ' | trim }}|{{ 'xxaxx' | trim('x') }}",
    "{{ '3' | int }} {{ '3.7' | int }} {{ 'x' | int }} {{ 3.9 | int }} {{ '2' | float }} {{ 'x' | float }} {{ t | int }} {{ -3 | abs }} {{ 2.567 | round(1) }} {{ 2.5 | round }} {{ 3.5 | round }} {{ 2.1 | round(0, 'ceil') }}",
    "{{ s | replace('o', '0') }} {{ '<&>\"\\'' | escape }} {{ '<b>' | safe }} {{ n | string }} {{ l | string }} {{ s | wordcount }}",
    "{{ 'a\\nb\\n\\nc' | indent }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'a\\n\\nb' | indent(width='> ', blank=true) }}",
    "{{ l | map('string') | map('upper') | list }} {{ ['a', 'b'] | map('upper') | join }} {{ l | map('tojson') | join(',') }}",
    "{{ nested.k.k2 | map(attribute='missing', default='D') | list }} {{ range(3) | list }} {{ range(1, 10, 4) | list }}",
    "{{ dict(a=1, b='x') }} {{ namespace(a=1).a }} {{ d | attr('C') }}|{{ namespace(q=2) | attr('q') }}",
    "{% filter upper %}up {{ s }}{% endfilter %}",
    "{% set x | upper %}set filter {{ n }}{% endset %}{{ x }}",
    # tests
    "{{ n is integer }}{{ f is float }}{{ t is boolean }}{{ t is number }}{{ s is string }}{{ d is mapping }}{{ l is sequence }}{{ d is sequence }}{{ s is iterable }}{{ none is none }}",
    "{{ n is odd }}{{ n is even }}{{ 9 is divisibleby 3 }}{{ n is eq 3 }}{{ n is gt 1 }}{{ 'a' is in 'abc' }}{{ t is true }}{{ t is false }}{{ s is lower }}{{ n is not none }}",
    "{{ x is defined }}{{ x is undefined }}{{ d.zz is undefined }}{{ l is callable }}{{ range is callable }}",
    # loops controls
    "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}",
    "{% for i in l %}{{ loop.cycle('a', 'b') }}{{ loop.first }}{{ loop.last }}{{ loop.depth }}{% endfor %}",
    # HF globals
    "{{ raise_exception('custom failure') }}",
    "{% if messages | length > 2 %}{{ raise_exception('too long') }}{% endif %}",
    "{{ strftime_now('%Y') | length }}",
    "{{ messages[0].content.strip() }}{{ messages[-1].reasoning_content }}{{ messages[2]['thinking'] }}{{ add_generation_prompt }}{{ bos_token }}{{ eos_token }}{{ tools }}",
    # real-world template fragments (Qwen3-, Llama-3- and ChatML-style constructs)
    """{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set content = message.content if message.content is string else '' %}
    {%- if message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}""",
    """{{- bos_token }}
{%- if not tools_in_user_message is defined %}{%- set tools_in_user_message = true %}{%- endif %}
{%- if not date_string is defined %}{%- set date_string = "26 Jul 2024" %}{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
""",
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
    "{%- for message in messages -%}\n  {%- if loop.first and message.role != 'system' -%}{{ raise_exception('x') }}{%- endif -%}\n  [{{ message.role | upper }}]\n{% endfor -%}\nEND",
    "  {%- if true %}\n    indented {{ n }}\n  {%- endif %}\n  tail",
    "{% if true %}  a  {% endif %}\n  {% if false %}no{% else %}  yes{% endif %}\n",
    "{{ u8 | upper }} {{ 'ÀÉÎõü' | lower }} {{ 'straße' | upper }} {{ 'привет мир' | upper }} {{ 'αβγ' | upper }} {{ u8.title() }} {{ u8 | title }}",
    "{{ '1' ~ 2 ~ 3.0 }} {{ '%d items' if n else '' }} {{ n ~ '' }} {{ s[1:-1] }} {{ s[-100:2] }} {{ s[2:1] }} {{ l[1::] }}",
    "{% set l2 = l %}{{ l2 is sameas l }} {{ l2 == l }} {{ loop is defined }}",
    "{{ messages | selectattr('role', 'equalto', 'user') | list | length }} {{ messages | map(attribute='role') | join(',') }} {{ messages | rejectattr('content') | list }}",
    "{{ d | length > 2 and 'a' in d }} {{ not d }} {{ not e }} {{ e | first }}|{{ '' | last }}|{{ e | max }}|",
    "{% with a = n, b = s %}{{ a }}{{ b }}{% set c = 1 %}{% endwith %}{{ a }}{{ c }}",
    "{% for m in messages %}{% generation %}{{ m.role }} {% endgeneration %}{% endfor %}",
    "{%- for m in messages %}\n  {%- generation -%}\n  [{{ m.content }}]\n  {%- endgeneration %}\n{% endfor %}",
    # errors
    "{% include 'x.jinja' %}",
    "{% if true %}unclosed",
    "{{ 1 + }}",
    "{% endfor %}",
    "{{ x | nosuchfilter }}",
    "{{ 1 is nosuchtest }}",
    "{% set ns = namespace() %}{% set ns._private = 1 %}",
    "{% set x = 1 %}{% set x.y = 2 %}",
]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    path = tmp_path_factory.mktemp("snip") / "cases.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for src in SNIPPETS:
            f.write(json.dumps({"source": src, "messages": MESSAGES, "tools": None, "add_generation_prompt": True,
                                "kwargs": KW}, ensure_ascii=False) + "\n")
    out = subprocess.run([BIN, "render", "--batch", str(path)], capture_output=True, check=True)
    rows = [json.loads(line) for line in out.stdout.decode("utf-8").splitlines()]
    assert len(rows) == len(SNIPPETS)
    return rows


@pytest.mark.parametrize("idx", range(len(SNIPPETS)))
def test_snippet(results, idx):
    src = SNIPPETS[idx]
    try:
        ref = {"text": corpus.reference_render(src, MESSAGES, None, None, True, extra=KW)}
    except Exception as e:  # noqa: BLE001 - any jinja2 failure must be a failure here too
        ref = {"error": f"{type(e).__name__}: {e}"}
    got = results[idx]
    if "error" in ref:
        assert "error" in got, f"jinja2 raised {ref['error']!r} but we rendered {got.get('text')!r}"
    else:
        assert got == ref, f"template {src!r}"
