#!/usr/bin/env python3
"""Writes a full-size Qwen3.5-0.8B-shaped checkpoint with random bf16 weights into the git-ignored
cache, for speed measurements only (speed does not depend on the values; no real Qwen3.5 weights
can be fetched here). Standard library + numpy + safetensors.

  .cache/models/qwen35-0.8b-random/   config.json (multimodal layout, text_config), model.safetensors
                                      (bf16, model.language_model.* names, tied embeddings),
                                      tokenizer.json (the Qwen3.5 vocabulary built by
                                      scripts/gen_qwen35_tokenizer.py)

Shape: hidden 1024, 24 layers (Gated DeltaNet x3 then full attention, repeated), 8 query / 2 KV
heads of 256 (partial rotary 0.25), GDN 16 key / 16 value heads of 128, conv kernel 4,
intermediate 3584, vocab 248,320.

With --vision the checkpoint also gets a vision tower of the Qwen3.5-0.8B shape (12 blocks of
768, 12 heads, MLP 3072, patch 16, merge 2, 48 x 48 learned positions, out 1024: ~0.1 B
parameters, model.visual.*), preprocessor_config.json and the image token ids, in
.cache/models/qwen35-0.8b-vl-random/.

Usage: .cache/venv-ref/bin/python scripts/gen_random_qwen35.py [--vision] [--out DIR]
       [--tokenizer PATH]

--out writes the checkpoint to DIR instead; --tokenizer takes the tokenizer.json from PATH (a .gz
is decompressed) instead of .cache/qwen35/. The GPU machine runs it this way (numpy and
safetensors are there; scripts/gpu/lattice_device.sh, step `models`); without the llama.cpp
sources the chat template is left out.
"""

import gzip
import json
import shutil
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

ROOT = Path(__file__).resolve().parent.parent
VISION = "--vision" in sys.argv


def _flag(name):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else None


OUT = Path(_flag("--out")) if _flag("--out") else (
    ROOT / ".cache" / "models" / ("qwen35-0.8b-vl-random" if VISION else "qwen35-0.8b-random"))
TOKENIZER = Path(_flag("--tokenizer") or ROOT / ".cache" / "qwen35" / "tokenizer.json")
VISION_CFG = dict(
    model_type="qwen3_5", depth=12, hidden_size=768, intermediate_size=3072, num_heads=12,
    in_channels=3, patch_size=16, spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=1024,
    num_position_embeddings=2304, hidden_act="gelu_pytorch_tanh",
)
TEXT = dict(
    model_type="qwen3_5_text", vocab_size=248320, hidden_size=1024, intermediate_size=3584,
    num_hidden_layers=24, num_attention_heads=8, num_key_value_heads=2, head_dim=256,
    max_position_embeddings=262144, rms_norm_eps=1e-6, tie_word_embeddings=True,
    linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128,
    linear_num_key_heads=16, linear_num_value_heads=16, hidden_act="silu", attention_bias=False,
    rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                     "mrope_section": [11, 11, 10], "mrope_interleaved": True},
    layer_types=[("full_attention" if (i + 1) % 4 == 0 else "linear_attention") for i in range(24)],
    eos_token_id=248044,
)


def qwen35_chat_template() -> str:
    """The Qwen3.5 chat template llama.cpp ships (models/templates/Qwen3.5-4B.jinja in the
    llama-cpp-python 0.3.36 sdist, fetched by scripts/fetch_models.sh, or in the llama.cpp tree
    unpacked from it: scripts/build_llama_cpp.sh, scripts/device/cpu_amx.sh)."""
    import tarfile
    tree = ROOT / ".cache" / "llama.cpp" / "src" / "models" / "templates" / "Qwen3.5-4B.jinja"
    if tree.exists():
        return tree.read_text()
    sdist = ROOT / ".cache" / "pypi" / "llama_cpp_python-0.3.36.tar.gz"
    if not sdist.exists():
        return None
    with tarfile.open(sdist) as t:
        member = "llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates/Qwen3.5-4B.jinja"
        return t.extractfile(member).read().decode()


def bf16(shape, rng, std=0.02, mean=0.0):
    x = (rng.standard_normal(shape, dtype=np.float32) * std + mean).astype(np.float32)
    # Round to nearest even bf16, stored as uint16, viewed by safetensors as BF16 below.
    u = x.view(np.uint32)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return u


