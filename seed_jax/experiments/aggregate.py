"""An experiment's page from its runs' figures: a markdown page and PNG curves.

The runs' records and each run's figures come from seed_jax/experiments/run_results.py;
here they are folded over seeds: each figure a mean and a sample standard deviation
(n - 1; with one seed only the mean is meaningful), and the arms paired by seed.
"""

from __future__ import annotations

import io
import itertools
import os
from typing import Any, Callable, Sequence

import numpy as np

from seed_jax import machine_speed, provenance
from seed_jax.experiments.arms import BC, STAGE1, get_arm
from seed_jax.experiments.jobs import warm_start_workdir
from seed_jax.experiments.run_results import (
    HELD_OUT, OTHER_SPLITS, PLAN_FIGURES, TRAIN_WINDOW, RunResults, episodes_consumed,
    eval_curve, final_eval, final_success, gap_figure, gate_spread, held_out_auc, is_number,
    optimizer_steps, plain_p_expert_rise, read_experiment, read_teacher_gap, rl_seconds,
    skill_curve, train_curve, train_total, training_ineffective_rate, training_success_rate,
    warm_start_eval, warm_start_success, windowed_train_curve)
from seed_jax.experiments.stats import mean_std, paired_difference
from seed_jax.train.algorithms import get_algorithm



def _fmt(values: Sequence[Any] | None, digits: int = 3) -> str:
  """"mean ± std" of the finite numbers among `values`; "value (n=1)" for one (no spread
  to give: a sample standard deviation needs two); "-" for none."""
  values = [v for v in values or () if is_number(v)]
  if not values:
    return "-"
  mean, std = mean_std(values)
  if len(values) == 1:
    return f"{mean:.{digits}f} (n=1)"
  return f"{mean:.{digits}f} ± {std:.{digits}f}"


# ------------------------------------------------------------------ the page


# The curve PNGs: file -> panels of (title, arm runs -> step -> values across seeds).
CURVES: dict[str, list[tuple[str, Callable]]] = {
    "success.png": [("training rollouts: success", train_curve),
                    (f"training rollouts: success over the last {TRAIN_WINDOW} iterations",
                     windowed_train_curve),
                    (f"held-out ({HELD_OUT}): success", eval_curve)],
    "opd_gate.png": [("OPD gate: mean over active tokens",
                      lambda runs: train_curve(runs, "gate_mean")),
                     ("OPD shift (teacher - student log-prob)",
                      lambda runs: train_curve(runs, "delta_mean")),
                     ("OPD-active tokens", lambda runs: train_curve(runs, "opd_tokens"))],
    # The teacher gap at theta_old (`seed_jax.seed.token_gap`; "precomputed" teacher mode):
    # on one y scale, so the action block and the rest compare at a glance.
    "teacher_gap.png": [
        (f"teacher gap, {part}: mean delta (nats/token)",
         lambda runs, key=key: train_curve(runs, f"gap_{key}_delta_mean"))
        for part, key in (("action block", "action"), ("rest of the response", "rest"),
                          ("won trajectories", "won"), ("failed trajectories", "failed"))],
    "skills.png": [("skills parsed (share of trajectories)",
                    lambda runs: skill_curve(runs, "parse_rate")),
                   ("skill length (words)", lambda runs: skill_curve(runs, "skill_words")),
                   ("skills naming all the task's objects",
                    lambda runs: skill_curve(runs, "names_objects")),
                   ("skills whose first step is the expert's",
                    lambda runs: skill_curve(runs, "first_step_right"))],
}

SHARED_Y = frozenset({"teacher_gap.png"})  # CURVES files whose panels share one y scale

# The teacher-gap columns of the skills table: (header, `train` record key).
GAP_COLUMNS = (("teacher gap, action block", "gap_action_delta_mean"),
               ("teacher gap, rest", "gap_rest_delta_mean"),
               ("action tokens with gate > 0.6", "gap_action_gate_above_0.6"),
               # A format that thinks before it acts decides its move in the rest (the
               # action block repeats it): the teacher's opinion of the move shows here.
               ("rest tokens with gate > 0.6", "gap_rest_gate_above_0.6"),
               ("rest tokens with gate < 0.4", "gap_rest_gate_below_0.4"),
               # Where the response first names its action (`decision_char_span`): the
               # move itself, wherever the format decides it (runs from 2026-12-04 on).
               ("teacher gap, decision", "gap_decision_delta_mean"),
               ("decision tokens with gate > 0.6", "gap_decision_gate_above_0.6"),
               ("decision tokens with gate < 0.4", "gap_decision_gate_below_0.4"),
               # A teacher that knows the outcome raises won moves and lowers failed ones.
               ("teacher gap, decisions of won episodes", "gap_decision_won_delta_mean"),
               ("teacher gap, decisions of failed episodes",
                "gap_decision_failed_delta_mean"),
               ("teacher gap, won", "gap_won_delta_mean"),
               ("teacher gap, failed", "gap_failed_delta_mean"))


