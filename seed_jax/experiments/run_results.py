"""One run's records read from its folder, and the figures of one run.

Per run (`<out>/<arm>/seed<k>`) it reads what the trainer writes: `metrics.jsonl` (phase
`train`: success, OPD gate, ...; phase `eval`: held-out success per split),
`summary.json` (the final evaluation), `analysis/iter_N.jsonl` (each trajectory's skill,
seed_jax/seed/analysis_file.py), `provenance.json` (the machines it ran on, the weights it
started from: seed_jax/provenance.py) and, with `--teacher_gap`, `teacher_gap.json` (its own
and its warm start's: seed_jax/experiments/teacher_gap.py). Every figure here is one run's;
the experiment's page (seed_jax/experiments/aggregate.py) folds them over seeds.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
import re
from typing import Any, Callable, Sequence

import numpy as np

from seed_jax import provenance
from seed_jax.experiments import expert_plans, recurrence
from seed_jax.experiments.jobs import (TEACHER_GAP_FILE, cpu_per_wall, log_path,
                                       warm_start_workdir)
from seed_jax.experiments.stats import curve_mean, pooled_rate
from seed_jax.metrics import read_metrics

HELD_OUT = "valid_unseen"  # unseen floor plans: the comparison's held-out split
OTHER_SPLITS = ("valid_seen", "train")  # shown too when a run evaluated them

# Words of ALFWorld task sentences ("clean some apple and put it in fridge", "look at bowl
# under the desklamp") that are not objects: what is left names the task's objects.
_NOT_OBJECTS = frozenset(
    "a an the some it them and then in on into under with at to of from put place look "
    "examine clean heat cool hot cold two find take use using turn your task is".split())


@dataclasses.dataclass
class RunResults:
  """One run's figures. Steps are RL iterations (1 = after the first update)."""
  arm: str
  seed: int
  train: dict[int, dict[str, Any]]   # step -> the `train` record
  evals: dict[int, dict[str, Any]]   # step -> the `eval` record
  skills: dict[int, dict[str, float]]  # step -> skill_quality() of its analysis file
  summary: dict[str, Any] | None
  gap: dict[str, Any] | None = None       # teacher_gap.json of its final weights
  warm_gap: dict[str, Any] | None = None  # and of its warm start's
  origin: dict[str, Any] | None = None       # provenance.json: machines, weights' fingerprints
  warm_origin: dict[str, Any] | None = None  # and its warm start's
  warm_workdir: str = ""  # the computation of its warm start it started from
  cpu_per_wall: float | None = None  # CPU seconds a wall second over its starts (its log)
  mini_batch_size: int | None = None  # rl.mini_batch_size of its config.json
  recurrence: dict[str, float] | None = None  # recurrence.recurrence() of its episodes


# ------------------------------------------------------------------ reading


def task_objects(task: str) -> list[str]:
  """The object words of a task sentence, in order, without repeats."""
  words = re.findall(r"[a-z]+", task.lower())
  return list(dict.fromkeys(w for w in words if w not in _NOT_OBJECTS))


def names_objects(skill: str, task: str) -> bool:
  """Whether `skill` names every object of `task` (a plural counts: "mugs" names mug)."""
  text = skill.lower()
  objects = task_objects(task)
  return bool(objects) and all(re.search(rf"\b{re.escape(o)}(e?s)?\b", text) for o in objects)


def skill_quality(records: Sequence[dict[str, Any]],
                  plans: dict[str, list[str]] | None = None) -> dict[str, float]:
  """Over one iteration's analysis records: the share of trajectories with a skill
  (`parse_rate`), the mean words of those skills, and the share of them that name all of
  their task's objects (`names_objects`: a skill about the task, not a generic one). The
  last two are NaN (left out of tables and curves) when there is no skill to measure.
  With the expert's plans (task id -> actions, `expert_plans.json`), also the share of the
  skills whose task has a plan that agree with it (`expert_plans.plan_agreement`:
  `first_step_right`, `plan_right`, `one_action_repeated`)."""
  skills = [(r["skill"], r.get("task", "")) for r in records if r.get("skill")]
  quality = {
      "parse_rate": len(skills) / len(records) if records else 0.0,
      "skill_words": (float(np.mean([len(s.split()) for s, _ in skills])) if skills
                      else math.nan),
      "names_objects": (float(np.mean([names_objects(s, t) for s, t in skills]))
                        if skills else math.nan),
  }
  if plans is not None:
    agreements = [expert_plans.plan_agreement(r["skill"], plans[r["task_id"]])
                  for r in records if r.get("skill") and r.get("task_id") in plans]
    for key in PLAN_FIGURES:
      quality[key] = (float(np.mean([a[key] for a in agreements])) if agreements
                      else math.nan)
  return quality


