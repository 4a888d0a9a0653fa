"""Evaluate a saved checkpoint of a run, without training (verl's `val_only`).

  python -m seed_jax.evaluate --workdir=runs/alfworld [--step=N]
      [--splits=valid_seen,valid_unseen] [--export=DIR] [--config.eval.max_episodes=0] ...

Restores checkpoint N (default: the latest) of the run in --workdir with the run's own
config (RUN/config.json, which `--config.KEY=VALUE` overrides, e.g. the eval temperature),
evaluates it as the run does (Skill-GRPO acts with that checkpoint's skill library), prints
the evaluation and summary tables the run prints, and writes them to RUN/eval/step_N/
(summary.json, summary.txt, metrics.jsonl, and the config.json evaluated with). --export=DIR
also writes that step as a Hugging Face folder. A folder that is not a run, a run without
checkpoints, an unknown step or split fails in one line (exit 2) before anything is loaded.
"""

from __future__ import annotations

from seed_jax import cli

if __name__ == "__main__":  # a command, not an import: before jax and transformers load
  cli.quiet_startup()

# pylint: disable=wrong-import-position
import os
import sys
from typing import Sequence

from absl import app, flags
from etils import epath
from ml_collections import config_flags

# The config file that reads a run's config.json; `--config=RUN_CONFIG:RUN` is put on the
# command line from `--workdir=RUN` (`with_run_config`).
RUN_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          "configs", "run.py")

_WORKDIR = flags.DEFINE_string("workdir", None, "the run's folder (config.json, checkpoints/)")
_STEP = flags.DEFINE_integer("step", None, "the checkpoint to evaluate (default: the latest)")
_SPLITS = flags.DEFINE_list("splits", None, "the splits to evaluate, e.g. "
                            "valid_seen,valid_unseen (default: the run's eval.splits)")
_EXPORT = flags.DEFINE_string("export", None,
                              "also write the step as a Hugging Face folder here")
_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "the run's config, set from --workdir; override keys with "
    "--config.KEY=VALUE", lock_config=True)
flags.mark_flags_as_required(["workdir"])


def with_run_config(argv: Sequence[str]) -> list[str]:
  """`argv` with `--config=configs/run.py:RUN` for its `--workdir=RUN`, so that the run's
  config takes `--config.KEY=` overrides, with their one-line errors, as any config file.

  A `--workdir` that is not a run folder fails here, in one line.
  """
  workdir = cli._config_flag_value(argv, "workdir")  # pylint: disable=protected-access
  if workdir is None:
    return list(argv)  # absl's "--workdir is required"
  folder = epath.Path(os.path.expanduser(workdir))
  if not folder.is_dir():
    cli.fail(f"--workdir={workdir}: no such folder")
  if not (folder / "config.json").exists():
    cli.fail(f"--workdir={workdir}: not a run folder (it has no config.json)")
  return [argv[0], f"--config={RUN_CONFIG}:{workdir}", *argv[1:]]


def chosen_splits(splits: list[str] | None) -> tuple[str, ...] | None:
  """The `--splits` asked for (None: the run's), each checked to be a split."""
  from seed_jax.train.spec import SPLITS  # pylint: disable=import-outside-toplevel
  if splits is None:
    return None
  if not splits:
    raise app.UsageError(f"--splits: no split given; choose among {', '.join(SPLITS)}")
  for split in splits:
    if split not in SPLITS:
      raise app.UsageError(f"--splits={','.join(splits)}: unknown split {split!r}; choose "
                           f"among {', '.join(SPLITS)}")
  return tuple(splits)


def chosen_step(workdir: str, step: int | None) -> int:
  """`step`, or the latest checkpoint of the run in `workdir`, checked to be saved."""
  from seed_jax.train.init_from import saved_steps  # pylint: disable=import-outside-toplevel
  checkpoints = os.path.join(workdir, "checkpoints")
  steps = saved_steps(checkpoints)
  if not steps:
    raise app.UsageError(f"--workdir={workdir}: no checkpoint in {checkpoints}")
  if step is None:
    return steps[-1]
  if step not in steps:
    raise app.UsageError(f"--step={step}: no such checkpoint in {checkpoints}; saved steps: "
                         f"{', '.join(map(str, steps))}")
  return step


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  # jax and the trainer load only once the command line has parsed.
  # pylint: disable=import-outside-toplevel
  import jax
  from seed_jax.train import evaluate as evaluation
  from seed_jax.train.spec import ConfigError, build_run_spec
  sys.stdout.reconfigure(line_buffering=True)  # progress lines appear as they happen
  workdir = os.path.expanduser(_WORKDIR.value)
  config = evaluation.checkpoint_eval_config(_CONFIG.value, chosen_splits(_SPLITS.value))
  try:
    spec = build_run_spec(config)
  except ConfigError as e:
    raise app.UsageError(str(e)) from None
  step = chosen_step(workdir, _STEP.value)
  # The devices last: counting them starts jax's backends (slow, and chatty on some hosts).
  mesh_error = cli.mesh_error(spec.mesh, jax.device_count())
  if mesh_error:
    raise app.UsageError(mesh_error)
  print(f"seed_jax: evaluating checkpoint {step} of {workdir} ({spec.algorithm.name} on "
        f"{spec.env.name})")
  evaluation.evaluate_checkpoint(spec, workdir, step, export=_EXPORT.value)


if __name__ == "__main__":
  sys.argv = with_run_config(sys.argv)
  cli.run(main)
