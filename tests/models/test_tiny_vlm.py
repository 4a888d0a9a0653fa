"""The generated `tiny-random-qwen2.5-vl`: resolves and loads by name like the embedded
SmolLM2, its tokenizer knows the vision tokens, an image prompt samples finite logprobs
(float32; its bfloat16 logits are finite too), and generating it is deterministic."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from seed_jax.models import load_model, model_config, resolve_model_path
from seed_jax.models.embedded import (SMOLLM2, TINY_VLM, embedded_model_config,
                                      embedded_model_dir)
from seed_jax.models.tiny_vlm import (TINY_VLM_IMAGE_PROCESSOR, VISION_TOKENS,
                                      tiny_vlm_config)
from seed_jax.models.vision import ImageProcessorConfig
from seed_jax.models.vision_language import (VisionLanguageModel, chat_prompt_with_images,
                                             multimodal_positions)
from seed_jax.sampling import Sampler, SamplingParams
from seed_jax.train.spec import ModelSpec, is_model_name

FILES = ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
         "tokenizer_config.json", "chat_template.jinja", "preprocessor_config.json")


def random_image(side: int, seed: int = 0) -> np.ndarray:
  return np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def tiny():
  """(model, tokenizer) loaded by name in float32."""
  return load_model(TINY_VLM)


def count_params(model) -> int:
  return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def test_the_name_loads_a_vision_language_model_with_its_tokenizer(tiny):
  model, tokenizer = tiny
  folder = resolve_model_path(TINY_VLM)
  assert folder == embedded_model_dir(TINY_VLM)
  assert os.path.basename(folder) == "tiny-random-qwen2.5-vl-v1"
  assert all(os.path.isfile(os.path.join(folder, f)) for f in FILES)
  assert isinstance(model, VisionLanguageModel)
  assert model.cfg == tiny_vlm_config() == model_config(TINY_VLM)
  assert (model.cfg.hidden_size, model.cfg.num_layers, model.cfg.vision.depth,
          model.cfg.vocab_size, model.cfg.tie_word_embeddings) == (64, 2, 2, 49156, True)
  assert count_params(model) == 3_303_904
  assert ImageProcessorConfig.from_file(folder) == TINY_VLM_IMAGE_PROCESSOR
  assert tokenizer.vocab_size == model.cfg.vocab_size


def test_the_tokenizer_maps_the_vision_tokens_to_the_config_ids(tiny):
  model, tokenizer = tiny
  cfg = model.cfg
  ids = tokenizer.encode("".join(VISION_TOKENS))
  assert ids == [cfg.vision_start_token_id, cfg.vision_end_token_id, cfg.image_token_id,
                 cfg.video_token_id] == [49152, 49153, 49154, 49155]
  assert tokenizer.decode(ids) == "".join(VISION_TOKENS)
  assert tokenizer.decode(ids, skip_special_tokens=True) == ""
  assert tokenizer.eos_ids == (2,) == cfg.eos_token_ids  # SmolLM2's <|im_end|>
  text = tokenizer.apply_chat_template([{"role": "user", "content": "Push."}])
  assert text.endswith("<|im_start|>user\nPush.<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("side,tokens", [(96, 9), (300, 36)])
def test_an_image_prompt_holds_the_image_tokens(tiny, side, tokens):
  """A 96 px Sokoban board is 3 x 3 merged tokens, a 300 px EZPoints table 6 x 6."""
  model, tokenizer = tiny
  cfg = model.cfg
  ids, images = chat_prompt_with_images(tokenizer, cfg, TINY_VLM_IMAGE_PROCESSOR,
                                        [random_image(side)], "Push the box.")
  assert ids.count(cfg.image_token_id) == tokens
  start = ids.index(cfg.vision_start_token_id)
  assert ids[start + 1:start + 2 + tokens] == [cfg.image_token_id] * tokens + [
      cfg.vision_end_token_id]
  assert images.pixel_values.shape == (tokens * 4, cfg.vision.patch_dim)


def image_prompt(model, tokenizer, side: int = 96):
  """(ids, `ImageInputs`) of one chat message holding a random `side` px image."""
  return chat_prompt_with_images(tokenizer, model.cfg, TINY_VLM_IMAGE_PROCESSOR,
                                 [random_image(side)], "Push the box.")


def test_greedy_sampling_with_an_image_gives_finite_logprobs(tiny):
  model, tokenizer = tiny
  ids, images = image_prompt(model, tokenizer)
  sampler = Sampler.from_model(model, tokenizer=tokenizer, max_cache_len=64)
  out = sampler.generate([ids, ids[-5:]], SamplingParams(max_new_tokens=8, temperature=0.0),
                         images=[images, None])
  for tokens, logprobs in zip(out.tokens, out.logprobs):
    assert 1 <= len(tokens) == len(logprobs) <= 8
    # Random weights: finite, and well short of certainty (the head spreads its mass).
    assert np.isfinite(logprobs).all() and (logprobs < -1).all()


def test_bfloat16_logits_are_finite_and_close_to_float32(tiny):
  model, tokenizer = tiny
  ids, images = image_prompt(model, tokenizer)
  bf16, _ = load_model(TINY_VLM, dtype="bfloat16")
  tokens = np.asarray([ids])
  mask = np.ones_like(tokens)
  positions, _ = multimodal_positions(model.cfg, tokens, mask, images)
  f32_logits, bf16_logits = (np.asarray(_logits(m, tokens, positions, mask, images), np.float32)
                             for m in (model, bf16))
  assert np.isfinite(bf16_logits).all() and np.isfinite(f32_logits).all()
  # Logits of std ~1 (the scaled embedding), equal up to bfloat16's rounding.
  assert 0.5 < f32_logits.std() < 2 and np.abs(bf16_logits - f32_logits).max() < 0.25


@nnx.jit
def _logits(model, tokens, positions, mask, images):
  """`[B, T, V]` logits of `[B, T]` tokens at `[3, B, T]` positions."""
  return model.unembed(model(jnp.asarray(tokens), jnp.asarray(positions),
                             jnp.asarray(mask, bool), images))


def test_generating_twice_writes_the_same_bytes(tmp_path, monkeypatch):
  """Two cache roots, two generations: identical files (fixed seed, no clock, no host).
  Each root borrows the converted SmolLM2 folder, whose tokenizer the tiny VLM extends."""
  smollm2 = embedded_model_dir(SMOLLM2)
  folders = []
  for root in (tmp_path / "a", tmp_path / "b"):
    (root / "models").mkdir(parents=True)
    os.symlink(smollm2, root / "models" / os.path.basename(smollm2))
    monkeypatch.setenv("SEED_JAX_CACHE", str(root))
    folders.append(embedded_model_dir(TINY_VLM))
    assert folders[-1].startswith(str(root))
  assert sorted(os.listdir(folders[0])) == sorted(os.listdir(folders[1])) == sorted(FILES)
  for name in FILES:
    with open(os.path.join(folders[0], name), "rb") as a, open(
        os.path.join(folders[1], name), "rb") as b:
      assert a.read() == b.read(), name


def test_its_config_needs_no_folder(tmp_path, monkeypatch):
  monkeypatch.setenv("SEED_JAX_CACHE", str(tmp_path))
  assert embedded_model_config(TINY_VLM, dtype="bfloat16") == tiny_vlm_config(dtype="bfloat16")
  assert not os.path.exists(tmp_path / "models")


def test_the_run_spec_accepts_the_name():
  assert is_model_name(TINY_VLM)
  spec = ModelSpec(name=TINY_VLM, dtype="bfloat16")
  assert spec.weights_error() is None


def test_unknown_embedded_names_list_both():
  with pytest.raises(ValueError, match=f"{SMOLLM2}, {TINY_VLM}"):
    embedded_model_dir("tiny-random-llava")
