"""Grouped-query attention: the causal full-sequence form (training, scoring, prefill) and
the cache forms (decode, multi-token extension).

`causal_attention` walks the queries in blocks, each against the keys up to its own end,
which halves the score work of a long sequence. Its backward pass is written out (as in
flash attention): it recomputes each block's probabilities from the saved log-sum-exp
and writes the key and value gradients into prefix slices of one accumulator. Autodiff of
the blocked loop instead pads every block's gradient to the full length and sums them,
which cost ~0.2 s per layer at 8 x 768 tokens on XLA:CPU, more than the block's matmuls.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from seed_jax.models.matmul import canonical_einsum

_NEG = jnp.finfo(jnp.float32).min


def attend(q: jax.Array, k: jax.Array, v: jax.Array, q_slots: jax.Array,
           kv_mask: jax.Array) -> jax.Array:
  """Grouped-query attention over key slots.

  Args:
    q: `[B, T, H, D]` queries. k, v: `[B, KV, S, D]` keys and values by slot.
    q_slots: `[T]` the slot index of each query; it sees key slots `<= q_slot` (causal).
    kv_mask: `[B, S]` True where a key slot holds a real token.
  Returns:
    `[B, T, H, D]` in q's dtype. Scores and softmax are float32.
  """
  b, t, h, d = q.shape
  kv = k.shape[1]
  q = q.reshape(b, t, kv, h // kv, d)
  scores = jnp.einsum("btkgd,bksd->bkgts", q, k, preferred_element_type=jnp.float32)
  scores = scores / math.sqrt(d)
  slots = jnp.arange(k.shape[2])
  visible = (slots[None, :] <= q_slots[:, None])[None] & kv_mask[:, None, :]  # [B, T, S]
  scores = jnp.where(visible[:, None, None], scores, _NEG)
  probs = jax.nn.softmax(scores, axis=-1)
  # Output in the operands' batch order, then transposed: XLA:CPU lacks some bf16 x bf16 ->
  # f32 dots with a transposed output ("btkgd" raised UNIMPLEMENTED for a decode step).
  out = jnp.einsum("bkgts,bksd->bkgtd", probs.astype(v.dtype), v,
                   preferred_element_type=jnp.float32)
  return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, d).astype(q.dtype)


def attend_decode(q: jax.Array, k: jax.Array, v: jax.Array, kv_mask: jax.Array) -> jax.Array:
  """One query per row (a decode step) over the cache: `attend` with T = 1 written as
  `[B, KV, G, D]` contractions, which XLA:CPU runs ~2x faster than the 5-D form.

  The query sees exactly the slots `kv_mask` marks: in a decode step every written slot is
  in its past, wherever it sits, so no slot order is assumed (the continuous-batching
  engine writes its cache as a ring, `seed_jax.sampling.engine`). Keys carry their
  positions through RoPE.

  Args:
    q: `[B, 1, H, D]`. k, v: `[B, KV, S, D]`. kv_mask: `[B, S]`.
  Returns:
    `[B, 1, H, D]` in q's dtype.
  """
  b, _, h, d = q.shape
  kv = k.shape[1]
  q = q.reshape(b, kv, h // kv, d)
  scores = jnp.einsum("bkgd,bksd->bkgs", q, k, preferred_element_type=jnp.float32)
  scores = scores / math.sqrt(d)
  scores = jnp.where(kv_mask[:, None, None], scores, _NEG)
  probs = jax.nn.softmax(scores, axis=-1)
  out = jnp.einsum("bkgs,bksd->bkgd", probs.astype(v.dtype), v,
                   preferred_element_type=jnp.float32)
  return out.reshape(b, 1, h, d).astype(q.dtype)


@functools.partial(jax.tree_util.register_dataclass, data_fields=["ids"],
                   meta_fields=["max_len"])
@dataclasses.dataclass(frozen=True)
class PackedSegments:
  """Segment ids `[B, T]` of packed rows (0 at padding) with a static bound on a segment's
  length: what `causal_attention` takes as `window`. It passes through the model where an
  attention mask does (`Transformer.__call__`), so the bound reaches every layer."""
  ids: jax.Array
  max_len: int


_MIN_BLOCK, _MAX_BLOCKS = 64, 32


def query_block(t: int) -> int:
  """Queries per block for a sequence of `t`: 64, or more for sequences over 2,048 so that
  there are at most 32 blocks. The blocks are unrolled (each sees a different key
  length), so their count bounds the program's size and compile time: 16,896-token SFT
  rows in blocks of 64 made 264 blocks and a TPU compile of over a quarter of an hour."""
  per_block = -(-t // _MAX_BLOCKS)
  return max(_MIN_BLOCK, -(-per_block // _MIN_BLOCK) * _MIN_BLOCK)


def causal_attention(q: jax.Array, k: jax.Array, v: jax.Array,
                     segments: jax.Array | PackedSegments, block: int | None = None,
                     window: int | None = None) -> jax.Array:
  """Causal attention of T queries over the same T keys (the full forward, and prefill
  into an empty cache), in query blocks of `block` (default `query_block(T)`; see the
  module docstring).

  Args:
    q: `[B, T, H, D]`. k, v: `[B, KV, T, D]`.
    segments: `[B, T]`, which sequence each token belongs to, 0 at padding: a query sees
      the earlier keys of its own segment. A bool mask (True at real tokens) is one
      segment per row; int32 segment ids let several sequences share a packed row;
      `PackedSegments` carry their `window` with them.
    window: static; no segment is longer than this many tokens (in a packed row every
      turn is at most the row layout's width), so a query block reads only the keys from
      `window - 1` before its first query on: a row of T tokens then costs about
      `T * (window + block)` scores instead of the whole `T^2 / 2` triangle. None: every
      earlier key (one segment a row, or no known bound).
  Returns:
    `[B, T, H, D]` in q's dtype. Scores and softmax are float32; the matmuls run in q's
    dtype with float32 accumulation, in the backward pass too.
  """
  if isinstance(segments, PackedSegments):
    segments, window = segments.ids, segments.max_len
  b, t, h, d = q.shape
  kv = k.shape[1]
  q = q.reshape(b, t, kv, h // kv, d).transpose(0, 2, 3, 1, 4)  # [B, KV, G, T, D]
  out = _blocked_attention(q, k, v, segments.astype(jnp.int32), block or query_block(t),
                           window)
  return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, d).astype(q.dtype)


def _block_scores(q_block: jax.Array, k: jax.Array, segments: jax.Array,
                  span: tuple[int, int, int]) -> tuple[jax.Array, jax.Array]:
  """Scaled scores `[B, KV, G, Tb, Sb]` of queries `start:end` over keys `first:end`
  (`span` = (first, start, end), Sb = end - first), and where they are visible
  `[B, 1, 1, Tb, Sb]`: earlier keys of the query's own segment."""
  first, start, end = span
  scores = canonical_einsum("bkgtd", "bksd", "bkgts", q_block, k[:, :, first:end])
  scores = scores / math.sqrt(q_block.shape[-1])
  causal = jnp.arange(first, end)[None, :] <= jnp.arange(start, end)[:, None]  # [Tb, Sb]
  key_segments = segments[:, None, first:end]  # [B, 1, Sb]
  same = (segments[:, start:end, None] == key_segments) & (key_segments > 0)
  visible = (causal[None] & same)[:, None, None]
  return jnp.where(visible, scores, _NEG), visible


def _blocks(t: int, block: int, window: int | None) -> list[tuple[int, int, int]]:
  """(first key, first query, end) of each query block: a block's queries read the keys
  `first:end`, from `window - 1` before its first query (0 without a window)."""
  return [(0 if window is None else max(0, start - window + 1), start, min(t, start + block))
          for start in range(0, t, block)]


def _attention_forward(q, k, v, segments, block, window):
  """Returns (out float32 `[B, KV, G, T, D]`, log-sum-exp float32 `[B, KV, G, T]`)."""
  outs, lses = [], []
  for first, start, end in _blocks(q.shape[3], block, window):
    q_block = q[:, :, :, start:end]
    if outs:
      # Orders the blocks, as in the backward pass: unordered, the TPU scheduler computed
      # the blocks' scores side by side (one layer of the embedded model's prefill, 16 x
      # 4,096 tokens on v5e:2x2: 1.27 GiB of temporaries instead of 0.10).
      q_block, outs[-1] = jax.lax.optimization_barrier((q_block, outs[-1]))
    scores, _ = _block_scores(q_block, k, segments, (first, start, end))
    top = jnp.max(scores, axis=-1, keepdims=True)
    weights = jnp.exp(scores - top)
    total = jnp.sum(weights, axis=-1, keepdims=True)
    # Normalising the `[.., D]` output instead of the `[.., S]` weights: less work.
    out = canonical_einsum("bkgts", "bksd", "bkgtd", weights.astype(v.dtype),
                           v[:, :, first:end])
    outs.append(out / total)
    lses.append((top + jnp.log(total))[..., 0])
  return jnp.concatenate(outs, axis=3), jnp.concatenate(lses, axis=3)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _blocked_attention(q, k, v, segments, block, window):
  return _attention_forward(q, k, v, segments, block, window)[0]


def _blocked_attention_fwd(q, k, v, segments, block, window):
  out, lse = _attention_forward(q, k, v, segments, block, window)
  return out, (q, k, v, segments, out, lse)


def _add_at(acc: jax.Array, update: jax.Array, first: int) -> jax.Array:
  """`acc[:, :, first:first + n] += update` for `update [B, KV, n, D]`, in place."""
  n = update.shape[2]
  return jax.lax.dynamic_update_slice_in_dim(acc, acc[:, :, first:first + n] + update, first,
                                             axis=2)


def _blocked_attention_bwd(block, window, residuals, g):
  q, k, v, segments, out, lse = residuals
  dtype = q.dtype
  g_c = g.astype(dtype)
  delta = jnp.sum(g * out, axis=-1)  # [B, KV, G, T]: rowsum(dO * O)
  scale = 1.0 / math.sqrt(q.shape[-1])
  dq_blocks = []
  dk = jnp.zeros(k.shape, jnp.float32)
  dv = jnp.zeros(v.shape, jnp.float32)
  for first, start, end in _blocks(q.shape[3], block, window):
    # The barrier orders the blocks: this block's scores are computed only after the last
    # block's gradients are added. Unordered, the TPU scheduler computed the blocks'
    # probabilities side by side: 12.7 GiB of temporaries for one 16k-token row of
    # Qwen2.5-1.5B's attention, instead of one block's.
    dk, dv, q_block, g_block = jax.lax.optimization_barrier(
        (dk, dv, q[:, :, :, start:end], g_c[:, :, :, start:end]))
    scores, visible = _block_scores(q_block, k, segments, (first, start, end))
    probs = jnp.where(visible, jnp.exp(scores - lse[:, :, :, start:end, None]), 0.0)
    dv = _add_at(dv, canonical_einsum("bkgts", "bkgtd", "bksd", probs.astype(dtype),
                                      g_block), first)
    dprobs = canonical_einsum("bkgtd", "bksd", "bkgts", g_block, v[:, :, first:end])
    dscores = (probs * (dprobs - delta[:, :, :, start:end, None]) * scale).astype(dtype)
    dq_blocks.append(canonical_einsum("bkgts", "bksd", "bkgtd", dscores,
                                      k[:, :, first:end]))
    dk = _add_at(dk, canonical_einsum("bkgts", "bkgtd", "bksd", dscores, q_block), first)
  dq = jnp.concatenate(dq_blocks, axis=3)
  return dq.astype(dtype), dk.astype(k.dtype), dv.astype(v.dtype), None


_blocked_attention.defvjp(_blocked_attention_fwd, _blocked_attention_bwd)
