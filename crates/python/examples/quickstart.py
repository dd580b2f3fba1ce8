"""The README's Python example: embeddings, a rerank and a short generation.

    ./scripts/fetch_models.sh && python3 -m pip install ./crates/python
    python3 crates/python/examples/quickstart.py
"""
import pathlib

import lattice

root = pathlib.Path(__file__).resolve().parents[3]
models = root / ".cache" / "models"

emb = lattice.Embedder(str(models / "all-MiniLM-L6-v2"))
vectors = emb.embed(["The cat sits on the mat.", "A cat is sitting on a mat.", "Stocks fell."])
print("embeddings:", vectors.shape, vectors.dtype)
print("similarities:", (vectors @ vectors.T).astype(float).round(3).tolist())

# A tiny random-weight cross-encoder from the test fixtures (any BERT cross-encoder folder or
# hub id works the same way, e.g. cross-encoder/ms-marco-MiniLM-L6-v2).
rr = lattice.Reranker(str(root / "crates/inference/tests/fixtures/tiny-cross-encoder"))
print("rerank:", rr.rerank("how many people live in berlin?",
                           ["Berlin has 3.7 million people.", "Berlin is often cloudy."]))

llm = lattice.LLM(str(models / "SmolLM2-135M-Instruct.Q4_1.gguf"))
print("chat:", llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                        max_tokens=24))
for piece in llm.generate("Once upon a time", max_tokens=16, stream=True):
    print(piece, end="", flush=True)
print()
