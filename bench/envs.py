"""Env throughput through the pool, and the pool's per-step overhead; prints one JSON line.

  python bench/envs.py [--env=alfworld] [--sizes=8,32] [--steps=10] [--workers=0] [--set=k=v]

Every env takes `--steps` uniformly random admissible actions (the same ones, by seed, in
every measurement). Reported:
  bare_steps_per_s          one env in this process, no pool
  pool_steps_per_s[n]       n envs in an EnvPool of `--workers` processes (0: one per CPU)
  pool_overhead_ms_per_step the pool's extra wall time per step over the bare env, with one
                            env on one worker (IPC, pickling, bookkeeping)
Resets are not timed. Generated ALFWorld games come from the usual cache (made on first use).
"""

from __future__ import annotations

import json
import os
import platform
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from seed_jax.envs.pool import EnvPool  # noqa: E402
from seed_jax.envs.registry import get_env_module  # noqa: E402
from seed_jax.play import apply_overrides  # noqa: E402  (also defines --env, --set, --workers)

FLAGS = flags.FLAGS
_SIZES = flags.DEFINE_list("sizes", ["8", "32"], "Numbers of envs stepped together.")
_STEPS = flags.DEFINE_integer("steps", 10, "Steps per env per measurement.")
flags.FLAGS.set_default("set", ["num_games.train=32"])


def _random_action(info, rng: random.Random) -> str:
  admissible = [a for a in info.get("admissible_actions") or [] if a != "help"]
  return rng.choice(admissible) if admissible else "look"


def bare_steps_per_s(env_module, config, tasks, steps: int) -> float:
  env = env_module.make_env(config)
  total_steps, total_time = 0, 0.0
  for i, task in enumerate(tasks):
    rng = random.Random(i)
    _, info = env.reset(task, i)
    for _ in range(steps):
      action = _random_action(info, rng)
      start = time.perf_counter()
      result = env.step(action)
      total_time += time.perf_counter() - start
      total_steps += 1
      info = result.info
      if result.done:
        break
  env.close()
  return total_steps / total_time


def pool_steps_per_s(pool: EnvPool, tasks, steps: int) -> float:
  rngs = [random.Random(i) for i in range(len(tasks))]
  infos = [info for _, info in pool.reset(tasks, seeds=list(range(len(tasks))))]
  done = [False] * len(tasks)
  total_steps, start = 0, time.perf_counter()
  for _ in range(steps):
    actions = [None if d else _random_action(info, rng)
               for d, info, rng in zip(done, infos, rngs)]
    for row, result in enumerate(pool.step(actions)):
      if result is not None:
        total_steps += 1
        infos[row], done[row] = result.info, result.done
    if all(done):
      break
  return total_steps / (time.perf_counter() - start)


def main(argv):
  del argv
  env_module = get_env_module(FLAGS.env)
  config = apply_overrides(env_module.default_config(), FLAGS.set)
  sizes = [int(s) for s in _SIZES.value]
  tasks = env_module.load_tasks(config, "train")
  workers = FLAGS.workers or os.cpu_count() or 1
  record = {"bench": "envs", "env": FLAGS.env, "steps_per_env": _STEPS.value,
            "workers": workers, "num_tasks": len(tasks)}
  bare = bare_steps_per_s(env_module, config, tasks[:4], _STEPS.value)
  record["bare_steps_per_s"] = round(bare, 2)
  # The same 4 episodes and actions through a pool of one env on one worker.
  with EnvPool(FLAGS.env, config, num_workers=1) as pool:
    per_step = []
    for i, task in enumerate(tasks[:4]):
      rng = random.Random(i)
      _, info = pool.reset([task], seeds=[i])[0]
      for _ in range(_STEPS.value):
        start = time.perf_counter()
        result = pool.step([_random_action(info, rng)])[0]
        per_step.append(time.perf_counter() - start)
        info = result.info
        if result.done:
          break
  pooled = sum(per_step) / len(per_step)
  record["pool_overhead_ms_per_step"] = round(1e3 * (pooled - 1.0 / bare), 3)
  record["pool_one_env_steps_per_s"] = round(1.0 / pooled, 2)
  record["pool_steps_per_s"] = {}
  with EnvPool(FLAGS.env, config, num_workers=workers) as pool:
    for size in sizes:
      batch = [tasks[i % len(tasks)] for i in range(size)]
      record["pool_steps_per_s"][str(size)] = round(pool_steps_per_s(pool, batch, _STEPS.value), 2)
  record["machine"] = {"platform": platform.platform(), "cpus": os.cpu_count(),
                       "python": sys.version.split()[0]}
  print(json.dumps(record))


if __name__ == "__main__":
  app.run(main)
