"""Forward throughput of the embedded model; prints one JSON line.

  python bench/forward.py [--shapes=1x128,4x128,8x256] [--dtype=float32] [--matmul_n=2048]

Reports tokens/s per batch x length and the achieved FLOP/s (`seed_jax.models.flops`, the
LM head at every position) as a fraction of this machine's matmul FLOP/s measured in the
same run (same dtype, `--matmul_n` cubed).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from absl import app, flags  # noqa: E402
from flax import nnx  # noqa: E402

from bench.common import emit, matmul_peak_flops, time_call  # noqa: E402
from seed_jax.models import load_model  # noqa: E402
from seed_jax.models.flops import forward_flops  # noqa: E402

_SHAPES = flags.DEFINE_string("shapes", "1x128,4x128,8x256", "batch x length list")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "compute dtype")
_MODEL = flags.DEFINE_string("model", "smollm2-135m-instruct", "model name or path")
_MATMUL_N = flags.DEFINE_integer("matmul_n", 2048, "side of the square matmul of the peak")


def main(_):
  model, _ = load_model(_MODEL.value, dtype=_DTYPE.value)
  graphdef, params = nnx.split(model, nnx.Param)

  @jax.jit
  def forward(params, tokens, positions, mask):
    m = nnx.merge(graphdef, params)
    return m.unembed(m(tokens, positions, mask))

  peak = matmul_peak_flops(jnp.dtype(_DTYPE.value), _MATMUL_N.value)
  results = []
  for shape in _SHAPES.value.split(","):
    batch, length = map(int, shape.split("x"))
    tokens = jnp.ones((batch, length), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    mask = jnp.ones((batch, length), bool)
    seconds = time_call(forward, params, tokens, positions, mask)
    flops = forward_flops(model.cfg, batch, length, unembedded=length) / seconds
    results.append(dict(batch=batch, length=length, seconds=round(seconds, 4),
                        tokens_per_s=round(batch * length / seconds, 1),
                        flops_per_s=round(flops / 1e9, 2), fraction_of_matmul_peak=round(
                            flops / peak, 3)))
  emit(dict(bench="forward", model=_MODEL.value, dtype=_DTYPE.value,
            matmul_peak_gflops=round(peak / 1e9, 1), results=results))


if __name__ == "__main__":
  app.run(main)
