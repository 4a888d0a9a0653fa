"""Scoring many continuations of one prompt, the prompt's keys and values computed once.

`seed_jax.teacher_gap`'s decision gap asks, at a step of an episode, how much probability
the policy gives each admissible action's response under a prompt (plain, or with a skill).
An ALFWorld step lists 10 to 40 actions after a prompt of ~500 tokens, whose forward would
dominate if every candidate row carried it: here the prompt is prefilled once into a KV
cache, the cache is repeated for the candidates, and only the candidates' tokens run
through the model (attending to the cached prompt), as a decode of several tokens would.

The last prompt token is held back from the prefill and leads each continuation, so that
every continuation token is predicted by a hidden state of the continuation pass.
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax.sharding import Mesh

from seed_jax.models.transformer import init_cache
from seed_jax.parallel.mesh import LogicalMesh, in_mesh
from seed_jax.seed.logprobs import chunked_token_logprobs, positions_from_mask


def _round_up(value: int, multiple: int) -> int:
  return -(-max(value, 1) // multiple) * multiple


def _power_of_two(value: int, minimum: int = 8) -> int:
  return max(minimum, 1 << (max(value, 1) - 1).bit_length())


def _continuation_logprobs(graphdef, params, prompt, prompt_mask, conts, cont_mask, chunk):
  """`prompt [P, S]` (left-padded, S >= 2), `conts [P, C, L]` (right-padded) ->
  log-probs `[P, C, L]` float32 of each continuation token (0 at padding)."""
  model = nnx.merge(graphdef, params)
  p, c, length = conts.shape
  s = prompt.shape[1] - 1  # the last prompt token leads each continuation instead
  cache = init_cache(model.cfg, p, s + 1 + length)
  head_mask = prompt_mask[:, :s]
  kv_mask = jnp.concatenate([head_mask, jnp.zeros((p, 1 + length), bool)], axis=1)
  _, cache = model.forward_with_cache(prompt[:, :s], positions_from_mask(head_mask), kv_mask,
                                      cache, 0)
  # Every candidate of prompt i gets prompt i's cache: rows [P * C].
  cache = jax.tree.map(lambda x: jnp.repeat(x, c, axis=0), cache)
  lead = jnp.repeat(prompt[:, s:], c, axis=0)  # [P*C, 1]
  tokens = jnp.concatenate([lead, conts.reshape(p * c, length)], axis=1)  # [P*C, 1+L]
  real = jnp.concatenate([jnp.ones((p * c, 1), bool), cont_mask.reshape(p * c, length)],
                         axis=1)
  kv_mask = jnp.concatenate([jnp.repeat(head_mask, c, axis=0), real], axis=1)
  start = jnp.repeat(jnp.sum(head_mask, axis=1), c)[:, None]  # real prompt tokens before
  positions = start + jnp.arange(1 + length)[None, :]
  hidden, _ = model.forward_with_cache(tokens, positions, kv_mask, cache, s)
  lp, _ = chunked_token_logprobs(model.unembed, hidden[:, :-1], tokens[:, 1:], chunk)
  return jnp.where(real[:, 1:], lp, 0.0).reshape(p, c, length)


def make_continuation_fn(graphdef, mesh: LogicalMesh | Mesh | None = None, chunk: int = 128
                         ) -> Callable:
  """Jitted `(params, prompt [P, S], prompt_mask, conts [P, C, L], cont_mask) -> [P, C, L]`
  (run under `mesh`'s rules when the parameters are sharded over one)."""
  return in_mesh(jax.jit(functools.partial(_continuation_logprobs, graphdef, chunk=chunk)),
                 mesh)


def continuation_logprobs(score_fn: Callable, params, prompts: Sequence[Sequence[int]],
                          continuations: Sequence[Sequence[Sequence[int]]], *, pad_id: int,
                          prompts_per_call: int = 1, bucket: int = 128) -> list[list[float]]:
  """The summed log-probability of every continuation given its prompt.

  Args:
    score_fn: `make_continuation_fn(graphdef, ...)`; params: the model's parameters.
    prompts: P prompts' token ids (each at least 2 tokens: chat prompts are).
    continuations: per prompt, its candidates' token ids (at least one token each).
    pad_id: the id padding rows hold (masked out; never scored).
    prompts_per_call: prompts scored together (memory: their candidates' rows each hold a
      copy of the prompt's cache).
    bucket: prompt lengths are padded to a multiple of it, candidate counts to a power of
      two and candidate lengths to a multiple of 16, so few shapes compile (each is a
      whole-model program: on a 2-core machine its compile costs as much as scoring
      several steps).
  Returns:
    per prompt, per candidate, `sum_t log p(cont_t | prompt, cont_<t)` (float).
  """
  if len(prompts) != len(continuations):
    raise ValueError(f"{len(prompts)} prompts and {len(continuations)} candidate lists")
  out: list[list[float]] = []
  for first in range(0, len(prompts), prompts_per_call):
    group = range(first, min(first + prompts_per_call, len(prompts)))
    s = _round_up(max(len(prompts[i]) for i in group), bucket)
    c = _power_of_two(max(len(continuations[i]) for i in group))
    length = _round_up(max(len(t) for i in group for t in continuations[i]), 16)
    prompt = np.full((prompts_per_call, s), pad_id, np.int32)
    prompt_mask = np.zeros((prompts_per_call, s), bool)
    conts = np.full((prompts_per_call, c, length), pad_id, np.int32)
    cont_mask = np.zeros((prompts_per_call, c, length), bool)
    for row, i in enumerate(group):
      if len(prompts[i]) < 2:
        raise ValueError(f"prompt {i} has {len(prompts[i])} token(s); at least 2 are needed")
      prompt[row, s - len(prompts[i]):] = prompts[i]
      prompt_mask[row, s - len(prompts[i]):] = True
      for k, ids in enumerate(continuations[i]):
        if not ids:
          raise ValueError(f"prompt {i}, candidate {k}: an empty continuation")
        conts[row, k, :len(ids)] = ids
        cont_mask[row, k, :len(ids)] = True
    for row in range(len(group), prompts_per_call):  # padding prompts: one visible token
      prompt_mask[row, -2:] = True
    lp = np.asarray(score_fn(params, prompt, prompt_mask, conts, cont_mask))
    sums = lp.astype(np.float64).sum(axis=2)
    out += [sums[row, :len(continuations[i])].tolist() for row, i in enumerate(group)]
  return out


def candidate_probabilities(logprob_sums: Sequence[float]) -> np.ndarray:
  """`softmax` over the candidates' summed log-probs: the policy's choice among them
  (float64, sums to 1)."""
  values = np.asarray(logprob_sums, np.float64)
  weights = np.exp(values - values.max())
  return weights / weights.sum()