# A skill's numbered plan against the expert's (`expert_plans.plan_agreement`), in order.
PLAN_FIGURES = ("first_step_right", "plan_right", "one_action_repeated")


def _phases(workdir: str) -> dict[str, dict[int, dict[str, Any]]]:
  """phase ("train", "eval") -> step -> the run's record."""
  by_phase: dict[str, dict[int, dict[str, Any]]] = {"train": {}, "eval": {}}
  for record in read_metrics(os.path.join(workdir, "metrics.jsonl")):
    if record.get("phase") in by_phase:
      by_phase[record["phase"]][record["step"]] = record
  return by_phase


def read_teacher_gap(workdir: str) -> dict[str, Any] | None:
  """A run's `teacher_gap.json` (`seed_jax.experiment --teacher_gap`), or None."""
  try:
    with open(os.path.join(workdir, TEACHER_GAP_FILE)) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def read_run(workdir: str, arm: str, seed: int, warm_workdir: str = "") -> RunResults:
  """A run's figures; a run that has not started or finished has fewer of them. The
  evaluation of its warm start (the run in `warm_workdir`, evaluated at iteration 0)
  becomes its own iteration 0: where its held-out curve starts."""
  by_phase = _phases(workdir)
  if warm_workdir:
    warm_eval = _phases(warm_workdir)["eval"].get(0)
    if warm_eval is not None:
      by_phase["eval"].setdefault(0, warm_eval)
  analysis = recurrence.iteration_records(workdir, "analysis")
  plans = expert_plans.read_expert_plans(workdir)
  summary = None
  if os.path.exists(os.path.join(workdir, "summary.json")):
    with open(os.path.join(workdir, "summary.json")) as f:
      summary = json.load(f)
  return RunResults(arm, seed, by_phase["train"], by_phase["eval"],
                    {step: skill_quality(records, plans) for step, records in analysis.items()},
                    summary,
                    read_teacher_gap(workdir),
                    read_teacher_gap(warm_workdir) if warm_workdir else None,
                    provenance.read(workdir),
                    provenance.read(warm_workdir) if warm_workdir else None, warm_workdir,
                    mini_batch_size=_mini_batch_size(workdir),
                    recurrence=recurrence.recurrence(
                        recurrence.read_episode_records(workdir, analysis)))


def _mini_batch_size(workdir: str) -> int | None:
  """`rl.mini_batch_size` of the config a run wrote to its workdir, or None."""
  try:
    with open(os.path.join(workdir, "config.json")) as f:
      return int(json.load(f)["rl"]["mini_batch_size"])
  except (OSError, ValueError, KeyError, TypeError):
    return None


def warm_start_computation(out: str, seed: int, warm_start: str,
                           origin: dict[str, Any] | None) -> str:
  """The folder of the computation of a run's warm start that the run started from: the
  current one, or one computed earlier and superseded (`jobs.supersede`, a warm start
  computed again on a new machine), whose final weights' fingerprint is the run's first
  (provenance.json); the current one when no record tells."""
  current = warm_start_workdir(out, seed, warm_start)
  start = provenance.initial_params(origin)
  if start is not None:
    earlier = sorted(glob.glob(os.path.join(current, "superseded", "*")),
                     key=lambda path: int(os.path.basename(path)))
    for folder in [current] + earlier:
      if (provenance.read(folder) or {}).get("final_params") == start:
        return folder
  return current


