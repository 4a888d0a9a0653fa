"""Continuous batching: a fixed set of decode slots that responses enter and leave.

  slots = SlotDecoder(sampler, sampling, num_slots=16, max_prompt_len=768, seed=0)
  slots.insert([(slot, prompt_ids, stream, turn), ...])   # prefill, insert
  for slot in slots.run():                                  # generate until one finishes
    tokens, logprobs, reason, text = slots.take(slot)       # the slot is free again

A row's random stream is `(seed, stream, turn)` (an episode's index and its turn in the
rollout loop) folded with each token's number, so a response does not depend on which
rows share the batch or which slot it sits in (`seed_jax.sampling.engine`'s ring cache).
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from seed_jax.parallel import hosts
from seed_jax.sampling import engine
from seed_jax.sampling.sampler import Sampler, SamplingParams, round_up


# Module-level jits, so that every rollout's SlotDecoder reuses the programs compiled for
# the first (one each per shape: a jit made per decoder recompiled them all every rollout,
# ~13 s a shape for the embedded model on 2 cores).
_FILTERING = ("top_k", "use_top_p")
_empty_slots = jax.jit(engine.empty_slots, static_argnums=(0, 1, 2, 3, 4))
_insert = jax.jit(engine.insert, static_argnums=0, static_argnames=_FILTERING,
                  donate_argnums=2)
_generate = jax.jit(engine.generate, static_argnums=0,
                    static_argnames=("max_steps", *_FILTERING), donate_argnums=2)


def _beside(state: engine.DecodeState, params) -> engine.DecodeState:
  """The empty slots on the mesh of `params` (a model loaded without a mesh sits on a
  one-device mesh), where `insert` and `generate` return them: a state of another
  placement compiled each program twice."""
  sharding = jax.tree.leaves(params)[0].sharding
  if not isinstance(sharding, NamedSharding):
    return state
  return jax.device_put(state, NamedSharding(sharding.mesh, PartitionSpec()))


@functools.partial(jax.jit, static_argnums=0)
def _row_keys(seed: int, streams: jax.Array, turns: jax.Array) -> jax.Array:
  base = jax.random.key(seed)
  return jax.vmap(lambda s, t: jax.random.fold_in(jax.random.fold_in(base, s), t))(
      streams, turns)


class SlotDecoder:
  """Continuous batching over `sampler`'s model and parameters (see the module docstring).

  Args:
    sampler: gives the model, its current parameters, the tokenizer and the stop tables.
    sampling: the responses' settings (`num_samples` must be 1: each slot is one response).
    num_slots: rows decoded together (R).
    max_prompt_len: the longest prompt to be inserted; with the response budget it sizes
      the ring cache (S = prompt bucket + response bucket).
    seed: base of every row's random stream.
    max_steps: decode steps per `run` at most before the host looks again.
  """

  def __init__(self, sampler: Sampler, sampling: SamplingParams, num_slots: int,
               max_prompt_len: int, seed: int, max_steps: int = 1 << 30):
    if sampling.num_samples != 1:
      raise ValueError("SlotDecoder: one response per slot (num_samples=1)")
    self.sampler, self.sampling, self.seed = sampler, sampling, seed
    self.num_slots, self.max_steps = num_slots, max_steps
    self.prompt_len = round_up(max_prompt_len, sampler.prompt_buckets, "prompt length")
    self.max_new_bucket = round_up(sampling.max_new_tokens, None, "max_new_tokens")
    cache_len = self.prompt_len + self.max_new_bucket
    self.knobs = {k: jnp.asarray(v) for k, v in
                  sampler.knob_arrays(sampling, self.max_new_bucket).items()}
    self.filtering = dict(top_k=sampling.top_k, use_top_p=sampling.top_p < 1.0)
    cache_dtype = jnp.dtype(sampler.cache_dtype or sampler.cfg.jnp_dtype)
    with sampler._mesh_context():  # pylint: disable=protected-access
      state = _empty_slots(sampler.cfg, num_slots, cache_len, self.max_new_bucket,
                           cache_dtype)
    self.state = state if sampler.mesh is not None else _beside(state, sampler.params)
    self.busy = np.zeros(num_slots, bool)

  def free_slots(self) -> list[int]:
    return [int(s) for s in np.flatnonzero(~self.busy)]

  def insert(self, items: Sequence[tuple[int, Sequence[int], int, int]]) -> None:
    """Prefills each `(slot, prompt_ids, stream, turn)` into its free slot, its first token
    sampled (equal prompts once). A prompt longer than `max_prompt_len` keeps its last
    tokens."""
    if not items:
      return
    slots = [slot for slot, *_ in items]
    if any(self.busy[s] for s in slots) or len(set(slots)) != len(slots):
      raise ValueError(f"slots {slots}: each must be free and named once")
    longest = max(len(ids) for _, ids, _, _ in items)
    prompt_len = min(round_up(longest, self.sampler.prompt_buckets, "prompt length"),
                     self.prompt_len)
    # A prompt shared by several entering rows (a GRPO group's first turn) is prefilled once.
    prompts = [tuple(ids) for _, ids, _, _ in items]
    distinct: dict[tuple[int, ...], int] = {}
    for ids in prompts:
      distinct.setdefault(ids, len(distinct))
    tokens, mask = self.sampler.left_padded(
        list(distinct), round_up(len(distinct), None, "number of prompts"), prompt_len)
    rows = round_up(len(items), None, "number of prompts")  # a few compiled shapes
    targets = np.full((rows,), self.num_slots, np.int32)  # padding rows: slot dropped
    sources, streams, turns = (np.zeros((rows,), np.int32) for _ in range(3))
    for i, ((slot, _, stream, turn), ids) in enumerate(zip(items, prompts)):
      targets[i], sources[i], streams[i], turns[i] = slot, distinct[ids], stream, turn
    keys = _row_keys(self.seed, jnp.asarray(streams), jnp.asarray(turns))
    with self.sampler._mesh_context():  # pylint: disable=protected-access
      self.state = _insert(self.sampler.graphdef, self.sampler.params, self.state,
                           jnp.asarray(tokens), jnp.asarray(mask), jnp.asarray(sources),
                           jnp.asarray(targets), keys, self.knobs, **self.filtering)
    self.busy[slots] = True

  def run(self) -> list[int]:
    """Decodes until a response finishes (or none is left); returns every busy slot
    whose response is complete."""
    done = np.asarray(hosts.fetch(self.state["done"]))
    if not (self.busy & done).any() and (self.busy & ~done).any():
      with self.sampler._mesh_context():  # pylint: disable=protected-access
        self.state = _generate(self.sampler.graphdef, self.sampler.params, self.state,
                               self.knobs, max_steps=self.max_steps, **self.filtering)
      done = np.asarray(hosts.fetch(self.state["done"]))
    return [int(s) for s in np.flatnonzero(self.busy & done)]

  def take(self, slot: int) -> tuple[list[int], np.ndarray, str, str | None]:
    """The finished response in `slot` (`Sampler.finish_row`'s tuple); frees the slot."""
    if not self.busy[slot]:
      raise ValueError(f"slot {slot} holds no response")
    row = hosts.fetch({k: self.state[k][slot] for k in
                       ("tokens", "logprobs", "lengths", "stop_reason")})
    self.busy[slot] = False
    return self.sampler.finish_row(np.asarray(row["tokens"]), np.asarray(row["logprobs"]),
                                   int(row["lengths"]), int(row["stop_reason"]),
                                   self.sampling)
