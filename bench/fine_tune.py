"""The behaviour-cloning step (and stage-1 SFT's, the same step) on padded rows against
packed sequences, on a run's real examples.

  python bench/fine_tune.py --config=configs/sokoban.py:cpu --config.bc.episodes=64 \\
      --config.env.num_tasks.train=64 --config.bc.skill_fraction=1.0 \\
      --config.skill_placement=end [--pack_rows=0,2,4,8 --steps=2]

The config's env expert plays its first `bc.episodes` training tasks and `stage1.bc_examples`
makes the run's examples (`Trainer.behaviour_cloning_examples`, as the warm start does); the run's batches
(`sft.step_batches`, the run's seed) are then laid out as rows (`pack_rows=0`: every
prompt left-padded to the run's longest) or packed k to a sequence, and the first `--steps`
optimizer steps of the run are timed after compiling (the model, dtype and remat of the
config).

Each layout reports the seconds of a step, the real tokens per second (prompt + target of
every example) and their useful FLOPs (forward + backward of each example on its own) as a
fraction of the matmul peak measured in the same run, the share of computed tokens that are
real (`fill`, over every batch of the run), the run's projected seconds (steps x seconds a
step), the compiled FLOPs and temporaries, and the first step's NLL (the same in every
layout). Prints one JSON line.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from bench.common import emit, matmul_peak_flops, useful_training_flops  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", "configs/sokoban.py:cpu", "the run")
_PACK = flags.DEFINE_list("pack_rows", ["0", "2", "4", "8"], "0: rows; k: batch / k sequences")
_STEPS = flags.DEFINE_integer("steps", 2, "timed optimizer steps of the run")


def main(_):
  # pylint: disable=import-outside-toplevel
  from seed_jax.seed.train_step import init_train_state
  from seed_jax.train import sft
  from seed_jax.train.spec import build_run_spec
  from seed_jax.train.trainer import Trainer
  packs = [int(k) for k in _PACK.value]
  spec = build_run_spec(_CONFIG.value)
  if spec.bc is None or not spec.bc.episodes:
    raise app.UsageError("--config: behaviour cloning is off (config.bc.enabled, bc.episodes)")
  peak = matmul_peak_flops(jnp.dtype(spec.model.dtype))
  with tempfile.TemporaryDirectory(prefix="bench_fine_tune-") as scratch:
    trainer = Trainer(spec, scratch)
    try:
      _, examples = trainer.behaviour_cloning_examples()
    finally:
      trainer.close()
    graphdef, params, cfg = trainer.graphdef, trainer.state.params, trainer.model_cfg
    results = {}
    for k in packs:
      fine_tune = dataclasses.replace(spec.bc.fine_tune, pack_rows=k)
      run = sft.step_batches(examples, (), spec=fine_tune, data_parallel=1,
                             pad_id=trainer.tokenizer.pad_id, seed=spec.seed)
      optim_cfg = sft.fine_tune_optim(fine_tune, len(run.batches))
      step = sft.make_nll_step(graphdef, optim_cfg, chunk=fine_tune.chunk,
                               max_segment_len=run.max_segment_len)
      state = init_train_state(jax.tree.map(jnp.copy, params), optim_cfg)
      first = {key: jnp.asarray(v) for key, v in run.host_batch(0).items()}
      start = time.perf_counter()
      compiled = step.lower(state, first).compile()
      compile_s = time.perf_counter() - start
      seconds, flops, tokens, nll = [], 0.0, 0, None
      for i in range(_STEPS.value):
        batch = {key: jnp.asarray(v) for key, v in run.host_batch(i).items()}
        start = time.perf_counter()
        state, metrics = compiled(state, batch)
        jax.block_until_ready(metrics)
        seconds.append(time.perf_counter() - start)
        nll = float(metrics["nll"]) if nll is None else nll
        f, t = useful_training_flops(cfg, [(e.prompt_ids, e.target_ids)
                                            for e in run.batches[i]])
        flops, tokens = flops + f, tokens + t
      spent = sum(seconds)
      fills = [sft.token_fill(run.host_batch(i)) for i in range(len(run.batches))]
      cost = compiled.cost_analysis()
      cost = cost[0] if isinstance(cost, (list, tuple)) else cost
      results["rows" if not k else f"packed_{k}"] = dict(
          shape=list(first["tokens"].shape), fill=round(float(np.mean(fills)), 3),
          seconds_per_step=round(spent / len(seconds), 2), compile_s=round(compile_s, 1),
          real_tokens_per_s=round(tokens / spent, 1),
          fraction_of_matmul_peak=round(flops / spent / peak, 3),
          run_steps=len(run.batches),
          projected_run_s=round(spent / len(seconds) * len(run.batches)),
          compiled_gflop=round(float(cost.get("flops", 0.0)) / 1e9, 1),
          temp_mib=round(compiled.memory_analysis().temp_size_in_bytes / 2**20, 1),
          first_nll=round(nll, 5))
      del state
  if "rows" in results:
    for r in results.values():
      r["speedup_vs_rows"] = round(results["rows"]["seconds_per_step"] / r["seconds_per_step"], 2)
  emit(dict(bench="fine_tune", env=spec.env.name, model=spec.model.name,
            dtype=spec.model.dtype, remat=spec.model.remat, examples=len(examples),
            batch_size=spec.bc.fine_tune.batch_size, steps_timed=_STEPS.value,
            matmul_peak_gflops=round(peak / 1e9, 1), results=results))


if __name__ == "__main__":
  app.run(main)
