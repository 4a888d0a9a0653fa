"""`tiny-random-qwen2.5-vl`: a tiny Qwen2.5-VL with random weights, generated, not downloaded.

What it is for: config presets that run a visual agent end to end on CPU (e.g.
`configs/sokoban_visual.py:cpu`) and tests of the visual path. Its weights are random
(drawn from a fixed seed, so every machine generates the same bytes): it learns nothing, it
proves the path. Images are resized, cut into patches, encoded by the tower, placed among
the text tokens with M-RoPE positions, sampled from, scored and trained exactly as with
Qwen2.5-VL-3B, in a model small enough (3.3M parameters) to step on two CPU cores.

No VLM weights can be downloaded here, so `seed_jax.models.embedded.embedded_model_dir`
generates its HF folder on first use (`write_tiny_vlm`), like the embedded SmolLM2's:
  * `model.safetensors` + `config.json`: `export_hf` of a `VisionLanguageModel` initialised
    from `nnx.Rngs(0)` with the config `TINY_VLM_HF_CONFIG` (a 2-block tower of width 32,
    a 2-layer text model of width 64, a tied head);
  * the embedded SmolLM2 tokenizer with Qwen's vision tokens appended (ids 49152..49155)
    and Qwen2-VL's chat template (`add_vision_tokens`); its eos stays `<|im_end|>`;
  * `preprocessor_config.json` (`TINY_VLM_IMAGE_PROCESSOR`): few image tokens per image.

This module is also the one home of Qwen2-VL's vision tokens (`VISION_TOKENS`) and of the
chat template that renders image content items (`QWEN2_VL_CHAT_TEMPLATE`), for any
checkpoint built on the SmolLM2 tokenizer (tests build others).
"""

from __future__ import annotations

import os

from flax import nnx

from seed_jax.models.config import ModelConfig
from seed_jax.models.tokenizer import Tokenizer
from seed_jax.models.vision.image_processor import ImageProcessorConfig
from seed_jax.models.vision_language import VisionLanguageModel, build_model
from seed_jax.models.weights import export_hf

# Qwen2-VL's vision tokens, appended to the vocabulary in this order.
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")

# Qwen2-VL's chat template, cut to text and image content items (no video, no vision ids):
# a message's content is a string, or a list of {"type": "image"} / {"type": "text", ...}.
# Each image renders as one `<|image_pad|>`, which `chat_prompt_with_images` expands to
# the image's token count, as transformers' processor does.
QWEN2_VL_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}"
    "<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

SMOLLM2_VOCAB_SIZE = 49152
# The ids the vision tokens get after SmolLM2's vocabulary: 49152..49155.
VISION_START_ID, VISION_END_ID, IMAGE_ID, VIDEO_ID = (
    SMOLLM2_VOCAB_SIZE + i for i in range(len(VISION_TOKENS)))
_BOS, _EOS, _PAD = 1, 2, 2  # SmolLM2's <|im_start|>, <|im_end|>, <|im_end|>

# An HF config.json dict (transformers 5's layout), read by `ModelConfig.from_hf_dict` as
# any Qwen2.5-VL checkpoint's, so no field of the family is left out.
# How errors name this model (its registered name lives in `seed_jax.models.embedded`,
# which imports this module lazily).
SOURCE = "the tiny random Qwen2.5-VL (seed_jax.models.tiny_vlm)"

