"""Compare algorithms: every (arm, seed) as its own resumable run, then one results page.

  python -m seed_jax.experiment --config=configs/alfworld.py:compare \
      --algorithms=seed,seed_oracle,grpo --seeds=0,1,2 --out=runs/exp \
      [--parallel=N] [--teacher_gap] [--max_runs=N] [--config.KEY=VALUE ...]
      [--aggregate_only]

Each run is `python -m seed_jax.main` in its own workdir, `<out>/<arm>/seed<k>` (its output
also goes to `<out>/logs/`). The arms of one seed share their warm start (behaviour cloning
and, for arms with it, stage 1), computed once per seed under `<out>/warm_start/` (arms
and warm starts: seed_jax/experiments/arms.py and jobs.py). Finished runs are skipped and
unfinished ones resume from their last checkpoint, so after a stop the same command
continues where the experiment stopped. A SIGTERM or Ctrl-C stops it: no new run starts,
the running ones checkpoint and stop (a second Ctrl-C ends them at once). `--max_runs=N`
starts at most N runs (warm starts count) and then stops the same way once they end: a
session of known length runs what fits, the next continues. At the end (and
with `--aggregate_only`, without running anything) the runs' metrics become
`<out>/results.md` and `<out>/*.png` (seed_jax/experiments/aggregate.py), headed by the
command (kept in `<out>/command.txt`). `--config.KEY=VALUE` applies to every run.

`--teacher_gap`: does the teacher know more than the student, before and after RL? Each
run, warm starts included, is measured by `seed_jax.teacher_gap` on its final weights as it
finishes (before the next run starts, so no timed run shares the machine with it), into
`<run>/teacher_gap.json`: the behaviour-cloning warm start acts (acting gap, content
score), every run gets the expert decisions' probabilities (decision gap). Checkpoints are
not kept across machines, so a run finished without its measurement is measured at the
next start if its checkpoint is still there.

Runs go one after another by default: each uses every core for XLA. `--parallel=N` runs N
at once, for machines with cores to spare. The compiled programs are cached in
`<out>/xla_cache` (unless JAX_COMPILATION_CACHE_DIR is set), so later runs of the same
shapes skip most of their compilation.
"""

from __future__ import annotations

from seed_jax import cli

if __name__ == "__main__":  # a command, not an import: before jax and transformers load
  cli.quiet_startup()

# pylint: disable=wrong-import-position
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Sequence

from absl import app, flags
from ml_collections import config_flags

from seed_jax.experiments import aggregate, expert_plans, run_results
from seed_jax.experiments.arms import Arm, check_arm_overrides, get_arm
from seed_jax.experiments.jobs import (TEACHER_GAP_FILE, Job, is_finished, log_path,
                                       needs_expert_plans, needs_teacher_gap, plan_jobs,
                                       run_jobs, teacher_gap_parts, usage_line)


def _define_flags() -> None:
  """The command's flags, defined only when it runs as a command: imported (by the tests),
  the module must not add required flags to every absl program of the process."""
  # pylint: disable-next=global-statement
  global _CONFIG, _ALGORITHMS, _SEEDS, _OUT, _PARALLEL, _AGGREGATE_ONLY, _TEACHER_GAP
  global _MAX_RUNS
  _CONFIG = config_flags.DEFINE_config_file(
      "config", None, "config file and preset of every run, e.g. configs/alfworld.py:compare",
      lock_config=True)
  _ALGORITHMS = flags.DEFINE_list(
      "algorithms", ["seed", "seed_oracle", "grpo"],
      "arms: algorithm names or variants (seed_jax/experiments/arms.py)")
  _SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "config.seed of each repetition")
  _OUT = flags.DEFINE_string("out", None, "experiment folder: runs, logs, results.md, PNGs")
  _PARALLEL = flags.DEFINE_integer("parallel", 1, "runs at once (each uses every core)")
  _AGGREGATE_ONLY = flags.DEFINE_bool("aggregate_only", False,
                                      "only re-render results.md and the PNGs from the runs")
  _TEACHER_GAP = flags.DEFINE_bool(
      "teacher_gap", False,
      "after each run and warm start, measure the teacher gap of its final weights on the "
      "held-out split into <run>/teacher_gap.json (seed_jax.teacher_gap; runs finished "
      "earlier are measured first while their checkpoints exist)")
  _MAX_RUNS = flags.DEFINE_integer(
      "max_runs", 0, "start at most this many runs, warm starts included (each with its "
      "teacher gap), then stop; the same command continues (0: no limit)")
  flags.mark_flags_as_required(["out"])

# The runs' environment, taken before anything imports jax: its import sets variables
# (TPU_LIBRARY_PATH) that, inherited, make each run's libtpu start differently and print
# warnings.
_LAUNCH_ENV = dict(os.environ)

# Set by the experiment for each run; the command line may not.
_RESERVED_KEYS = ("algorithm", "seed", "init_from", "workdir")


