"""The decoder family (Llama 3 / SmolLM2, Qwen2 / 2.5, Qwen3) as Flax NNX modules.

Weights keep Hugging Face's layout (`[out, in]` for projections) so that import and export
are plain copies and matmuls contract the inner dimension. Every parameter carries
`logical_axes` metadata that `seed_jax.parallel` maps to mesh axes; the main activations are
constrained by the same logical names.

Two entry points share every layer:
  * `Transformer.__call__(tokens, positions, attention_mask)`: a full forward without a
    cache (training, scoring, reference). Attention is causal over the sequence and never
    attends to padding keys.
  * `Transformer.forward_with_cache(tokens, positions, kv_mask, cache, cache_index)`:
    writes the new keys/values at slots `cache_index + [0, T)` of a per-layer cache and
    attends to every earlier slot marked valid by `kv_mask` (prefill and decode).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from seed_jax.models.config import ModelConfig
from seed_jax.parallel.rules import constrain

KVCache = list[dict[str, jax.Array]]  # per layer {"k", "v"}: [B, KV, S, head_dim]


def _matmul(x: jax.Array, w: jax.Array) -> jax.Array:
  """`x [..., in] @ w[out, in]^T` with float32 accumulation, result in x's dtype."""
  y = jnp.einsum("...i,oi->...o", x, w.astype(x.dtype), preferred_element_type=jnp.float32)
  return y.astype(x.dtype)


class Linear(nnx.Module):
  """A projection stored as HF does: kernel `[out, in]`, optional bias `[out]`."""

  def __init__(self, in_dim: int, out_dim: int, axes: tuple[str, str], *, bias: bool,
               param_dtype, rngs: nnx.Rngs):
    init = nnx.initializers.normal(stddev=1.0 / math.sqrt(in_dim))
    self.kernel = nnx.Param(init(rngs.params(), (out_dim, in_dim), param_dtype),
                            logical_axes=axes)
    self.bias = (nnx.Param(jnp.zeros((out_dim,), param_dtype), logical_axes=(axes[0],))
                 if bias else None)

  def __call__(self, x: jax.Array) -> jax.Array:
    y = _matmul(x, self.kernel[...])
    if self.bias is not None:
      y = y + self.bias[...].astype(y.dtype)
    return y


class RMSNorm(nnx.Module):
  """RMSNorm computed in float32, as the reference implementations do."""

  def __init__(self, dim: int, eps: float, param_dtype, axis: str = "norm"):
    self.scale = nnx.Param(jnp.ones((dim,), param_dtype), logical_axes=(axis,))
    self.eps = eps

  def __call__(self, x: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return (x32 * self.scale[...].astype(jnp.float32)).astype(x.dtype)


def rope_inverse_frequencies(cfg: ModelConfig) -> jax.Array:
  """Per-pair inverse frequencies `[head_dim // 2]`, with linear or Llama-3 scaling."""
  dim = cfg.head_dim
  inv_freq = 1.0 / (cfg.rope_theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
  scaling = cfg.rope_scaling_dict
  rope_type = scaling.get("rope_type", "default")
  if rope_type == "linear":
    inv_freq = inv_freq / scaling["factor"]
  elif rope_type == "llama3":
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    original = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = jnp.where(wavelen > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= original / high) & (wavelen <= original / low)
    inv_freq = jnp.where(is_medium, smoothed, scaled)
  return inv_freq


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: jax.Array) -> jax.Array:
  """Rotate-half RoPE. x `[B, T, N, D]`, positions `[B, T]` -> `[B, T, N, D]`."""
  angles = positions[..., None].astype(jnp.float32) * inv_freq  # [B, T, D/2]
  cos = jnp.concatenate([jnp.cos(angles)] * 2, axis=-1)[:, :, None, :]
  sin = jnp.concatenate([jnp.sin(angles)] * 2, axis=-1)[:, :, None, :]
  x32 = x.astype(jnp.float32)
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
  return (x32 * cos + rotated * sin).astype(x.dtype)


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
  scores = jnp.where(visible[:, None, None], scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1)
  # Output in the operands' batch order, then transposed: XLA:CPU lacks some bf16 x bf16 ->
  # f32 dots with a transposed output ("btkgd" raised UNIMPLEMENTED for a decode step).
  out = jnp.einsum("bkgts,bksd->bkgtd", probs.astype(v.dtype), v,
                   preferred_element_type=jnp.float32)
  return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, d).astype(q.dtype)


