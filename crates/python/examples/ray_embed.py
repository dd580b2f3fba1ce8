"""Embed a corpus with Ray Data: one `lattice.Embedder` per actor, batches spread over them.

    python crates/python/examples/ray_embed.py MODEL [N_SENTENCES] [ACTORS]

Each actor loads the model once and embeds the batches Ray hands it (the GIL is released while
Lattice computes, and each actor gets `threads` cores of its own). On a cluster, start Ray
first (`ray start --head` / `ray start --address ...`) and `ray.init()` joins it; here it starts
a local one. Prints the rows embedded and the throughput.
"""
from __future__ import annotations

import sys
import time

import numpy as np
import ray

import lattice


class Embed:
    """A Ray Data actor: one Embedder, many batches."""

    def __init__(self, model: str, threads: int = 1) -> None:
        self.embedder = lattice.Embedder(model, threads=threads)

    def __call__(self, batch: dict) -> dict:
        texts = [str(t) for t in batch["text"]]
        batch["embedding"] = list(self.embedder.embed(texts))
        return batch


def embed_dataset(model: str, texts: list, actors: int = 2, batch_size: int = 64) -> np.ndarray:
    """The vectors of `texts`, in order, computed by `actors` Ray actors."""
    ds = ray.data.from_items([{"id": i, "text": t} for i, t in enumerate(texts)])
    out = ds.map_batches(
        Embed,
        fn_constructor_kwargs={"model": model, "threads": 1},
        batch_size=batch_size,
        concurrency=actors,
        num_cpus=1,
    )
    rows = sorted(out.take_all(), key=lambda r: r["id"])
    return np.stack([np.asarray(r["embedding"], dtype=np.float32) for r in rows])


def main() -> None:
    model = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    actors = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    texts = [f"sentence {i}: the quick brown fox jumps over {i % 17} lazy dogs" for i in range(n)]
    # Workers import this file's module (`Embed` is pickled by reference to it).
    here = str(__import__("pathlib").Path(__file__).resolve().parent)
    ray.init(num_cpus=actors, include_dashboard=False, ignore_reinit_error=True,
             runtime_env={"env_vars": {"PYTHONPATH": here}})
    t0 = time.perf_counter()
    vectors = embed_dataset(model, texts, actors)
    dt = time.perf_counter() - t0
    print(f"{len(vectors)} sentences, dim {vectors.shape[1]}, {dt:.1f} s, {len(vectors) / dt:.0f}/s "
          f"with {actors} actors")


if __name__ == "__main__":
    main()
