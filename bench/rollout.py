"""One RL iteration's rollout, turn-synchronous against continuous (`rollout.continuous`).

  python bench/rollout.py [--config=configs/alfworld.py:compare --max_new_tokens=40,512
                           --modes=synchronous,continuous --repeats=2
                           --config.init_from=RUN_OR_HF_FOLDER]

The preset's model, games and sampling (its `rollout.tasks_per_batch` x `group_size`
episodes of its first training games, the same seed in every mode), played through
`seed_jax.train.rollout.play_episodes` once per response budget and mode, `--repeats` times
(the first includes XLA compiles: `cold_s`; `seconds` is the fastest of the others). Each
reports the prompt tokens prefilled, the response tokens decoded and their rate, the turns,
success, the response lengths' spread, and `decode_steps` (`bench.common`): the steps these
responses need with the turn barrier and, at least, without it (the longest episode's
responses together); for the synchronous loop also `barrier_utilisation`, the share of its
decode rows that held a live response. The two loops sample different streams, so compare
their `tok_s` and steps, not their seconds alone. Beside them this machine's streaming
bandwidth and matmul peak, measured in the same run. Prints one JSON line.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from seed_jax.cli import NO_TPU_ENV  # noqa: E402

for _key, _value in NO_TPU_ENV.items():
  os.environ.setdefault(_key, _value)

import dataclasses  # noqa: E402

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from bench.common import (barrier_utilisation, decode_steps, emit,  # noqa: E402
                          matmul_peak_flops, stream_bandwidth_bytes)
from seed_jax.train.rollout import play_episodes  # noqa: E402
from seed_jax.train.spec import build_run_spec  # noqa: E402
from seed_jax.train.trainer import Trainer  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", "configs/alfworld.py:compare",
                                          "the preset whose rollout is measured")
_BUDGETS = flags.DEFINE_list("max_new_tokens", ["40", "512"], "response budgets")
_MODES = flags.DEFINE_list("modes", ["synchronous", "continuous"], "rollout loops")
_REPEATS = flags.DEFINE_integer("repeats", 2, "rollouts per budget and mode (first: cold)")
_SEED = flags.DEFINE_integer("seed", 0, "seed of the env resets and of sampling")
_MODES_CHOICES = ("synchronous", "continuous")


def _play(trainer: Trainer, spec, tasks) -> tuple[float, list, dict]:
  start = time.perf_counter()
  trajs, stats = play_episodes(trainer.sampler, trainer.tokenizer, trainer.pool(),
                               trainer.fmt, tasks, trainer.spec.rl.group_size, spec,
                               seed=_SEED.value, desc=None)
  return time.perf_counter() - start, trajs, stats


def main(_):
  modes = _MODES.value
  if not modes or any(m not in _MODES_CHOICES for m in modes):
    raise app.UsageError(f"--modes={','.join(modes)}: each one of {', '.join(_MODES_CHOICES)}")
  if not all(b.isdigit() and int(b) > 0 for b in _BUDGETS.value):
    raise app.UsageError(f"--max_new_tokens={','.join(_BUDGETS.value)}: positive integers")
  if _REPEATS.value < 1:
    raise app.UsageError(f"--repeats={_REPEATS.value}: at least 1")
  config = _CONFIG.value
  with config.unlocked():  # the sampler's cache must hold the largest budget
    config.rollout.max_new_tokens = max(int(b) for b in _BUDGETS.value)
  run_spec = build_run_spec(config)
  workdir = tempfile.TemporaryDirectory(prefix="bench_rollout_")  # the Trainer's files
  trainer = Trainer(run_spec, workdir.name)
  tasks = trainer.tasks("train")[:run_spec.rl.tasks_per_batch]
  results = {}
  try:
    for budget in (int(b) for b in _BUDGETS.value):
      by_mode = results[str(budget)] = {}
      for mode in modes:
        spec = dataclasses.replace(run_spec.rollout, max_new_tokens=budget,
                                   continuous=mode == "continuous")
        times, trajs, stats = [], None, None
        for _ in range(_REPEATS.value):
          seconds, trajs, stats = _play(trainer, spec, tasks)
          times.append(seconds)
        lengths = [[len(s.response_ids) for s in t.steps] for t in trajs]
        flat = np.array([n for episode in lengths for n in episode])
        warm = min(times[1:]) if len(times) > 1 else times[0]
        by_mode[mode] = dict(
            cold_s=round(times[0], 1), seconds=round(warm, 1),
            prompt_tokens=sum(len(s.prompt_ids) for t in trajs for s in t.steps),
            response_tokens=int(flat.sum()), tok_s=round(float(flat.sum()) / warm, 1),
            turns=int(stats["steps"]), success=round(float(stats["success"]), 3),
            response_len_mean=round(float(flat.mean()), 1),
            response_len_p10_p50_p90=[int(q) for q in np.percentile(flat, [10, 50, 90])],
            at_budget=round(float(np.mean(flat >= budget)), 3),
            decode_steps=decode_steps(lengths))
        if mode == "synchronous":
          by_mode[mode]["barrier_utilisation"] = round(barrier_utilisation(lengths), 3)
      if len(by_mode) == 2:
        by_mode["speedup"] = round(by_mode["synchronous"]["seconds"]
                                   / by_mode["continuous"]["seconds"], 2)
  finally:
    trainer.close()
    workdir.cleanup()
  emit(dict(bench="rollout", config=config_flags.get_config_filename(flags.FLAGS["config"]),
            model=run_spec.model.name, dtype=run_spec.model.dtype,
            episodes=len(tasks) * run_spec.rl.group_size,
            max_turns=run_spec.rollout.max_turns, init_from=run_spec.init_from or None,
            stream_gbps=round(stream_bandwidth_bytes() / 1e9, 2),
            matmul_peak_gflops=round(matmul_peak_flops(jnp.dtype(run_spec.model.dtype))
                                     / 1e9, 1),
            results=results))


if __name__ == "__main__":
  app.run(main)
