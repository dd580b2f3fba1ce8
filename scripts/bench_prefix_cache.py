#!/usr/bin/env python3
"""Multi-turn chat against a running `lattice serve`, with the official OpenAI client: a ~2,000
token system prompt and TURNS user turns, each request carrying the whole conversation so far
(the assistant's earlier answers included), greedy, streamed. Prints one JSON line per turn
(time to first token, total seconds, prompt tokens, text) and a last line with the ratios of
turns 2..N's time to first token to turn 1's. scripts/bench_prefix_cache.sh runs it against a
server with the prefix cache on and one with it off (--no-prefix-cache) and compares the texts.

  python bench_prefix_cache.py --base-url http://127.0.0.1:PORT/v1 [--turns 4] [--max-tokens 48]
"""

import argparse
import json
import time

from openai import OpenAI

TOPICS = [
    "the page pool", "the prefix cache", "the scheduler", "the forward batch", "the sampler",
    "the tokenizer", "the chat template", "the HTTP server", "the metrics endpoint",
    "the quantized kernels", "the attention kernel", "the recurrent state", "the weight loader",
]


def system_prompt(target_words):
    """A deterministic, varied text of about `target_words` words (~1.3 tokens per word)."""
    parts = []
    i = 0
    while sum(len(p.split()) for p in parts) < target_words:
        a, b = TOPICS[i % len(TOPICS)], TOPICS[(i * 7 + 3) % len(TOPICS)]
        parts.append(
            f"Rule {i + 1}: when a question concerns {a}, answer in at most two sentences, "
            f"mention how it relates to {b}, and never invent figures that were not measured "
            f"in run number {1000 + 37 * i}."
        )
        i += 1
    return "You are a terse assistant for the Lattice inference engine.\n" + "\n".join(parts)


QUESTIONS = [
    "What does the page pool do?",
    "And how does the prefix cache use it?",
    "Why does the scheduler count tokens?",
    "Summarise the three answers in one line.",
    "What would you measure next?",
    "Name one risk.",
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--system-words", type=int, default=1500)
    ap.add_argument("--model", default="default")
    args = ap.parse_args()
    client = OpenAI(base_url=args.base_url, api_key="unused", max_retries=0, timeout=600)
    messages = [{"role": "system", "content": system_prompt(args.system_words)}]
    ttfts = []
    for turn in range(args.turns):
        messages.append({"role": "user", "content": QUESTIONS[turn % len(QUESTIONS)]})
        t0 = time.perf_counter()
        first = None
        text = []
        usage = None
        stream = client.chat.completions.create(
            model=args.model, messages=messages, max_tokens=args.max_tokens, temperature=0,
            stream=True, stream_options={"include_usage": True},
        )
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for c in chunk.choices:
                if c.delta.content:
                    if first is None:
                        first = time.perf_counter() - t0
                    text.append(c.delta.content)
        total = time.perf_counter() - t0
        answer = "".join(text)
        if first is None:
            first = total
        ttfts.append(first)
        print(json.dumps({
            "turn": turn + 1, "ttft_s": round(first, 4), "total_s": round(total, 4),
            "prompt_tokens": usage.prompt_tokens if usage else None,
            "completion_tokens": usage.completion_tokens if usage else None,
            "text": answer,
        }), flush=True)
        messages.append({"role": "assistant", "content": answer})
    print(json.dumps({"ttft_ratio_to_turn1": [round(t / ttfts[0], 4) for t in ttfts[1:]]}))


if __name__ == "__main__":
    main()
