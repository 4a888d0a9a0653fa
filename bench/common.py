"""Shared benchmark helpers: timing, the machine's matmul peak, a synthetic RL batch.

FLOPs are counted by `seed_jax.models.flops`, the project's one count (the TPU plan uses it
too), so a bench's fraction of peak and the plan's estimates mean the same thing.
"""

from __future__ import annotations

import json
import os
import platform
import sys

import jax
import numpy as np

# The machine's limits, measured: one piece of code for the benches and the runs' provenance.
from seed_jax.machine_speed import (matmul_peak_flops, stream_bandwidth_bytes,  # noqa: F401
                                   time_call)
from seed_jax.models.flops import forward_flops, training_flops


def decode_step_cost(cfg, weight_bytes: int, batch: int, prompt_len: int, new_tokens: int,
                     cache_itemsize: int) -> dict[str, float]:
  """What one greedy decode step of `batch` rows must read and compute, on average over a
  `new_tokens` decode after `prompt_len`-token prompts: the weights once (`weight_bytes`, as
  the sampler holds them) and each row's filled KV cache (`prompt_len + (new_tokens - 1) / 2`
  slots on average), and the FLOPs of one token a row over that context
  (`seed_jax.models.flops.forward_flops`)."""
  filled = prompt_len + (new_tokens - 1) / 2
  kv_bytes = (2 * cfg.num_layers * batch * cfg.num_kv_heads * filled * cfg.head_dim
              * cache_itemsize)
  return {"weight_bytes": weight_bytes, "kv_bytes": kv_bytes,
          "step_bytes": weight_bytes + kv_bytes,
          "step_flops": forward_flops(cfg, batch, 1, unembedded=1, context=int(filled))}


def decode_roofline(batch: int, decode_tok_s: float, cost: dict[str, float],
                    bandwidth: float, peak_flops: float) -> dict[str, float]:
  """Decode tokens/s beside the machine's ceilings for a step of `cost`
  (`decode_step_cost`): streaming `step_bytes` at `bandwidth` bytes/s bounds it at
  `bandwidth_limit_tok_s`, its FLOPs at `peak_flops` at `compute_limit_tok_s`; the roofline
  is the lower. `weight_limit_tok_s` is the bound if the cache were free. The fractions are
  `decode_tok_s` over each."""
  step_s = batch / decode_tok_s
  bandwidth_limit = batch * bandwidth / cost["step_bytes"]
  compute_limit = batch * peak_flops / cost["step_flops"]
  roofline = min(bandwidth_limit, compute_limit)
  weight_limit = batch * bandwidth / cost["weight_bytes"]
  return dict(
      weight_mb=round(cost["weight_bytes"] / 1e6, 1), kv_mb=round(cost["kv_bytes"] / 1e6, 1),
      step_bytes_mb=round(cost["step_bytes"] / 1e6, 1),
      achieved_gbps=round(cost["step_bytes"] / step_s / 1e9, 2),
      bandwidth_limit_tok_s=round(bandwidth_limit, 1),
      compute_limit_tok_s=round(compute_limit, 1),
      roofline_tok_s=round(roofline, 1), roofline_fraction=round(decode_tok_s / roofline, 3),
      weight_limit_tok_s=round(weight_limit, 1),
      weight_fraction=round(decode_tok_s / weight_limit, 3),
      gflops=round(cost["step_flops"] / step_s / 1e9, 1),
      frac_peak_flops=round(cost["step_flops"] / step_s / peak_flops, 3))


def synthetic_rl_batch(rows: int, prompt_len: int, response_len: int, vocab: int,
                       seed: int = 0) -> dict[str, np.ndarray]:
  """A train-step batch of random tokens with every field the step reads (the teacher's
  log-probs precomputed), a quarter of each prompt left-padded."""
  rng = np.random.default_rng(seed)
  total = prompt_len + response_len
  tokens = rng.integers(3, vocab, size=(rows, total)).astype(np.int32)
  mask = np.ones((rows, total), bool)
  mask[:, : prompt_len // 4] = False
  return {
      "student_tokens": tokens, "student_mask": mask,
      "teacher_tokens": np.roll(tokens, 1, axis=1), "teacher_mask": np.ones_like(mask),
      "teacher_logprobs": np.full((rows, response_len), -10.5, np.float32),
      "response_mask": np.ones((rows, response_len), np.float32),
      "old_logprobs": np.full((rows, response_len), -10.8, np.float32),
      "advantages": rng.normal(size=rows).astype(np.float32),
      "opd_mask": np.ones((rows,), np.float32),
  }


def _live_by_turn(lengths_by_episode: list[list[int]]) -> list[list[int]]:
  """Per turn, the response lengths of the episodes still live at it."""
  turns = max(len(lengths) for lengths in lengths_by_episode)
  return [[lengths[turn] for lengths in lengths_by_episode if len(lengths) > turn]
          for turn in range(turns)]


def barrier_utilisation(lengths_by_episode: list[list[int]]) -> float:
  """Share of a turn-synchronous loop's decode rows that held a live response: the sum of
  the response lengths over the sum, per turn, of live episodes x the turn's longest."""
  by_turn = _live_by_turn(lengths_by_episode)
  useful = sum(sum(live) for live in by_turn)
  padded = sum(len(live) * max(live) for live in by_turn)
  return useful / max(padded, 1)


def decode_steps(lengths_by_episode: list[list[int]]) -> dict[str, int]:
  """The decode steps each rollout loop needs for these responses: the turn-synchronous
  loop runs every turn to its longest response (`barrier`: the sum over turns of the
  longest live one); without the barrier, one slot per episode, an episode's turns still
  follow each other, so no loop takes fewer steps than the longest episode's responses
  together (`critical_path`). Their ratio bounds what `rollout.continuous` can save of
  the decode, before any prefill."""
  return dict(barrier=sum(max(live) for live in _live_by_turn(lengths_by_episode)),
              critical_path=max(sum(lengths) for lengths in lengths_by_episode))


def useful_training_flops(cfg, sequences) -> tuple[float, int]:
  """Forward + backward FLOPs over the real tokens of `sequences` ((prompt ids, target ids)
  pairs), each on its own as if no padding or packing were there, and their token count."""
  flops, tokens = 0.0, 0
  for prompt, target in sequences:
    length = len(prompt) + len(target)
    flops += training_flops(cfg, 1, length, unembedded=len(target))[0]
    tokens += length
  return flops, tokens


def emit(record: dict) -> None:
  """Prints the benchmark's one JSON line, with the machine it ran on."""
  record = dict(record, machine=dict(platform=platform.platform(), cpus=os.cpu_count(),
                                     jax=jax.__version__, backend=jax.default_backend(),
                                     python=sys.version.split()[0]))
  print(json.dumps(record))