def config_overrides(argv: Sequence[str]) -> list[tuple[str, str]]:
  """The `--config.KEY=VALUE` arguments of `argv` as (KEY, VALUE) text, in order: passed
  on verbatim to every run, which parses them as `seed_jax.main` does."""
  overrides = []
  for arg in argv:
    match = re.match(r"^--?config\.([^=]+)(=(.*))?$", arg, re.S)
    if match is None:
      continue
    if match.group(2) is None:
      raise app.UsageError(f"{arg}: give config overrides as --config.KEY=VALUE")
    if match.group(1) in _RESERVED_KEYS:
      raise app.UsageError(f"config.{match.group(1)}: set by the experiment for each run "
                           "(--algorithms, --seeds, --out)")
    if match.group(1) == "analyzer.static_library":  # read before RL, which arms skip
      raise app.UsageError("config.analyzer.static_library: not supported by the experiment "
                           "(library arms use the library of the shared stage 1)")
    overrides.append((match.group(1), match.group(3)))
  return overrides


def override_arg(key: str, value: Any) -> str:
  """`--config.KEY=VALUE`; text is passed as given (the command line's own overrides)."""
  return f"--config.{key}={value if isinstance(value, str) else repr(value)}"


def job_command(job: Job, config_arg: str) -> list[str]:
  return [sys.executable, "-m", "seed_jax.main", f"--config={config_arg}",
          f"--workdir={job.workdir}"] + [override_arg(k, v) for k, v in job.overrides]


def teacher_gap_command(job: Job, config_arg: str) -> list[str]:
  """`seed_jax.teacher_gap` on the job's final weights, with the job's config, on every
  held-out task; its JSON goes to `<workdir>/teacher_gap.json`."""
  return [sys.executable, "-m", "seed_jax.teacher_gap", f"--config={config_arg}",
          f"--init={job.workdir}", f"--split={run_results.HELD_OUT}", "--episodes=0",
          f"--parts={','.join(teacher_gap_parts(job))}",
          f"--json={os.path.join(job.workdir, TEACHER_GAP_FILE)}"] + [
              override_arg(k, v) for k, v in job.overrides]


def with_teacher_gap(runner: Callable[[Job], int], measure: Callable[[Job], int],
                     stop: threading.Event) -> Callable[[Job], int]:
  """`runner`, then `measure` of the job once it has finished (its status is the run's:
  a failed measurement is reported in the log and tried again at the next start)."""
  def run(job: Job) -> int:
    status = runner(job)
    if status == 0 and not stop.is_set() and is_finished(job) and needs_teacher_gap(job):
      measure(job)
    return status
  return run


def check_configs(config, arms: Sequence[Arm]) -> None:
  """Every arm's run spec (and the warm starts') is built now, so a bad value fails before
  the first run rather than hours into the experiment."""
  # pylint: disable-next=import-outside-toplevel
  from seed_jax.train.spec import ConfigError, build_run_spec
  variants = [(a.name, a.algorithm, a.overrides) for a in arms]
  variants += [("warm start", "grpo", (("rl.iterations", 0),)),
               ("stage 1", "seed", (("rl.iterations", 0),))]
  for name, algorithm, overrides in variants:
    c = config.copy_and_resolve_references()
    with c.unlocked():
      c.algorithm = algorithm
      for key, value in overrides:
        *parents, leaf = key.split(".")
        node = c
        for part in parents:
          node = node[part]
        node[leaf] = value
    try:
      build_run_spec(c)
    except ConfigError as e:
      raise app.UsageError(f"{name}: {e}") from None


def subprocess_runner(command_of: Callable[[Job], list[str]], logs: str, echo: bool,
                      env: dict[str, str], children: set[subprocess.Popen],
                      what: str = ""):
  """Runs a job as the process `command_of(job)` (`job_command`: `seed_jax.main`), its
  output appended to `logs/<job>[_<what>].log` (and shown here when `echo`); `children`
  holds the running processes, for `stop_handler`."""
  def run(job: Job) -> int:
    command = command_of(job)
    with open(log_path(logs, job.name, what), "ab") as log:
      log.write(f"$ {shlex.join(command)}\n".encode())
      log.flush()
      # Its own session: a Ctrl-C reaches the experiment only, which passes it on as the
      # SIGTERM the trainer stops cleanly on (a SIGINT would kill it mid-iteration).
      process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 env=env, start_new_session=True)
      children.add(process)
      start = time.monotonic()
      try:
        for chunk in iter(lambda: process.stdout.read1(65536), b""):
          log.write(chunk)
          log.flush()
          if echo:
            sys.stdout.buffer.write(chunk)
            sys.stdout.flush()
        # wait4: the run's CPU seconds (its env workers' included) next to its wall time,
        # which on a shared machine tells how much of the wall time was waiting for cores.
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
      finally:
        children.discard(process)
      line = usage_line(f"{job.name}{' ' + what if what else ''}", process.returncode,
                        time.monotonic() - start, usage.ru_utime + usage.ru_stime)
      log.write(line.encode())
      sys.stdout.write(line)
      sys.stdout.flush()
      return process.returncode
  return run


