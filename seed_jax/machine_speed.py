"""How fast this machine multiplies and streams, measured: the limits a speed figure is
read against (`bench/`) and the check that two runs' wall times measure alike machines
(`seed_jax.provenance`).

Two machines that name the same CPU ("AMD EPYC", 2 cores) have run this project's
iterations 2x apart (session 60: rollout 35 s against 70 s on the same code), so a CPU's
name does not say its speed; these two figures do, in about a second.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import jax
import jax.numpy as jnp


def time_call(fn, *args, repeats: int = 3) -> float:
  """Best wall time in seconds of `fn(*args)` after one warm-up (compile) call."""
  jax.block_until_ready(fn(*args))
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    best = min(best, time.perf_counter() - start)
  return best


def matmul_peak_flops(dtype=jnp.float32, n: int = 2048, repeats: int = 5) -> float:
  """Measured FLOP/s of a jitted `n x n x n` matmul (bf16 accumulates in float32).

  Random operands: some chips multiply constant data faster (an H200 ran ~13% faster on
  zeros), which would flatter the peak and so understate every fraction of it.
  """
  key_a, key_b = jax.random.split(jax.random.key(0))
  a = jax.random.normal(key_a, (n, n), dtype)
  b = jax.random.normal(key_b, (n, n), dtype)
  matmul = jax.jit(lambda x, y: jnp.matmul(x, y, preferred_element_type=jnp.float32))
  return 2 * n**3 / time_call(matmul, a, b, repeats=repeats)


def stream_bandwidth_bytes(gib: float = 1.0, repeats: int = 5) -> float:
  """Measured bytes/s of reading a `gib`-GiB float32 array once (a jitted sum): the
  memory-streaming ceiling a weight- or cache-bound program (a decode step) runs against.
  The array is several times any CPU cache, so the figure is DRAM's."""
  n = int(gib * 2**30) // 4
  x = jax.random.normal(jax.random.key(0), (n,), jnp.float32)
  total = jax.jit(jnp.sum)
  return 4 * n / time_call(total, x, repeats=repeats)


@functools.cache
def quick_speed() -> dict[str, float]:
  """This process's machine in two figures, once a process (about 1.5 s on 2 cores):
  `matmul_gflops`, a bf16 1024-cube matmul (the train step's dtype), and `stream_gbps`, a
  half-GiB read; each the best of 10 (best of 3 swung 2x on a quiet machine, best of 10
  within 10%). Taken at a run's start, when it has the machine."""
  return {"matmul_gflops": round(matmul_peak_flops(jnp.bfloat16, 1024, repeats=10) / 1e9, 1),
          "stream_gbps": round(stream_bandwidth_bytes(0.5, repeats=10) / 1e9, 2)}


# Two measurements of one machine, each at a run's start, differ by noise (10% apart on a
# quiet machine) and by what else ran; two machines of one CPU name have differed by 2x
# (session 60: bf16 matmuls 940 GFLOP/s where the benchmarks page measured 371). Within
# this share of each other they count as alike.
ALIKE_SHARE = 0.7


def alike(a: dict[str, Any], b: dict[str, Any], share: float = ALIKE_SHARE) -> bool:
  """Whether two `quick_speed` records are within `share` of each other on every figure."""
  return all(min(a[key], b[key]) >= share * max(a[key], b[key])
             for key in ("matmul_gflops", "stream_gbps"))
