"""The update with padded rows against packed sequences, on turns of realistic lengths.

  python bench/packing.py [--turns=16 --micro_turns=8 --prompt_range=380,720
                           --response_len=40 --at_budget=0.69 --pack_rows=0,2,4
                           --windows=on --dtype=bfloat16 --remat=projections --repeats=2]

A mini-batch of `--turns` turns of random tokens: prompts uniform in `--prompt_range`
(the `:compare` ALFWorld turns: the first turn's ~380 tokens to a long history's ~720),
responses at the budget `--response_len` with probability `--at_budget` and otherwise
uniform below it (results/speed/rollout_2026-12-02.jsonl: 69% of the :compare responses
hit 40 tokens, p10 18), each turn with a teacher prompt 60 tokens longer (a skill). Rows
are laid out by `build_batch` as the trainer does (prompt bucket 128), then either run as
rows (`pack_rows=0`) or packed into turns / k sequences (`seed_jax.seed.packing`), and one
full train step (the "precomputed" teacher mode, `--micro_turns` turns a forward) is timed.
Packed sequences attend within a window of the longest turn (`packing.max_segment_len`,
`--windows=on`, the trainer's way) or over their whole causal triangle (`off`, reported as
`packed_K_full`).

Each layout reports the seconds of a step, the real tokens (prompt + response of every
turn) per second, the share of computed tokens that are real (`fill`), the useful FLOPs
(forward + backward over the real tokens only, each turn on its own) per second and their
fraction of the matmul peak measured in the same run, and the compiled temporaries.
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

from bench.common import emit, matmul_peak_flops, useful_training_flops  # noqa: E402
from seed_jax.models import load_model  # noqa: E402
from seed_jax.seed import batch as batch_lib  # noqa: E402
from seed_jax.seed import losses  # noqa: E402
from seed_jax.seed import packing  # noqa: E402
from seed_jax.seed import train_step as ts  # noqa: E402
from seed_jax.seed.optim import OptimConfig  # noqa: E402

_TURNS = flags.DEFINE_integer("turns", 16, "turns of the mini-batch (one optimizer step)")
_MICRO = flags.DEFINE_integer("micro_turns", 8, "turns per forward/backward")
_PROMPTS = flags.DEFINE_list("prompt_range", ["380", "720"], "prompt tokens, low,high")
_RESPONSE = flags.DEFINE_integer("response_len", 40, "R, the response budget")
_AT_BUDGET = flags.DEFINE_float("at_budget", 0.69, "share of responses at the budget")
_SKILL = flags.DEFINE_integer("skill_tokens", 60, "extra tokens of a teacher prompt")
_PACK = flags.DEFINE_list("pack_rows", ["0", "2", "4"], "0: rows; k: turns / k sequences")
_WINDOWS = flags.DEFINE_list("windows", ["on"], "packed attention: on (a window of the "
                              "longest turn), off (the whole row), or both")
_DTYPE = flags.DEFINE_enum("dtype", "bfloat16", ["float32", "bfloat16"], "compute dtype")
_REMAT = flags.DEFINE_string("remat", "projections", "model.remat (the :cpu presets')")
_REPEATS = flags.DEFINE_integer("repeats", 2, "timed steps after a warm-up")
_SEED = flags.DEFINE_integer("seed", 0, "the turns' lengths and tokens")


def synthetic_turns(vocab: int) -> list[batch_lib.Trajectory]:
  """One trajectory per turn (advantages need groups: two groups of mixed scores)."""
  rng = np.random.default_rng(_SEED.value)
  low, high = (int(x) for x in _PROMPTS.value)
  trajs = []
  for n in range(_TURNS.value):
    prompt = rng.integers(3, vocab, size=rng.integers(low, high + 1)).tolist()
    length = (_RESPONSE.value if rng.random() < _AT_BUDGET.value
              else int(rng.integers(5, _RESPONSE.value)))
    response = rng.integers(3, vocab, size=length).tolist()
    step = batch_lib.StepRecord(
        prompt_ids=prompt, response_ids=response, sampler_logprobs=[-2.0] * length,
        teacher_prompt_ids=rng.integers(3, vocab, size=_SKILL.value).tolist() + prompt)
    trajs.append(batch_lib.Trajectory(task_id=str(n % 2), group_id=str(n % 2),
                                      traj_id=str(n), won=n % 3 == 0,
                                      episode_reward=10.0 * (n % 3 == 0), steps=[step]))
  return trajs


def layout(rows: dict[str, np.ndarray], pack_rows: int) -> dict[str, np.ndarray]:
  if not pack_rows:
    return rows
  plan = packing.plan_packing(rows, _TURNS.value // pack_rows)
  return packing.pack_batch(rows, plan, packing.packed_widths([plan], 128, shared=False))


def main(_):
  packs = [int(k) for k in _PACK.value]
  if any(k < 0 or _MICRO.value % max(k, 1) for k in packs):
    raise app.UsageError(f"--pack_rows={','.join(_PACK.value)}: each 0 or a divisor of "
                         f"--micro_turns={_MICRO.value}")
  peak = matmul_peak_flops(jnp.dtype(_DTYPE.value))
  model, _ = load_model("smollm2-135m-instruct", dtype=_DTYPE.value, param_dtype="float32",
                        remat=_REMAT.value)
  cfg = model.cfg
  graphdef, params = nnx.split(model, nnx.Param)
  trajs = synthetic_turns(cfg.vocab_size)
  rows, _ = batch_lib.build_batch(trajs, batch_lib.BatchConfig(
      response_len=_RESPONSE.value, prompt_bucket=128, rows_multiple=_TURNS.value,
      shared_prompt_len=False))
  rows["teacher_logprobs"] = np.full(rows["old_logprobs"].shape, -1.5, np.float32)
  flops, real_tokens = useful_training_flops(
      cfg, [(t.steps[0].prompt_ids, t.steps[0].response_ids) for t in trajs])
  optim_cfg = OptimConfig()
  step = ts.make_train_step(graphdef, optim_cfg, ts.TrainStepConfig(
      micro_batches=_TURNS.value // _MICRO.value, logprob_chunk=512,
      loss=losses.LossConfig(kl_coef=0.0)))
  results = {}
  runs = [(k, window) for k in packs for window in (_WINDOWS.value if k else ["off"])]
  for k, window in runs:
    batch = {key: jnp.asarray(v) for key, v in layout(rows, k).items()
             if not key.startswith("teacher_") or key == "teacher_logprobs"}
    state = ts.init_train_state(jax.tree.map(jnp.copy, params), optim_cfg)
    start = time.perf_counter()
    compiled = step.lower(state, batch, (
        packing.max_segment_len(rows) if window == "on" else None)).compile()
    compile_s = time.perf_counter() - start
    best = float("inf")
    for i in range(_REPEATS.value + 1):
      start = time.perf_counter()
      state, metrics = compiled(state, batch)
      jax.block_until_ready(metrics)
      if i:
        best = min(best, time.perf_counter() - start)
    fill = packing.token_fill({k2: np.asarray(v) for k2, v in batch.items()})["student_fill"]
    name = "rows" if not k else f"packed_{k}" + ("" if window == "on" else "_full")
    results[name] = dict(
        shape=list(batch["student_tokens"].shape), fill=round(fill, 3),
        seconds=round(best, 2), compile_s=round(compile_s, 1),
        real_tokens_per_s=round(real_tokens / best, 1),
        useful_gflops_per_s=round(flops / best / 1e9, 1),
        fraction_of_matmul_peak=round(flops / best / peak, 3),
        temp_mib=round(compiled.memory_analysis().temp_size_in_bytes / 2**20, 1),
        loss=round(float(metrics["loss"]), 5))
    del state
  if "rows" in results:
    for name, r in results.items():
      r["speedup_vs_rows"] = round(results["rows"]["seconds"] / r["seconds"], 2)
  emit(dict(bench="packing", model="smollm2-135m-instruct", dtype=_DTYPE.value,
            remat=_REMAT.value, turns=_TURNS.value, micro_turns=_MICRO.value,
            prompt_range=[int(x) for x in _PROMPTS.value], response_len=_RESPONSE.value,
            at_budget=_AT_BUDGET.value, real_tokens=real_tokens,
            matmul_peak_gflops=round(peak / 1e9, 1), results=results))


if __name__ == "__main__":
  app.run(main)
