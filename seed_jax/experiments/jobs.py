"""The runs of an experiment and their order: shared warm starts, then every (arm, seed).

Per seed, the warm start is computed once and every arm starts RL from it:
  * `warm_start/seed<k>/bc`: behaviour cloning only (`rl.iterations=0`, algorithm grpo, no
    evaluation); its iteration-0 checkpoint is the BC policy.
  * `warm_start/seed<k>/stage1`, when an arm has stage 1: a run started from the BC
    checkpoint (`init_from`, no BC of its own) that runs stage 1 and stops before RL
    (algorithm seed); its iteration-0 checkpoint holds the stage-1 policy and library.
  * `<arm>/seed<k>`: before its first start the arm's workdir receives a copy of its warm
    start's iteration-0 checkpoint, so `seed_jax.main` resumes from it straight into RL
    with the arm's own config (which it writes to the workdir's config.json). Skill-GRPO
    (library arms) instead starts from the BC weights (`init_from`) with a copy of stage
    1's annotations, which its own stage 1 loads instead of playing anything.

A run is finished when its summary.json says it reached its configured iterations (the
trainer writes it at the very end; a preempted run writes none). Finished runs are skipped;
any other run is started again with the same command, and the trainer resumes it from the
last checkpoint in its workdir. A finished warm start whose checkpoint is gone (the records
of a run are kept, its checkpoints are not: a fresh clone of a results folder) while a run
still to start fresh needs it is computed again, its earlier record moved to
`<workdir>/superseded/<n>/`; the log gives its earlier and its new held-out success, to
check that the same seed computed the same warm start.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import re
import shutil
import threading
from typing import Any, Callable, Sequence

from seed_jax.experiments.arms import BC, LIBRARY, STAGE1, Arm
from seed_jax.experiments.expert_plans import EXPERT_PLANS_FILE

WARM_START = "warm_start"  # folder of the shared warm starts under --out (not an arm name)


@dataclasses.dataclass(frozen=True)
class Job:
  """One `seed_jax.main` run of the experiment.

  Attributes:
    name: `<arm>/seed<k>` or `warm_start/seed<k>/<bc|stage1>`; also its folder under --out.
    workdir: the run's folder.
    overrides: `(config key, value)` pairs passed as `--config.KEY=VALUE`, in order.
    iterations: its `rl.iterations`: it is finished once its summary says so.
    after: names of the jobs it starts from (they must be finished first).
    warm_checkpoint: a checkpoint step folder copied into the workdir as iteration 0
      before the run's first start ("": none).
    warm_stage1: a `stage1/` folder copied into the workdir before its first start.
  """
  name: str
  workdir: str
  overrides: tuple[tuple[str, Any], ...]
  iterations: int
  after: tuple[str, ...] = ()
  warm_checkpoint: str = ""
  warm_stage1: str = ""


def _warm_overrides(seed: int, algorithm: str) -> tuple[tuple[str, Any], ...]:
  """A run that stops where RL would begin, having written its iteration-0 checkpoint and
  its summary with the held-out evaluation of that checkpoint: the baseline every arm
  that starts from it is measured against."""
  return (("algorithm", algorithm), ("seed", seed), ("rl.iterations", 0),
          ("eval.at_end", True), ("checkpoint.export_hf", False), ("log.plots", False))


def warm_start_workdir(out: str, seed: int, warm_start: str) -> str:
  """The folder of the run that computed an arm's warm start (`Arm.warm_start`); a
  library arm starts from the BC weights."""
  return os.path.join(out, WARM_START, f"seed{seed}", STAGE1 if warm_start == STAGE1 else BC)


def plan_jobs(out: str, arms: Sequence[Arm], seeds: Sequence[int], iterations: int,
              user_overrides: Sequence[tuple[str, Any]] = ()) -> list[Job]:
  """Every job of the experiment, in a runnable order: per seed its warm starts, then its
  arms. `user_overrides` (the command line's `--config.KEY=VALUE`) apply to every run;
  the experiment's own keys (the warm starts' settings, the arm's) take precedence. With
  `--config.log.wandb=True` every run is one W&B run named after its job, in one group
  (`log.wandb_group`, by default the experiment folder's name)."""
  group = dict(user_overrides).get("log.wandb_group") or os.path.basename(
      os.path.normpath(out))
  jobs = []
  for seed in seeds:
    bc = Job(f"{WARM_START}/seed{seed}/bc", warm_start_workdir(out, seed, BC),
             _merge(user_overrides, _warm_overrides(seed, "grpo")), 0)
    stage1 = Job(f"{WARM_START}/seed{seed}/stage1", warm_start_workdir(out, seed, STAGE1),
                 _merge(user_overrides, _warm_overrides(seed, "seed") + (
                     ("init_from", _step_folder(bc.workdir, 0)), ("bc.enabled", False))),
                 0, after=(bc.name,))
    needs = {arm.warm_start for arm in arms}
    jobs.append(bc)
    if needs & {STAGE1, LIBRARY}:
      jobs.append(stage1)
    for arm in arms:
      base = (("algorithm", arm.algorithm), ("seed", seed)) + arm.overrides
      workdir = os.path.join(out, arm.name, f"seed{seed}")
      if arm.warm_start == LIBRARY:
        jobs.append(Job(f"{arm.name}/seed{seed}", workdir, _merge(user_overrides, base + (
            ("init_from", _step_folder(bc.workdir, 0)), ("bc.enabled", False))),
                        iterations, after=(bc.name, stage1.name),
                        warm_stage1=os.path.join(stage1.workdir, "stage1")))
      else:
        source = stage1 if arm.warm_start == STAGE1 else bc
        jobs.append(Job(f"{arm.name}/seed{seed}", workdir, _merge(user_overrides, base),
                        iterations, after=(source.name,),
                        warm_checkpoint=_step_folder(source.workdir, 0)))
  return [dataclasses.replace(job, overrides=_merge(job.overrides, (
      ("log.wandb_name", job.name), ("log.wandb_group", group)))) for job in jobs]


def _merge(first: Sequence[tuple[str, Any]], then: Sequence[tuple[str, Any]]
           ) -> tuple[tuple[str, Any], ...]:
  """`first` with the keys of `then` replaced (a key given twice would leave the winner
  to the flag parser's order)."""
  merged = dict(first)
  merged.update(then)
  return tuple(merged.items())


def _step_folder(workdir: str, step: int) -> str:
  return os.path.join(workdir, "checkpoints", str(step))


# ------------------------------------------------------------------ state on disk


def run_summary(workdir: str) -> dict[str, Any] | None:
  """The run's summary.json, or None (not written yet, or torn)."""
  try:
    with open(os.path.join(workdir, "summary.json")) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def is_finished(job: Job) -> bool:
  summary = run_summary(job.workdir)
  return (summary is not None and not summary.get("preempted")
          and summary.get("iterations") == job.iterations)


TEACHER_GAP_FILE = "teacher_gap.json"  # a run's teacher gap at its final weights


def log_path(logs: str, job_name: str, what: str = "") -> str:
  """`logs/<job>[_<what>].log`: the output of a job (with `what`, of a measurement of it,
  e.g. "teacher gap")."""
  return os.path.join(logs, job_name.replace("/", "_")
                      + (f"_{what.replace(' ', '_')}" if what else "") + ".log")


def usage_line(label: str, returncode: int, wall_s: float, cpu_s: float) -> str:
  """The line the runner appends to a job's log when its process ends: its exit code, wall
  seconds and CPU seconds (`cpu_per_wall` reads it back)."""
  return f"[experiment] {label}: exit {returncode}, {wall_s:.0f} s wall, {cpu_s:.0f} s CPU\n"


def cpu_per_wall(path: str, job_name: str) -> float | None:
  """The CPU seconds per wall second of a job over all its starts, from its `usage_line`s
  in the log at `path` (its measurements' lines, labelled apart, are not counted); None
  without a log or a start. A run alone on a machine keeps its cores busy; one that shared
  them waited, and its wall time says more of its neighbours than of itself."""
  pattern = re.compile(rf"^\[experiment\] {re.escape(job_name)}: exit -?\d+, (\d+) s wall, "
                       r"(\d+) s CPU$")
  wall = cpu = 0
  try:
    with open(path, errors="replace") as f:
      for line in f:
        match = pattern.match(line.strip())
        if match:
          wall, cpu = wall + int(match.group(1)), cpu + int(match.group(2))
  except OSError:
    return None
  return cpu / wall if wall else None


def analyses_with_the_policy(job: Job) -> bool:
  """Whether the job's RL analyses its trajectories with the policy itself (the arm's
  `analyzer.backend`): the skills its OPD term reads are the policy's own."""
  return ("analyzer.backend", "policy") in job.overrides


def teacher_gap_parts(job: Job) -> tuple[str, ...]:
  """What `--teacher_gap` measures of a finished job (`seed_jax.teacher_gap --parts`).

  Every run gets the expert decisions' probabilities (plain, oracle, wrong and empty
  skill: the decision gap). The behaviour-cloning warm start, where the comparison starts,
  also acts (the acting gap and the content score, minutes). A policy that writes its own
  skills (stage 1's warm start, an arm whose analyzer is the policy) also plays the tasks
  from the plain prompt and analyses those episodes (`tokens`): its own skills are then a
  source of the decision gap, the teacher that arm's OPD term actually reads.
  """
  if job.name.endswith(f"/{BC}"):
    return ("acting", "decision")
  if job.name.endswith(f"/{STAGE1}") or analyses_with_the_policy(job):
    return ("decision", "tokens")
  return ("decision",)


def needs_teacher_gap(job: Job) -> bool:
  """A finished job without its teacher gap whose weights are still here to measure."""
  return (is_finished(job) and not os.path.exists(os.path.join(job.workdir, TEACHER_GAP_FILE))
          and bool(checkpoint_steps(job.workdir)))


def needs_expert_plans(job: Job) -> bool:
  """A finished run whose policy wrote skills, without the expert's plans to read them
  against (`seed_jax.experiments.expert_plans`: records only, no checkpoint needed)."""
  return (analyses_with_the_policy(job) and is_finished(job)
          and not os.path.exists(os.path.join(job.workdir, EXPERT_PLANS_FILE)))


def checkpoint_steps(workdir: str) -> list[int]:
  """The committed checkpoint steps of a local run: orbax writes a step into a temporary
  folder and renames it to its number only once it is complete."""
  folder = os.path.join(workdir, "checkpoints")
  if not os.path.isdir(folder):
    return []
  return sorted(int(n) for n in os.listdir(folder)
                if n.isdigit() and os.path.isdir(os.path.join(folder, n)))


def _warm_copies(job: Job) -> list[tuple[str, str, str]]:
  """What a job's next start copies into its workdir, as (name, source, target): the warm
  checkpoint as `checkpoints/0` unless the workdir has a checkpoint of its own (the run
  resumes from it), and the stage-1 annotations unless they are there already."""
  copies = []
  if job.warm_checkpoint and not checkpoint_steps(job.workdir):
    copies.append(("start", job.warm_checkpoint, _step_folder(job.workdir, 0)))
  if job.warm_stage1 and not os.path.isdir(os.path.join(job.workdir, "stage1")):
    copies.append(("stage1", job.warm_stage1, os.path.join(job.workdir, "stage1")))
  return copies


def prepare_workdir(job: Job) -> bool:
  """Before a job's first start, copies its warm start into its workdir (`_warm_copies`),
  each a whole folder or nothing: copied aside, then renamed. Returns whether anything was
  copied."""
  copies = _warm_copies(job)
  for name, source, target in copies:
    staging = os.path.join(job.workdir, f".warm_{name}_copy")
    shutil.rmtree(staging, ignore_errors=True)  # a copy interrupted earlier
    shutil.copytree(source, staging)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    os.rename(staging, target)
  return bool(copies)


def _missing_inputs(job: Job) -> list[str]:
  """The paths a job's next start would read that are not there: its warm copies and,
  when it starts fresh (no checkpoint of its own), the parameters it initialises from."""
  needed = [source for _, source, _ in _warm_copies(job)]
  if not checkpoint_steps(job.workdir):
    needed.append(dict(job.overrides).get("init_from", ""))
  return [path for path in needed if path and not os.path.exists(path)]


def stale_warm_starts(jobs: Sequence[Job], finished: set[str]) -> list[Job]:
  """The finished jobs to compute again because a job still to run needs a file of
  theirs that is gone (and, for those, the jobs they start from), in the jobs' order."""
  by_name = {job.name: job for job in jobs}
  redo: set[str] = set()
  to_check = [job for job in jobs if job.name not in finished]
  while to_check:
    job = to_check.pop()
    for path in _missing_inputs(job):
      for name in job.after:
        source = by_name[name]
        inside = os.path.commonpath([os.path.abspath(path), os.path.abspath(source.workdir)])
        if (name in finished and name not in redo
            and inside == os.path.abspath(source.workdir)):
          redo.add(name)
          to_check.append(source)
  return [job for job in jobs if job.name in redo]


def supersede(job: Job) -> str:
  """Moves a finished job's record aside, to `<workdir>/superseded/<n>/`, so that it runs
  again from the start. Returns that folder."""
  root = os.path.join(job.workdir, "superseded")
  os.makedirs(root, exist_ok=True)
  target = os.path.join(root, str(len(os.listdir(root))))
  os.makedirs(target)
  for entry in os.listdir(job.workdir):
    if entry != "superseded":
      os.rename(os.path.join(job.workdir, entry), os.path.join(target, entry))
  return target


def _held_out_success(summary: dict[str, Any] | None) -> Any:
  """The summary's held-out success rates (whatever the splits), for the log."""
  if not summary:
    return None
  return {key: value for key, value in summary.items() if key.endswith("/success")}


# ------------------------------------------------------------------ running

# Runs one job (its workdir prepared) and returns its exit status.
Runner = Callable[[Job], int]


@dataclasses.dataclass
class Outcome:
  """What one pass over the jobs did."""
  skipped: list[str] = dataclasses.field(default_factory=list)   # finished before
  finished: list[str] = dataclasses.field(default_factory=list)  # finished now
  unfinished: list[str] = dataclasses.field(default_factory=list)  # ran, not finished
  waiting: list[str] = dataclasses.field(default_factory=list)   # a job before it is not

  @property
  def complete(self) -> bool:
    return not (self.unfinished or self.waiting)


def run_jobs(jobs: Sequence[Job], runner: Runner, parallel: int = 1,
             stop: threading.Event | None = None, max_starts: int = 0,
             log: Callable[[str], None] = print) -> Outcome:
  """Runs the unfinished jobs, at most `parallel` at once, each once its `after` jobs are
  finished. A job that ends unfinished (failed, or stopped) holds back the jobs after it;
  the others go on. Once `stop` is set, or `max_starts` jobs were started (0: no limit),
  no job is started (running ones end as their runner makes them)."""
  stop = stop or threading.Event()
  outcome = Outcome()
  done = set()
  for job in jobs:
    if is_finished(job):
      done.add(job.name)
      outcome.skipped.append(job.name)
  earlier: dict[str, dict[str, Any] | None] = {}
  for job in stale_warm_starts(jobs, done):
    earlier[job.name] = run_summary(job.workdir)
    kept = supersede(job)
    done.discard(job.name)
    outcome.skipped.remove(job.name)
    log(f"[experiment] {job.name} is computed again: a run still to start needs its "
        f"checkpoint, which is gone (its earlier record: {kept})")
  pending = [job for job in jobs if job.name not in done]

  def start(job: Job) -> int:
    prepare_workdir(job)
    return runner(job)

  with concurrent.futures.ThreadPoolExecutor(max(parallel, 1)) as pool:
    running: dict[concurrent.futures.Future, Job] = {}
    starts = 0
    while True:
      ready = [job for job in pending if all(name in done for name in job.after)]
      while (ready and len(running) < parallel and not stop.is_set()
             and (not max_starts or starts < max_starts)):
        job = ready.pop(0)
        pending.remove(job)
        starts += 1
        log(f"[experiment] start {job.name}")
        running[pool.submit(start, job)] = job
      if not running:
        break
      finished, _ = concurrent.futures.wait(running,
                                            return_when=concurrent.futures.FIRST_COMPLETED)
      for future in finished:
        job = running.pop(future)
        error = future.exception()
        status = error if error is not None else future.result()
        if error is None and status == 0 and is_finished(job):
          done.add(job.name)
          outcome.finished.append(job.name)
          log(f"[experiment] finished {job.name}")
          if job.name in earlier:
            log(f"[experiment] {job.name} held-out success: now "
                f"{_held_out_success(run_summary(job.workdir))}, before "
                f"{_held_out_success(earlier[job.name])}")
        else:
          outcome.unfinished.append(job.name)
          log(f"[experiment] {job.name} did not finish ({status!r}); the same command "
              "resumes it")
  outcome.waiting = [job.name for job in pending]
  return outcome
