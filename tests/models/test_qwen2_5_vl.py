"""Qwen2.5-VL (vision tower + Qwen2 text model with M-RoPE) equals transformers'
`Qwen2_5_VLForConditionalGeneration`: logits, greedy generation, the generate command, HF
export; and on text alone it is the plain Qwen2 model.

The checkpoint is tiny and random (every tensor randomised), saved by transformers: a tower
of two blocks (block 0 windowed, block 1 full attention; windows of 2 x 2 merged tokens, so
the images below are cut into clipped windows), merge size 2, a tied head as
Qwen2.5-VL-3B's. Its tokenizer is the embedded SmolLM2 one with Qwen's vision tokens added
and a minimal Qwen2-VL chat template (the folder has none of its own).
"""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from PIL import Image

from seed_jax import plan as plan_lib
from seed_jax.models import ModelConfig, Transformer, export_hf, load_model, shape_config
from seed_jax.models.shapes import shape_hf_dict
from seed_jax.models.tiny_vlm import add_vision_tokens
from seed_jax.models.vision import ImageProcessorConfig, preprocess_images
from seed_jax.models.vision_language import (ImageInputs, VisionLanguageModel, build_model,
                                             chat_prompt_with_images, concat_image_inputs,
                                             expand_image_tokens, multimodal_positions)
from seed_jax.sampling import Sampler, SamplingParams

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from transformers.models.qwen2_vl import (  # pylint: disable=wrong-import-position
    image_processing_pil_qwen2_vl as hf_pil)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOL = 1e-4  # max abs logit difference in float32

# Qwen's vision tokens appended to SmolLM2's 49,152 tokens, in this order
# (seed_jax.models.tiny_vlm.add_vision_tokens, with its Qwen2-VL chat template).
VISION_START, VISION_END, IMAGE, VIDEO = 49152, 49153, 49154, 49155
EOS, PAD = 2, 0  # SmolLM2's <|im_end|>, <|endoftext|>

VISION = dict(depth=2, hidden_size=32, intermediate_size=40, num_heads=2, out_hidden_size=48,
              patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=56,
              fullatt_block_indexes=[1])
TEXT = dict(vocab_size=49156, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, bos_token_id=1, eos_token_id=EOS,
            pad_token_id=PAD, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                               "mrope_section": [2, 3, 7]})
PIXELS = dict(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16)
# Two image sizes: 56 x 84 px -> grid (1, 4, 6), 6 tokens; 84 x 84 -> (1, 6, 6), 9 tokens.
IMAGE_SHAPES = ((56, 84, 3), (84, 84, 3))


def random_image(shape, seed) -> np.ndarray:
  return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, embedded_dir):
  """(folder, transformers model, transformers tokenizer)."""
  torch.manual_seed(0)
  config = transformers.Qwen2_5_VLConfig(
      text_config=TEXT, vision_config=VISION, image_token_id=IMAGE, video_token_id=VIDEO,
      vision_start_token_id=VISION_START, vision_end_token_id=VISION_END,
      tie_word_embeddings=True)
  model = transformers.Qwen2_5_VLForConditionalGeneration(config).eval()
  with torch.no_grad():  # randomise every tensor: a swapped or missing one shows
    for p in model.parameters():
      p.copy_(torch.randn_like(p) * 0.2 + (1.0 if p.ndim == 1 else 0.0))
  folder = tmp_path_factory.mktemp("qwen2_5_vl")
  model.save_pretrained(folder)
  tokenizer = transformers.AutoTokenizer.from_pretrained(embedded_dir)
  assert add_vision_tokens(tokenizer) == [VISION_START, VISION_END, IMAGE, VIDEO]
  tokenizer.save_pretrained(folder)
  hf_pil.Qwen2VLImageProcessorPil(**PIXELS).save_pretrained(folder)
  return str(folder), model, tokenizer


@pytest.fixture(scope="module")
def ours(checkpoint):
  return load_model(checkpoint[0])


@nnx.jit
def _logits(model, tokens, positions, mask, images):
  return model.unembed(model(tokens, positions, mask, images))


