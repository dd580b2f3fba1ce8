"""Lattice from Python: embeddings, reranking, tokenizers and text generation.

Everything runs in the Rust engine (the GIL is released while it computes); models load by
path or Hugging Face hub id through the same resolution and cache as the `lattice` CLI.

    import lattice
    emb = lattice.Embedder("sentence-transformers/all-MiniLM-L6-v2")
    vectors = emb.embed(["a sentence", "another"])          # numpy float32, shape (2, 384)
    rr = lattice.Reranker("cross-encoder/ms-marco-MiniLM-L6-v2")
    rr.rerank("what is rust?", ["a language", "a fungus"])  # [(index, score), ...]
    llm = lattice.LLM("Qwen/Qwen2.5-0.5B-Instruct")
    llm.chat([{"role": "user", "content": "Hi"}], max_tokens=32)
"""
from __future__ import annotations

import json as _json
from typing import Any, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _lattice

__version__ = _lattice.__version__
__all__ = ["Embedder", "Reranker", "Tokenizer", "Encoding", "LLM", "cpu_isa", "__version__"]


def cpu_isa() -> str:
    """The instruction set Lattice's CPU kernels chose on this machine (e.g. "avx512")."""
    return _lattice.cpu_isa()


def _texts(texts: Union[str, Sequence[str]]) -> Tuple[List[str], bool]:
    if isinstance(texts, str):
        return [texts], True
    out = list(texts)
    for i, t in enumerate(out):
        if not isinstance(t, str):
            raise TypeError(f"texts[{i}] is {type(t).__name__}, not str")
    return out, False


class Embedder:
    """A sentence-embedding model (BERT family, Qwen3-Embedding, ...), by folder, hub id or
    catalog name. `threads` gives it a worker pool of its own (default: all cores). `bf16=True`
    rounds the matrices to bf16 (bf16 products, f32 sums), `q8=True` quantizes them and the
    activations to int8 per row (exact integer products):
    faster on CPUs with bf16 / int8 instructions, close to but not equal to f32 (the default)."""

    def __init__(self, model: str, *, device: str = "cpu", threads: Optional[int] = None,
                 bf16: bool = False, q8: bool = False, max_batch_tokens: int = 16384) -> None:
        self._inner = _lattice.Embedder(model, device=device, threads=threads,
                                        max_batch_tokens=max_batch_tokens, bf16=bf16, q8=q8)

    @property
    def dim(self) -> int:
        """Width of the vectors."""
        return self._inner.dim

    @property
    def max_tokens(self) -> int:
        """Most tokens of one text (longer ones are truncated)."""
        return self._inner.max_tokens

    def embed(self, texts: Union[str, Sequence[str]], *, batch_size: Optional[int] = None,
              normalize: Optional[bool] = None, query: bool = False,
              dimensions: Optional[int] = None) -> np.ndarray:
        """The vectors of `texts` as float32, shape (n, dim). `normalize=True` L2-normalizes
        them (the model's own pipeline decides when None or False); `query=True` adds the
        model's query prefix; `dimensions` keeps the first N values (Matryoshka models)."""
        items, _ = _texts(texts)
        data, rows, dim = self._inner.embed_bytes(
            items, kind="query" if query else "plain", batch_size=batch_size,
            normalize=bool(normalize), dimensions=dimensions)
        return np.frombuffer(data, dtype="<f4").reshape(rows, dim).astype(np.float32)

    def encode(self, sentences: Union[str, Sequence[str]], batch_size: int = 32,
               show_progress_bar: Optional[bool] = None, output_value: str = "sentence_embedding",
               precision: str = "float32", convert_to_numpy: bool = True,
               convert_to_tensor: bool = False, device: Optional[str] = None,
               normalize_embeddings: bool = False, **kwargs: Any):
        """sentence-transformers' `SentenceTransformer.encode`: one string gives shape (dim,),
        a list (n, dim). Token embeddings, other precisions and tensors are refused."""
        if output_value != "sentence_embedding":
            raise ValueError("only output_value='sentence_embedding' is supported")
        if precision != "float32":
            raise ValueError("only precision='float32' is supported")
        if convert_to_tensor:
            raise ValueError("convert_to_tensor is not supported (no torch); use numpy")
        if device is not None:
            raise ValueError("encode(device=...) is not supported: give device= to Embedder()")
        # show_progress_bar is accepted for compatibility; there is no bar to show.
        prompt = kwargs.pop("prompt_name", None)
        if prompt not in (None, "query"):
            raise ValueError(
                f"prompt_name {prompt!r}: only 'query' (the model's query prefix) is supported")
        if kwargs:
            raise TypeError(f"unsupported arguments: {', '.join(sorted(kwargs))}")
        items, single = _texts(sentences)
        out = self.embed(items, batch_size=batch_size, normalize=normalize_embeddings,
                         query=prompt == "query")
        if single:
            out = out[0]
        return out if convert_to_numpy else list(out)

    def __repr__(self) -> str:
        return f"lattice.Embedder(dim={self.dim})"


