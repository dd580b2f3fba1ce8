"""The Ray Data recipe (examples/ray_embed.py) on a local 2-CPU Ray cluster: a few thousand
sentences embedded by two `lattice.Embedder` actors equal the single-process vectors."""
from __future__ import annotations

import pathlib
import sys

import numpy as np
import ray

import lattice

ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "crates" / "python" / "examples"))
import ray_embed  # noqa: E402

MODEL = str(ROOT / ".cache" / "models" / "all-MiniLM-L6-v2")


def test_ray_data_embeddings_equal_one_process():
    texts = [f"sentence {i}: the quick brown fox jumps over {i % 17} lazy dogs" for i in range(3000)]
    # The workers import the recipe's module as the driver does.
    examples = str(ROOT / "crates" / "python" / "examples")
    ray.init(num_cpus=2, include_dashboard=False, ignore_reinit_error=True, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": examples}})
    try:
        got = ray_embed.embed_dataset(MODEL, texts, actors=2, batch_size=128)
    finally:
        ray.shutdown()
    want = lattice.Embedder(MODEL).embed(texts)
    assert got.shape == want.shape == (3000, 384)
    assert np.abs(got - want).max() <= 1e-6
