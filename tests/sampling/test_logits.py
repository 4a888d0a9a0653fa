"""Token choice: greedy, temperature, top-k, top-p, and the raw log-probs."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from seed_jax.sampling.logits import (blocked_cumsum, categorical, sample_tokens,
                                     token_logprobs)


def _keys(n, seed=0):
  return jax.random.split(jax.random.key(seed), n)


def test_token_logprobs_match_numpy():
  logits = np.random.default_rng(0).normal(size=(3, 11)).astype(np.float32) * 3
  tokens = np.array([0, 5, 10])
  expected = logits[np.arange(3), tokens] - np.log(np.exp(logits).sum(-1))
  np.testing.assert_allclose(token_logprobs(jnp.asarray(logits), jnp.asarray(tokens)),
                             expected, atol=1e-5)


def test_greedy_is_argmax_whatever_the_filters():
  logits = jnp.asarray(np.random.default_rng(1).normal(size=(4, 50)), jnp.float32)
  for top_k, use_top_p in ((0, False), (5, False), (0, True), (5, True)):
    got = sample_tokens(_keys(4), logits, jnp.float32(0.0), jnp.float32(0.5), top_k=top_k,
                        use_top_p=use_top_p)
    np.testing.assert_array_equal(got, jnp.argmax(logits, -1))


def _draw(logits_row, n, **kwargs):
  logits = jnp.broadcast_to(jnp.asarray(logits_row, jnp.float32), (n, len(logits_row)))
  fn = jax.jit(lambda k, l: sample_tokens(k, l, jnp.float32(kwargs.get("temperature", 1.0)),
                                          jnp.float32(kwargs.get("top_p", 1.0)),
                                          top_k=kwargs.get("top_k", 0),
                                          use_top_p=kwargs.get("top_p", 1.0) < 1.0))
  return np.asarray(fn(_keys(n), logits))


def test_sampling_follows_the_distribution_and_temperature():
  probs = np.array([0.5, 0.3, 0.15, 0.05])
  logits = np.log(probs)
  counts = np.bincount(_draw(logits, 20000), minlength=4) / 20000
  np.testing.assert_allclose(counts, probs, atol=0.015)
  hot = np.exp(logits / 2.0) / np.exp(logits / 2.0).sum()
  counts = np.bincount(_draw(logits, 20000, temperature=2.0), minlength=4) / 20000
  np.testing.assert_allclose(counts, hot, atol=0.015)


def test_top_k_and_top_p_keep_only_the_head():
  probs = np.array([0.05, 0.4, 0.1, 0.3, 0.15])
  logits = np.log(probs)
  drawn = _draw(logits, 4000, top_k=2)
  assert set(drawn) == {1, 3}
  np.testing.assert_allclose(np.mean(drawn == 1), 0.4 / 0.7, atol=0.03)
  # Nucleus 0.75: 0.4 + 0.3 = 0.7 < 0.75, so the 0.15 token joins; 0.1 and 0.05 do not.
  assert set(_draw(logits, 4000, top_p=0.75)) == {1, 3, 4}
  assert set(_draw(logits, 4000, top_p=0.75, top_k=2)) == {1, 3}
  assert set(_draw(logits, 2000, top_p=0.3)) == {1}  # the top token is always kept


def test_categorical_never_draws_filtered_tokens():
  logits = jnp.asarray([[-jnp.inf, 0.0, -jnp.inf, 1.0, -jnp.inf]] * 4000, jnp.float32)
  drawn = np.asarray(categorical(_keys(4000), logits))
  assert set(drawn) == {1, 3}
  np.testing.assert_allclose(np.mean(drawn == 3), np.e / (1 + np.e), atol=0.03)


def test_top_p_cutoff_matches_the_sorted_rule():
  # A wide nucleus on a flat row: 500 tied tokens (ties at the cut-off are all kept).
  logits = np.full(600, -30.0, np.float32)
  logits[:500] = 0.0
  drawn = _draw(logits, 4000, top_p=0.9)
  assert drawn.max() < 500 and len(set(drawn)) > 300
  # Random rows: the kept set equals the smallest sorted prefix reaching top_p.
  rng = np.random.default_rng(3)
  for top_p in (0.3, 0.8, 0.95):
    row = rng.normal(size=200).astype(np.float32) * 2
    probs = np.exp(row - row.max()) / np.exp(row - row.max()).sum()
    order = np.argsort(-row)
    count = int(np.searchsorted(np.cumsum(probs[order]), top_p) + 1)
    expected = set(order[:count].tolist())
    assert set(_draw(row, 6000, top_p=top_p)) == expected


def test_blocked_cumsum_matches_numpy_for_any_width():
  rng = np.random.default_rng(4)
  for width in (1, 5, 128, 300, 49152):
    values = rng.random((3, width)).astype(np.float32)
    np.testing.assert_allclose(blocked_cumsum(jnp.asarray(values)),
                               np.cumsum(values.astype(np.float64), axis=-1), rtol=1e-5)


def _scan_windows(compiled_hlo: str) -> list[int]:
  """The widest dimension of every reduce-window's window in a compiled program."""
  return [max(int(d) for d in m.group(1).split("x"))
          for m in re.finditer(r"reduce-window\(.*?window=\{size=([0-9x]+)", compiled_hlo)]


def test_a_draw_over_a_vocabulary_sharded_on_devices_scans_it_in_blocks(mesh):
  # The sampler's logits are sharded over "tensor" on the vocabulary; a plain cumsum there
  # compiled to one reduce-window as wide as the vocabulary (O(V^2): 0.5 s a decode step).
  vocab = 49152
  sharding = NamedSharding(mesh.mesh, PartitionSpec(("data", "fsdp"), "tensor"))
  logits = np.random.default_rng(5).normal(size=(8, vocab)).astype(np.float32) * 3
  keys = _keys(8)
  draw = jax.jit(categorical)
  hlo = draw.lower(keys, jax.device_put(logits, sharding)).compile().as_text()
  windows = _scan_windows(hlo)
  assert windows and max(windows) <= vocab // 64, windows
  np.testing.assert_array_equal(draw(keys, jax.device_put(logits, sharding)),
                                draw(keys, logits))
