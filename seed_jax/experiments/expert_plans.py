"""Do the policy's skills say what the expert would do? The expert's plans, and a skill read
against them.

The oracle analyzer writes the expert's plan as numbered steps ("step 1: up, step 2: left";
`seed_jax.seed.analyzer.oracle_skill`), and stage 1 teaches the policy analyzer that form.
A skill the policy writes in it can be read against the expert's plan for its task
(`plan_agreement`): whether its first step is the expert's first action, whether its list is
the expert's whole plan, and whether it repeats one action throughout (a degenerate plan).
A teacher reading a skill whose plan is wrong knows less than its student, not more.

The plans come from playing each task a run's analysis records name once with the env's
expert (in process, no model), written to `<run>/expert_plans.json` (task id -> actions);
the experiment page (`seed_jax.experiments.run_results.skill_quality`) reads them beside the
run's `analysis/iter_N.jsonl`:

  python -m seed_jax.experiments.expert_plans --runs=results/sokoban_long/seed/seed0
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Sequence

from absl import app, flags

from seed_jax.experiments import recurrence

EXPERT_PLANS_FILE = "expert_plans.json"

_STEP = re.compile(r"\bstep (\d+): ")


def plan_steps(skill: str) -> list[str]:
  """The actions of a skill's numbered steps ("step 1: go to desk 1, step 2: take mug 1
  from desk 1; check ..." -> ["go to desk 1", "take mug 1 from desk 1"]), in the order
  written; [] for a skill without them. An item runs to the next step, and the last one to
  the first ';' or sentence end after it."""
  marks = list(_STEP.finditer(skill))
  steps = []
  for i, mark in enumerate(marks):
    end = marks[i + 1].start() if i + 1 < len(marks) else len(skill)
    item = skill[mark.end():end]
    if i + 1 == len(marks):
      item = re.split(r";|\.(?:\s|$)", item, maxsplit=1)[0]
    steps.append(item.strip().rstrip(",").strip())
  return steps


def plan_agreement(skill: str, expert_plan: Sequence[str]) -> dict[str, bool]:
  """A skill's numbered plan against the expert's plan for its task (actions compared
  case-insensitively): `first_step_right`, its first step is the expert's first action;
  `plan_right`, its steps are the expert's plan, no more and no fewer; `one_action_repeated`,
  two or more steps, all the same action."""
  steps = [s.lower() for s in plan_steps(skill)]
  expert = [str(a).strip().lower() for a in expert_plan]
  return {"first_step_right": bool(steps) and bool(expert) and steps[0] == expert[0],
          "plan_right": bool(steps) and steps == expert,
          "one_action_repeated": len(steps) > 1 and len(set(steps)) == 1}


def read_expert_plans(workdir: str) -> dict[str, list[str]] | None:
  """A run's `expert_plans.json` (task id -> the expert's actions), or None."""
  try:
    with open(os.path.join(workdir, EXPERT_PLANS_FILE)) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def analysed_task_ids(workdir: str) -> list[str]:
  """The ids of the tasks a run's analysis records name, sorted."""
  records = recurrence.iteration_records(workdir, "analysis")
  return sorted({r["task_id"] for rs in records.values() for r in rs if r.get("task_id")})


def expert_plans(run_config: dict[str, Any], task_ids: Sequence[str],
                 split: str = "train") -> dict[str, list[str]]:
  """task id -> the actions of the env's expert on that task of `split`, played once in
  process with the run's env settings (`run_config`: the run's `config.json`)."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  from seed_jax.envs.pool import InProcessPool  # pylint: disable=g-import-not-at-top
  from seed_jax.envs.registry import get_env_module  # pylint: disable=g-import-not-at-top
  from seed_jax.train.expert import collect_demonstrations  # pylint: disable=g-import-not-at-top
  settings = ml_collections.ConfigDict(run_config["env"])
  module = get_env_module(settings.name)
  by_id = {t.task_id: t for t in module.load_tasks(settings, split)}
  missing = sorted(set(task_ids) - set(by_id))
  if missing:
    raise ValueError(f"tasks {missing[:3]} are not in the {split} split of env "
                     f"{settings.name!r} with the run's settings")
  pool = InProcessPool(lambda: module.make_env(settings, with_expert=True))
  demos = collect_demonstrations(pool, module.make_agent_format(settings),
                                 [by_id[i] for i in task_ids], settings.max_steps,
                                 int(run_config.get("seed", 0)))
  return {d.task_id: list(d.actions) for d in demos}


def write_expert_plans(workdir: str) -> str:
  """Plays the expert on every task `workdir`'s analysis records name and writes
  `workdir/expert_plans.json`; returns its path."""
  config_path = os.path.join(workdir, "config.json")
  if not os.path.exists(config_path):
    raise ValueError(f"{workdir}: no config.json (not a run folder)")
  task_ids = analysed_task_ids(workdir)
  if not task_ids:
    raise ValueError(f"{workdir}: no analysis records (a run whose policy writes skills has "
                     "analysis/iter_N.jsonl)")
  with open(config_path) as f:
    plans = expert_plans(json.load(f), task_ids)
  path = os.path.join(workdir, EXPERT_PLANS_FILE)
  with open(path, "w") as f:
    json.dump(plans, f, indent=1, sort_keys=True)
  return path


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  for workdir in _RUNS.value:
    try:
      path = write_expert_plans(workdir)
    except ValueError as e:
      raise app.UsageError(f"--runs: {e}") from None
    print(f"[expert_plans] {path}", flush=True)


if __name__ == "__main__":
  # Defined here, not at import: the experiment runner and its page import this module.
  _RUNS = flags.DEFINE_list("runs", None, "run folders whose analysis records to read",
                            required=True)
  app.run(main)