def attend_prefill(q: jax.Array, k: jax.Array, v: jax.Array, kv_mask: jax.Array,
                   block: int = 64) -> jax.Array:
  """Causal attention of T queries over the same T fresh keys (prefill into an empty cache).

  Queries go in blocks of `block`, each against keys up to its own end only, which halves
  the score work of a long prompt; the softmax normalisation is applied to the `[.., D]`
  output instead of the `[.., S]` probabilities. On XLA:CPU this is ~3x faster than
  `attend` at 512 tokens (the elementwise softmax dominates there).

  Args:
    q: `[B, T, H, D]`. k, v: `[B, KV, T, D]`. kv_mask: `[B, T]` True at real tokens.
  Returns:
    `[B, T, H, D]` in q's dtype.
  """
  b, t, h, d = q.shape
  kv = k.shape[1]
  q = q.reshape(b, t, kv, h // kv, d).transpose(0, 2, 3, 1, 4)  # [B, KV, G, T, D]
  outs = []
  for start in range(0, t, block):
    end = min(t, start + block)
    scores = jnp.einsum("bkgtd,bksd->bkgts", q[:, :, :, start:end], k[:, :, :end],
                        preferred_element_type=jnp.float32) / math.sqrt(d)
    causal = jnp.arange(end)[None, :] <= jnp.arange(start, end)[:, None]  # [Tb, S]
    visible = causal[None] & kv_mask[:, None, :end]
    scores = jnp.where(visible[:, None, None], scores, jnp.finfo(jnp.float32).min)
    scores = scores - jnp.max(scores, axis=-1, keepdims=True)
    weights = jnp.exp(scores)
    total = jnp.sum(weights, axis=-1, keepdims=True)
    out = jnp.einsum("bkgts,bksd->bkgtd", weights.astype(v.dtype), v[:, :, :end],
                     preferred_element_type=jnp.float32)
    outs.append(out / total)
  out = jnp.concatenate(outs, axis=3)
  return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, d).astype(q.dtype)