class Reranker:
    """A cross-encoder scoring (query, passage) pairs, by folder or hub id (`bf16` / `q8` as
    for `Embedder`)."""

    def __init__(self, model: str, *, threads: Optional[int] = None, bf16: bool = False,
                 q8: bool = False) -> None:
        self._inner = _lattice.Reranker(model, threads=threads, bf16=bf16, q8=q8)

    def rerank(self, query: str, passages: Sequence[str],
               top_n: Optional[int] = None) -> List[Tuple[int, float]]:
        """`(index into passages, score)` pairs, best first (the first `top_n` when given)."""
        scores = self._inner.scores(query, list(passages))
        order = sorted(range(len(scores)), key=lambda i: -scores[i])
        if top_n is not None:
            if top_n < 0:
                raise ValueError("top_n must not be negative")
            order = order[:top_n]
        return [(i, float(scores[i])) for i in order]

    def predict(self, sentences: Sequence[Tuple[str, str]], batch_size: int = 32,
                show_progress_bar: Optional[bool] = None) -> np.ndarray:
        """sentence-transformers' `CrossEncoder.predict`: the score of each (query, passage)
        pair, float32, shape (n,); pairs sharing a query run together, `batch_size` at a time
        (`show_progress_bar` is accepted for compatibility; there is no bar)."""
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        pairs = [tuple(p) for p in sentences]
        for i, p in enumerate(pairs):
            if len(p) != 2 or not all(isinstance(s, str) for s in p):
                raise TypeError(f"sentences[{i}] is not a (str, str) pair")
        out = np.zeros(len(pairs), dtype=np.float32)
        by_query: dict = {}
        for i, (q, p) in enumerate(pairs):
            by_query.setdefault(q, []).append((i, p))
        for q, items in by_query.items():
            for b in range(0, len(items), batch_size):
                part = items[b:b + batch_size]
                for (i, _), s in zip(part, self._inner.scores(q, [p for _, p in part])):
                    out[i] = s
        return out


class Encoding:
    """One encoded text, in HF tokenizers' shape (`offsets` in characters)."""

    __slots__ = ("ids", "tokens", "offsets", "type_ids", "special_tokens_mask", "attention_mask")

    def __init__(self, ids, tokens, offsets, type_ids, special_tokens_mask) -> None:
        self.ids: List[int] = list(ids)
        self.tokens: List[str] = list(tokens)
        self.offsets: List[Tuple[int, int]] = [tuple(o) for o in offsets]
        self.type_ids: List[int] = list(type_ids)
        self.special_tokens_mask: List[int] = list(special_tokens_mask)
        self.attention_mask: List[int] = [1] * len(self.ids)

    def __len__(self) -> int:
        return len(self.ids)

    def __repr__(self) -> str:
        return f"Encoding(num_tokens={len(self.ids)})"


