#!/usr/bin/env python3
"""Generates the tiny random-weight vision-language checkpoints and their transformers references.

Output (committed) under crates/inference/tests/fixtures/:
  vlm-images/            two odd-sized test images (pillow): a.png (101 x 67 RGB), b.png (75 x 90
                         RGB; PNG because JPEG decoders differ by a few levels, see
                         tests/vision_preprocess.rs), and the processor's pixel_values of each as raw
                         little-endian f32 (<name>.pixels.bin, [patches, 3 * 2 * 16 * 16])
  tiny-qwen3-vl/         Qwen3VLForConditionalGeneration: a 3-layer Qwen3 text model (GQA 4/2,
                         head_dim 32, interleaved M-RoPE sections [6, 5, 5], untied head) behind a
                         3-block vision tower (hidden 32, 2 heads, patch 16, merge 2, 16 learned
                         position embeddings) with DeepStack mergers after blocks 0 and 1
  tiny-qwen35-vl/        Qwen3_5ForConditionalGeneration: the tiny Qwen3.5 hybrid text model (3 Gated
                         DeltaNet layers + 1 gated attention layer, partial rotary, M-RoPE sections
                         [4, 2, 2]) behind a 2-block vision tower (no DeepStack), tied embeddings
Each model folder: config.json, model.safetensors (bf16, the names save_pretrained writes:
model.visual.*, model.language_model.*), tokenizer.json (the tiny byte-level BPE of the decoder
fixtures plus <|vision_start|> <|vision_end|> <|image_pad|> <|video_pad|>), tokenizer_config.json
with the Qwen3.5 chat template (the one llama.cpp ships; its image parts are the same as
Qwen3-VL's), preprocessor_config.json (patch 16, merge 2, temporal 2, mean = std = 0.5,
shortest_edge 4096, longest_edge 16384 pixels: the test images stay 64 x 96 / 96 x 64), and
reference.json:
  images: [{file, grid_thw, embeds (the tower's merged output, f32 [tokens, hidden]),
            deepstack [[f32 [tokens, hidden]] per DeepStack layer]}]
  cases: [{name, images [file], messages, input_ids (placeholders expanded by the processor),
           positions [3][len] (get_rope_index), rope_delta, last_logits, greedy_ids [32], min_gap}]

The references run in f32 on weights rounded to bf16 (what the committed files hold), eager
attention, a manual greedy loop with the KV cache (no stopping), rope_deltas reset per case.

Usage: .cache/venv-ref/bin/python scripts/gen_vlm_fixtures.py   (see scripts/setup_reference_env.sh)
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_decoder_fixtures import f32_list  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "crates" / "inference" / "tests" / "fixtures"
IMAGES = FIX / "vlm-images"
SEED = int(__import__("os").environ.get("FIXTURE_SEED", "7"))
GREEDY_STEPS = 32
SPECIALS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
PREPROCESSOR = {
    "image_processor_type": "Qwen2VLImageProcessor",
    "do_resize": True,
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "do_convert_rgb": True,
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "size": {"shortest_edge": 4096, "longest_edge": 16384},
}


def make_images() -> list[Path]:
    from PIL import Image

    IMAGES.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(3)
    y, x = np.mgrid[0:67, 0:101]
    a = np.stack([x * 2.5, y * 3.7, (x + y) * 1.5], -1) + rng.normal(0, 25, (67, 101, 3))
    Image.fromarray(np.clip(a, 0, 255).astype(np.uint8), "RGB").save(IMAGES / "a.png")
    y, x = np.mgrid[0:90, 0:75]
    b = np.stack([255 - x * 3, (x * y) % 256, y * 2.8], -1) + rng.normal(0, 15, (90, 75, 3))
    Image.fromarray(np.clip(b, 0, 255).astype(np.uint8), "RGB").save(IMAGES / "b.png")
    return [IMAGES / "a.png", IMAGES / "b.png"]


def write_tokenizer(folder: Path) -> dict[str, int]:
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_file(str(FIX / "tiny-qwen3" / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    tok.save(str(folder / "tokenizer.json"))
    cfg = json.loads((FIX / "tiny-qwen3" / "tokenizer_config.json").read_text())
    cfg["chat_template"] = json.loads((FIX / "tiny-qwen35" / "tokenizer_config.json").read_text())["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    shutil.copy(FIX / "tiny-qwen3" / "generation_config.json", folder / "generation_config.json")
    (folder / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR, indent=2) + "\n")
    return {s: tok.token_to_id(s) for s in SPECIALS}


def randomize(model, gen: torch.Generator, hybrid: bool) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = lambda s: torch.randn(p.shape, generator=gen) * s  # noqa: E731
            if name.startswith("model.visual."):
                if name.endswith("patch_embed.proj.weight"):
                    p.copy_(r(0.03))
                elif name.endswith("norm.weight"):
                    p.copy_(1.0 + r(0.2))
                elif name.endswith(".bias"):
                    p.copy_(r(0.1))
                elif name.endswith("pos_embed.weight"):
                    p.copy_(r(0.5))
                else:
                    p.copy_(r(0.15))
            elif hybrid:
                # As scripts/gen_qwen35_fixtures.py: zero-centred (1 + w) norms, peaked logits.
                if name.endswith("language_model.norm.weight"):
                    p.copy_(3.0 + r(0.5))
                elif name.endswith("linear_attn.norm.weight"):
                    p.copy_(1.0 + r(0.2))
                elif name.endswith("norm.weight"):
                    p.copy_(r(0.2))
                elif name.endswith("A_log"):
                    p.copy_(torch.log(torch.empty(p.shape).uniform_(0.5, 8.0, generator=gen)))
                elif name.endswith("dt_bias"):
                    p.copy_(1.0 + r(0.3))
                elif name.endswith("conv1d.weight"):
                    p.copy_(r(0.4))
                else:
                    p.copy_(r(0.15))
            else:
                if name.endswith("language_model.norm.weight"):
                    p.copy_(4.0 + r(0.5))
                elif name.endswith("norm.weight"):
                    p.copy_(1.0 + r(0.2))
                else:
                    p.copy_(r(0.15))
        model.tie_weights()
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).to(torch.float32))


def build_model(kind: str, ids: dict[str, int]):
    vision = dict(
        hidden_size=32, intermediate_size=64, num_heads=2, in_channels=3, patch_size=16,
        spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=16, hidden_act="gelu_pytorch_tanh",
    )
    tokens = dict(
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
    )
    if kind == "qwen3_vl":
        from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

        text = dict(
            vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, max_position_embeddings=4096, rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [6, 5, 5],
                             "mrope_interleaved": True},
            tie_word_embeddings=False,
        )
        vision.update(depth=3, out_hidden_size=64, deepstack_visual_indexes=[0, 1])
        config = Qwen3VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=False, **tokens)
        cls = Qwen3VLForConditionalGeneration
    else:
        from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

        text = dict(
            vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=4096,
            rms_norm_eps=1e-6, tie_word_embeddings=True, linear_conv_kernel_dim=4, linear_key_head_dim=16,
            linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
            rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                             "mrope_section": [2, 1, 1], "mrope_interleaved": True},
        )
        vision.update(depth=2, out_hidden_size=64)
        config = Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=True, **tokens)
        cls = Qwen3_5ForConditionalGeneration
    config._attn_implementation = "eager"
    torch.manual_seed(SEED)
    model = cls(config).eval()
    return model, config


def greedy(model, inputs: dict) -> tuple[list[int], float, list[float]]:
    model.model.rope_deltas = None
    with torch.no_grad():
        out = model(**inputs, use_cache=True)
        last = out.logits[0, -1].clone()
        past = out.past_key_values
        logits = last
        gen, gaps = [], []
        for _ in range(GREEDY_STEPS):
            top = torch.topk(logits, 2)
            gaps.append(float(top.values[0] - top.values[1]))
            nxt = int(torch.argmax(logits))
            gen.append(nxt)
            out = model(input_ids=torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits = out.logits[0, -1]
    return gen, min(gaps), last.tolist()


def main() -> None:
    from transformers import AutoTokenizer, Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor
    from transformers.image_utils import load_image

    paths = make_images()
    images = {p.name: load_image(str(p)) for p in paths}
    for kind, name in [("qwen3_vl", "tiny-qwen3-vl"), ("qwen3_5", "tiny-qwen35-vl")]:
        out = FIX / name
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        ids = write_tokenizer(out)
        model, config = build_model(kind, ids)
        gen = torch.Generator().manual_seed(SEED)
        randomize(model, gen, hybrid=kind == "qwen3_5")
        tied = config.tie_word_embeddings
        state = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()
                 if not (tied and k == "lm_head.weight")}
        save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
        cfg = json.loads(config.to_json_string())
        cfg["architectures"] = [type(model).__name__]
        cfg.pop("_attn_implementation", None)
        (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")

        tokenizer = AutoTokenizer.from_pretrained(str(out))
        processor = Qwen3VLProcessor(
            image_processor=Qwen2VLImageProcessor(**{k: v for k, v in PREPROCESSOR.items()
                                                    if k != "image_processor_type"}),
            tokenizer=tokenizer, video_processor=Qwen3VLVideoProcessor(), chat_template=tokenizer.chat_template,
        )
        refs_images = []
        for file, img in images.items():
            px = processor.image_processor(images=[img], return_tensors="pt")
            pv, grid = px["pixel_values"], px["image_grid_thw"]
            if kind == "qwen3_vl":
                np.asarray(pv, dtype="<f4").tofile(IMAGES / f"{file.split('.')[0]}.pixels.bin")
            with torch.no_grad():
                feats = model.model.get_image_features(pv, grid, return_dict=True)
            entry = {"file": file, "grid_thw": grid[0].tolist(),
                     "embeds": f32_list(feats.pooler_output[0].flatten())}
            if kind == "qwen3_vl":
                entry["deepstack"] = [f32_list(d[0].flatten()) for d in feats.deepstack_features]
            refs_images.append(entry)

        cases = [
            ("one_image", ["a.png"], "Describe the picture."),
            ("two_images", ["a.png", "b.png"], "What differs between them?"),
            ("text_only", [], "The capital of France is"),
        ]
        refs = []
        for case, files, text in cases:
            content = [{"type": "image"} for _ in files] + [{"type": "text", "text": text}]
            messages = [{"role": "user", "content": content}]
            prompt = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            kw = {"images": [images[f] for f in files]} if files else {}
            inputs = processor(text=[prompt], return_tensors="pt", **kw)
            inputs = {k: v for k, v in inputs.items() if k != "attention_mask"}
            if files:
                pos, delta = model.model.get_rope_index(
                    inputs["input_ids"], inputs["mm_token_type_ids"], image_grid_thw=inputs["image_grid_thw"])
                pos, delta = pos[:, 0].tolist(), int(delta[0, 0])
            else:
                n = inputs["input_ids"].shape[1]
                pos, delta = [list(range(n))] * 3, 0
            g, gap, last = greedy(model, inputs)
            refs.append({"name": case, "images": files, "messages": messages, "prompt": prompt,
                         "input_ids": inputs["input_ids"][0].tolist(), "positions": pos, "rope_delta": delta,
                         "last_logits": f32_list(last), "greedy_ids": g, "min_gap": round(gap, 6)})
            print(f"{name} {case}: {inputs['input_ids'].shape[1]} tokens, rope delta {delta}, "
                  f"min top-2 gap {gap:.4f}", flush=True)
        (out / "reference.json").write_text(
            json.dumps({"model": name, "images": refs_images, "cases": refs}) + "\n")


if __name__ == "__main__":
    main()