def attend_decode(q: jax.Array, k: jax.Array, v: jax.Array, q_slot: jax.Array,
                  kv_mask: jax.Array) -> jax.Array:
  """One query per row (a decode step) over the cache: `attend` with T = 1 written as
  `[B, KV, G, D]` contractions, which XLA:CPU runs ~2x faster than the 5-D form.

  Args:
    q: `[B, 1, H, D]`. k, v: `[B, KV, S, D]`. q_slot: scalar slot of the query (it sees
    slots `<= q_slot`). kv_mask: `[B, S]`.
  Returns:
    `[B, 1, H, D]` in q's dtype.
  """
  b, _, h, d = q.shape
  kv = k.shape[1]
  q = q.reshape(b, kv, h // kv, d)
  scores = jnp.einsum("bkgd,bksd->bkgs", q, k, preferred_element_type=jnp.float32)
  scores = scores / math.sqrt(d)
  visible = (jnp.arange(k.shape[2]) <= q_slot)[None, :] & kv_mask  # [B, S]
  scores = jnp.where(visible[:, None, None], scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1)
  out = jnp.einsum("bkgs,bksd->bkgd", probs.astype(v.dtype), v,
                   preferred_element_type=jnp.float32)
  return out.reshape(b, 1, h, d).astype(q.dtype)


class Attention(nnx.Module):
  """Multi-head attention with grouped KV heads, optional q/k/v bias and q/k RMSNorm."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    pd, d, hd = cfg.jnp_param_dtype, cfg.hidden_size, cfg.head_dim
    self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, hd
    self.q_proj = Linear(d, cfg.num_heads * hd, ("heads", "embed"), bias=cfg.qkv_bias,
                         param_dtype=pd, rngs=rngs)
    self.k_proj = Linear(d, cfg.num_kv_heads * hd, ("kv_heads", "embed"), bias=cfg.qkv_bias,
                         param_dtype=pd, rngs=rngs)
    self.v_proj = Linear(d, cfg.num_kv_heads * hd, ("kv_heads", "embed"), bias=cfg.qkv_bias,
                         param_dtype=pd, rngs=rngs)
    self.o_proj = Linear(cfg.num_heads * hd, d, ("embed", "heads"), bias=cfg.o_bias,
                         param_dtype=pd, rngs=rngs)
    self.q_norm = RMSNorm(hd, cfg.rms_norm_eps, pd, "head_dim") if cfg.qk_norm else None
    self.k_norm = RMSNorm(hd, cfg.rms_norm_eps, pd, "head_dim") if cfg.qk_norm else None

  def __call__(self, x: jax.Array, positions: jax.Array, inv_freq: jax.Array,
               kv_mask: jax.Array, cache: dict[str, jax.Array] | None,
               cache_index: jax.Array | int) -> tuple[jax.Array, dict[str, jax.Array] | None]:
    """x `[B, T, E]` -> (`[B, T, E]`, updated cache or None)."""
    b, t, _ = x.shape
    q = self.q_proj(x).reshape(b, t, self.num_heads, self.head_dim)
    k = self.k_proj(x).reshape(b, t, self.num_kv_heads, self.head_dim)
    v = self.v_proj(x).reshape(b, t, self.num_kv_heads, self.head_dim)
    if self.q_norm is not None:
      q, k = self.q_norm(q), self.k_norm(k)
    q = constrain(apply_rope(q, positions, inv_freq), ("batch", "length", "act_heads", None))
    k = apply_rope(k, positions, inv_freq)
    k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [B, KV, T, D]
    if cache is None:
      out = attend(q, k, v, jnp.arange(t), kv_mask)
    else:
      start = (0, 0, cache_index, 0)
      k_new, v_new = k.astype(cache["k"].dtype), v.astype(cache["v"].dtype)
      k = jax.lax.dynamic_update_slice(cache["k"], k_new, start)
      v = jax.lax.dynamic_update_slice(cache["v"], v_new, start)
      cache = {"k": k, "v": v}
      if isinstance(cache_index, int) and cache_index == 0:
        # Prefill into an empty cache: only the fresh keys can be visible.
        out = attend_prefill(q, k_new.astype(q.dtype), v_new.astype(q.dtype), kv_mask[:, :t])
      elif t == 1:
        out = attend_decode(q, k.astype(q.dtype), v.astype(q.dtype), cache_index, kv_mask)
      else:
        out = attend(q, k.astype(q.dtype), v.astype(q.dtype), cache_index + jnp.arange(t),
                     kv_mask)
    return self.o_proj(out.reshape(b, t, -1)), cache


class MLP(nnx.Module):
  """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    pd, d, f = cfg.jnp_param_dtype, cfg.hidden_size, cfg.intermediate_size
    self.gate_proj = Linear(d, f, ("mlp", "embed"), bias=False, param_dtype=pd, rngs=rngs)
    self.up_proj = Linear(d, f, ("mlp", "embed"), bias=False, param_dtype=pd, rngs=rngs)
    self.down_proj = Linear(f, d, ("embed", "mlp"), bias=False, param_dtype=pd, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    h = jax.nn.silu(self.gate_proj(x)) * self.up_proj(x)
    return self.down_proj(constrain(h, ("batch", "length", "act_mlp")))


class Block(nnx.Module):
  """Pre-norm residual block: attention then MLP."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.jnp_param_dtype)
    self.attn = Attention(cfg, rngs)
    self.post_attention_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.jnp_param_dtype)
    self.mlp = MLP(cfg, rngs)

  def __call__(self, x, positions, inv_freq, kv_mask, cache, cache_index):
    attn_out, cache = self.attn(self.input_norm(x), positions, inv_freq, kv_mask, cache,
                                cache_index)
    x = constrain(x + attn_out, ("batch", "length", "act_embed"))
    x = x + self.mlp(self.post_attention_norm(x))
    return constrain(x, ("batch", "length", "act_embed")), cache


def _full_block(layer: Block, x, positions, inv_freq, kv_mask):
  return layer(x, positions, inv_freq, kv_mask, None, 0)[0]


class Transformer(nnx.Module):
  """Decoder-only LM. Layers are a Python list: on XLA:CPU an unrolled loop beat `scan`,
  which copied each layer's weights and cache every decode step."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    pd = cfg.jnp_param_dtype
    self.embed = nnx.Param(
        nnx.initializers.normal(stddev=1.0)(rngs.params(), (cfg.vocab_size, cfg.hidden_size),
                                            pd), logical_axes=("vocab", "embed"))
    self.layers = nnx.List([Block(cfg, rngs) for _ in range(cfg.num_layers)])
    self.final_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, pd)
    self.lm_head = (None if cfg.tie_word_embeddings else
                    Linear(cfg.hidden_size, cfg.vocab_size, ("vocab", "embed"), bias=False,
                           param_dtype=pd, rngs=rngs))

  def _run(self, tokens, positions, kv_mask, cache: KVCache | None, cache_index):
    # Gather from a whole table: a lookup into a vocab/fsdp-sharded table has no efficient
    # SPMD partitioning, and XLA would replicate it anyway (with a warning).
    table = constrain(self.embed[...].astype(self.cfg.jnp_dtype), (None, None))
    x = table[tokens]
    x = constrain(x, ("batch", "length", "act_embed"))
    inv_freq = rope_inverse_frequencies(self.cfg)
    new_cache = [] if cache is not None else None
    if cache is None:
      x = self._scan_layers(x, positions, inv_freq, kv_mask)
    else:
      for i, layer in enumerate(self.layers):
        x, layer_cache = layer(x, positions, inv_freq, kv_mask, cache[i], cache_index)
        new_cache.append(layer_cache)
    return self.final_norm(x), new_cache

  def _scan_layers(self, x, positions, inv_freq, kv_mask):
    """The layers as a rematerialised `scan` over their stacked weights.

    Under grad, the backward pass keeps one `[B, T, E]` input per layer and recomputes the
    rest, one layer at a time, so memory does not grow with depth. (`jax.checkpoint` on an
    unrolled loop does not bound it on XLA:CPU, whose scheduler hoists the recomputation.)
    """
    graphdef = nnx.graphdef(self.layers[0])
    stacked = jax.tree.map(lambda *ws: jnp.stack(ws),
                           *[nnx.state(layer) for layer in self.layers])

    @jax.checkpoint
    def body(h, layer_state):
      return _full_block(nnx.merge(graphdef, layer_state), h, positions, inv_freq,
                         kv_mask), None

    return jax.lax.scan(body, x, stacked)[0]

  def __call__(self, tokens: jax.Array, positions: jax.Array,
               attention_mask: jax.Array) -> jax.Array:
    """Full causal forward.

    Args:
      tokens: `[B, T]` int32 token ids. positions: `[B, T]` int32 rotary positions.
      attention_mask: `[B, T]` bool, True for real tokens (padding keys are never seen).
    Returns:
      `[B, T, E]` hidden states after the final norm, in the compute dtype.
    """
    hidden, _ = self._run(tokens, positions, attention_mask, None, 0)
    return hidden

  def forward_with_cache(self, tokens: jax.Array, positions: jax.Array, kv_mask: jax.Array,
                         cache: KVCache, cache_index: jax.Array | int
                         ) -> tuple[jax.Array, KVCache]:
    """Forward that writes keys/values into `cache` at slots `cache_index + [0, T)`.

    Args:
      tokens, positions: `[B, T]`. kv_mask: `[B, S]` bool over all cache slots, already
        True for the slots being written now when they hold real tokens.
      cache: per-layer {"k", "v"} `[B, KV, S, D]`. cache_index: scalar first slot to write.
    Returns:
      (`[B, T, E]` hidden states, the updated cache).
    """
    return self._run(tokens, positions, kv_mask, cache, cache_index)

  def unembed(self, hidden: jax.Array) -> jax.Array:
    """`[..., E]` hidden states -> `[..., V]` float32 logits (tied or separate head)."""
    w = self.embed[...] if self.lm_head is None else self.lm_head.kernel[...]
    return jnp.einsum("...e,ve->...v", hidden, w.astype(hidden.dtype),
                      preferred_element_type=jnp.float32)


def init_cache(cfg: ModelConfig, batch: int, max_len: int, dtype=None) -> KVCache:
  """An empty per-layer KV cache `[B, KV, S, D]` (zeros), in `dtype` or the compute dtype."""
  shape = (batch, cfg.num_kv_heads, max_len, cfg.head_dim)
  dtype = dtype or cfg.jnp_dtype
  return [{"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}
          for _ in range(cfg.num_layers)]
