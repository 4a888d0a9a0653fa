"""Shared benchmark helpers: timing, the machine's matmul peak, model FLOPs."""

from __future__ import annotations

import json
import os
import platform
import sys
import time

import jax
import jax.numpy as jnp

from seed_jax.models.config import ModelConfig


def time_call(fn, *args, repeats: int = 3) -> float:
  """Best wall time in seconds of `fn(*args)` after one warm-up (compile) call."""
  jax.block_until_ready(fn(*args))
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    best = min(best, time.perf_counter() - start)
  return best


def matmul_peak_flops(dtype=jnp.float32, n: int = 2048) -> float:
  """Measured FLOP/s of a jitted square matmul (bf16 accumulates in float32)."""
  a = jnp.ones((n, n), dtype)
  b = jnp.ones((n, n), dtype)
  matmul = jax.jit(lambda x, y: jnp.matmul(x, y, preferred_element_type=jnp.float32))
  return 2 * n**3 / time_call(matmul, a, b, repeats=5)


def forward_flops(cfg: ModelConfig, batch: int, length: int, with_head: bool = True) -> float:
  """FLOPs of one full causal forward: projections, causal attention, LM head."""
  d, f, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
  per_token_params = (d * hd * (cfg.num_heads * 2 + cfg.num_kv_heads * 2) + 3 * d * f)
  tokens = batch * length
  dense = 2 * per_token_params * cfg.num_layers * tokens
  # QK^T and PV over the causal half of the [T, T] score matrix.
  attention = 2 * 2 * cfg.num_layers * batch * cfg.num_heads * hd * length * (length + 1) / 2
  head = 2 * d * cfg.vocab_size * tokens if with_head else 0
  return dense + attention + head


def emit(record: dict) -> None:
  """Prints the benchmark's one JSON line, with the machine it ran on."""
  record = dict(record, machine=dict(platform=platform.platform(), cpus=os.cpu_count(),
                                     jax=jax.__version__, backend=jax.default_backend(),
                                     python=sys.version.split()[0]))
  print(json.dumps(record))
