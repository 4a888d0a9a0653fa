"""Does my teacher know more than my student? The teacher gap of a policy, before any run.

  python -m seed_jax.teacher_gap --config=configs/alfworld.py:cpu [--init=RUN_OR_HF_FOLDER]
      [--split=valid_unseen] [--episodes=N] [--json=FILE] [--placement=end]
      [--parts=acting,decision,tokens,update] [--config.KEY=VALUE ...]

On the split's tasks it compares the policy acting from the plain prompt with the policy
reading a skill through H, for each skill source (oracle plan, the policy's own analysis,
another task's plan, the empty block): success and invalid actions, the probability of
the expert's action among the admissible ones, and the shift `delta = lp_skill - lp` on
the policy's own tokens (action span and the rest); and the content score, oracle minus
wrong. `seed_jax/experiments/teacher_gap.py` says what each figure means; the README
section "Does the teacher know more than the student?" says how to read them. Prints one
table and, with --json, writes the same figures as one JSON object. `--init` takes a run
folder (its latest checkpoint), a checkpoint or an HF folder (config.init_from); without
it the config's model is measured as loaded.
"""

from __future__ import annotations

from seed_jax import cli

if __name__ == "__main__":  # a command, not an import: before jax and transformers load
  cli.quiet_startup()

# pylint: disable=wrong-import-position
import json
import os
import sys
import tempfile
from typing import Sequence

from absl import app, flags
from ml_collections import config_flags

from seed_jax import paths

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "config file, optionally with a preset: configs/alfworld.py:cpu",
    lock_config=True)
_INIT = flags.DEFINE_string("init", None, "the policy's weights: a run folder, a checkpoint "
                            "or an HF folder (sets config.init_from)")
_SPLIT = flags.DEFINE_string("split", "valid_unseen", "the tasks: train, valid_seen or "
                             "valid_unseen")
_EPISODES = flags.DEFINE_integer("episodes", 8, "the first N tasks of the split (0: all); "
                                 "one episode per task and skill source")
_JSON = flags.DEFINE_string("json", None, "also write the figures to this JSON file")
_PLACEMENT = flags.DEFINE_string("placement", None, "where H puts the skill: task_line, end "
                                 "or system (default: config.skill_placement)")
_SEED = flags.DEFINE_integer("seed", 0, "seed of the env resets and of sampling")
_PARTS = flags.DEFINE_list("parts", ["acting", "decision", "tokens"],
                           "what to measure: acting (every source plays the tasks), decision "
                           "(the expert's choice among the admissible actions), tokens (the "
                           "shift on the plain episodes' tokens); decision alone is cheapest; "
                           "update (an algorithm with OPD): the OPD term's share of the "
                           "gradient on the run's first training iteration")
flags.mark_flags_as_required(["config"])


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  # pylint: disable=import-outside-toplevel
  from seed_jax.seed.skills import PLACEMENTS
  from seed_jax.train.spec import SPLITS, ConfigError, build_run_spec
  if _SPLIT.value not in SPLITS:
    raise app.UsageError(f"--split={_SPLIT.value}: choose among {', '.join(SPLITS)}")
  if _EPISODES.value < 0:
    raise app.UsageError(f"--episodes={_EPISODES.value}: a number of tasks >= 0")
  from seed_jax.experiments.teacher_gap import PARTS
  unknown = sorted(set(_PARTS.value) - set(PARTS))
  if unknown or not _PARTS.value:
    raise app.UsageError(f"--parts={','.join(_PARTS.value)}: choose among {', '.join(PARTS)}")
  if _PLACEMENT.value is not None and _PLACEMENT.value not in PLACEMENTS:
    raise app.UsageError(f"--placement={_PLACEMENT.value}: one of {', '.join(PLACEMENTS)}")
  config = _CONFIG.value
  if _INIT.value:
    with config.unlocked():
      config.init_from = os.path.expanduser(_INIT.value)
  try:
    spec = build_run_spec(config)
  except ConfigError as e:
    raise app.UsageError(str(e).replace("config.init_from", "--init")) from None
  weights_error = spec.model.weights_error()
  if weights_error:
    raise app.UsageError(weights_error)
  if _JSON.value and not os.path.isdir(os.path.dirname(os.path.abspath(_JSON.value))):
    raise app.UsageError(f"--json={_JSON.value}: its folder does not exist")
  import jax
  mesh_error = cli.mesh_error(spec.mesh, jax.device_count())
  if mesh_error:
    raise app.UsageError(mesh_error)
  sys.stdout.reconfigure(line_buffering=True)
  from seed_jax.experiments import teacher_gap
  from seed_jax.train.trainer import Trainer
  # The trainer's machinery (model, pool, sampler, scorer) without a run: its folder is
  # scratch, removed at the end.
  with tempfile.TemporaryDirectory(prefix="teacher_gap-") as scratch:
    trainer = Trainer(spec, scratch)
    try:
      result = teacher_gap.measure(trainer, _SPLIT.value, _EPISODES.value, seed=_SEED.value,
                                   placement=_PLACEMENT.value, parts=_PARTS.value)
    finally:
      trainer.close()
  result["init"] = spec.init_from or spec.model.name
  print(teacher_gap.format_table(result))
  if _JSON.value:  # whole or not at all: the experiment measures a run without one
    paths.write_text(_JSON.value, json.dumps(result, indent=2))
    print(f"written: {_JSON.value}")


if __name__ == "__main__":
  cli.run(main)
