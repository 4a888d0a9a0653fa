"""Chunked log-probs and entropies against numpy, values and gradients."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seed_jax.seed import logprobs as lp_lib


def _numpy_stats(hidden, weight, targets):
  logits = hidden.astype(np.float64) @ weight.astype(np.float64)
  logz = np.log(np.sum(np.exp(logits - logits.max(-1, keepdims=True)), -1)) + logits.max(-1)
  probs = np.exp(logits - logz[..., None])
  target_lp = np.take_along_axis(logits, targets[..., None], -1)[..., 0] - logz
  entropy = -np.sum(probs * np.log(probs), -1)
  return target_lp, entropy, probs


@pytest.mark.parametrize("length,chunk", [(10, 3), (8, 4), (1, 128), (5, 64)])
def test_values_match_numpy(length, chunk):
  rng = np.random.default_rng(0)
  hidden = rng.normal(size=(2, length, 8)).astype(np.float32)
  weight = rng.normal(size=(8, 33)).astype(np.float32)
  targets = rng.integers(0, 33, size=(2, length)).astype(np.int32)
  got_lp, got_ent = lp_lib.chunked_token_logprobs(
      lambda h: h @ weight, jnp.asarray(hidden), jnp.asarray(targets), chunk)
  want_lp, want_ent, _ = _numpy_stats(hidden, weight, targets)
  np.testing.assert_allclose(got_lp, want_lp, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got_ent, want_ent, rtol=1e-5, atol=1e-5)


def test_gradients_match_numpy():
  """d sum(c * lp) / d logits = c * (onehot - p); d sum(e * H) / d logits = -e * p (log p + H)."""
  rng = np.random.default_rng(1)
  hidden = rng.normal(size=(2, 7, 6)).astype(np.float32)
  weight = rng.normal(size=(6, 19)).astype(np.float32)
  targets = rng.integers(0, 19, size=(2, 7)).astype(np.int32)
  c_lp = rng.normal(size=(2, 7)).astype(np.float32)
  c_ent = rng.normal(size=(2, 7)).astype(np.float32)

  def objective(h, w):
    lp, ent = lp_lib.chunked_token_logprobs(lambda x: x @ w, h, jnp.asarray(targets), 3)
    return jnp.sum(c_lp * lp) + jnp.sum(c_ent * ent)

  g_hidden, g_weight = jax.grad(objective, argnums=(0, 1))(jnp.asarray(hidden), jnp.asarray(weight))
  _, entropy, probs = _numpy_stats(hidden, weight, targets)
  onehot = np.eye(19)[targets]
  d_logits = c_lp[..., None] * (onehot - probs)
  d_logits += -c_ent[..., None] * probs * (np.log(probs) + entropy[..., None])
  np.testing.assert_allclose(g_hidden, d_logits @ weight.T, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(
      g_weight, np.einsum("btd,btv->dv", hidden, d_logits), rtol=1e-4, atol=1e-4)


def test_chunked_never_holds_full_logits():
  """Compiled value-and-grad temp memory stays well below one [B, R, V] float32 tensor."""
  batch, length, dim, vocab = 2, 512, 16, 4096
  full_bytes = batch * length * vocab * 4

  def loss(fn, h, w, t):
    lp, ent = fn(lambda x: x @ w, h, t)
    return jnp.sum(lp) + jnp.sum(ent)

  args = (jax.ShapeDtypeStruct((batch, length, dim), jnp.float32),
          jax.ShapeDtypeStruct((dim, vocab), jnp.float32),
          jax.ShapeDtypeStruct((batch, length), jnp.int32))
  chunked = lambda u, h, t: lp_lib.chunked_token_logprobs(u, h, t, 32)
  temp = {}
  for name, fn in (("chunked", chunked), ("naive", lp_lib.naive_token_logprobs)):
    step = jax.jit(jax.grad(lambda h, w, t, fn=fn: loss(fn, h, w, t), argnums=(0, 1)))
    temp[name] = step.lower(*args).compile().memory_analysis().temp_size_in_bytes
  assert temp["naive"] >= full_bytes
  assert temp["chunked"] < full_bytes / 2, temp


def test_positions_from_mask():
  mask = jnp.asarray([[False, False, True, True, True], [True, True, True, False, False]])
  np.testing.assert_array_equal(
      lp_lib.positions_from_mask(mask), [[0, 0, 0, 1, 2], [0, 1, 2, 2, 2]])
