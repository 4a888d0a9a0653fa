"""Token log-probabilities and entropies at response tokens, chunked over the sequence.

The vocabulary is large (49k to 152k) so the float32 logits of a whole batch, `[B, T, V]`,
would dominate memory. We only need the log-prob of the sampled token and the entropy at
each response position, so the response positions are cut into chunks of `chunk_size`; each
chunk is unembedded, reduced to `[B, C]` numbers and dropped. The chunk body is
rematerialised (`jax.checkpoint`) so the backward pass also holds one chunk of logits at a
time instead of saving all of them as scan residuals.

Row layout shared with the batch builder: every row is `prompt (left-padded to P) ++
response (right-padded to R)`, so `T = P + R` and response token `r` sits at position
`P + r` and is predicted by the hidden state at position `P + r - 1`.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from seed_jax.models.attention import PackedSegments

Array = jax.Array
UnembedFn = Callable[[Array], Array]


def positions_from_mask(attention_mask: Array) -> Array:
  """Positions for left-padded rows: `max(cumsum(mask) - 1, 0)`.

  Args:
    attention_mask: bool `[B, T]`, True at real tokens.
  Returns:
    int32 `[B, T]`.
  """
  return jnp.maximum(jnp.cumsum(attention_mask.astype(jnp.int32), axis=-1) - 1, 0)


def _chunk_stats(unembed: UnembedFn, hidden: Array, targets: Array) -> tuple[Array, Array]:
  """Log-prob of `targets` and entropy for one chunk.

  Args:
    hidden: `[B, C, D]`; targets: int32 `[B, C]`.
  Returns:
    (logprobs, entropy), float32 `[B, C]` each.
  """
  logits = unembed(hidden).astype(jnp.float32)  # [B, C, V]
  logz = jax.nn.logsumexp(logits, axis=-1)
  target_logits = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  probs = jnp.exp(logits - logz[..., None])
  entropy = logz - jnp.sum(probs * logits, axis=-1)
  return target_logits - logz, entropy


def chunked_token_logprobs(
    unembed: UnembedFn,
    hidden: Array,
    targets: Array,
    chunk_size: int = 128,
) -> tuple[Array, Array]:
  """Log-probs of `targets` under `softmax(unembed(hidden))` and the entropy, chunked.

  Args:
    unembed: maps `[B, C, D]` hidden states to `[B, C, V]` logits.
    hidden: `[B, R, D]`, the hidden state that predicts each target.
    targets: int32 `[B, R]`.
    chunk_size: positions per chunk; R is padded up to a multiple of it.
  Returns:
    (logprobs, entropy): float32 `[B, R]` each.
  """
  batch, length, dim = hidden.shape
  chunk = max(1, min(chunk_size, length))
  num_chunks = -(-length // chunk)
  pad = num_chunks * chunk - length
  if pad:
    hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)))
  # [N, B, C, ...]: chunks lead so lax.map walks over them.
  hidden_chunks = hidden.reshape(batch, num_chunks, chunk, dim).swapaxes(0, 1)
  target_chunks = targets.reshape(batch, num_chunks, chunk).swapaxes(0, 1)

  @jax.checkpoint
  def body(args):
    return _chunk_stats(unembed, *args)

  if num_chunks == 1:
    logprobs, entropy = body((hidden_chunks[0], target_chunks[0]))
  else:
    logprobs, entropy = jax.lax.map(body, (hidden_chunks, target_chunks))
    logprobs = logprobs.swapaxes(0, 1).reshape(batch, num_chunks * chunk)
    entropy = entropy.swapaxes(0, 1).reshape(batch, num_chunks * chunk)
  return logprobs[:, :length], entropy[:, :length]


def naive_token_logprobs(unembed: UnembedFn, hidden: Array, targets: Array) -> tuple[Array, Array]:
  """The unchunked version (whole `[B, R, V]` float32 logits): the benchmark's baseline."""
  return _chunk_stats(unembed, hidden, targets)


def response_logprobs(
    model,
    tokens: Array,
    attention_mask: Array,
    response_len: int,
    chunk_size: int = 128,
    positions: Array | None = None,
    row_images: Array | None = None,
) -> tuple[Array, Array]:
  """Run `model` over full rows and score the response tokens.

  Args:
    model: callable `(tokens, positions, attention_mask) -> hidden [B, T, D]` with an
      `unembed(hidden) -> logits` method (seed_jax.models.Transformer).
    tokens: int32 `[B, T]`, rows laid out as prompt (left-padded) ++ response.
    attention_mask: bool `[B, T]`.
    response_len: R, static; the last R positions are the response.
    positions: int32 `[B, 3, T]` multimodal positions of rows with images; None: the
      rows' token positions (`positions_from_mask`).
    row_images: `[B, n, E]` each row's encoded image, placed at its image tokens (a
      `VisionLanguageModel`'s `encode_row_images`).
  Returns:
    (logprobs, entropy): float32 `[B, R]` each.
  """
  if positions is None:
    positions = positions_from_mask(attention_mask)
  else:
    positions = jnp.moveaxis(positions, 1, 0)  # [3, B, T], as the model reads them
  if row_images is None:
    hidden = model(tokens, positions, attention_mask)
  else:
    hidden = model(tokens, positions, attention_mask, row_images=row_images)
  prompt_len = tokens.shape[1] - response_len
  predicting = hidden[:, prompt_len - 1:-1]  # [B, R, D]
  return chunked_token_logprobs(model.unembed, predicting, tokens[:, prompt_len:], chunk_size)


def packed_response_logprobs(
    model,
    tokens: Array,
    segments: Array,
    positions: Array,
    predict: Array,
    chunk_size: int = 128,
    max_segment_len: int | None = None,
) -> tuple[Array, Array]:
  """Run `model` over packed sequences and score their response tokens
  (`seed_jax.seed.packing`).

  Args:
    tokens, segments, positions: int32 `[N, L]`: the turns laid end to end, the segment of
      each token (0 at padding) and its position within its turn.
    predict: int32 `[N, Rp]` the position whose hidden state predicts each response slot;
      the slot's token is the next one.
    max_segment_len: static; no turn is longer (`packing.max_segment_len`), so attention
      reads only that window of keys before each query block. None: the whole row.
  Returns:
    (logprobs, entropy): float32 `[N, Rp]` each (unused slots hold don't-care values).
  """
  hidden = model(tokens, positions, segments if max_segment_len is None
                 else PackedSegments(segments, max_segment_len))
  predicting = jnp.take_along_axis(hidden, predict[..., None], axis=1)  # [N, Rp, D]
  targets = jnp.take_along_axis(tokens, predict + 1, axis=1)
  return chunked_token_logprobs(model.unembed, predicting, targets, chunk_size)
