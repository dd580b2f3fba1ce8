#!/usr/bin/env python3
"""Inverse RoPE frequencies and attention scaling from transformers 5.24's modeling_rope_utils, for
the scaling types Lattice implements (crates/inference/tests/rope.rs compares ops::Rope to them).

Writes crates/inference/tests/fixtures/rope/reference.json:
  [{name, head_dim, max_position_embeddings, rope_parameters, inv_freq [..], attention_scaling}]
Usage: .cache/venv-ref/bin/python scripts/gen_rope_reference.py
"""

import json
from pathlib import Path

from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

OUT = Path(__file__).resolve().parent.parent / "crates/inference/tests/fixtures/rope/reference.json"

CASES = [
    ("default", 128, 4096, {"rope_type": "default", "rope_theta": 1000000.0}),
    ("default_small_theta", 64, 2048, {"rope_type": "default", "rope_theta": 10000.0}),
    ("linear", 64, 4096, {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}),
    ("llama3", 128, 131072, {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    ("yarn_qwen3", 128, 131072, {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
                                 "original_max_position_embeddings": 32768}),
    ("yarn_mscale", 64, 163840, {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "mscale": 1.0,
                                 "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1,
                                 "original_max_position_embeddings": 4096}),
    ("yarn_no_truncate", 64, 65536, {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 16.0, "truncate": False,
                                     "original_max_position_embeddings": 4096}),
    ("yarn_attention_factor", 128, 65536, {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 2.0,
                                           "attention_factor": 1.25, "original_max_position_embeddings": 32768}),
]


def main() -> None:
    out = []
    for name, head_dim, max_pos, params in CASES:
        cfg = LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, head_dim=head_dim,
                          max_position_embeddings=max_pos, rope_parameters=dict(params))
        if params["rope_type"] == "default":
            from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
            inv_freq, scaling = LlamaRotaryEmbedding.compute_default_rope_parameters(cfg)
        else:
            inv_freq, scaling = ROPE_INIT_FUNCTIONS[params["rope_type"]](cfg, "cpu")
        out.append({"name": name, "head_dim": head_dim, "max_position_embeddings": max_pos,
                    "rope_parameters": params, "inv_freq": [float(x) for x in inv_freq.tolist()],
                    "attention_scaling": float(scaling)})
        print(name, len(inv_freq), scaling)
    OUT.write_text(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