TINY_VLM_HF_CONFIG = {
    "model_type": "qwen2_5_vl",
    "text_config": {
        "vocab_size": SMOLLM2_VOCAB_SIZE + len(VISION_TOKENS), "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "rms_norm_eps": 1e-6, "max_position_embeddings": 8192,
        "bos_token_id": _BOS, "eos_token_id": _EOS, "pad_token_id": _PAD,
        # head_dim 32: the sections split its 16 frequencies (t, h, w) as 3B's 64 are.
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0,
                            "mrope_section": [4, 6, 6]},
    },
    "vision_config": {
        "depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
        "out_hidden_size": 64, "patch_size": 14, "spatial_merge_size": 2,
        "temporal_patch_size": 2, "hidden_act": "silu",
        # Block 0 attends within windows of 112 px (4 x 4 merged tokens), block 1 to the
        # whole image: both attention kinds of the real tower.
        "window_size": 112, "fullatt_block_indexes": [1],
    },
    "image_token_id": IMAGE_ID, "video_token_id": VIDEO_ID,
    "vision_start_token_id": VISION_START_ID, "vision_end_token_id": VISION_END_ID,
    "tie_word_embeddings": True,
}

# Images between 2 x 2 and 6 x 6 merged tokens (4..36 image tokens): a 96 x 96 px Sokoban
# board (6 x 6 tiles of 16 px) is resized to 84 x 84, one 14 px patch per tile, 9 tokens;
# EZPoints' 300 x 300 table to 168 x 168, 36 tokens.
TINY_VLM_IMAGE_PROCESSOR = ImageProcessorConfig(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 36)

_SEED = 0


def tiny_vlm_config(**overrides) -> ModelConfig:
  """The tiny VLM's `ModelConfig`; `overrides` replace fields (dtype, remat, ...)."""
  return ModelConfig.from_hf_dict(TINY_VLM_HF_CONFIG, source=SOURCE, **overrides)


def random_tiny_vlm(seed: int = _SEED) -> VisionLanguageModel:
  """The tiny VLM with random weights (float32): nnx's initialisers, but for the embedding.

  nnx draws the embedding table from N(0, 1). Tied as the head, its logits would have a
  std of sqrt(hidden) = 8, and since the residual stream of two random layers is still
  mostly the input embedding, each position would predict its own token with probability
  ~1. Rows scaled to norm ~1 give logits of std ~1: a spread distribution to sample from.
  """
  cfg = tiny_vlm_config()
  model = build_model(cfg, nnx.Rngs(seed))
  embed = model.text.embed
  embed.set_value(embed.get_value() * cfg.hidden_size ** -0.5)
  return model


def add_vision_tokens(hf_tokenizer) -> list[int]:
  """Adds `VISION_TOKENS` to a transformers tokenizer as special tokens (after its
  vocabulary) and sets `QWEN2_VL_CHAT_TEMPLATE`, in place. Returns the tokens' ids."""
  hf_tokenizer.add_special_tokens({"additional_special_tokens": list(VISION_TOKENS)})
  hf_tokenizer.chat_template = QWEN2_VL_CHAT_TEMPLATE
  return hf_tokenizer.convert_tokens_to_ids(list(VISION_TOKENS))


def tiny_vlm_tokenizer(smollm2: Tokenizer) -> Tokenizer:
  """The SmolLM2 tokenizer `smollm2` (modified in place) with the vision tokens at the
  ids the tiny VLM's config names, and the Qwen2-VL chat template."""
  ids = add_vision_tokens(smollm2.hf)
  cfg = tiny_vlm_config()
  expected = [cfg.vision_start_token_id, cfg.vision_end_token_id, cfg.image_token_id,
              cfg.video_token_id]
  if ids != expected or len(smollm2.hf) != cfg.vocab_size:
    raise ValueError(f"{SOURCE}: the vision tokens got ids {ids} in a vocabulary of "
                     f"{len(smollm2.hf)}; the config expects {expected} in {cfg.vocab_size} "
                     f"(not SmolLM2's tokenizer?)")
  return smollm2


def write_tiny_vlm(folder: str | os.PathLike, smollm2: Tokenizer) -> str:
  """Writes the tiny VLM's HF folder (weights, config, tokenizer, preprocessor config) to
  `folder`, from the embedded SmolLM2 tokenizer `smollm2` (modified in place)."""
  return export_hf(random_tiny_vlm(), folder, tiny_vlm_tokenizer(smollm2),
                   image_processor=TINY_VLM_IMAGE_PROCESSOR)
