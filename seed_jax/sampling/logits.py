"""Choosing the next token from logits: greedy, temperature, top-k and top-p (pure, jittable).

Static choices (whether top-k / top-p filtering runs at all, and k) are Python values, so a
plain `temperature`-only call never pays for a sort over the vocabulary; the temperature
and top-p values themselves are traced, so changing them does not recompile.

The log-probability returned for each chosen token is always under the *raw* model
distribution, `log_softmax(logits)` at temperature 1 without filtering: that is what the
training forward computes for the same token, so the PPO ratio `exp(lp_new - lp_old)` is
exactly 1 for unchanged parameters whatever the sampling settings were.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array
_NEG_INF = -jnp.inf


def token_logprobs(logits: Array, tokens: Array) -> Array:
  """`log_softmax(logits)[tokens]` in float32. logits `[B, V]`, tokens `[B]` -> `[B]`."""
  logits = logits.astype(jnp.float32)
  chosen = jnp.take_along_axis(logits, tokens[:, None], axis=-1)[:, 0]
  return chosen - jax.nn.logsumexp(logits, axis=-1)


def _nucleus_keep(sorted_logits: Array, top_p: Array) -> Array:
  """For logits sorted descending `[B, K]`: True for the smallest prefix whose probability
  mass reaches `top_p` (the first token is always kept)."""
  probs = jax.nn.softmax(sorted_logits, axis=-1)
  mass_before = jnp.cumsum(probs, axis=-1) - probs
  return mass_before < top_p


def sample_tokens(keys: Array, logits: Array, temperature: Array, top_p: Array, *,
                  top_k: int = 0, use_top_p: bool = False) -> Array:
  """Draws one token per row.

  Args:
    keys: `[B]` typed PRNG keys, one per row (rows draw independently of batch padding).
    logits: `[B, V]` float32 raw logits.
    temperature: scalar; 0 means greedy (argmax of the raw logits).
    top_p: scalar in (0, 1]; only applied when `use_top_p` (static).
    top_k: static; 0 disables top-k filtering.
    use_top_p: static; False skips the nucleus filter (and its sort) entirely.
  Returns:
    int32 `[B]` token ids.
  """
  logits = logits.astype(jnp.float32)
  # A cond, not a select: greedy decoding then skips the random draw over the vocabulary
  # (the Gumbel noise of `[B, V]` costs more than the rest of the step's sampling).
  return jax.lax.cond(
      temperature > 0,
      lambda: _draw(keys, logits / jnp.where(temperature > 0, temperature, 1.0), top_p,
                    top_k, use_top_p),
      lambda: jnp.argmax(logits, axis=-1).astype(jnp.int32))


def _draw(keys: Array, scaled: Array, top_p: Array, top_k: int, use_top_p: bool) -> Array:
  """Samples from temperature-scaled logits `[B, V]` after the static filters."""
  categorical = jax.vmap(jax.random.categorical)

  if top_k > 0:
    k = min(top_k, scaled.shape[-1])
    top_values, top_ids = jax.lax.top_k(scaled, k)  # sorted descending, [B, k]
    if use_top_p:
      top_values = jnp.where(_nucleus_keep(top_values, top_p), top_values, _NEG_INF)
    choice = categorical(keys, top_values)
    sampled = jnp.take_along_axis(top_ids, choice[:, None], axis=-1)[:, 0]
  elif use_top_p:
    sorted_desc = -jnp.sort(-scaled, axis=-1)
    keep = _nucleus_keep(sorted_desc, top_p)
    # The smallest kept logit is the cut-off; ties at the cut-off are kept as well.
    threshold = jnp.min(jnp.where(keep, sorted_desc, jnp.inf), axis=-1, keepdims=True)
    sampled = categorical(keys, jnp.where(scaled >= threshold, scaled, _NEG_INF))
  else:
    sampled = categorical(keys, scaled)
  return sampled.astype(jnp.int32)