def read_experiment(out: str, arms: Sequence[str], seeds: Sequence[int],
                    warm_starts: dict[str, str] | None = None) -> dict[str, list[RunResults]]:
  """arm -> its runs (one per seed) under `out`; `warm_starts` (arm -> `Arm.warm_start`)
  adds the evaluation of the warm start each run started from as its iteration 0."""
  warm_starts = warm_starts or {}
  results = {}
  for arm in arms:
    results[arm] = []
    for seed in seeds:
      workdir = os.path.join(out, arm, f"seed{seed}")
      warm = (warm_start_computation(out, seed, warm_starts[arm], provenance.read(workdir))
              if arm in warm_starts else "")
      run = read_run(workdir, arm, seed, warm)
      job_name = f"{arm}/seed{seed}"
      share = cpu_per_wall(log_path(os.path.join(out, "logs"), job_name), job_name)
      results[arm].append(dataclasses.replace(run, cpu_per_wall=share))
  return results


# ------------------------------------------------------------------ one run's figures


def final_eval(run: RunResults, key: str) -> float | None:
  """The final evaluation's figure `key` (e.g. "valid_unseen/success"): the summary's,
  else the last eval record's after RL began (iteration 0 is the warm start's)."""
  if run.summary is not None and key in run.summary:
    return run.summary[key]
  steps = [s for s, r in run.evals.items() if s > 0 and isinstance(r.get(key), (int, float))]
  return run.evals[max(steps)][key] if steps else None


def final_success(run: RunResults, split: str = HELD_OUT) -> float | None:
  """The final evaluation's success on `split`."""
  return final_eval(run, f"{split}/success")


def warm_start_eval(run: RunResults, key: str) -> float | None:
  """The figure `key` of the evaluation at iteration 0: the warm start's, before any RL."""
  return run.evals.get(0, {}).get(key)


def warm_start_success(run: RunResults, split: str = HELD_OUT) -> float | None:
  """The warm start's success on `split`."""
  return warm_start_eval(run, f"{split}/success")


def episodes_consumed(run: RunResults) -> dict[int, float]:
  """iteration -> the training episodes played up to and including it (0: the warm start,
  before any). The x axis of a sample-efficiency curve."""
  consumed, total = {0: 0.0}, 0.0
  for step in sorted(run.train):
    total += run.train[step].get("episodes", 0)
    consumed[step] = total
  return consumed


def iteration_share(run: RunResults, key: str, last: float = 1.0,
                    first: float | None = None) -> list[int]:
  """The iterations of the last `last` share of those that recorded the train figure
  `key` (at least one), or of the first `first` share when given."""
  steps = [s for s in sorted(run.train) if is_number(run.train[s].get(key))]
  share = last if first is None else first
  count = max(1, math.ceil(share * len(steps))) if steps else 0
  return steps[:count] if first is not None else steps[len(steps) - count:]


def training_success_rate(run: RunResults, last: float = 1.0, first: float | None = None
                          ) -> float | None:
  """The success rate over the training episodes of the last `last` share of the run's
  iterations (at least one), or of the first `first` share when given; over all of them
  (`last=1`): the area under the training success-against-episodes curve over its width."""
  steps = iteration_share(run, "success", last, first)
  if not steps:
    return None
  return pooled_rate([run.train[s]["success"] for s in steps],
                     [run.train[s].get("episodes", 1) for s in steps])


def training_ineffective_rate(run: RunResults, last: float = 1.0, first: float | None = None
                              ) -> float | None:
  """The share of the training steps of those iterations (`iteration_share`) whose valid
  move changed nothing, from the raw counts; None before the metric existed."""
  steps = iteration_share(run, "ineffective_actions", last, first)
  taken = sum(run.train[s].get("steps", 0) for s in steps)
  return sum(run.train[s]["ineffective_actions"] for s in steps) / taken if taken else None


def held_out_auc(run: RunResults, split: str = HELD_OUT) -> float | None:
  """The mean held-out success over the run's training episodes: the area under the
  piecewise-linear held-out curve (from the warm start's evaluation at 0 episodes) over its
  width; None with fewer than two evaluations."""
  consumed, key = episodes_consumed(run), f"{split}/success"
  points = sorted((consumed[s], r[key]) for s, r in run.evals.items()
                  if s in consumed and is_number(r.get(key)))
  if len(points) < 2:
    return None
  return curve_mean([x for x, _ in points], [y for _, y in points])


def gap_figure(gap: dict[str, Any] | None, source: str, key: str) -> float | None:
  """`gap[source][key]` (`source` "" for a top-level figure) of a teacher_gap.json; None
  for a skill source that gave no task a skill (a policy that cannot write one: its
  "teacher" is the plain prompt and measures nothing)."""
  if gap is None:
    return None
  if not source:
    return gap.get(key)
  figures = gap.get(source) or {}
  if source != "plain" and figures.get("skills") == 0:
    return None
  return figures.get(key)