def stop_handler(children: set[subprocess.Popen], stop: threading.Event):
  """The experiment's SIGTERM / SIGINT handler: no new run starts (`stop`), and each
  running one gets a SIGTERM: the first makes it checkpoint and stop at its next safe
  point, a second ends it at once."""
  def handle(signum, frame):  # pylint: disable=unused-argument
    for child in list(children):
      child.send_signal(signal.SIGTERM)
    if not stop.is_set():
      print("[experiment] stopping: the running runs checkpoint and stop (again to end them "
            "now); the same command continues", flush=True)
    stop.set()
  return handle


def reproducing_command(argv: Sequence[str]) -> str:
  """The command that runs the experiment (`--aggregate_only` and `--max_runs`, which say
  how much of it to run now, left out), for the page."""
  kept = [a for a in argv[1:]
          if not re.match(r"^--?((no)?aggregate_only|max_runs)(=|$)", a)]
  return shlex.join(["python", "-m", "seed_jax.experiment"] + kept)


def write_expert_plans(jobs: Sequence[Job], stop: threading.Event) -> None:
  """The expert's plans for every finished run whose policy wrote skills and has none yet
  (the page reads its skills against them); a run whose records cannot give them is named
  and left without."""
  for job in jobs:
    if stop.is_set() or not needs_expert_plans(job):
      continue
    try:
      print(f"[experiment] {job.name} expert plans: "
            f"{expert_plans.write_expert_plans(job.workdir)}", flush=True)
    except ValueError as e:
      print(f"[experiment] {job.name} expert plans not written: {e}", flush=True)


def run_experiment(config, arms: Sequence[Arm], seeds: Sequence[int], out: str,
                   parallel: int, teacher_gap: bool = False, max_runs: int = 0):
  """Runs the experiment's unfinished runs (at most `max_runs` starts; 0: all); returns
  the `Outcome`. SIGTERM or Ctrl-C:
  no new run starts, the running ones are asked to checkpoint and stop. With
  `teacher_gap`, each finished run's teacher gap is measured (`teacher_gap_command`)
  before the next run starts: first those finished earlier, then each as it finishes."""
  overrides = config_overrides(sys.argv[1:])
  check_configs(config, arms)
  jobs = plan_jobs(out, arms, seeds, config.rl.iterations, overrides)
  os.makedirs(os.path.join(out, "logs"), exist_ok=True)
  env = dict(_LAUNCH_ENV)
  env.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(out, "xla_cache"))
  config_arg = cli._config_flag_value(sys.argv, "config")  # pylint: disable=protected-access
  children: set[subprocess.Popen] = set()
  stop = threading.Event()
  signal.signal(signal.SIGTERM, stop_handler(children, stop))
  signal.signal(signal.SIGINT, stop_handler(children, stop))
  logs = os.path.join(out, "logs")
  runner = subprocess_runner(lambda job: job_command(job, config_arg), logs, parallel == 1,
                             env, children)
  if teacher_gap:
    measure = subprocess_runner(lambda job: teacher_gap_command(job, config_arg), logs,
                                parallel == 1, env, children, what="teacher gap")
    for job in jobs:
      if not stop.is_set() and needs_teacher_gap(job):
        measure(job)
    runner = with_teacher_gap(runner, measure, stop)
  outcome = run_jobs(jobs, runner, parallel=parallel, stop=stop, max_starts=max_runs)
  if teacher_gap:
    write_expert_plans(jobs, stop)
  print(f"[experiment] {len(outcome.skipped)} runs already finished, "
        f"{len(outcome.finished)} finished now, {len(outcome.unfinished)} unfinished "
        f"{outcome.unfinished or ''}, {len(outcome.waiting)} waiting", flush=True)
  return outcome


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  try:
    arms = [get_arm(name) for name in _ALGORITHMS.value]
    for arm in arms:
      check_arm_overrides(arm)
    seeds = [int(s) for s in _SEEDS.value]
  except ValueError as e:
    raise app.UsageError(str(e)) from None
  if _PARALLEL.value < 1:
    raise app.UsageError(f"--parallel: at least 1, got {_PARALLEL.value}")
  if _MAX_RUNS.value < 0:
    raise app.UsageError(f"--max_runs: 0 (no limit) or more, got {_MAX_RUNS.value}")
  out = os.path.abspath(_OUT.value)
  command_file = os.path.join(out, "command.txt")  # the page names the running command
  outcome = None
  if not _AGGREGATE_ONLY.value:
    if _CONFIG.value is None:
      raise app.UsageError("--config is required (except with --aggregate_only)")
    os.makedirs(out, exist_ok=True)
    with open(command_file, "w") as f:
      f.write(reproducing_command(sys.argv) + "\n")
    outcome = run_experiment(_CONFIG.value, arms, seeds, out, _PARALLEL.value,
                             _TEACHER_GAP.value, _MAX_RUNS.value)
  command = (open(command_file).read().strip() if os.path.exists(command_file)
             else reproducing_command(sys.argv))
  path = aggregate.write_results(out, [arm.name for arm in arms], seeds,
                                 {arm.name: arm.description for arm in arms}, command,
                                 {arm.name: arm.warm_start for arm in arms})
  print(f"[experiment] results: {path}")
  if outcome is not None and not outcome.complete:
    sys.exit(1)


if __name__ == "__main__":
  _define_flags()
  cli.run(main)