def our_logits(model, tokens, mask, images) -> np.ndarray:
  positions, _ = multimodal_positions(model.cfg, tokens, mask, images)
  return np.asarray(_logits(model, jnp.asarray(tokens), jnp.asarray(positions),
                            jnp.asarray(mask, bool), images))


def hf_logits(model, tokens, mask, images: ImageInputs | None) -> np.ndarray:
  kwargs = dict(attention_mask=torch.tensor(mask, dtype=torch.long),
                mm_token_type_ids=torch.tensor((tokens == IMAGE).astype(np.int64)))
  if images is not None:
    kwargs.update(pixel_values=torch.tensor(np.asarray(images.pixel_values)),
                  image_grid_thw=torch.tensor(images.grids))
  with torch.no_grad():
    return model(torch.tensor(tokens), **kwargs).logits.float().numpy()


def left_pad(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
  length = max(map(len, rows))
  tokens = np.full((len(rows), length), PAD, np.int64)
  mask = np.zeros((len(rows), length), np.int64)
  for i, row in enumerate(rows):
    tokens[i, length - len(row):], mask[i, length - len(row):] = row, 1
  return tokens, mask


def image_batch(seed=0):
  """Two prompts of different images and lengths (row 0 left-padded) and their images."""
  processor = ImageProcessorConfig(**PIXELS)
  per_row = [ImageInputs(*preprocess_images([random_image(shape, seed + i)], processor))
             for i, shape in enumerate(IMAGE_SHAPES)]
  rng = np.random.default_rng(seed)
  text = lambda n: rng.integers(10, 1000, n).tolist()
  image = lambda grid: [VISION_START] + [IMAGE] * (grid[1] * grid[2] // 4) + [VISION_END]
  rows = [text(3) + image(per_row[0].grids[0]) + text(4),
          text(2) + image(per_row[1].grids[0]) + text(6)]
  return rows, per_row


def test_config_reads_the_vision_language_fields(checkpoint):
  cfg = ModelConfig.from_hf_file(checkpoint[0])
  assert (cfg.model_type, cfg.qkv_bias, cfg.o_bias, cfg.tie_word_embeddings) == (
      "qwen2_5_vl", True, False, True)
  assert cfg.mrope_section == (2, 3, 7)
  assert (cfg.image_token_id, cfg.vision_start_token_id, cfg.vision_end_token_id) == (
      IMAGE, VISION_START, VISION_END)
  assert (cfg.vision.depth, cfg.vision.fullatt_block_indexes, cfg.vision.window_size) == (
      2, (1,), 56)
  bf16 = ModelConfig.from_hf_file(checkpoint[0], dtype="bfloat16", remat="none")
  assert (bf16.vision.dtype, bf16.vision.param_dtype, bf16.vision.remat) == (
      "bfloat16", "float32", "none")


def test_logits_with_images_match_transformers(checkpoint, ours):
  """Two images of different sizes, one row left-padded: equal at every real token."""
  _, hf_model, _ = checkpoint
  model, _ = ours
  assert isinstance(model, VisionLanguageModel)
  rows, per_row = image_batch()
  tokens, mask = left_pad(rows)
  images = concat_image_inputs(per_row)
  diff = np.abs(our_logits(model, tokens, mask, images) - hf_logits(hf_model, tokens, mask,
                                                                     images))
  assert diff[mask.astype(bool)].max() <= TOL


def test_text_only_input_is_the_plain_qwen2_model(checkpoint, ours):
  """Without images, M-RoPE's three equal positions are RoPE: the model equals a `qwen2`
  Transformer holding the same text weights (and transformers)."""
  _, hf_model, _ = checkpoint
  model, _ = ours
  tokens, mask = left_pad([list(range(20, 32)), list(range(40, 47))])
  vlm = our_logits(model, tokens, mask, None)
  qwen2_cfg = model.cfg.replace(model_type="qwen2", vision=None, mrope_section=None,
                                image_token_id=None)
  qwen2 = Transformer(qwen2_cfg, rngs=nnx.Rngs(0))
  nnx.update(qwen2, nnx.state(model.text))
  positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
  plain = np.asarray(_logits_text(qwen2, jnp.asarray(tokens), jnp.asarray(positions),
                                  jnp.asarray(mask, bool)))
  real = mask.astype(bool)
  assert np.abs(vlm - plain)[real].max() <= 1e-5
  assert np.abs(vlm - hf_logits(hf_model, tokens, mask, None))[real].max() <= TOL


@nnx.jit
def _logits_text(model, tokens, positions, mask):
  return model.unembed(model(tokens, positions, mask))


def test_greedy_sampler_matches_transformers_generate(checkpoint, ours):
  """A batch of two prompts with images of different sizes and one without: the same
  greedy tokens as transformers' `generate` (whose decode positions continue from its
  rope deltas too)."""
  _, hf_model, _ = checkpoint
  model, tokenizer = ours
  rows, per_row = image_batch(seed=1)
  rows.append(list(range(60, 75)))
  per_row.append(None)
  new_tokens = 8
  sampler = Sampler.from_model(model, tokenizer=tokenizer, max_cache_len=64)
  out = sampler.generate(rows, SamplingParams(max_new_tokens=new_tokens, temperature=0.0),
                         images=per_row)
  tokens, mask = left_pad(rows)
  images = concat_image_inputs(per_row)
  with torch.no_grad():
    generated = hf_model.generate(
        torch.tensor(tokens), attention_mask=torch.tensor(mask),
        mm_token_type_ids=torch.tensor((tokens == IMAGE).astype(np.int64)),
        pixel_values=torch.tensor(images.pixel_values), image_grid_thw=torch.tensor(
            images.grids), max_new_tokens=new_tokens, do_sample=False, eos_token_id=EOS,
        pad_token_id=PAD)[:, tokens.shape[1]:].numpy()
  for row, ours_row in enumerate(out.tokens):
    expected = generated[row].tolist()
    if EOS in expected:
      expected = expected[:expected.index(EOS) + 1]
    assert ours_row == expected, f"row {row}"


def test_generate_command_with_an_image_matches_transformers(checkpoint, tmp_path):
  """`python -m seed_jax.generate --image`: the chat prompt transformers' processor builds
  (template with one placeholder per image, expanded to the image's token count; the
  processor itself needs a video processor, i.e. torchvision, so its steps are repeated
  here with transformers' tokenizer and image processor), the same greedy text."""
  folder, hf_model, hf_tokenizer = checkpoint
  image_path = tmp_path / "image.png"
  Image.fromarray(random_image((70, 50, 3), seed=7)).save(image_path)
  prompt, new_tokens = "What is in the picture?", 6
  messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
  text = hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
  pixels = hf_pil.Qwen2VLImageProcessorPil(**PIXELS)([np.asarray(Image.open(image_path))],
                                                     return_tensors="pt")
  count = int(pixels["image_grid_thw"][0].prod()) // 4
  text = text.replace("<|image_pad|>", "<|image_pad|>" * count)
  input_ids = hf_tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
  with torch.no_grad():
    generated = hf_model.generate(
        input_ids, mm_token_type_ids=(input_ids == IMAGE).long(), max_new_tokens=new_tokens,
        do_sample=False, eos_token_id=EOS, pad_token_id=PAD, **pixels)[0, input_ids.shape[1]:]
  expected = hf_tokenizer.decode(generated, skip_special_tokens=True)

  result = subprocess.run(
      [sys.executable, "-m", "seed_jax.generate", f"--model={folder}", f"--image={image_path}",
       f"--prompt={prompt}", f"--max_new_tokens={new_tokens}", "--temperature=0"],
      cwd=REPO, capture_output=True, text=True, timeout=600,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout == expected + "\n"


def test_chat_prompt_with_images_is_what_transformers_builds(checkpoint, ours):
  folder, _, hf_tokenizer = checkpoint
  model, tokenizer = ours
  image = random_image((70, 50, 3), seed=3)
  ids, images = chat_prompt_with_images(tokenizer, model.cfg,
                                        ImageProcessorConfig.from_file(folder), [image], "Hi")
  messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]}]
  text = hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
  text = text.replace("<|image_pad|>", "<|image_pad|>" * (np.prod(images.grids[0]) // 4))
  assert ids == hf_tokenizer(text, add_special_tokens=False)["input_ids"]


def test_export_loads_in_transformers_with_the_same_logits(checkpoint, ours, tmp_path):
  """The whole checkpoint (tower, merger, text model, tied head) and the image processor's
  settings, which transformers reads back as they were."""
  folder = checkpoint[0]
  model, tokenizer = ours
  processor = ImageProcessorConfig.from_file(folder)
  out = export_hf(model, tmp_path / "export", tokenizer, image_processor=processor)
  assert ImageProcessorConfig.from_file(out) == processor
  assert (hf_pil.Qwen2VLImageProcessorPil.from_pretrained(out).to_dict() ==
          hf_pil.Qwen2VLImageProcessorPil.from_pretrained(folder).to_dict())
  reference = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(
      out, dtype=torch.float32).eval()
  rows, per_row = image_batch(seed=2)
  tokens, mask = left_pad(rows)
  images = concat_image_inputs(per_row)
  mine = our_logits(model, tokens, mask, images)
  diff = np.abs(hf_logits(reference, tokens, mask, images) - mine)
  assert diff[mask.astype(bool)].max() <= TOL
  reloaded, _ = load_model(str(out))
  assert reloaded.cfg == model.cfg
  assert np.array_equal(our_logits(reloaded, tokens, mask, images), mine)


def test_image_tokens_and_grids_that_disagree_are_named(ours):
  model, _ = ours
  rows, per_row = image_batch()
  tokens, mask = left_pad(rows)
  with pytest.raises(ValueError, match=r"hold 15 image tokens .* make 6 \(\[6\] per image\)"):
    multimodal_positions(model.cfg, tokens, mask, per_row[0])
  with pytest.raises(ValueError, match="2 image placeholders .* for 1 image"):
    expand_image_tokens([IMAGE, 7, IMAGE], [4], IMAGE)
  with pytest.raises(ValueError, match=r"grids \(\(1, 4, 6\),\) need 24 rows"):
    ImageInputs(np.zeros((20, 1176), np.float32), ((1, 4, 6),))
  sampler, sampling = Sampler.from_model(model), SamplingParams(max_new_tokens=1)
  with pytest.raises(ValueError, match="2 entries for 1 prompts"):
    sampler.generate([rows[0]], sampling, images=per_row)
  with pytest.raises(ValueError, match=f"hold image tokens \\(id {IMAGE}\\) but no images"):
    sampler.generate([rows[0]], sampling)


# Qwen2.5-VL-3B-Instruct's safetensors: Qwen2.5-3B's 3,085,938,688 (tied head) + the
# tower's 668,684,288 (patch embedding 1,505,280, 32 blocks of 19,702,200, merger 36,708,608).
PUBLISHED_3B = 3_754_622_976


def test_the_3b_shape_counts_the_published_parameters():
  cfg = shape_config("qwen2.5-vl-3b-instruct")
  assert (cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.vocab_size,
          cfg.intermediate_size, cfg.tie_word_embeddings, cfg.rope_theta, cfg.mrope_section) == (
              2048, 36, 16, 2, 151936, 11008, True, 1e6, (16, 24, 24))
  assert (cfg.vision.depth, cfg.vision.hidden_size, cfg.vision.out_hidden_size,
          cfg.vision.fullatt_block_indexes) == (32, 1280, 2048, (7, 15, 23, 31))
  model = nnx.eval_shape(lambda: build_model(cfg, nnx.Rngs(0)))
  count = lambda module: sum(x.size for x in jax.tree.leaves(nnx.state(module, nnx.Param)))
  assert (count(model.text), count(model.tower)) == (3_085_938_688, 668_684_288)
  assert count(model) == PUBLISHED_3B
  assert plan_lib._param_counts(cfg) == (PUBLISHED_3B, 0)  # pylint: disable=protected-access
  hf_config = transformers.AutoConfig.for_model(**shape_hf_dict("qwen2.5-vl-3b-instruct"))
  with torch.device("meta"):
    reference = transformers.Qwen2_5_VLForConditionalGeneration(hf_config)
  assert sum(p.numel() for p in reference.parameters()) == PUBLISHED_3B
