"""Low-rank adapters (LoRA) on the transformer's projections.

A projection `W [out, in]` with an adapter computes `x W^T + (alpha / r) (x A^T) B^T` with
`A [r, in]` and `B [out, r]`, both float32 `LoraParam`s (stacked `[L, ...]` like every
layer weight; the rank axis, logical name "lora_rank", is never sharded). PEFT's
initialisation: `A` uniform in +-1/sqrt(in) (kaiming-uniform with a = sqrt(5)), `B` zero, so
a fresh adapter leaves the model unchanged. `LoraParam` subclasses `nnx.Param`: a filter on
it splits the trainable adapters from the frozen base (`split_adapters`).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from seed_jax.models.config import ModelConfig


class LoraParam(nnx.Param):
  """A low-rank adapter's `A` or `B`: with LoRA, the only parameters that train."""


def adapter_params(rank: int, in_dim: int, out_dim: int, axes: tuple[str, str],
                   rngs: nnx.Rngs) -> tuple[LoraParam, LoraParam]:
  """`(A [rank, in], B [out, rank])`, float32, initialised as PEFT does (B = 0)."""
  bound = 1.0 / math.sqrt(in_dim)
  a = jax.random.uniform(rngs.params(), (rank, in_dim), jnp.float32, -bound, bound)
  return (LoraParam(a, logical_axes=("lora_rank", axes[1])),
          LoraParam(jnp.zeros((out_dim, rank), jnp.float32), logical_axes=(axes[0], "lora_rank")))


def split_adapters(model: nnx.Module) -> tuple[nnx.GraphDef, nnx.State, nnx.State]:
  """`(graphdef, adapters, base)`: the adapters (`LoraParam`) and every other parameter;
  `nnx.merge(graphdef, adapters, base)` rebuilds the model."""
  return nnx.split(model, LoraParam, nnx.Param)


def merged_model(model: nnx.Module) -> nnx.Module:
  """The same function without adapters: each adapted kernel becomes
  `W + (alpha / r) B A` (in float32, stored in W's dtype), for export and serving."""
  cfg: ModelConfig = model.cfg
  plain_cfg = cfg.replace(lora_rank=0)
  plain = nnx.eval_shape(lambda: type(model)(plain_cfg, rngs=nnx.Rngs(0)))
  source = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
  merged = {}
  for path, variable in nnx.to_flat_state(nnx.state(plain, nnx.Param)):
    value = source[path].get_value()
    if path[-1] == "kernel" and path[:-1] + ("lora_a",) in source:
      a = source[path[:-1] + ("lora_a",)].get_value()
      b = source[path[:-1] + ("lora_b",)].get_value()
      scale = cfg.lora_scale(path[-2].removesuffix("_proj"))  # q_proj -> q
      delta = scale * jnp.einsum("...or,...ri->...oi", b, a)
      value = (value.astype(jnp.float32) + delta).astype(value.dtype)
    merged[path] = variable.replace(value)
  nnx.update(plain, nnx.from_flat_state(merged))
  return plain


def split_trainable(params: nnx.State) -> tuple[nnx.State, nnx.State]:
  """`(trainable, frozen)` parameters: with adapters, the adapters and the frozen base;
  without, everything and nothing. Every update (RL, stage 1, behaviour cloning) takes
  gradients of and holds optimizer moments for the trainable part only.
  `merge_trainable(trainable, frozen)` gives `params` back."""
  adapters, base = nnx.split_state(params, LoraParam, ...)
  if not jax.tree.leaves(adapters):
    return params, adapters  # adapters is the empty state here
  return adapters, base


def merge_trainable(trainable: nnx.State, frozen: nnx.State) -> nnx.State:
  """The whole parameter state from `split_trainable`'s two parts (no array is copied)."""
  return nnx.merge_state(trainable, frozen)


def with_adapters(model: nnx.Module, rank: int, alpha: float, targets: tuple[str, ...],
                  shardings_of, seed: int = 0) -> nnx.Module:
  """`model` (without adapters) with fresh adapters of `rank` on `targets`: a new model
  holding the same base arrays and PEFT-initialised adapters, each created in place in its
  sharding (`shardings_of(abstract_state) -> shardings`, e.g. `param_shardings` on the
  run's mesh)."""
  cfg: ModelConfig = model.cfg.replace(lora_rank=rank, lora_alpha=alpha,
                                       lora_targets=tuple(targets))
  build = lambda: type(model)(cfg, rngs=nnx.Rngs(seed))
  graphdef, abstract_adapters, _ = nnx.split(nnx.eval_shape(build), LoraParam, ...)
  # Only the adapters leave the jitted build: the base's initialisation is dead code.
  adapters = jax.jit(lambda: nnx.split(build(), LoraParam, ...)[1],
                     out_shardings=shardings_of(abstract_adapters))()
  return nnx.merge(graphdef, adapters, nnx.state(model))
