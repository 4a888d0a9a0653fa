"""Blocked causal attention against a plain masked softmax, values and gradients."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seed_jax.models.attention import causal_attention


def _inputs(dtype=jnp.float32, b=2, t=10, h=4, kv=2, d=8, seed=0):
  rng = np.random.default_rng(seed)
  q = jnp.asarray(rng.normal(size=(b, t, h, d)), dtype)
  k = jnp.asarray(rng.normal(size=(b, kv, t, d)), dtype)
  v = jnp.asarray(rng.normal(size=(b, kv, t, d)), dtype)
  mask = np.ones((b, t), bool)
  mask[1, :3] = False  # row 1 is left-padded
  return q, k, v, jnp.asarray(mask)


def _reference(q, k, v, mask):
  """Full `[T, T]` masked softmax per head, each query head on its KV group, float32."""
  b, t, h, d = q.shape
  group = h // k.shape[1]
  k = jnp.repeat(k.astype(jnp.float32), group, axis=1)  # [B, H, T, D]
  v = jnp.repeat(v.astype(jnp.float32), group, axis=1)
  scores = jnp.einsum("bthd,bhsd->bhts", q.astype(jnp.float32), k) / np.sqrt(d)
  visible = jnp.tril(jnp.ones((t, t), bool))[None, None] & mask[:, None, None, :]
  probs = jax.nn.softmax(jnp.where(visible, scores, -1e30), axis=-1)
  return jnp.einsum("bhts,bhsd->bthd", probs, v)


def _real_rows(x, mask):
  return np.asarray(x, np.float32)[np.asarray(mask)]  # padding queries are don't-care


@pytest.mark.parametrize("block", [1, 4, 64])
def test_blocked_attention_equals_full_softmax(block):
  q, k, v, mask = _inputs()
  got = jax.jit(lambda *a: causal_attention(*a, block=block))(q, k, v, mask)
  np.testing.assert_allclose(_real_rows(got, mask), _real_rows(_reference(q, k, v, mask), mask),
                             atol=1e-5)


@pytest.mark.parametrize("block", [3, 64])
def test_blocked_attention_gradients_equal_full_softmax_gradients(block):
  q, k, v, mask = _inputs(seed=1)
  weights = jnp.asarray(np.random.default_rng(2).normal(size=q.shape), jnp.float32)
  weights = weights * mask[:, :, None, None]  # the loss never reads padding queries

  def loss(fn):
    return lambda q, k, v: jnp.sum(fn(q, k, v, mask).astype(jnp.float32) * weights)

  got = jax.jit(jax.grad(loss(lambda *a: causal_attention(*a, block=block)),
                         argnums=(0, 1, 2)))(q, k, v)
  want = jax.grad(loss(_reference), argnums=(0, 1, 2))(q, k, v)
  for name, g, w in zip("qkv", got, want):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=2e-5, err_msg=name)


def test_bfloat16_attention_gradients_stay_close_to_float32():
  q, k, v, mask = _inputs(jnp.bfloat16, t=32, seed=3)
  loss = lambda fn: (lambda q, k, v: jnp.sum(fn(q, k, v, mask).astype(jnp.float32) ** 2))
  got = jax.jit(jax.grad(loss(lambda *a: causal_attention(*a, block=8)),
                         argnums=(0, 1, 2)))(q, k, v)
  want = jax.grad(loss(_reference), argnums=(0, 1, 2))(
      *(x.astype(jnp.float32) for x in (q, k, v)))
  for name, g, w in zip("qkv", got, want):
    assert g.dtype == jnp.bfloat16
    scale = float(jnp.max(jnp.abs(w)))
    np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w), atol=0.03 * scale,
                               err_msg=name)


@pytest.mark.parametrize("t,block", [(16, 64), (768, 64), (2048, 64), (2560, 128),
                                     (16896, 576)])
def test_long_sequences_use_at_most_32_query_blocks(t, block):
  from seed_jax.models.attention import query_block
  assert query_block(t) == block
  assert -(-t // query_block(t)) <= 32


@pytest.mark.slow
def test_the_tpu_backward_holds_one_block_of_probabilities_at_a_time():
  """Compiled for a v5e chip (libtpu, no TPU needed): Qwen2.5-1.5B's heads over one
  2,048-token row (32 blocks). Without an order between the blocks the TPU scheduler
  computed their probabilities side by side: 0.82 GiB of temporaries at 4,096 tokens,
  12.7 GiB at 16k."""
  from seed_jax.models.attention import query_block  # pylint: disable=import-outside-toplevel
  from seed_jax.planning import targets  # pylint: disable=import-outside-toplevel
  t, h, kv, d = 2048, 12, 2, 128
  device = jax.sharding.SingleDeviceSharding(targets.topology_target("v5e:2x2").devices[0])
  shapes = [((1, t, h, d), jnp.bfloat16), ((1, kv, t, d), jnp.bfloat16),
            ((1, kv, t, d), jnp.bfloat16), ((1, t), jnp.bool_)]
  args = [jax.ShapeDtypeStruct(s, dt, sharding=device) for s, dt in shapes]
  loss = lambda q, k, v, mask: causal_attention(q, k, v, mask).astype(jnp.float32).sum()
  compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(*args).compile()
  block_probs = h * query_block(t) * t * 4  # one block's float32 probabilities: 6 MiB
  assert compiled.memory_analysis().temp_size_in_bytes < 4 * block_probs



@pytest.mark.parametrize("block, window", [(4, None), (64, None), (4, 6), (2, 7), (64, 6)])
def test_a_packed_row_attends_like_its_segments_apart(block, window):
  """Two sequences (6 and 5 tokens) and 2 pads in one row with segment ids 1, 2, 0: each
  token's output and the gradients equal those of its sequence attended on its own, also
  when each query block reads only the keys of a window as long as the longest segment."""
  rng = np.random.default_rng(4)
  lengths, t, h, kv, d = (6, 5), 13, 4, 2, 8
  q = jnp.asarray(rng.normal(size=(1, t, h, d)), jnp.float32)
  k = jnp.asarray(rng.normal(size=(1, kv, t, d)), jnp.float32)
  v = jnp.asarray(rng.normal(size=(1, kv, t, d)), jnp.float32)
  segments = jnp.asarray([[1] * 6 + [2] * 5 + [0] * 2], jnp.int32)
  weights = jnp.asarray(rng.normal(size=q.shape), jnp.float32) * (segments > 0)[..., None, None]

  def packed_loss(q, k, v):
    return jnp.sum(causal_attention(q, k, v, segments, block=block, window=window) * weights)

  def apart_loss(q, k, v):
    total, start = 0.0, 0
    for n in lengths:
      part = slice(start, start + n)
      out = _reference(q[:, part], k[:, :, part], v[:, :, part], jnp.ones((1, n), bool))
      total += jnp.sum(out * weights[:, part])
      start += n
    return total

  np.testing.assert_allclose(jax.jit(packed_loss)(q, k, v), apart_loss(q, k, v), rtol=1e-5)
  got = jax.jit(jax.grad(packed_loss, argnums=(0, 1, 2)))(q, k, v)
  want = jax.grad(apart_loss, argnums=(0, 1, 2))(q, k, v)
  for name, g, w in zip("qkv", got, want):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=2e-5, err_msg=name)


@pytest.mark.parametrize("block, window", [(16, 24), (16, 1), (64, 100)])
def test_with_a_window_a_query_block_scores_only_the_keys_its_segment_can_hold(block, window):
  """The score matrices of the forward and backward passes: every block's keys span at
  most `block + window - 1` (the block's own queries, and `window - 1` before the first)."""
  t = 96
  q, k, v, _ = _inputs(b=2, t=t)
  segments = jnp.asarray(np.tile(np.arange(t) // window + 1, (2, 1)), jnp.int32)
  loss = lambda q, k, v: jnp.sum(causal_attention(q, k, v, segments, block=block,
                                                  window=window))
  jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
  key_spans = [eqn.outvars[0].aval.shape[-1] for eqn in _equations(jaxpr.jaxpr)
               if eqn.primitive.name == "dot_general" and eqn.outvars[0].aval.ndim == 5
               and eqn.outvars[0].aval.shape[-2] <= block  # [B, KV, G, Tb, Sb] scores
               and eqn.outvars[0].aval.shape[-1] != q.shape[-1]]
  assert key_spans and max(key_spans) == min(t, block + window - 1)


def _equations(jaxpr):
  """Every equation of a jaxpr, those of its sub-jaxprs (custom_vjp, pjit) included."""
  for eqn in jaxpr.eqns:
    yield eqn
    for value in eqn.params.values():
      for sub in (value if isinstance(value, (list, tuple)) else (value,)):
        inner = getattr(sub, "jaxpr", None)
        if inner is not None:
          yield from _equations(getattr(inner, "jaxpr", inner))