def main():
    rng = np.random.default_rng(0)
    t = TEXT
    h, inter, hd = t["hidden_size"], t["intermediate_size"], t["head_dim"]
    nk, nv, dk, dv = t["linear_num_key_heads"], t["linear_num_value_heads"], t["linear_key_head_dim"], t["linear_value_head_dim"]
    conv_dim = 2 * nk * dk + nv * dv
    q_dim, kv_dim = t["num_attention_heads"] * hd, t["num_key_value_heads"] * hd
    tensors = {}
    pre = "model.language_model."
    tensors[pre + "embed_tokens.weight"] = bf16((t["vocab_size"], h), rng)
    tensors[pre + "norm.weight"] = bf16((h,), rng)
    for i, kind in enumerate(t["layer_types"]):
        p = f"{pre}layers.{i}."
        tensors[p + "input_layernorm.weight"] = bf16((h,), rng)
        tensors[p + "post_attention_layernorm.weight"] = bf16((h,), rng)
        tensors[p + "mlp.gate_proj.weight"] = bf16((inter, h), rng)
        tensors[p + "mlp.up_proj.weight"] = bf16((inter, h), rng)
        tensors[p + "mlp.down_proj.weight"] = bf16((h, inter), rng)
        if kind == "full_attention":
            a = p + "self_attn."
            tensors[a + "q_proj.weight"] = bf16((2 * q_dim, h), rng)
            tensors[a + "k_proj.weight"] = bf16((kv_dim, h), rng)
            tensors[a + "v_proj.weight"] = bf16((kv_dim, h), rng)
            tensors[a + "o_proj.weight"] = bf16((h, q_dim), rng)
            tensors[a + "q_norm.weight"] = bf16((hd,), rng)
            tensors[a + "k_norm.weight"] = bf16((hd,), rng)
        else:
            a = p + "linear_attn."
            tensors[a + "in_proj_qkv.weight"] = bf16((conv_dim, h), rng)
            tensors[a + "in_proj_z.weight"] = bf16((nv * dv, h), rng)
            tensors[a + "in_proj_b.weight"] = bf16((nv, h), rng)
            tensors[a + "in_proj_a.weight"] = bf16((nv, h), rng)
            tensors[a + "conv1d.weight"] = bf16((conv_dim, 1, t["linear_conv_kernel_dim"]), rng, 0.3)
            tensors[a + "dt_bias"] = bf16((nv,), rng, 0.1, 1.0)
            tensors[a + "A_log"] = bf16((nv,), rng, 0.5, 0.5)
            tensors[a + "norm.weight"] = bf16((dv,), rng, 0.02, 1.0)
            tensors[a + "out_proj.weight"] = bf16((h, nv * dv), rng)
    if VISION:
        v = VISION_CFG
        vh, vi, wide = v["hidden_size"], v["intermediate_size"], 4 * v["hidden_size"]
        pv = "model.visual."
        tensors[pv + "patch_embed.proj.weight"] = bf16((vh, 3, 2, 16, 16), rng)
        tensors[pv + "patch_embed.proj.bias"] = bf16((vh,), rng)
        tensors[pv + "pos_embed.weight"] = bf16((v["num_position_embeddings"], vh), rng)
        for i in range(v["depth"]):
            b = f"{pv}blocks.{i}."
            for n in ("norm1", "norm2"):
                tensors[b + n + ".weight"] = bf16((vh,), rng, 0.02, 1.0)
                tensors[b + n + ".bias"] = bf16((vh,), rng)
            for n, shape in (("attn.qkv", (3 * vh, vh)), ("attn.proj", (vh, vh)),
                             ("mlp.linear_fc1", (vi, vh)), ("mlp.linear_fc2", (vh, vi))):
                tensors[b + n + ".weight"] = bf16(shape, rng)
                tensors[b + n + ".bias"] = bf16((shape[0],), rng)
        m = pv + "merger."
        tensors[m + "norm.weight"] = bf16((vh,), rng, 0.02, 1.0)
        tensors[m + "norm.bias"] = bf16((vh,), rng)
        for n, shape in (("linear_fc1", (wide, wide)), ("linear_fc2", (v["out_hidden_size"], wide))):
            tensors[m + n + ".weight"] = bf16(shape, rng)
            tensors[m + n + ".bias"] = bf16((shape[0],), rng)
    OUT.mkdir(parents=True, exist_ok=True)
    # safetensors.numpy has no bf16 dtype: write uint16 and patch the header's dtype.
    tmp = OUT / "model.safetensors.tmp"
    save_file(tensors, str(tmp))
    raw = tmp.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    for k, v in header.items():
        if k != "__metadata__":
            v["dtype"] = "BF16"
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)  # offsets are relative to the data, so only the length changes
    with open(OUT / "model.safetensors", "wb") as f:
        f.write(len(hb).to_bytes(8, "little"))
        f.write(hb)
        f.write(memoryview(raw)[8 + n:])
    tmp.unlink()
    config = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
              "text_config": t, "tie_word_embeddings": True}
    if VISION:
        config.update(vision_config=VISION_CFG, image_token_id=248056, video_token_id=248057,
                      vision_start_token_id=248053, vision_end_token_id=248054)
        (OUT / "preprocessor_config.json").write_text(json.dumps({
            "image_processor_type": "Qwen2VLImageProcessor", "patch_size": 16, "temporal_patch_size": 2,
            "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
            "size": {"shortest_edge": 65536, "longest_edge": 16777216}}, indent=2) + "\n")
    (OUT / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if TOKENIZER.suffix == ".gz":
        (OUT / "tokenizer.json").write_bytes(gzip.decompress(TOKENIZER.read_bytes()))
    else:
        shutil.copy(TOKENIZER, OUT / "tokenizer.json")
    tok_cfg = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None,
               "add_bos_token": False}
    template = qwen35_chat_template()
    if template is not None:
        tok_cfg["chat_template"] = template
    (OUT / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
    params = sum(int(np.prod(v.shape)) for v in tensors.values())
    print(f"{OUT}: {params / 1e6:.0f}M parameters")


if __name__ == "__main__":
    main()
