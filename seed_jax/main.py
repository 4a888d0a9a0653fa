"""Train an agent with SEED (or a baseline) on an environment.

  python -m seed_jax.main --config=configs/alfworld.py:cpu [--workdir=runs/alfworld]
      [--config.rl.lambda_opd=0.0] [--config.algorithm=grpo] ...

Re-running with the `--workdir` of a stopped run resumes it from its last checkpoint. A
SIGTERM (a preempted TPU VM) stops the run at the next safe point with its last completed
iteration checkpointed, and the command exits 0. The workdir may be `gs://bucket/run`.
A bad key or value fails in one line naming the key, before anything is loaded or compiled.
`--dry_run` compiles every program for this process's devices, prints the memory plan and
stops (`python -m seed_jax.plan` does the same for a TPU slice from any machine).
"""

from __future__ import annotations

from seed_jax import cli

if __name__ == "__main__":  # a command, not an import: before jax and transformers load
  cli.quiet_startup()

# pylint: disable=wrong-import-position
import os
import sys
import time
from typing import Sequence

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "config file, optionally with a preset: configs/alfworld.py:cpu",
    lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None,
                               "run folder (checkpoints, metrics, plots); default runs/<env>-"
                               "<algorithm>-<time>, or config.workdir")
_MULTIHOST = flags.DEFINE_bool("multihost", False,
                               "call jax.distributed.initialize() (TPU pods, see launch/)")
_DRY_RUN = flags.DEFINE_bool("dry_run", False,
                             "compile every program of the run for the devices this process "
                             "sees, print the memory plan (seed_jax.plan) and stop; exit 1 "
                             "if a program does not fit")
flags.mark_flags_as_required(["config"])


def default_workdir(config) -> str:
  return os.path.join("runs", f"{config.env.name}-{config.algorithm}-"
                      f"{time.strftime('%Y%m%d-%H%M%S')}")


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  import jax  # pylint: disable=import-outside-toplevel
  if _MULTIHOST.value:
    jax.distributed.initialize()
  sys.stdout.reconfigure(line_buffering=True)  # progress lines appear as they happen
  config = _CONFIG.value
  # pylint: disable-next=import-outside-toplevel
  from seed_jax.train.spec import ConfigError, build_run_spec
  try:
    spec = build_run_spec(config)
  except ConfigError as e:
    raise app.UsageError(str(e)) from None
  # A model shape is a valid spec (a dry run plans it) but has no weights to train.
  weights_error = None if _DRY_RUN.value else spec.model.weights_error()
  if weights_error:
    raise app.UsageError(weights_error)
  # The mesh against the devices (all hosts' with --multihost) before the model is loaded.
  mesh_error = (cli.mesh_error(spec.mesh, jax.device_count())
                or cli.batch_error(spec, jax.device_count()))
  if mesh_error:
    raise app.UsageError(mesh_error)
  if _DRY_RUN.value:
    # pylint: disable=import-outside-toplevel
    from seed_jax.plan import run_plan
    from seed_jax.planning.report import oversized
    from seed_jax.planning.targets import topology_target
    plans, report = run_plan(spec, topology_target("local"))
    print(report)
    sys.exit(1 if oversized(plans, topology_target("local")) else 0)
  workdir = _WORKDIR.value or config.workdir or default_workdir(config)
  logging.info("workdir %s", workdir)
  from seed_jax.parallel import hosts  # pylint: disable=import-outside-toplevel
  hosts.print0(f"seed_jax: {config.algorithm} on {config.env.name}, workdir {workdir}")
  from seed_jax.train.trainer import Trainer  # pylint: disable=import-outside-toplevel
  Trainer(spec, workdir).run()


if __name__ == "__main__":
  cli.run(main)