BASELINE = "grpo"  # the arm every other arm is paired against, when the experiment has it
# The arm with the same stage-1 weights as the SEED arms and no OPD term: an OPD arm minus
# it is what the distillation term does, the rest of the recipe held fixed.
OPD_BASELINE = "no_opd"

# The figures compared between paired runs: (name, run -> figure or None).
PAIRED_FIGURES: tuple[tuple[str, Callable[[RunResults], float | None]], ...] = (
    (f"final {HELD_OUT} success", final_success),
    (f"{HELD_OUT} success, area under the curve", held_out_auc),
    ("training success, last quarter of the iterations",
     lambda run: training_success_rate(run, last=0.25)),
    ("training success, area under the curve", training_success_rate),
    ("plain p(expert) on the held-out expert decisions, rise over RL", plain_p_expert_rise),
)


def _finished_by_seed(runs: Sequence[RunResults]) -> dict[int, RunResults]:
  return {run.seed: run for run in runs if run.summary is not None}


def _has_opd_term(arm: str) -> bool:
  return get_algorithm(get_arm(arm).algorithm).opd


def _paired_rows(results: dict[str, list[RunResults]], arm: str, baseline: str) -> list[str]:
  """`arm` minus `baseline`, per figure, over the seeds both finished: the mean
  difference, its paired 95% t interval and whether the interval excludes zero."""
  base, runs = _finished_by_seed(results[baseline]), _finished_by_seed(results[arm])
  rows = []
  for name, figure in PAIRED_FIGURES:
    pairs = [(figure(runs[s]), figure(base[s])) for s in sorted(set(runs) & set(base))]
    pairs = [(a, b) for a, b in pairs if is_number(a) and is_number(b)]
    diff = paired_difference([a for a, _ in pairs], [b for _, b in pairs])
    interval = (f"[{diff.low:+.3f}, {diff.high:+.3f}]" if diff.n > 1 else "-")
    mean = f"{diff.mean:+.3f}" if diff.n else "-"
    excludes = "-" if diff.n < 2 else "yes" if diff.excludes_zero else "no"
    if diff.n > 1 and abs(diff.high - diff.low) < 1e-9:  # equal up to float rounding
      # A zero-width interval: the seeds agree exactly (a coarse figure, few seeds), which
      # estimates no spread; a reader must not take it for a tight interval.
      excludes += " (every seed the same difference: no spread)"
    rows.append(f"| {arm} - {baseline} | {name} | {diff.n} | {mean} | {interval} | "
                f"{excludes} |")
  return rows


_PAIRED_HEADER = ["| difference | figure | seeds | mean | 95% interval | excludes 0 |",
                  "|---|---|---|---|---|---|"]


def paired_lines(results: dict[str, list[RunResults]]) -> list[str]:
  """Every other arm minus `BASELINE`, and each arm with an OPD term minus `OPD_BASELINE`
  (the same stage-1 start, the term alone), per figure, paired over seeds."""
  lines = []
  if BASELINE in results:
    lines += ["", f"## Each arm minus {BASELINE}, paired over seeds", "",
              "Per seed the same warm start, games and sampling seeds; the interval is the "
              "Student-t 95% interval of the mean per-seed difference (n - 1 degrees of "
              "freedom; none with one seed). Areas under the curves are over training "
              "episodes, divided by their width: a mean success rate.", ""] + _PAIRED_HEADER
    for arm in results:
      if arm != BASELINE:
        lines += _paired_rows(results, arm, BASELINE)
  opd_arms = [a for a in results if a != OPD_BASELINE and _has_opd_term(a)]
  if OPD_BASELINE in results and opd_arms:
    lines += ["", f"## What the OPD term does: each SEED arm minus {OPD_BASELINE}", "",
              f"{OPD_BASELINE} starts RL from the same stage-1 weights as the SEED arms and "
              "runs the same GRPO without the OPD term, so each difference is the term's "
              "(with its skill source); paired and computed as above.", ""] + _PAIRED_HEADER
    for arm in opd_arms:
      lines += _paired_rows(results, arm, OPD_BASELINE)
  return lines


def one_machine(run: RunResults) -> str | None:
  """The machine kind a run ran on throughout (provenance.json), or None: unrecorded, or
  resumed on another kind."""
  kinds = provenance.machine_kinds(run.origin)
  return kinds[0] if len(kinds) == 1 else None


