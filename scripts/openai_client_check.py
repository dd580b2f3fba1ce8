#!/usr/bin/env python3
"""Drives a running `lattice serve` with the official OpenAI Python client and checks what it
answers against values the `lattice` command line produced (crates/cli/tests/serve.rs writes
them to the --expected JSON file and runs this script with .cache/venv-openai's python, made by
scripts/setup_openai_client.sh).

The expected file holds:
  {"embedding": {"texts": [str], "vectors": [[float]]},
   "completion": {"prompt": str, "prompt_ids": [int], "max_tokens": int, "text": str,
                  "prompt_tokens": int, "completion_tokens": int, "finish_reason": str},
   "chat": {the same fields but prompt_ids; "prompt" is the user message}}

Prints one line per check ("ok   name" or "FAIL name: why") and exits 1 when any check fails.
"""

import argparse
import json
import math
import sys
import traceback

import openai
from openai import OpenAI


def cosine_distance(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(y * y for y in b))
    return 1.0 - dot / (na * nb)


class Checks:
    def __init__(self, args):
        self.args = args
        self.expected = json.load(open(args.expected, encoding="utf-8"))
        self.client = OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=120)
        self.failed = 0

    def run(self, name, fn):
        try:
            fn()
            print(f"ok   {name}", flush=True)
        except Exception as e:  # noqa: BLE001 - every failure is reported, then the next check runs
            self.failed += 1
            detail = str(e) or type(e).__name__
            if not isinstance(e, AssertionError):
                detail = f"{type(e).__name__}: {detail}\n{traceback.format_exc()}"
            print(f"FAIL {name}: {detail}", flush=True)

    # ---- models --------------------------------------------------------------------------

    def models_list(self):
        page = self.client.models.list()
        ids = [m.id for m in page.data]
        for want in [self.args.gen_model, self.args.embed_model] + self.args.extra_model:
            assert want in ids, f"GET /v1/models lacks {want!r}; ids: {ids}"
        for m in page.data:
            assert m.object == "model", f"model object is {m.object!r}"
            assert m.owned_by == "lattice", f"owned_by is {m.owned_by!r}"
            assert isinstance(m.created, int), f"created is {m.created!r}"

    # ---- embeddings ----------------------------------------------------------------------

    def embeddings(self):
        exp = self.expected["embedding"]
        texts, want = exp["texts"], exp["vectors"]
        # The client asks for base64 when no encoding_format is given and decodes it itself.
        b64 = self.client.embeddings.create(model=self.args.embed_model, input=texts)
        flt = self.client.embeddings.create(
            model=self.args.embed_model, input=texts, encoding_format="float"
        )
        for name, resp in (("base64", b64), ("float", flt)):
            assert len(resp.data) == len(texts), f"{name}: {len(resp.data)} embeddings for {len(texts)} texts"
            assert [d.index for d in resp.data] == list(range(len(texts))), (
                f"{name}: indices {[d.index for d in resp.data]}"
            )
            assert resp.usage.prompt_tokens > 0, f"{name}: usage {resp.usage}"
            assert resp.usage.total_tokens == resp.usage.prompt_tokens, f"{name}: usage {resp.usage}"
            for i, (d, w) in enumerate(zip(resp.data, want)):
                assert len(d.embedding) == len(w), f"{name}[{i}]: {len(d.embedding)} dims, want {len(w)}"
                dist = cosine_distance(d.embedding, w)
                assert dist < 1e-6, f"{name}[{i}]: 1 - cosine vs `lattice embed` is {dist:.3e}"
        for i, (a, b) in enumerate(zip(b64.data, flt.data)):
            worst = max(abs(x - y) for x, y in zip(a.embedding, b.embedding))
            assert worst <= 1e-6, f"[{i}]: base64 and float differ by {worst:.3e}"

    # ---- chat ----------------------------------------------------------------------------

    def _chat_args(self):
        exp = self.expected["chat"]
        return exp, dict(
            model=self.args.gen_model,
            messages=[{"role": "user", "content": exp["prompt"]}],
            max_tokens=exp["max_tokens"],
            temperature=0,
        )

    def chat(self):
        exp, kw = self._chat_args()
        r = self.client.chat.completions.create(**kw)
        assert r.object == "chat.completion", f"object {r.object!r}"
        assert len(r.choices) == 1, f"{len(r.choices)} choices"
        c = r.choices[0]
        assert c.message.role == "assistant", f"role {c.message.role!r}"
        assert c.message.content == exp["text"], (
            f"text {c.message.content!r} != `lattice generate --chat` {exp['text']!r}"
        )
        assert c.finish_reason == exp["finish_reason"], (
            f"finish_reason {c.finish_reason!r}, want {exp['finish_reason']!r}"
        )
        u = r.usage
        assert u is not None, "no usage"
        assert u.prompt_tokens == exp["prompt_tokens"], f"prompt_tokens {u.prompt_tokens}, want {exp['prompt_tokens']}"
        assert u.completion_tokens == exp["completion_tokens"], (
            f"completion_tokens {u.completion_tokens}, want {exp['completion_tokens']}"
        )
        assert u.total_tokens == u.prompt_tokens + u.completion_tokens, f"usage {u}"

    def chat_content_parts(self):
        exp, kw = self._chat_args()
        kw["messages"] = [{"role": "user", "content": [{"type": "text", "text": exp["prompt"]}]}]
        del kw["max_tokens"]
        r = self.client.chat.completions.create(**kw, max_completion_tokens=exp["max_tokens"])
        assert r.choices[0].message.content == exp["text"], (
            f"text {r.choices[0].message.content!r} != {exp['text']!r}"
        )
        assert r.usage.prompt_tokens == exp["prompt_tokens"], f"usage {r.usage}"

    def chat_stream(self):
        exp, kw = self._chat_args()
        chunks = list(
            self.client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True})
        )
        assert chunks, "no chunks"
        for ch in chunks:
            assert ch.object == "chat.completion.chunk", f"chunk object {ch.object!r}"
        with_choices = [ch for ch in chunks if ch.choices]
        assert with_choices[0].choices[0].delta.role == "assistant", (
            f"first delta {with_choices[0].choices[0].delta}"
        )
        text = "".join(ch.choices[0].delta.content or "" for ch in with_choices)
        assert text == exp["text"], f"streamed text {text!r} != {exp['text']!r}"
        reasons = [ch.choices[0].finish_reason for ch in with_choices if ch.choices[0].finish_reason]
        assert reasons == [exp["finish_reason"]], f"finish_reasons {reasons}, want [{exp['finish_reason']!r}]"
        last = chunks[-1]
        assert last.choices == [], f"the usage chunk has choices {last.choices}"
        assert last.usage is not None, "no usage chunk with stream_options.include_usage"
        assert last.usage.completion_tokens == exp["completion_tokens"], f"usage {last.usage}"
        assert last.usage.prompt_tokens == exp["prompt_tokens"], f"usage {last.usage}"
        assert all(ch.usage is None for ch in chunks[:-1]), "usage before the last chunk"

    def chat_stream_without_usage(self):
        exp, kw = self._chat_args()
        chunks = list(self.client.chat.completions.create(**kw, stream=True))
        assert all(ch.usage is None for ch in chunks), "usage sent without stream_options.include_usage"
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert text == exp["text"], f"streamed text {text!r} != {exp['text']!r}"

    def chat_n2_seed(self):
        exp, kw = self._chat_args()
        kw.update(n=2, seed=7, temperature=1.0, max_tokens=8)
        a = self.client.chat.completions.create(**kw)
        assert len(a.choices) == 2, f"{len(a.choices)} choices for n=2"
        assert sorted(c.index for c in a.choices) == [0, 1], f"indices {[c.index for c in a.choices]}"
        for c in a.choices:
            assert isinstance(c.message.content, str), f"choice {c.index}: content {c.message.content!r}"
            assert c.finish_reason in ("stop", "length"), f"finish_reason {c.finish_reason!r}"
        assert a.usage.completion_tokens >= 1, f"usage {a.usage}"
        b = self.client.chat.completions.create(**kw)
        ta = [c.message.content for c in sorted(a.choices, key=lambda c: c.index)]
        tb = [c.message.content for c in sorted(b.choices, key=lambda c: c.index)]
        assert ta == tb, f"the same seed gave {ta} then {tb}"

    def chat_logprobs(self):
        exp, kw = self._chat_args()
        r = self.client.chat.completions.create(**kw, logprobs=True, top_logprobs=2)
        c = r.choices[0]
        assert c.message.content == exp["text"], f"text {c.message.content!r} != {exp['text']!r}"
        assert c.logprobs is not None and c.logprobs.content is not None, "no logprobs.content"
        lp = c.logprobs.content
        assert len(lp) == r.usage.completion_tokens, (
            f"{len(lp)} logprob entries for {r.usage.completion_tokens} tokens"
        )
        for i, t in enumerate(lp):
            assert t.logprob <= 1e-6, f"token {i}: logprob {t.logprob}"
            assert len(t.top_logprobs) == 2, f"token {i}: {len(t.top_logprobs)} top_logprobs"
            top = t.top_logprobs
            assert top[0].logprob >= top[1].logprob, f"token {i}: top_logprobs not sorted {top}"
            # Greedy: the chosen token is the most likely one.
            assert abs(t.logprob - top[0].logprob) < 1e-5, f"token {i}: chosen {t.logprob} vs top {top[0].logprob}"
            assert t.token == top[0].token, f"token {i}: chosen {t.token!r} vs top {top[0].token!r}"

    # ---- completions ---------------------------------------------------------------------

    def _completion_args(self):
        exp = self.expected["completion"]
        return exp, dict(
            model=self.args.gen_model, prompt=exp["prompt"], max_tokens=exp["max_tokens"], temperature=0
        )

    def completion(self):
        exp, kw = self._completion_args()
        r = self.client.completions.create(**kw)
        assert r.object == "text_completion", f"object {r.object!r}"
        assert len(r.choices) == 1, f"{len(r.choices)} choices"
        c = r.choices[0]
        assert c.text == exp["text"], f"text {c.text!r} != `lattice generate` {exp['text']!r}"
        assert c.finish_reason == exp["finish_reason"], f"finish_reason {c.finish_reason!r}"
        u = r.usage
        assert u is not None, "no usage"
        assert u.prompt_tokens == exp["prompt_tokens"], f"prompt_tokens {u.prompt_tokens}, want {exp['prompt_tokens']}"
        assert u.completion_tokens == exp["completion_tokens"], f"completion_tokens {u.completion_tokens}"
        assert u.total_tokens == u.prompt_tokens + u.completion_tokens, f"usage {u}"

    def completion_token_ids(self):
        exp, kw = self._completion_args()
        kw["prompt"] = exp["prompt_ids"]
        r = self.client.completions.create(**kw)
        assert r.choices[0].text == exp["text"], f"text {r.choices[0].text!r} != {exp['text']!r}"
        assert r.usage.prompt_tokens == len(exp["prompt_ids"]), f"usage {r.usage}"

    def completion_echo_and_stop(self):
        exp, kw = self._completion_args()
        r = self.client.completions.create(**kw, echo=True)
        want = exp["prompt"] + exp["text"]
        assert r.choices[0].text == want, f"echo: {r.choices[0].text!r} != {want!r}"
        text = exp["text"]
        # A stop string of two printable ASCII characters from the middle of the expected text.
        k = next(
            (i for i in range(3, len(text) - 1) if text[i : i + 2].isascii() and text[i : i + 2].isprintable()),
            None,
        )
        assert k is not None, f"no ASCII pair in the expected text {text!r} to stop at"
        stop = text[k : k + 2]
        r = self.client.completions.create(**kw, stop=[stop])
        want = text[: text.index(stop)]
        c = r.choices[0]
        assert c.text == want, f"stop={stop!r}: {c.text!r} != {want!r}"
        assert c.finish_reason == "stop", f"stop={stop!r}: finish_reason {c.finish_reason!r}"

    def completion_stream(self):
        exp, kw = self._completion_args()
        chunks = list(
            self.client.completions.create(**kw, stream=True, stream_options={"include_usage": True})
        )
        assert chunks, "no chunks"
        for ch in chunks:
            assert ch.object == "text_completion", f"chunk object {ch.object!r}"
        with_choices = [ch for ch in chunks if ch.choices]
        text = "".join(ch.choices[0].text for ch in with_choices)
        assert text == exp["text"], f"streamed text {text!r} != {exp['text']!r}"
        reasons = [ch.choices[0].finish_reason for ch in with_choices if ch.choices[0].finish_reason]
        assert reasons == [exp["finish_reason"]], f"finish_reasons {reasons}"
        last = chunks[-1]
        assert last.usage is not None, "no usage chunk with stream_options.include_usage"
        assert last.usage.completion_tokens == exp["completion_tokens"], f"usage {last.usage}"

    # ---- errors --------------------------------------------------------------------------

    # ---- structured outputs and tools (whatever the weights, the output follows) ----------

    SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"},
              "n": {"type": "integer", "minimum": 1, "maximum": 9}},
              "required": ["ok", "n"], "additionalProperties": False}
    TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"], "additionalProperties": False}}}]

    def chat_json_schema(self):
        _, kw = self._chat_args()
        kw.update(max_tokens=64, temperature=1.0, seed=3)
        r = self.client.chat.completions.create(**kw, response_format={
            "type": "json_schema", "json_schema": {"name": "t", "schema": self.SCHEMA, "strict": True}})
        v = json.loads(r.choices[0].message.content)
        assert isinstance(v["ok"], bool) and 1 <= v["n"] <= 9 and set(v) == {"ok", "n"}, v
        assert r.choices[0].finish_reason == "stop", r.choices[0].finish_reason

    def chat_tools_required(self):
        _, kw = self._chat_args()
        kw.update(max_tokens=128, temperature=1.0, seed=5)
        r = self.client.chat.completions.create(**kw, tools=self.TOOLS, tool_choice="required",
                                                parallel_tool_calls=False)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls", c.finish_reason
        calls = c.message.tool_calls
        assert len(calls) == 1 and calls[0].type == "function", calls
        assert calls[0].function.name == "get_weather", calls[0]
        args = json.loads(calls[0].function.arguments)
        assert set(args) == {"city"} and len(args["city"]) <= 12, args

    def chat_tools_stream(self):
        _, kw = self._chat_args()
        kw.update(max_tokens=128, temperature=1.0, seed=5)
        chunks = list(self.client.chat.completions.create(
            **kw, tools=self.TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}},
            parallel_tool_calls=False, stream=True))
        calls = {}
        finish = None
        for ch in chunks:
            for c in ch.choices:
                for d in c.delta.tool_calls or []:
                    e = calls.setdefault(d.index, {"name": "", "arguments": ""})
                    if d.function and d.function.name:
                        e["name"] += d.function.name
                    if d.function and d.function.arguments:
                        e["arguments"] += d.function.arguments
                finish = c.finish_reason or finish
        assert finish == "tool_calls", finish
        assert list(calls) == [0] and calls[0]["name"] == "get_weather", calls
        args = json.loads(calls[0]["arguments"])
        assert set(args) == {"city"}, args

    def bad_requests(self):
        _, kw = self._completion_args()
        for field, value in (("temperature", "hot"), ("max_tokens", -1)):
            bad = dict(kw, **{field: value})
            try:
                self.client.completions.create(**bad)
            except openai.BadRequestError as e:
                assert e.status_code == 400, f"{field}={value!r}: status {e.status_code}"
                body = e.body if isinstance(e.body, dict) else {}
                assert body.get("message"), f"{field}={value!r}: error body {e.body!r}"
                assert field in (body.get("param") or ""), f"{field}={value!r}: param {body.get('param')!r}"
            else:
                raise AssertionError(f"{field}={value!r} was accepted")

    def wrong_key(self):
        bad = OpenAI(base_url=self.args.base_url, api_key=self.args.api_key + "-wrong", max_retries=0)
        try:
            bad.models.list()
        except openai.AuthenticationError as e:
            assert e.status_code == 401, f"status {e.status_code}"
        else:
            raise AssertionError("a wrong api key was accepted")

    def unknown_model(self):
        try:
            self.client.embeddings.create(model="no-such-model", input="x")
        except openai.NotFoundError as e:
            assert e.status_code == 404, f"status {e.status_code}"
        else:
            raise AssertionError("an unknown model was accepted")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8080/v1")
    p.add_argument("--api-key", required=True)
    p.add_argument("--gen-model", required=True, help="id of the generation model")
    p.add_argument("--embed-model", required=True, help="id of the embedding model")
    p.add_argument("--extra-model", action="append", default=[], help="another id /v1/models must list")
    p.add_argument("--expected", required=True, help="JSON file of expected values")
    args = p.parse_args()
    print(f"openai {openai.__version__} against {args.base_url}", flush=True)
    c = Checks(args)
    for name in (
        "models_list",
        "embeddings",
        "chat",
        "chat_content_parts",
        "chat_stream",
        "chat_stream_without_usage",
        "chat_n2_seed",
        "chat_logprobs",
        "completion",
        "completion_token_ids",
        "completion_echo_and_stop",
        "completion_stream",
        "chat_json_schema",
        "chat_tools_required",
        "chat_tools_stream",
        "bad_requests",
        "wrong_key",
        "unknown_model",
    ):
        c.run(name, getattr(c, name))
    if c.failed:
        print(f"{c.failed} check(s) failed", flush=True)
        sys.exit(1)
    print("all checks passed", flush=True)


if __name__ == "__main__":
    main()