def plain_p_expert_rise(run: RunResults) -> float | None:
  """How far RL moved the plain policy's p(expert) on the held-out expert decisions: the
  figure of its final weights' `teacher_gap.json` minus its warm start's. What the student
  learned of the expert's moves, which distillation from an informed teacher should raise;
  None without both records."""
  before, after = (gap_figure(gap, "plain", "p_expert") for gap in (run.warm_gap, run.gap))
  return after - before if is_number(before) and is_number(after) else None


def rl_seconds(run: RunResults) -> float | None:
  """The run's RL wall time: its iterations' rollout, analysis and update seconds (the
  evaluations, the same for every arm, left out)."""
  if not run.train:
    return None
  return float(sum(v for record in run.train.values() for k, v in record.items()
                   if k.startswith("time_") and k.endswith("_s") and is_number(v)))


def gate_spread(record: dict[str, Any]) -> float | None:
  """The share of OPD-active tokens whose gate is outside [0.4, 0.6] (from the `train`
  record's `gate_hist`, equal bins over [0, 1]): how many tokens the teacher moves away
  from the uniform 0.5 a teacher with no knowledge of its own gives."""
  hist = record.get("gate_hist")
  if not hist:
    return None
  centres = (np.arange(len(hist)) + 0.5) / len(hist)
  return float(np.sum(np.asarray(hist)[np.abs(centres - 0.5) > 0.1]))


def curve(runs: Sequence[RunResults], value: Callable[[RunResults, int], float | None],
          steps: Callable[[RunResults], Sequence[int]]) -> dict[int, list[float]]:
  """step -> the value of every run that has one at that step."""
  points: dict[int, list[float]] = {}
  for run in runs:
    for step in steps(run):
      v = value(run, step)
      if is_number(v):
        points.setdefault(step, []).append(float(v))
  return dict(sorted(points.items()))


def train_curve(runs, key: str = "success") -> dict[int, list[float]]:
  return curve(runs, lambda r, s: r.train[s].get(key), lambda r: r.train)


# Iterations pooled by the smoothed training curve: one iteration's few games move its
# success by more than a run's learning (32 episodes of 8 puzzles on `:learn_long`).
TRAIN_WINDOW = 5


def windowed_training_success(run: RunResults, step: int, window: int = TRAIN_WINDOW
                              ) -> float | None:
  """The success rate over the episodes of the `window` iterations up to and including
  `step`, pooled; None before `window` iterations have played."""
  steps = [s for s in sorted(run.train) if s <= step
           and is_number(run.train[s].get("success"))][-window:]
  if len(steps) < window:
    return None
  return pooled_rate([run.train[s]["success"] for s in steps],
                     [run.train[s].get("episodes", 1) for s in steps])


def windowed_train_curve(runs, window: int = TRAIN_WINDOW) -> dict[int, list[float]]:
  return curve(runs, lambda r, s: windowed_training_success(r, s, window), lambda r: r.train)


def eval_curve(runs, split: str = HELD_OUT) -> dict[int, list[float]]:
  return curve(runs, lambda r, s: r.evals[s].get(f"{split}/success"), lambda r: r.evals)


def skill_curve(runs, key: str) -> dict[int, list[float]]:
  return curve(runs, lambda r, s: r.skills[s].get(key), lambda r: r.skills)


def is_number(value: Any) -> bool:
  return (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value))


def train_total(run: RunResults, key: str) -> float:
  """A train figure summed over a run's iterations (0 where it was not recorded)."""
  return float(sum(r.get(key, 0) for r in run.train.values()))


def optimizer_steps(run: RunResults) -> float | None:
  """The optimizer steps a run took: its mini-batches (batch rows, padding included, over
  `rl.mini_batch_size`) less those without signal (`update_empty`) and those skipped as
  non-finite (`update_skipped`); None without the figures."""
  if run.mini_batch_size is None or not all("batch_rows" in r for r in run.train.values()):
    return None
  mini_batches = (train_total(run, "batch_rows") + train_total(run, "batch_padding_rows")) \
      / run.mini_batch_size
  return mini_batches - train_total(run, "update_empty") - train_total(run, "update_skipped")