# Two runs' wall times are compared only if neither kept its cores busy much less than the
# other: a run whose CPU seconds per wall second fell below this share of the other's
# waited for cores another job held.
MIN_CPU_SHARE = 0.8


def alike_speeds(run: RunResults, base: RunResults) -> bool:
  """Whether the segments of both runs measured machines all alike, every two of them
  (`machine_speed.alike`: being alike is not transitive, so each against the first would
  pass two starts 2x apart that both sit near it). Runs from before the measurement (no
  segment has it) pass on their machine kind alone, as they were compared; a run with it
  and one without do not: one CPU name has covered machines 2x apart."""
  speeds = provenance.segment_speeds(run.origin) + provenance.segment_speeds(base.origin)
  if all(speed is None for speed in speeds):
    return True
  if any(speed is None for speed in speeds):
    return False
  return all(machine_speed.alike(a, b) for a, b in itertools.combinations(speeds, 2))


def _comparable(run: RunResults, base: RunResults) -> bool:
  """Whether two runs' wall times measure the same machine: one machine kind throughout
  each (provenance.json), the same for both, of alike measured speed (`alike_speeds`), and
  neither shared its cores much more than the other (`MIN_CPU_SHARE`, where both logs
  tell)."""
  kind = one_machine(run)
  if (kind is None or kind != one_machine(base) or not rl_seconds(base)
      or not alike_speeds(run, base)):
    return False
  shares = (run.cpu_per_wall, base.cpu_per_wall)
  if None in shares:
    return True
  return min(shares) >= MIN_CPU_SHARE * max(shares)


def cost_lines(results: dict[str, list[RunResults]], baseline: str = BASELINE) -> list[str]:
  """RL wall time per arm and, paired by seed, its ratio to the baseline's: only between
  runs that ran on one machine kind of alike measured speed throughout (machines differ by
  up to 2x) and kept their cores alike busy (`_comparable`)."""
  lines = ["", "## Wall time of RL", "",
           "Rollout, analysis and update seconds of the finished runs (evaluations left "
           f"out), and CPU seconds per wall second over each run's starts (its log; about 1.8 "
           f"alone on 2 cores); the ratio to {baseline} is per seed, between two runs that "
           "ran throughout on one machine of the same kind and, where measured, of alike "
           f"speed (the slower at least {machine_speed.ALIKE_SHARE:.0%} of the faster; "
           "`provenance.json`, see \"Where the runs ran\") and neither of which kept its "
           "cores busy less than "
           f"{MIN_CPU_SHARE:.0%} as much as the other (it shared them), then averaged.", "",
           f"| arm | RL seconds | CPU s per wall s | ratio to {baseline} | seeds paired |",
           "|---|---|---|---|---|"]
  base = _finished_by_seed(results.get(baseline, []))
  for arm, runs in results.items():
    finished = _finished_by_seed(runs)
    paired = [s for s in sorted(set(finished) & set(base))
              if _comparable(finished[s], base[s])]
    ratios = [rl_seconds(finished[s]) / rl_seconds(base[s]) for s in paired]
    lines.append(f"| {arm} | {_fmt([rl_seconds(r) for r in finished.values()], 0)} | "
                 f"{_fmt([r.cpu_per_wall for r in finished.values()], 2)} | "
                 f"{_fmt(ratios, 2)} | {len(paired)} |")
  return lines


def _starts_from(origin: dict[str, Any] | None, source: dict[str, Any] | None,
                 source_workdir: str = "") -> str:
  """Whether a run's first weights are bitwise its warm start's last (`provenance`), and
  which computation of it when an earlier one."""
  start, end = provenance.initial_params(origin), (source or {}).get("final_params")
  if start is None or end is None:
    return "not recorded"
  if start != end:
    return "**no**"
  parent = os.path.basename(os.path.dirname(source_workdir))
  return (f"yes (an earlier computation: superseded/{os.path.basename(source_workdir)})"
          if parent == "superseded" else "yes")