class Tokenizer:
    """A tokenizer: `tokenizer.json`, a SentencePiece `.model`, or a model folder / hub id."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    @classmethod
    def from_file(cls, path: str) -> "Tokenizer":
        return cls(_lattice.Tokenizer.from_file(str(path)))

    @classmethod
    def from_pretrained(cls, identifier: str) -> "Tokenizer":
        return cls(_lattice.Tokenizer.from_pretrained(identifier))

    def encode(self, text: str, add_special_tokens: bool = True) -> Encoding:
        if not isinstance(text, str):
            raise TypeError(f"text is {type(text).__name__}, not str")
        return Encoding(*self._inner.encode_many([text], add_special_tokens)[0])

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True) -> List[Encoding]:
        items, _ = _texts(texts)
        return [Encoding(*e) for e in self._inner.encode_many(items, add_special_tokens)]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._inner.decode(list(ids), skip_special_tokens)

    def token_to_id(self, token: str) -> Optional[int]:
        return self._inner.token_to_id(token)

    def id_to_token(self, id: int) -> Optional[str]:
        return self._inner.id_to_token(id)

    def get_vocab_size(self) -> int:
        return self._inner.vocab_size


def _generation_options(kw: dict) -> dict:
    schema = kw.pop("json_schema", None)
    response_format = kw.pop("response_format", None)
    if response_format is not None:
        if schema is not None:
            raise ValueError("give json_schema or response_format, not both")
        if response_format.get("type") == "json_schema":
            schema = response_format.get("json_schema", {}).get("schema")
        elif response_format.get("type") == "json_object":
            schema = {"type": "object"}
        elif response_format.get("type") != "text":
            raise ValueError(f"unknown response_format type {response_format.get('type')!r}")
    if schema is not None and not isinstance(schema, str):
        schema = _json.dumps(schema)
    stop = kw.pop("stop", None)
    if isinstance(stop, str):
        stop = [stop]
    out = dict(
        max_tokens=kw.pop("max_tokens", 256), temperature=kw.pop("temperature", 0.0),
        top_p=kw.pop("top_p", 1.0), top_k=kw.pop("top_k", 0), min_p=kw.pop("min_p", 0.0),
        repetition_penalty=kw.pop("repetition_penalty", 1.0),
        presence_penalty=kw.pop("presence_penalty", 0.0),
        frequency_penalty=kw.pop("frequency_penalty", 0.0), seed=kw.pop("seed", None),
        stop=list(stop or []), ignore_eos=kw.pop("ignore_eos", False), json_schema=schema,
        regex=kw.pop("regex", None))
    if kw:
        raise TypeError(f"unsupported arguments: {', '.join(sorted(kw))}")
    return out



def _text_content(content: Any, i: int) -> str:
    """A message's content as text: a string, or OpenAI-style parts that are all `text`.
    Images are refused (the command line and `lattice serve` take them), never stringified."""
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        texts = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text" or not isinstance(part.get("text"), str):
                raise ValueError(
                    f"messages[{i}].content[{j}]: only text parts are taken from Python "
                    f"(got {kind!r}); images go through `lattice generate --image` or "
                    f"`lattice serve`")
            texts.append(part["text"])
        return "".join(texts)
    raise ValueError(f"messages[{i}].content must be a string or a list of text parts")

class LLM:
    """A text-generation model (Llama, Qwen2/3, Qwen3.5; a safetensors folder, a GGUF file or a
    hub id). Greedy by default (temperature 0); several prompts decode in one batch."""

    def __init__(self, model: str, *, device: str = "cpu", threads: Optional[int] = None,
                 kv_f16: bool = False, q8: bool = False, bf16: bool = False, f32: bool = False,
                 lora: Union[None, str, Sequence[Union[str, Tuple[str, float]]]] = None,
                 lora_merge: bool = False) -> None:
        paths, scales = [], []
        for item in ([lora] if isinstance(lora, str) else list(lora or [])):
            path, scale = (item, 1.0) if isinstance(item, str) else item
            paths.append(str(path))
            scales.append(float(scale))
        self._inner = _lattice.LLM(model, device=device, threads=threads, q8=q8, bf16=bf16,
                                   f32=f32, kv_f16=kv_f16, lora=paths, lora_scales=scales,
                                   lora_merge=lora_merge)

    def generate(self, prompt: Union[str, Sequence[str]], *, stream: bool = False,
                 **kwargs: Any) -> Union[str, List[str], Iterator[str]]:
        """The completion of `prompt` (a list gives a list, decoded together); `stream=True`
        gives an iterator of text pieces instead. Options: max_tokens (256), temperature (0:
        greedy), top_p (1), top_k (0: off), min_p (0), repetition_penalty (1),
        presence_penalty / frequency_penalty (0), seed, stop, ignore_eos, json_schema /
        response_format, regex."""
        opts = _generation_options(dict(kwargs))
        if isinstance(prompt, str):
            ids = [self._inner.encode(prompt)]
        else:
            ids = [self._inner.encode(p) for p in _texts(prompt)[0]]
        return self._run(ids, isinstance(prompt, str), stream, opts)

    def chat(self, messages: Sequence[dict], *, stream: bool = False,
             enable_thinking: Optional[bool] = None, **kwargs: Any):
        """The assistant's reply to `messages` (`{"role", "content"}` dicts) through the model's
        chat template; `stream=True` gives an iterator of text pieces."""
        opts = _generation_options(dict(kwargs))
        pairs = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise ValueError(f"messages[{i}] needs 'role' and 'content'")
            pairs.append((str(m["role"]), _text_content(m["content"], i)))
        ids = [self._inner.encode_chat(pairs, enable_thinking)]
        return self._run(ids, True, stream, opts)

    def _run(self, ids, single, stream, opts):
        if stream:
            if not single:
                raise ValueError("stream=True takes one prompt")
            return iter(self._inner.stream_ids(ids[0], _lattice.Sampling(**opts)))
        texts = [t for t, _, _ in self._inner.generate_ids(ids, _lattice.Sampling(**opts))]
        return texts[0] if single else texts
