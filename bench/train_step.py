"""SEED train-step throughput and log-prob memory; prints one JSON line.

  python bench/train_step.py [--rows=4 --prompt_len=64 --response_len=64 --repeats=2]

At the embedded model's shape (SmolLM2-135M: 30 layers, hidden 576, MLP 1536, 9 / 3 heads,
vocab 49152) with random weights:
* train-step tokens/s for the batched ("joint") and the separate teacher pass, with the
  achieved useful FLOP/s as a fraction of this machine's matmul FLOP/s measured in the same
  run (useful = student forward + backward and teacher forward; the joint pass also runs a
  zero backward through the teacher rows, which is not counted);
* the compiled temp memory of the step in each mode;
* the compiled temp memory of value-and-grad of the chunked log-prob + entropy against the
  naive version that materialises `[B, R, V]` float32 logits (at `--lp_rows x --lp_len`).
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402
from flax import nnx  # noqa: E402

from bench.common import emit, forward_flops, matmul_peak_flops  # noqa: E402
from seed_jax.models import ModelConfig, Transformer  # noqa: E402
from seed_jax.seed import logprobs as lp_lib  # noqa: E402
from seed_jax.seed import losses  # noqa: E402
from seed_jax.seed import train_step as ts  # noqa: E402
from seed_jax.seed.optim import OptimConfig  # noqa: E402

_ROWS = flags.DEFINE_integer("rows", 4, "student rows per step (as many teacher rows)")
_PROMPT = flags.DEFINE_integer("prompt_len", 64, "P, padded prompt length")
_RESPONSE = flags.DEFINE_integer("response_len", 64, "R, padded response length")
_CHUNK = flags.DEFINE_integer("chunk", 128, "log-prob chunk over response positions")
_REPEATS = flags.DEFINE_integer("repeats", 2, "timed steps per mode after one warm-up")
_MODES = flags.DEFINE_list("modes", ["joint", "separate"], "teacher modes to time")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "compute dtype")
_LP_ROWS = flags.DEFINE_integer("lp_rows", 8, "rows of the log-prob memory comparison")
_LP_LEN = flags.DEFINE_integer("lp_len", 512, "response length of the memory comparison")
_LP_CHUNKS = flags.DEFINE_list("lp_chunks", ["32", "128"], "chunk sizes of the comparison")


def _batch(rows, prompt_len, response_len, vocab, seed=0):
  rng = np.random.default_rng(seed)
  total = prompt_len + response_len
  tokens = rng.integers(3, vocab, size=(rows, total)).astype(np.int32)
  mask = np.ones((rows, total), bool)
  mask[:, : prompt_len // 4] = False  # some left padding
  return {
      "student_tokens": tokens, "student_mask": mask,
      "teacher_tokens": np.roll(tokens, 1, axis=1), "teacher_mask": np.ones_like(mask),
      "response_mask": np.ones((rows, response_len), np.float32),
      "old_logprobs": np.full((rows, response_len), -10.8, np.float32),
      "advantages": rng.normal(size=rows).astype(np.float32),
      "opd_mask": np.ones((rows,), np.float32),
  }


def _step_flops(cfg: ModelConfig, rows: int, prompt_len: int, response_len: int) -> float:
  """Useful FLOPs: student forward + backward (3x) and teacher forward (1x); the LM head
  only at the R response positions."""
  body = forward_flops(cfg, rows, prompt_len + response_len, with_head=False)
  head = 2 * cfg.hidden_size * cfg.vocab_size * rows * response_len
  return 4 * (body + head)


def _logprob_memory(cfg: ModelConfig, rows: int, length: int, chunks: list[int]) -> dict:
  """Compiled temp bytes of value-and-grad of log-prob + entropy, chunked vs naive."""
  args = (jax.ShapeDtypeStruct((rows, length, cfg.hidden_size), jnp.float32),
          jax.ShapeDtypeStruct((cfg.vocab_size, cfg.hidden_size), jnp.float32),
          jax.ShapeDtypeStruct((rows, length), jnp.int32))

  def temp_mib(fn):
    def objective(hidden, embed, targets):
      lp, entropy = fn(lambda h: jnp.einsum("...e,ve->...v", h, embed), hidden, targets)
      return jnp.sum(lp) + jnp.sum(entropy)
    memory = jax.jit(jax.grad(objective, argnums=(0, 1))).lower(*args).compile()
    return round(memory.memory_analysis().temp_size_in_bytes / 2**20, 1)

  out = {"rows": rows, "length": length, "vocab": cfg.vocab_size,
         "full_logits_mib": round(rows * length * cfg.vocab_size * 4 / 2**20, 1),
         "naive_temp_mib": temp_mib(lp_lib.naive_token_logprobs)}
  for chunk in chunks:
    out[f"chunked{chunk}_temp_mib"] = temp_mib(
        lambda u, h, t, c=chunk: lp_lib.chunked_token_logprobs(u, h, t, c))
  return out


def main(_):
  cfg = ModelConfig(dtype=_DTYPE.value)  # the SmolLM2-135M shape
  model = Transformer(cfg, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model, nnx.Param)
  rows, prompt_len, response_len = _ROWS.value, _PROMPT.value, _RESPONSE.value
  batch = {k: jnp.asarray(v) for k, v in
           _batch(rows, prompt_len, response_len, cfg.vocab_size).items()}
  optim_cfg = OptimConfig()
  loss_cfg = losses.LossConfig(kl_coef=0.0)
  useful = _step_flops(cfg, rows, prompt_len, response_len)
  peak = matmul_peak_flops(jnp.dtype(_DTYPE.value))
  results = {}
  for mode in _MODES.value:
    step = ts.make_train_step(graphdef, optim_cfg, ts.TrainStepConfig(
        teacher_mode=mode, logprob_chunk=_CHUNK.value, loss=loss_cfg))
    state = ts.init_train_state(jax.tree.map(jnp.copy, params), optim_cfg)
    start = time.perf_counter()
    compiled = step.lower(state, batch).compile()
    compile_s = time.perf_counter() - start
    state, metrics = compiled(state, batch)  # warm-up
    jax.block_until_ready(metrics)
    times = []
    for _ in range(_REPEATS.value):
      start = time.perf_counter()
      state, metrics = compiled(state, batch)
      jax.block_until_ready(metrics)
      times.append(time.perf_counter() - start)
    seconds = min(times)
    results[mode] = dict(
        seconds=round(seconds, 3), compile_s=round(compile_s, 1),
        tokens_per_s=round(rows * (prompt_len + response_len) / seconds, 1),
        response_tokens_per_s=round(rows * response_len / seconds, 1),
        useful_gflops_per_s=round(useful / seconds / 1e9, 2),
        fraction_of_matmul_peak=round(useful / seconds / peak, 3),
        step_temp_mib=round(compiled.memory_analysis().temp_size_in_bytes / 2**20, 1),
        loss_finite=bool(np.isfinite(float(metrics["loss"]))))
    del state
  emit(dict(bench="train_step", model="smollm2-135m-shape (random weights)",
            dtype=_DTYPE.value, rows=rows, prompt_len=prompt_len, response_len=response_len,
            matmul_peak_gflops=round(peak / 1e9, 1), modes=results,
            logprob_memory=_logprob_memory(cfg, _LP_ROWS.value, _LP_LEN.value,
                                           [int(c) for c in _LP_CHUNKS.value])))


if __name__ == "__main__":
  app.run(main)