def provenance_lines(results: dict[str, list[RunResults]],
                     warm_origins: dict[tuple[int, str], dict[str, Any] | None]) -> list[str]:
  """Per run: the machine kinds it ran on and whether it started from its warm start's
  final weights, bitwise. A warm start computed again on another kind of CPU is close to,
  not equal to, the first (bf16 arithmetic differs), so a seed's arms compare exactly only
  where they started from one computation. `warm_origins`: (seed, bc | stage1) -> the warm
  start's provenance."""
  rows = []
  for (seed, kind), origin in sorted(warm_origins.items()):
    if origin is not None:
      source = "-" if kind == BC else _starts_from(origin, warm_origins.get((seed, BC)))
      rows.append((f"warm_start/seed{seed}/{kind}", origin, source))
  for arm, runs in results.items():
    for run in runs:
      if run.train or run.summary is not None:
        rows.append((f"{arm}/seed{run.seed}", run.origin,
                     _starts_from(run.origin, run.warm_origin, run.warm_workdir)))
  if not any(origin for _, origin, _ in rows):
    return []
  lines = ["", "## Where the runs ran", "",
           "Each start of a run records its machine and the fingerprint of the "
           "weights it starts from (`provenance.json`, seed_jax/provenance.py); a warm start "
           "computed again on another kind of CPU is close to the first, not bitwise equal; "
           "speed: each start's bf16 matmul GFLOP/s and streaming GB/s "
           "(seed_jax/machine_speed.py). `not recorded`: a run from before the record.", "",
           "| run | machines | speed at each start | starts from its warm start's final "
           "weights |", "|---|---|---|---|"]
  for name, origin, source in rows:
    machines = "; ".join(provenance.machine_kinds(origin)) or "not recorded"
    speeds = "; ".join("-" if speed is None else
                       f"{speed['matmul_gflops']:.0f} GFLOP/s, {speed['stream_gbps']:.1f} GB/s"
                       for speed in provenance.segment_speeds(origin)) or "not recorded"
    lines.append(f"| {name} | {machines} | {speeds} | {source} |")
  return lines


def learning_lines(results: dict[str, list[RunResults]]) -> list[str]:
  """Whether each arm learns at all, before any comparison: per finished run the training
  success of the first and of the last quarter of the iterations and the held-out success
  of the warm start and at the end, each rise taken within the run, then over seeds."""
  def rise(after: float | None, before: float | None) -> float | None:
    return after - before if is_number(after) and is_number(before) else None
  lines = ["", "## Does each arm learn?", "",
           "Per finished run: the training success over the first and over the last quarter "
           "of the iterations (pooled over their episodes; the first iteration plays the "
           "warm start's weights) and the rise between them; the held-out success of "
           "the warm start and at the end, and its rise. Each rise is taken within a run, "
           "then averaged over seeds.", "",
           "| arm | seeds | training success, first quarter | last quarter | rise | "
           f"{HELD_OUT} success, warm start | final | rise |", "|---" * 8 + "|"]
  for arm, runs in results.items():
    runs = [run for run in runs if run.summary is not None]
    early = [training_success_rate(r, first=0.25) for r in runs]
    late = [training_success_rate(r, last=0.25) for r in runs]
    start = [warm_start_success(r) for r in runs]
    final = [final_success(r) for r in runs]
    lines.append(f"| {arm} | {len(runs)} | {_fmt(early)} | {_fmt(late)} | "
                 f"{_fmt([rise(b, a) for a, b in zip(early, late)])} | {_fmt(start)} | "
                 f"{_fmt(final)} | {_fmt([rise(b, a) for a, b in zip(start, final)])} |")
  return lines + recurrence_lines(results)


def recurrence_lines(results: dict[str, list[RunResults]]) -> list[str]:
  """Per arm, a task's success at its later draws against its first (`recurrence.py`):
  learning with the draw's difficulty taken out. Nothing when no run has the records."""
  runs_of = {arm: [r for r in runs if r.summary is not None and r.recurrence]
             for arm, runs in results.items()}
  if not any(runs_of.values()):
    return []
  lines = ["", "Each task drawn in two or more iterations of a run, against itself: its "
           "success at its first draw and at its later draws (per run over its recurring "
           "tasks, then over seeds), and the tasks every episode lost at their first draw "
           "(no GRPO signal there) with their later success.", "",
           "| arm | seeds | recurring tasks | first draw | later draws | rise | "
           "lost at first draw | their later draws |", "|---" * 8 + "|"]
  counts = ("tasks", "lost_first")
  for arm, runs in runs_of.items():
    if runs:
      cells = [_fmt([r.recurrence[key] for r in runs], 1 if key in counts else 3)
               for key in ("tasks", "first", "later", "rise", "lost_first", "lost_first_later")]
      lines.append(f"| {arm} | {len(runs)} | " + " | ".join(cells) + " |")
  return lines


