"""Our Flax decoder equals transformers' PyTorch models, family by family."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from seed_jax.models import ModelConfig, export_hf, load_model
from tests.models.conftest import hf_logits

TOL = 1e-4  # max abs logit difference in float32


@nnx.jit
def _forward(model, tokens, positions, mask):
  return model.unembed(model(tokens, positions, mask))


def our_logits(model, tokens, mask):
  """Jitted, as everywhere in the project (XLA:CPU runs bf16 dots only when compiled)."""
  positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
  return np.asarray(_forward(model, jnp.asarray(tokens), jnp.asarray(positions),
                             jnp.asarray(mask, bool)))


def random_batch(vocab, batch=2, length=12, seed=0):
  return np.random.default_rng(seed).integers(3, vocab, size=(batch, length))


def test_logits_match_transformers(tiny_hf_folder):
  family, folder = tiny_hf_folder
  model, _ = load_model(folder)
  tokens = random_batch(model.cfg.vocab_size)
  mask = np.ones_like(tokens)
  diff = np.abs(our_logits(model, tokens, mask) - hf_logits(folder, tokens)).max()
  assert diff <= TOL, f"{family}: max |logit diff| {diff}"


def test_left_padded_rows_match_transformers(tiny_hf_folder):
  family, folder = tiny_hf_folder
  model, _ = load_model(folder)
  tokens = random_batch(model.cfg.vocab_size, seed=1)
  mask = np.ones_like(tokens)
  mask[0, :5] = 0  # row 0 is left-padded
  tokens[0, :5] = 0
  ours, ref = our_logits(model, tokens, mask), hf_logits(folder, tokens, mask)
  diff = np.abs(ours - ref)[mask.astype(bool)].max()
  assert diff <= TOL, f"{family}: max |logit diff| at real tokens {diff}"


def test_config_reads_each_family_flags(tiny_hf_folder):
  family, folder = tiny_hf_folder
  cfg = ModelConfig.from_hf_file(folder)
  assert cfg.qkv_bias == family.startswith("qwen2")
  assert cfg.qk_norm == (family == "qwen3")
  assert cfg.tie_word_embeddings == (family in ("llama3", "qwen2_tied"))
  if family == "llama3":
    assert cfg.rope_scaling_dict["rope_type"] == "llama3"
  if family == "qwen3":
    assert cfg.head_dim == 24


def test_export_loads_in_transformers_with_same_logits(tiny_hf_folder, tmp_path):
  family, folder = tiny_hf_folder
  model, tokenizer = load_model(folder)
  out = export_hf(model, tmp_path / "export", tokenizer)
  tokens = random_batch(model.cfg.vocab_size, seed=2)
  mask = np.ones_like(tokens)
  diff = np.abs(hf_logits(out, tokens) - our_logits(model, tokens, mask)).max()
  assert diff <= TOL, f"{family}: exported model differs by {diff}"
  reloaded, _ = load_model(str(out))
  assert np.array_equal(our_logits(reloaded, tokens, mask), our_logits(model, tokens, mask))


@pytest.mark.parametrize("dtype", ["bfloat16"])
def test_bfloat16_params_stay_close(tiny_hf_folder, dtype):
  _, folder = tiny_hf_folder
  model32, _ = load_model(folder)
  model16, _ = load_model(folder, dtype=dtype)
  assert model16.embed[...].dtype == jnp.bfloat16
  tokens = random_batch(model32.cfg.vocab_size, seed=3)
  mask = np.ones_like(tokens)
  a, b = our_logits(model32, tokens, mask), our_logits(model16, tokens, mask)
  assert np.abs(a - b).max() < 0.1 * np.abs(a).max()
