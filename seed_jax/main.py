"""Train an agent with SEED (or a baseline) on an environment.

  python -m seed_jax.main --config=configs/alfworld.py:cpu [--workdir=runs/alfworld]
      [--config.rl.lambda_opd=0.0] [--config.algorithm=grpo] ...

Re-running with the `--workdir` of a stopped run resumes it from its last checkpoint.
"""

from __future__ import annotations

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
flags.mark_flags_as_required(["config"])


def default_workdir(config) -> str:
  return os.path.join("runs", f"{config.env.name}-{config.algorithm}-"
                      f"{time.strftime('%Y%m%d-%H%M%S')}")


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if _MULTIHOST.value:
    import jax  # pylint: disable=import-outside-toplevel
    jax.distributed.initialize()
  sys.stdout.reconfigure(line_buffering=True)  # progress lines appear as they happen
  if not flags.FLAGS["verbosity"].present:  # library INFO chatter only on request
    logging.set_verbosity(logging.WARNING)
  config = _CONFIG.value
  from seed_jax.train.config import ConfigError, validate_config  # pylint: disable=import-outside-toplevel
  try:
    validate_config(config)
  except ConfigError as e:
    raise app.UsageError(str(e)) from None
  workdir = _WORKDIR.value or config.workdir or default_workdir(config)
  logging.info("workdir %s", workdir)
  print(f"seed_jax: {config.algorithm} on {config.env.name}, workdir {workdir}")
  from seed_jax.train.trainer import Trainer  # pylint: disable=import-outside-toplevel
  Trainer(config, workdir).run()


if __name__ == "__main__":
  app.run(main)