def ineffective_lines(results: dict[str, list[RunResults]]) -> list[str]:
  """How often each arm's valid moves changed nothing (a Sokoban move into a wall), in
  training and on held-out games, early and late; nothing for runs that predate the
  metric."""
  runs_of = {arm: [r for r in runs if r.summary is not None
                   and any("ineffective_actions" in t for t in r.train.values())]
             for arm, runs in results.items()}
  if not any(runs_of.values()):
    return []
  key = f"{HELD_OUT}/ineffective_action_rate"
  lines = ["", "## Moves that changed nothing", "",
           "Per finished run: the share of steps whose valid move left the state as it was "
           "(the env's `action_effective` false: a Sokoban move into a wall or an immovable "
           "box; `rl.ineffective_penalty` charges them), over the training steps of the "
           "first and of the last quarter of the iterations, and on the held-out games at "
           "the warm start and at the end.", "",
           f"| arm | seeds | training, first quarter | last quarter | {HELD_OUT}, warm start "
           "| final |", "|---" * 6 + "|"]
  for arm, runs in runs_of.items():
    if runs:
      early = [training_ineffective_rate(r, first=0.25) for r in runs]
      late = [training_ineffective_rate(r, last=0.25) for r in runs]
      lines.append(f"| {arm} | {len(runs)} | {_fmt(early)} | {_fmt(late)} | "
                   f"{_fmt([warm_start_eval(r, key) for r in runs])} | "
                   f"{_fmt([final_eval(r, key) for r in runs])} |")
  return lines



def signal_lines(results: dict[str, list[RunResults]]) -> list[str]:
  """How often GRPO had nothing to learn from: groups whose advantages were all zero, the
  optimizer steps skipped for want of any signal (`rl.skip_zero_advantage_groups`), and
  the steps taken (an arm with an OPD term steps where GRPO has nothing: more steps)."""
  lines = ["", "## Groups without a GRPO signal", "",
           "Per run: groups whose episodes all scored the same (zero advantages), per "
           "iteration; the mini-batch steps with nothing to learn from (skipped with "
           "`rl.skip_zero_advantage_groups`) and the optimizer steps taken, over the whole "
           "run. An arm with an OPD term steps on mini-batches that hold no GRPO signal "
           "(`rl.spread_outcome_rows` deals the signal over every mini-batch).", "",
           "| arm | zero-advantage groups per iteration | mini-batch steps skipped | "
           "optimizer steps |",
           "|---|---|---|---|"]
  for arm, runs in results.items():
    runs = [run for run in runs if run.train]
    per_iteration = [train_total(r, "batch_zero_advantage_groups") / len(r.train) for r in runs]
    lines.append(f"| {arm} | {_fmt(per_iteration, 2)} | "
                 f"{_fmt([train_total(r, 'update_empty') for r in runs], 1)} | "
                 f"{_fmt([optimizer_steps(r) for r in runs], 1)} |")
  return lines


def gap_lines(results: dict[str, list[RunResults]]) -> list[str]:
  """The teacher gap on the action block and on the rest of the response, and the gate's
  spread, at the first and the last iteration, per arm with a teacher."""
  arms = [a for a, runs in results.items()
          if any("gate_hist" in rec for run in runs for rec in run.train.values())]
  if not arms:
    return []
  lines = ["", "## The teacher at the start and the end of RL", "",
           "Teacher gap: the mean shift `teacher - student` log-prob of the sampled tokens "
           "at theta_old (\"precomputed\" teacher mode), on the action block and on the "
           "rest of the response (where a format that thinks before it acts decides its "
           "move; the action block then only repeats it), and on the decision: the tokens "
           "where the response first names its action (the move itself; on samples drawn at "
           "temperature 1 the mean shift there is minus the KL divergence of the student "
           "from the teacher: below zero for any teacher that differs). Gate spread: the "
           "share of "
           "OPD-active tokens whose gate is outside [0.4, 0.6] (a teacher that knows nothing "
           "more than its student leaves every gate near 0.5).", "",
           "| arm | gap on the action block, first iteration | last iteration | gap on the "
           "rest, first iteration | last iteration | gap on the decision, first iteration | "
           "last iteration | gate spread, first iteration | last iteration |",
           "|---|---|---|---|---|---|---|---|---|"]
  for arm in arms:
    firsts = [run.train[min(run.train)] for run in results[arm] if run.train]
    lasts = [run.train[max(run.train)] for run in results[arm] if run.train]
    cells = [_fmt([r.get(f"gap_{part}_delta_mean") for r in records])
             for part in ("action", "rest", "decision") for records in (firsts, lasts)]
    cells += [_fmt([gate_spread(r) for r in records]) for records in (firsts, lasts)]
    lines.append(f"| {arm} | " + " | ".join(cells) + " |")
  return lines


