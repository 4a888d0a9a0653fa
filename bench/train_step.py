"""Training throughput at the Quickstart's shape, against this machine's matmul peak.

  python bench/train_step.py [--rows=8 --prompt_len=704 --response_len=64 --dtype=bfloat16
                              --micro_batches=1 --live_rows=0
                              --modes=precomputed,separate --repeats=2 --matmul_n=2048
                              --remat=full,projections,none --lora_ranks=0,64]

The embedded model (SmolLM2-135M-Instruct, float32 parameters, `--dtype` compute) on
`rows x (prompt_len + response_len)` tokens (the `:cpu` presets' micro-batch: 8 x 768):
* `grad`: the jitted value-and-grad of the summed response log-probs (the training
  forward + backward, no optimizer);
* one full train step per teacher mode (`precomputed`, the default, scores no teacher in
  the step; `separate` adds a no-grad teacher forward; `joint` a batched one), over
`--micro_batches`, with `--live_rows` of the rows counted by a loss term (GRPO's rows of
groups that all scored alike are not: the step skips the micro-batches they fill; its
tokens/s and useful FLOPs count the live rows only).
Each reports tokens/s, the achieved useful GFLOP/s (the model count of
`seed_jax.models.flops.training_flops`: forward 1x, backward 2x; the LM head only at
response positions; rematerialisation not counted) and its fraction of the matmul peak
measured in the same run: a bf16 x bf16 -> float32 matmul for bfloat16 compute, float32
otherwise. Also the compiled temp memory of each (and the train state's: weights and
AdamW moments), and of value-and-grad
of the chunked log-prob + entropy against the naive `[B, R, V]` float32 logits.
Prints one JSON line.
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

from bench.common import emit, matmul_peak_flops, synthetic_rl_batch  # noqa: E402
from seed_jax.models import load_model  # noqa: E402
from seed_jax.models.config import REMAT_POLICIES  # noqa: E402
from seed_jax.models.flops import forward_flops, training_flops  # noqa: E402
from seed_jax.seed import logprobs as lp_lib  # noqa: E402
from seed_jax.seed import losses  # noqa: E402
from seed_jax.seed import train_step as ts  # noqa: E402
from seed_jax.seed.optim import OptimConfig  # noqa: E402

_ROWS = flags.DEFINE_integer("rows", 8, "student rows per step (as many teacher rows)")
_PROMPT = flags.DEFINE_integer("prompt_len", 704, "P, padded prompt length")
_RESPONSE = flags.DEFINE_integer("response_len", 64, "R, padded response length")
_CHUNK = flags.DEFINE_integer("chunk", 512, "log-prob chunk over response positions")
_REPEATS = flags.DEFINE_integer("repeats", 2, "timed runs per measurement after a warm-up")
_MODES = flags.DEFINE_list("modes", ["precomputed"], "teacher modes of the full step")
_DTYPE = flags.DEFINE_enum("dtype", "bfloat16", ["float32", "bfloat16"], "compute dtype")
_LP_ROWS = flags.DEFINE_integer("lp_rows", 8, "rows of the log-prob memory comparison")
_LP_LEN = flags.DEFINE_integer("lp_len", 512, "response length of the memory comparison")
_LP_CHUNKS = flags.DEFINE_list("lp_chunks", ["32", "128"], "chunk sizes of the comparison")
_MATMUL_N = flags.DEFINE_integer("matmul_n", 2048, "side of the square matmul of the peak")
_LORA = flags.DEFINE_list("lora_ranks", ["0"], "LoRA ranks on every projection (0: full "
                          "fine-tuning); a rank r adds `_lora<r>` to the measurement names")
_MICRO = flags.DEFINE_integer("micro_batches", 1, "micro-batches the step accumulates over")
_LIVE = flags.DEFINE_integer("live_rows", 0, "rows some loss term counts; the others are rows "
                             "of groups that all scored alike, without a skill, which the step "
                             "skips by the micro-batch (0: every row)")
_REMAT = flags.DEFINE_list("remat", list(REMAT_POLICIES), "what the backward pass keeps "
                           "of each layer (`model.remat`); a policy other than full adds "
                           "`_remat_<policy>` to the measurement names")


def _useful_flops(cfg, rows: int, prompt_len: int, response_len: int,
                  teacher_forward: bool) -> float:
  """Model FLOPs of forward + backward over every token, the LM head only at the R
  response positions; plus a no-grad teacher forward when the step scores the teacher."""
  length = prompt_len + response_len
  model, _ = training_flops(cfg, rows, length, unembedded=response_len)
  teacher = forward_flops(cfg, rows, length, unembedded=response_len) if teacher_forward else 0
  return model + teacher


def _timed(compiled, *args, donate_first: bool = False):
  """Best wall time of `compiled(*args)` over the repeats, after one warm-up; with
  `donate_first` the first output replaces the first argument (a donated train state)."""
  best = float("inf")
  for i in range(_REPEATS.value + 1):
    start = time.perf_counter()
    out = compiled(*args)
    jax.block_until_ready(out)
    if i:
      best = min(best, time.perf_counter() - start)
    if donate_first:
      args = (out[0],) + args[1:]
  return best, out


def _record(seconds, compile_s, flops, peak, tokens, compiled, **extra):
  return dict(seconds=round(seconds, 3), compile_s=round(compile_s, 1),
              tokens_per_s=round(tokens / seconds, 1),
              achieved_gflops_per_s=round(flops / seconds / 1e9, 1),
              fraction_of_matmul_peak=round(flops / seconds / peak, 3),
              temp_mib=round(compiled.memory_analysis().temp_size_in_bytes / 2**20, 1),
              **extra)


def _logprob_memory(cfg, rows: int, length: int, chunks: list[int]) -> dict:
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
  for remat in _REMAT.value:
    if remat not in REMAT_POLICIES:
      raise app.UsageError(f"--remat={','.join(_REMAT.value)}: each must be one of "
                           f"{', '.join(REMAT_POLICIES)}")
  ranks = [int(r) for r in _LORA.value if r.isdigit()]
  if len(ranks) != len(_LORA.value):
    raise app.UsageError(f"--lora_ranks={','.join(_LORA.value)}: non-negative integers")
  peak = matmul_peak_flops(jnp.dtype(_DTYPE.value), _MATMUL_N.value)
  results = {}
  for remat in _REMAT.value:
    for rank in ranks:
      suffix = ("" if remat == "full" else f"_remat_{remat}") + (f"_lora{rank}" if rank else "")
      cfg = _measure(remat, rank, suffix, peak, results)
  emit(dict(bench="train_step", model="smollm2-135m-instruct", dtype=_DTYPE.value,
            param_dtype="float32", rows=_ROWS.value, micro_batches=_MICRO.value,
            live_rows=_LIVE.value or _ROWS.value, prompt_len=_PROMPT.value,
            response_len=_RESPONSE.value, matmul_peak_gflops=round(peak / 1e9, 1),
            results=results,
            logprob_memory=_logprob_memory(cfg, _LP_ROWS.value, _LP_LEN.value,
                                           [int(c) for c in _LP_CHUNKS.value])))


def _with_live_rows(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """`batch` with only `--live_rows` rows counted by a loss term, in the row order the
  trainer gives a mini-batch (`train_step.micro_batch_row_order`)."""
  live = np.arange(_ROWS.value) < (_LIVE.value or _ROWS.value)
  batch = {**batch, "outcome_mask": live.astype(np.float32),
           "opd_mask": live.astype(np.float32)}
  order = ts.micro_batch_row_order(live, _MICRO.value)
  return {k: v[order] for k, v in batch.items()}


def _measure(remat: str, lora_rank: int, suffix: str, peak: float, results: dict):
  """The value-and-grad and each mode's train step under remat policy `remat`,
  full or LoRA (`lora_rank` on every projection, alpha 2 x rank), into `results` (names +
  `suffix`); returns the model config."""
  model, _ = load_model("smollm2-135m-instruct", dtype=_DTYPE.value, param_dtype="float32",
                        remat=remat, lora_rank=lora_rank, lora_alpha=2.0 * lora_rank)
  cfg = model.cfg
  graphdef, params = nnx.split(model, nnx.Param)
  rows, prompt_len, response_len = _ROWS.value, _PROMPT.value, _RESPONSE.value
  tokens = rows * (prompt_len + response_len)
  batch = {k: jnp.asarray(v) for k, v in _with_live_rows(
      synthetic_rl_batch(rows, prompt_len, response_len, cfg.vocab_size)).items()}

  def logprob_loss(p, tokens, mask):
    lp, _ = lp_lib.response_logprobs(nnx.merge(graphdef, p), tokens, mask, response_len,
                                     _CHUNK.value)
    return -jnp.sum(lp)

  start = time.perf_counter()
  grad = jax.jit(ts.trainable_value_and_grad(logprob_loss)).lower(
      params, batch["student_tokens"], batch["student_mask"]).compile()
  compile_s = time.perf_counter() - start
  seconds, (loss, _) = _timed(grad, params, batch["student_tokens"], batch["student_mask"])
  results["grad" + suffix] = _record(seconds, compile_s, _useful_flops(
      cfg, rows, prompt_len, response_len, teacher_forward=False), peak, tokens, grad,
                            loss_finite=bool(np.isfinite(float(loss))))

  optim_cfg = OptimConfig()
  loss_cfg = losses.LossConfig(kl_coef=0.0)
  for mode in _MODES.value:
    step = ts.make_train_step(graphdef, optim_cfg, ts.TrainStepConfig(
        teacher_mode=mode, logprob_chunk=_CHUNK.value, micro_batches=_MICRO.value,
        loss=loss_cfg))
    state = ts.init_train_state(jax.tree.map(jnp.copy, params), optim_cfg)
    start = time.perf_counter()
    compiled = step.lower(state, batch).compile()
    compile_s = time.perf_counter() - start
    seconds, (state, metrics) = _timed(compiled, state, batch, donate_first=True)
    # Useful work: the rows some loss term counts (all of them unless --live_rows).
    live_rows = _LIVE.value or rows
    flops = _useful_flops(cfg, live_rows, prompt_len, response_len,
                          teacher_forward=mode != "precomputed")
    results[f"step_{mode}{suffix}"] = _record(
        seconds, compile_s, flops, peak, live_rows * (prompt_len + response_len), compiled,
        loss_finite=bool(np.isfinite(float(metrics["loss"]))),
        state_mib=round(sum(x.nbytes for x in jax.tree.leaves(state)) / 2**20, 1))
    del state
  return cfg


if __name__ == "__main__":
  app.run(main)