# The columns of the per-run table: (header, run -> figure or None, digits).
RUN_COLUMNS: tuple[tuple[str, Callable[[RunResults], float | None], int], ...] = (
    ("training success, first quarter", lambda r: training_success_rate(r, first=0.25), 3),
    ("last quarter", lambda r: training_success_rate(r, last=0.25), 3),
    ("area under the curve", training_success_rate, 3),
    (f"{HELD_OUT} success, warm start", warm_start_success, 3),
    ("final", final_success, 3),
    ("area under the curve", held_out_auc, 3),
    ("plain p(expert), warm start", lambda r: gap_figure(r.warm_gap, "plain", "p_expert"), 3),
    ("after RL", lambda r: gap_figure(r.gap, "plain", "p_expert"), 3),
    ("decision gap, after RL", lambda r: gap_figure(r.gap, "oracle", "decision_gap"), 3),
    ("own skill decision gap, after RL",
     lambda r: gap_figure(r.gap, "policy", "decision_gap"), 3),
    ("gate spread, last iteration",
     lambda r: gate_spread(r.train[max(r.train)]) if r.train else None, 3),
    ("RL seconds", rl_seconds, 0),
)


def run_lines(results: dict[str, list[RunResults]]) -> list[str]:
  """One row per finished run: the figures the page's means, rises and paired differences
  are taken from, so a reader sees which seed carries a difference."""
  runs = [run for arm_runs in results.values() for run in arm_runs if run.summary is not None]
  if not runs:
    return []
  lines = ["", "## Each run", "",
           "The per-run figures behind the means and the paired differences above: training "
           "success over the first and the last quarter of the iterations and over all of "
           "them (the area under the curve), held-out success, the plain policy's p(expert) "
           "and the teacher gaps (seed_jax.teacher_gap, below), the gate's spread "
           "(\"The teacher at the start and the end of RL\") and the RL wall seconds.", "",
           "| arm | seed | " + " | ".join(h for h, _, _ in RUN_COLUMNS) + " |",
           "|---" * (len(RUN_COLUMNS) + 2) + "|"]
  for run in runs:
    cells = [figure(run) for _, figure, _ in RUN_COLUMNS]
    lines.append(f"| {run.arm} | {run.seed} | " + " | ".join(
        f"{v:.{digits}f}" if is_number(v) else "-"
        for v, (_, _, digits) in zip(cells, RUN_COLUMNS)) + " |")
  return lines


# (column, skill source, key) of the decision table: the plain student, the teacher reading
# the oracle's plan, and what the plan's content adds (oracle minus another task's plan);
# for a policy that writes skills (stage 1, the `seed` arm), the teacher reading its own
# analysis of its plain episode: the teacher that arm's OPD term reads.
DECISION_COLUMNS = (("plain p(expert)", "plain", "p_expert"),
                    ("oracle p(expert)", "oracle", "p_expert"),
                    ("decision gap", "oracle", "decision_gap"),
                    ("content score", "", "content_score"),
                    ("own skill p(expert)", "policy", "p_expert"),
                    ("own skill decision gap", "policy", "decision_gap"))
# (column, skill source, key) of the warm start's acting table.
ACTING_COLUMNS = (("plain success", "plain", "success"),
                  ("oracle success", "oracle", "success"),
                  ("acting gap", "oracle", "acting_gap"),
                  ("wrong plan, success", "wrong", "success"),
                  ("empty block, success", "empty", "success"),
                  ("content score", "", "content_score"))


def teacher_gap_lines(results: dict[str, list[RunResults]],
                      warm_gaps: dict[int, dict[str, Any] | None]) -> list[str]:
  """`seed_jax.teacher_gap` of the behaviour-cloning warm starts (acting, per seed) and of
  every arm before and after RL (the expert decisions of the held-out tasks)."""
  arms = [a for a, runs in results.items() if any(r.gap or r.warm_gap for r in runs)]
  if not arms and not any(warm_gaps.values()):
    return []
  lines = ["", "## Does the teacher know more than the student? (seed_jax.teacher_gap)", "",
           "On the held-out tasks: the plain policy and the same policy reading a skill "
           "through H (the oracle's plan; another task's plan; an empty block). p(expert): "
           "the probability of the expert's action among the admissible ones, averaged "
           "over the expert episodes' decisions; decision gap: oracle minus plain; content "
           "score: oracle minus wrong plan (what the plan's content, not its presence, "
           "adds). Each arm is measured at its warm start (behaviour cloning, or stage 1 on "
           "top for arms with it) and at its final weights. Own skill: the policy's "
           "analysis of its own plain episode of the task as the skill (measured where the "
           "policy writes skills: stage 1 and the seed arm)."]
  if any(warm_gaps.values()):
    lines += ["", "The behaviour-cloning warm start, playing each held-out task once per "
              "skill source:", "",
              "| seed | " + " | ".join(h for h, _, _ in ACTING_COLUMNS) + " |",
              "|---" * (len(ACTING_COLUMNS) + 1) + "|"]
    for seed, gap in sorted(warm_gaps.items()):
      figures = [gap_figure(gap, source, key) for _, source, key in ACTING_COLUMNS]
      lines.append(f"| {seed} | " + " | ".join(
          f"{v:.3f}" if is_number(v) else "-" for v in figures) + " |")
  if arms:
    lines += ["", "| arm | " + " | ".join(f"{h}, warm start | after RL"
                                          for h, _, _ in DECISION_COLUMNS) + " |",
              "|---" * (2 * len(DECISION_COLUMNS) + 1) + "|"]
    for arm in arms:
      cells = [_fmt([gap_figure(getattr(run, which), source, key) for run in results[arm]])
               for _, source, key in DECISION_COLUMNS for which in ("warm_gap", "gap")]
      lines.append(f"| {arm} | " + " | ".join(cells) + " |")
  return lines


def results_markdown(results: dict[str, list[RunResults]],
                     descriptions: dict[str, str] | None = None,
                     images: Sequence[str] = (), command: str = "",
                     warm_gaps: dict[int, dict[str, Any] | None] | None = None,
                     warm_origins: dict[tuple[int, str], dict[str, Any] | None] | None = None
                     ) -> str:
  """The results page: final held-out success per arm (mean ± std over seeds), the
  training success per iteration, the last iteration's skill quality, and the curves."""
  descriptions = descriptions or {}
  arms = list(results)
  lines = ["# Experiment results", ""]
  if command:
    lines += ["```bash", command, "```", ""]
  all_runs = [run for runs in results.values() for run in runs]
  splits = [HELD_OUT] + [s for s in OTHER_SPLITS
                         if any(final_success(r, s) is not None for r in all_runs)]
  lines += ["Mean ± sample standard deviation over seeds; `(n=1)`: one seed, no spread; `-`: no "
            "run has the figure yet.", "",
            f"| arm | seeds finished | {HELD_OUT} success after the warm start | "
            + " | ".join(f"final {s} success" for s in splits)
            + " | training success, last iteration | what it is |",
            "|---" * (len(splits) + 5) + "|"]
  for arm in arms:
    runs = results[arm]
    finished = sum(r.summary is not None for r in runs)
    final = [_fmt([final_success(r, s) for r in runs]) for s in splits]
    # A final figure: an unfinished run's latest iteration is on the curve, not here.
    last = [r.train[max(r.train)].get("success") for r in runs
            if r.train and r.summary is not None]
    start = _fmt([warm_start_success(r) for r in runs])
    lines.append(f"| {arm} | {finished}/{len(runs)} | {start} | " + " | ".join(final)
                 + f" | {_fmt(last)} | {descriptions.get(arm, '')} |")
  curves = {arm: train_curve(results[arm]) for arm in arms}
  steps = sorted({s for c in curves.values() for s in c})
  lines += ["", "## Training success per iteration", "",
            "| iteration | " + " | ".join(arms) + " |", "|---" * (len(arms) + 1) + "|"]
  for step in steps:
    lines.append(f"| {step} | " + " | ".join(_fmt(curves[a].get(step)) for a in arms) + " |")
  lines += (learning_lines(results) + ineffective_lines(results) + paired_lines(results)
            + run_lines(results)
            + cost_lines(results) + signal_lines(results)
            + teacher_gap_lines(results, warm_gaps or {}) + gap_lines(results)
            + provenance_lines(results, warm_origins or {}))
  skill_arms = [a for a in arms if any(r.skills for r in results[a])]
  if skill_arms:
    lines += ["", "## Skills and the OPD gate, last iteration", "",
              "Teacher gap: the mean shift `delta = teacher - student log-prob` of the "
              "OPD-active tokens at theta_old (\"precomputed\" teacher mode only).", "",
              "| arm | skills parsed | skill words | skills naming the task's objects "
              "| OPD gate mean | " + " | ".join(h for h, _ in GAP_COLUMNS) + " |",
              "|---" * (5 + len(GAP_COLUMNS)) + "|"]
    for arm in skill_arms:
      runs = [r for r in results[arm] if r.skills]
      last = [r.skills[max(r.skills)] for r in runs]
      final = [r.train[max(r.train)] for r in runs if r.train]
      lines.append(f"| {arm} | {_fmt([q['parse_rate'] for q in last])} | "
                   f"{_fmt([q['skill_words'] for q in last])} | "
                   f"{_fmt([q['names_objects'] for q in last])} | "
                   f"{_fmt([t.get('gate_mean') for t in final])} | "
                   + " | ".join(_fmt([t.get(key) for t in final]) for _, key in GAP_COLUMNS)
                   + " |")
    lines += plan_lines({arm: results[arm] for arm in skill_arms})
  if images:
    lines += ["", "## Curves", "", "Lines: the mean over seeds; bands: ± one standard "
              "deviation.", ""] + [f"![{name}]({name})" for name in images]
  return "\n".join(lines) + "\n"


def plan_lines(results: dict[str, list[RunResults]]) -> list[str]:
  """The skills' numbered plans against the expert's, at the first and the last iteration,
  per arm whose runs have `expert_plans.json` (`seed_jax.experiments.expert_plans`)."""
  def figure(run: RunResults, step_of, key: str) -> float | None:
    return run.skills[step_of(run.skills)].get(key) if run.skills else None
  arms = {arm: [r for r in runs if any(PLAN_FIGURES[0] in q for q in r.skills.values())]
          for arm, runs in results.items()}
  arms = {arm: runs for arm, runs in arms.items() if runs}
  if not arms:
    return []
  lines = ["", "## The skills' plans against the expert's", "",
           "Per skill written in numbered steps (the oracle analyzer's form, which stage 1 "
           "teaches): whether its first step is the expert's first action for the task, "
           "whether its steps are the expert's whole plan, and whether it repeats one action "
           "throughout (`seed_jax.experiments.expert_plans`; the runs with "
           "`expert_plans.json`).", "",
           "| arm | runs | first step right, first iteration | last iteration | plan right, "
           "first iteration | last iteration | one action repeated, first iteration | "
           "last iteration |", "|---" * 8 + "|"]
  for arm, runs in arms.items():
    cells = [_fmt([figure(r, step_of, key) for r in runs])
             for key in PLAN_FIGURES for step_of in (min, max)]
    lines.append(f"| {arm} | {len(runs)} | " + " | ".join(cells) + " |")
  return lines


def episode_axis(runs: Sequence[RunResults]) -> dict[int, float]:
  """iteration -> the training episodes consumed by then, the mean over the runs that got
  there (the same for every seed of an arm: the games per iteration are fixed)."""
  by_step: dict[int, list[float]] = {}
  for run in runs:
    for step, episodes in episodes_consumed(run).items():
      by_step.setdefault(step, []).append(episodes)
  return {step: float(np.mean(values)) for step, values in sorted(by_step.items())}


def plot_experiment(results: dict[str, list[RunResults]], out: str) -> list[str]:
  """Writes the CURVES PNGs into `out` (a panel without any data is left out, a file
  without any panel is not written); returns the file names."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  from matplotlib.ticker import MaxNLocator  # pylint: disable=import-outside-toplevel
  axes_by_arm = {arm: episode_axis(runs) for arm, runs in results.items()}
  written = []
  for name, panels in CURVES.items():
    data = [(title, {arm: fn(runs) for arm, runs in results.items()}) for title, fn in panels]
    data = [(title, arms) for title, arms in data if any(arms.values())]
    if not data:
      continue
    fig, axes = plt.subplots(1, len(data), figsize=(5 * len(data), 3.6), squeeze=False,
                             sharey=name in SHARED_Y)
    for ax, (title, arms) in zip(axes.flat, data):
      for arm, points in arms.items():
        axis = axes_by_arm[arm]
        points = {step: v for step, v in points.items() if step in axis}
        if not points:
          continue
        episodes = np.array([axis[step] for step in points])
        stats = np.array([mean_std(v) for v in points.values()])
        ax.plot(episodes, stats[:, 0], marker="o", markersize=3, label=arm)
        ax.fill_between(episodes, stats[:, 0] - stats[:, 1], stats[:, 0] + stats[:, 1],
                        alpha=0.2)
      ax.set_title(title, fontsize=9)
      ax.set_xlabel("training episodes consumed")
      ax.xaxis.set_major_locator(MaxNLocator(integer=True))
      ax.grid(alpha=0.3)
      ax.legend(fontsize=8)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100)
    plt.close(fig)
    with open(os.path.join(out, name), "wb") as f:
      f.write(png.getvalue())
    written.append(name)
  return written


def write_results(out: str, arms: Sequence[str], seeds: Sequence[int],
                  descriptions: dict[str, str] | None = None, command: str = "",
                  warm_starts: dict[str, str] | None = None) -> str:
  """Reads the runs under `out` (see read_experiment), writes `out/results.md` (headed by
  `command`, the one that reproduces it) and the curve PNGs; returns the page's path."""
  results = read_experiment(out, arms, seeds, warm_starts)
  images = plot_experiment(results, out)
  warm_gaps = {seed: read_teacher_gap(warm_start_workdir(out, seed, BC)) for seed in seeds}
  warm_origins = {(seed, kind): provenance.read(warm_start_workdir(out, seed, kind))
                  for seed in seeds for kind in (BC, STAGE1)}
  path = os.path.join(out, "results.md")
  with open(path, "w") as f:
    f.write(results_markdown(results, descriptions, images, command, warm_gaps,
                             warm_origins))
  return path
