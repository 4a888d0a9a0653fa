"""The experiment runner (`python -m seed_jax.experiment`): the arms, the runs it plans,
skipping finished runs and resuming an interrupted experiment (with a fake run command,
so no training), the aggregation into a results page, and one real run of two arms that
start RL from the same shared warm start."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading

import numpy as np
import pytest

from seed_jax import experiment
from seed_jax.experiments import aggregate, run_results
from seed_jax.experiments.arms import (BC, LIBRARY, STAGE1, Arm, check_arm_overrides,
                                       get_arm)
from seed_jax.experiments.jobs import (TEACHER_GAP_FILE, Job, checkpoint_steps, cpu_per_wall,
                                       is_finished, needs_teacher_gap, plan_jobs,
                                       prepare_workdir, run_jobs)
from seed_jax.train.algorithms import ALGORITHMS
from tests.train.conftest import tiny_model  # noqa: F401  (a fixture)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ------------------------------------------------------------------ the arms


def test_seed_runs_twice_with_the_policy_and_with_the_oracle_analyzer_after_stage_1():
  seed, oracle = get_arm("seed"), get_arm("seed_oracle")
  assert seed.algorithm == oracle.algorithm == "seed"
  assert dict(seed.overrides)["analyzer.backend"] == "policy"
  assert dict(oracle.overrides)["analyzer.backend"] == "oracle"
  assert seed.warm_start == oracle.warm_start == STAGE1


@pytest.mark.parametrize("centered,plain", [("seed_centered", "seed"),
                                            ("seed_oracle_centered", "seed_oracle")])
def test_a_centred_arm_is_its_seed_arm_with_the_opd_pull_weighed_by_gate_minus_a_half(
    centered, plain):
  arm, base = get_arm(centered), get_arm(plain)
  assert (arm.algorithm, arm.warm_start) == (base.algorithm, base.warm_start)
  assert dict(arm.overrides) == {**dict(base.overrides), "rl.opd_gate_baseline": 0.5}
  check_arm_overrides(arm)  # the warm start every arm of a seed shares stays shareable


@pytest.mark.parametrize("name,warm_start", [
    ("grpo", BC), ("no_sft", BC), ("seed", STAGE1), ("no_opd", STAGE1),
    ("static_library", STAGE1), ("skill_grpo", LIBRARY)])
def test_every_algorithm_is_an_arm_starting_from_the_warm_start_it_would_compute(
    name, warm_start):
  assert name in ALGORITHMS
  arm = get_arm(name)
  assert arm.algorithm == name and arm.warm_start == warm_start


@pytest.mark.parametrize("name, told", [
    ("grpo", "GRPO alone, no stage 1"),
    ("no_opd", "GRPO alone, after stage-1 SFT"),
    ("no_sft", "GRPO + OPD, no stage 1; the teacher sees skills from the policy's own "
               "analyses"),
    ("skill_grpo", "GRPO, no stage 1; skills from a fixed library in the acting prompt"),
    ("static_library", "GRPO + OPD, after stage-1 SFT; the teacher sees skills from a "
                       "fixed library")])
def test_the_results_page_says_what_each_algorithm_arm_trains_with(name, told):
  assert get_arm(name).description == told


def test_an_unknown_arm_fails_listing_the_known_ones():
  with pytest.raises(ValueError, match="seed_oracle.*grpo"):
    get_arm("gpro")


@pytest.mark.parametrize("key", ["rl.kl_coef", "model.name", "mesh.fsdp", "seed"])
def test_an_arm_may_not_change_what_the_shared_checkpoint_holds(key):
  with pytest.raises(ValueError, match=key):
    check_arm_overrides(Arm("bad", "grpo", ((key, 1),)))
  check_arm_overrides(Arm("fine", "grpo", (("analyzer.backend", "oracle"),)))


# ------------------------------------------------------------------ the plan


def by_name(jobs):
  return {job.name: job for job in jobs}


def test_each_seed_computes_its_warm_starts_once_and_every_arm_starts_from_one(tmp_path):
  out = str(tmp_path)
  jobs = by_name(plan_jobs(out, [get_arm(a) for a in ("seed", "seed_oracle", "grpo")],
                           [0, 1], iterations=5))
  assert sorted(jobs) == sorted(
      [f"{a}/seed{k}" for a in ("seed", "seed_oracle", "grpo") for k in (0, 1)]
      + [f"warm_start/seed{k}/{w}" for k in (0, 1) for w in ("bc", "stage1")])
  bc, stage1 = jobs["warm_start/seed1/bc"], jobs["warm_start/seed1/stage1"]
  assert bc.iterations == stage1.iterations == 0  # they stop where RL begins
  assert dict(stage1.overrides)["init_from"] == os.path.join(bc.workdir, "checkpoints", "0")
  assert stage1.after == (bc.name,)
  for arm, source in (("seed", stage1), ("seed_oracle", stage1), ("grpo", bc)):
    job = jobs[f"{arm}/seed1"]
    assert job.workdir == os.path.join(out, arm, "seed1") and job.iterations == 5
    assert job.after == (source.name,)
    assert job.warm_checkpoint == os.path.join(source.workdir, "checkpoints", "0")
    assert dict(job.overrides)["seed"] == 1


def test_an_experiment_without_stage_1_arms_computes_no_stage_1(tmp_path):
  jobs = plan_jobs(str(tmp_path), [get_arm("grpo")], [0], iterations=2)
  assert [job.name for job in jobs] == ["warm_start/seed0/bc", "grpo/seed0"]


def test_command_line_overrides_reach_every_run_but_the_experiment_sets_its_own_keys(
    tmp_path):
  jobs = by_name(plan_jobs(str(tmp_path), [get_arm("seed_oracle")], [0], iterations=3,
                           user_overrides=[("rl.iterations", "3"),
                                           ("analyzer.backend", "policy"),
                                           ("bc.episodes", "7")]))
  for job in jobs.values():
    assert dict(job.overrides)["bc.episodes"] == "7"
  assert dict(jobs["warm_start/seed0/bc"].overrides)["rl.iterations"] == 0
  assert dict(jobs["seed_oracle/seed0"].overrides)["analyzer.backend"] == "oracle"


def test_config_overrides_are_read_from_the_command_line_as_given():
  argv = ["--config=configs/alfworld.py:compare", "--config.rl.iterations=4",
          "--config.eval.splits=('valid_unseen',)", "--seeds=0"]
  assert experiment.config_overrides(argv) == [("rl.iterations", "4"),
                                               ("eval.splits", "('valid_unseen',)")]
  with pytest.raises(experiment.app.UsageError, match="config.seed"):
    experiment.config_overrides(["--config.seed=3"])
  with pytest.raises(experiment.app.UsageError, match="static_library"):
    experiment.config_overrides(["--config.analyzer.static_library=lib.json"])
  with pytest.raises(experiment.app.UsageError, match="KEY=VALUE"):
    experiment.config_overrides(["--config.rl.iterations"])


def test_a_run_is_the_main_command_in_its_workdir_with_its_overrides():
  job = Job("grpo/seed0", "/out/grpo/seed0", (("seed", 0), ("eval.at_end", False),
                                              ("eval.splits", "('valid_unseen',)")), 1)
  command = experiment.job_command(job, "configs/alfworld.py:compare")
  assert command[1:] == ["-m", "seed_jax.main", "--config=configs/alfworld.py:compare",
                         "--workdir=/out/grpo/seed0", "--config.seed=0",
                         "--config.eval.at_end=False",
                         "--config.eval.splits=('valid_unseen',)"]


def test_the_teacher_gap_of_a_run_is_measured_with_its_config_on_its_final_weights():
  warm = Job("warm_start/seed0/bc", "/out/warm_start/seed0/bc", (("seed", 0),), 0)
  arm = Job("grpo/seed0", "/out/grpo/seed0", (("seed", 0), ("rl.iterations", 10)), 10)
  command = experiment.teacher_gap_command(arm, "configs/sokoban.py:learn")
  assert command[1:] == ["-m", "seed_jax.teacher_gap", "--config=configs/sokoban.py:learn",
                         "--init=/out/grpo/seed0", "--split=valid_unseen", "--episodes=0",
                         "--parts=decision", "--json=/out/grpo/seed0/teacher_gap.json",
                         "--config.seed=0", "--config.rl.iterations=10"]
  # The behaviour-cloning warm start, where every comparison starts, also plays the tasks.
  assert "--parts=acting,decision" in experiment.teacher_gap_command(warm, "c.py")
  # A policy that writes its own skills also analyses its plain episodes: its own skill is
  # then a source of the decision gap (the teacher of the `seed` arm).
  stage1 = Job("warm_start/seed0/stage1", "/out/warm_start/seed0/stage1", (("seed", 0),), 0)
  seed = Job("seed/seed0", "/out/seed/seed0",
             (("analyzer.backend", "policy"), ("seed", 0)), 10)
  oracle = Job("seed_oracle/seed0", "/out/seed_oracle/seed0",
               (("analyzer.backend", "oracle"), ("seed", 0)), 10)
  for job, parts in ((stage1, "decision,tokens"), (seed, "decision,tokens"),
                     (oracle, "decision")):
    assert f"--parts={parts}" in experiment.teacher_gap_command(job, "c.py")


# ------------------------------------------------------------------ running, with a fake run


class FakeTrainer:
  """Stands in for `seed_jax.main`: resumes from the workdir's last checkpoint (or starts
  at 0), saves one checkpoint per iteration and writes the summary at the end. It can be
  made to die after a given iteration of a given run."""

  def __init__(self, die_in: str = "", die_after: int = 0, stop: threading.Event = None):
    self.die_in, self.die_after, self.stop = die_in, die_after, stop
    self.started: list[tuple[str, int]] = []  # (job, the iteration it started from)
    self.lock = threading.Lock()

  def __call__(self, job: Job) -> int:
    steps = checkpoint_steps(job.workdir)
    start = steps[-1] if steps else 0
    with self.lock:
      self.started.append((job.name, start))
    for it in range(start, job.iterations + 1):
      os.makedirs(os.path.join(job.workdir, "checkpoints", str(it)), exist_ok=True)
      if job.name == self.die_in and it == self.die_after:
        if self.stop is not None:
          self.stop.set()
        return 1
    with open(os.path.join(job.workdir, "summary.json"), "w") as f:
      json.dump({"iterations": job.iterations}, f)
    return 0


def plan(tmp_path, arms=("seed", "grpo"), seeds=(0, 1), iterations=2):
  return plan_jobs(str(tmp_path), [get_arm(a) for a in arms], list(seeds), iterations)


def test_finished_runs_are_skipped(tmp_path):
  jobs = plan(tmp_path)
  first = FakeTrainer()
  outcome = run_jobs(jobs, first, log=lambda _: None)
  assert outcome.complete and sorted(outcome.finished) == sorted(j.name for j in jobs)
  again = FakeTrainer()
  outcome = run_jobs(jobs, again, log=lambda _: None)
  assert again.started == [] and sorted(outcome.skipped) == sorted(j.name for j in jobs)


@pytest.mark.parametrize("summary,finished", [
    ({"iterations": 2}, True),
    ({"iterations": 1}, False),  # written by a run of fewer iterations: it goes on
    ({"iterations": 2, "preempted": True}, False),
    (None, False),
    ("{torn", False)])
def test_a_run_is_finished_when_its_summary_says_it_reached_its_iterations(
    tmp_path, summary, finished):
  job = Job("grpo/seed0", str(tmp_path), (), iterations=2)
  if summary is not None:
    (tmp_path / "summary.json").write_text(
        summary if isinstance(summary, str) else json.dumps(summary))
  assert is_finished(job) == finished


def test_an_interrupted_experiment_continues_where_it_stopped(tmp_path):
  jobs = plan(tmp_path)
  dying = FakeTrainer(die_in="seed/seed0", die_after=1)
  outcome = run_jobs(jobs, dying, log=lambda _: None)
  assert outcome.unfinished == ["seed/seed0"] and not outcome.complete
  # The others went on: nothing waits for seed/seed0.
  assert "grpo/seed0" in outcome.finished and "seed/seed1" in outcome.finished
  resumed = FakeTrainer()
  outcome = run_jobs(jobs, resumed, log=lambda _: None)
  assert outcome.complete
  # Only the interrupted run ran again, from its own last checkpoint, not from the
  # warm start copied in before its first start.
  assert resumed.started == [("seed/seed0", 1)]


def fresh_clone(jobs, unfinished=()):
  """What a clone of a results folder holds: every run's record, no checkpoint; the runs
  named `unfinished` had not finished (no summary)."""
  for job in jobs:
    shutil.rmtree(os.path.join(job.workdir, "checkpoints"))
    if job.name in unfinished:
      os.remove(os.path.join(job.workdir, "summary.json"))


def test_a_warm_start_whose_checkpoint_is_gone_is_computed_again_for_a_run_to_start(
    tmp_path):
  jobs = plan(tmp_path)
  run_jobs(jobs, FakeTrainer(), log=lambda _: None)
  fresh_clone(jobs, unfinished=["grpo/seed0"])
  again = FakeTrainer()
  outcome = run_jobs(jobs, again, log=lambda _: None)
  assert outcome.complete
  # grpo starts from BC only: stage 1 and the other seed are not computed again.
  assert again.started == [("warm_start/seed0/bc", 0), ("grpo/seed0", 0)]
  bc = by_name(jobs)["warm_start/seed0/bc"].workdir
  assert json.load(open(os.path.join(bc, "superseded", "0", "summary.json"))) == {
      "iterations": 0}
  assert checkpoint_steps(os.path.join(tmp_path, "grpo", "seed0")) == [0, 1, 2]


def test_a_stage_1_computed_again_first_computes_again_the_bc_it_starts_from(tmp_path):
  jobs = plan(tmp_path)
  run_jobs(jobs, FakeTrainer(), log=lambda _: None)
  fresh_clone(jobs, unfinished=["seed/seed1"])
  again = FakeTrainer()
  assert run_jobs(jobs, again, log=lambda _: None).complete
  assert [name for name, _ in again.started] == [
      "warm_start/seed1/bc", "warm_start/seed1/stage1", "seed/seed1"]


def test_a_run_that_resumes_from_its_own_checkpoint_needs_no_warm_start_again(tmp_path):
  jobs = plan(tmp_path)
  run_jobs(jobs, FakeTrainer(die_in="grpo/seed0", die_after=1), log=lambda _: None)
  for job in jobs:
    if job.name.startswith("warm_start/"):
      shutil.rmtree(os.path.join(job.workdir, "checkpoints"))
  again = FakeTrainer()
  assert run_jobs(jobs, again, log=lambda _: None).complete
  assert again.started == [("grpo/seed0", 1)]


def test_a_resuming_run_whose_stage_1_annotations_are_gone_gets_stage_1_again(tmp_path):
  jobs = plan(tmp_path, arms=("skill_grpo",), seeds=(0,))
  arm = by_name(jobs)["skill_grpo/seed0"]

  def writing_annotations(trainer):
    """The trainer, its stage 1 writing the annotations a library arm copies in."""
    def run(job):
      if job.name.endswith("stage1"):
        os.makedirs(arm.warm_stage1, exist_ok=True)
      return trainer(job)
    return run

  run_jobs(jobs, writing_annotations(FakeTrainer(die_in=arm.name, die_after=1)),
           log=lambda _: None)
  # Stopped between its warm copies: its own checkpoint is there, its annotations are
  # not, and neither are stage 1's.
  shutil.rmtree(os.path.join(arm.workdir, "stage1"))
  shutil.rmtree(arm.warm_stage1)
  again = FakeTrainer()
  assert run_jobs(jobs, writing_annotations(again), log=lambda _: None).complete
  assert again.started == [("warm_start/seed0/stage1", 0), (arm.name, 1)]
  assert os.path.isdir(os.path.join(arm.workdir, "stage1"))


def test_a_failed_warm_start_holds_back_the_arms_of_its_seed_only(tmp_path):
  jobs = plan(tmp_path)
  outcome = run_jobs(jobs, FakeTrainer(die_in="warm_start/seed0/bc", die_after=0),
                     log=lambda _: None)
  assert outcome.unfinished == ["warm_start/seed0/bc"]
  assert sorted(outcome.waiting) == ["grpo/seed0", "seed/seed0", "warm_start/seed0/stage1"]
  assert sorted(outcome.finished) == ["grpo/seed1", "seed/seed1", "warm_start/seed1/bc",
                                      "warm_start/seed1/stage1"]


def test_once_stopped_no_new_run_starts(tmp_path):
  jobs = plan(tmp_path)
  stop = threading.Event()
  trainer = FakeTrainer(die_in="warm_start/seed0/bc", die_after=0, stop=stop)
  outcome = run_jobs(jobs, trainer, stop=stop, log=lambda _: None)
  assert [name for name, _ in trainer.started] == ["warm_start/seed0/bc"]
  assert len(outcome.waiting) == len(jobs) - 1


def test_max_starts_runs_that_many_and_the_next_call_continues(tmp_path):
  jobs = plan(tmp_path)
  trainer = FakeTrainer()
  outcome = run_jobs(jobs, trainer, max_starts=2, log=lambda _: None)
  assert [name for name, _ in trainer.started] == [jobs[0].name, jobs[1].name]
  assert outcome.finished == [jobs[0].name, jobs[1].name]
  assert len(outcome.waiting) == len(jobs) - 2 and not outcome.complete
  again = FakeTrainer()
  outcome = run_jobs(jobs, again, log=lambda _: None)
  assert [name for name, _ in again.started] == [job.name for job in jobs[2:]]
  assert outcome.complete


def test_the_page_command_leaves_out_how_much_to_run_now():
  argv = ["seed_jax/experiment.py", "--config=c.py:learn", "--max_runs=3", "--seeds=0",
          "--aggregate_only", "--out=x"]
  assert experiment.reproducing_command(argv) == (
      "python -m seed_jax.experiment --config=c.py:learn --seeds=0 --out=x")


def test_parallel_runs_start_each_run_after_the_runs_it_starts_from(tmp_path):
  jobs = plan(tmp_path, seeds=(0, 1, 2))
  finished, running, most = set(), set(), [0]
  lock = threading.Lock()
  fake = FakeTrainer()

  def runner(job):
    with lock:
      assert all(name in finished for name in job.after), job.name
      running.add(job.name)
      most[0] = max(most[0], len(running))
    threading.Event().wait(0.05)
    status = fake(job)
    with lock:
      running.discard(job.name)
      finished.add(job.name)
    return status

  outcome = run_jobs(jobs, runner, parallel=3, log=lambda _: None)
  assert outcome.complete and most[0] > 1


def test_the_warm_checkpoint_is_copied_before_the_first_start_only(tmp_path):
  warm = tmp_path / "warm" / "checkpoints" / "0"
  (warm / "state").mkdir(parents=True)
  (warm / "state" / "params").write_text("warm")
  job = Job("grpo/seed0", str(tmp_path / "arm"), (), 1, warm_checkpoint=str(warm))
  assert prepare_workdir(job)
  assert (tmp_path / "arm" / "checkpoints" / "0" / "state" / "params").read_text() == "warm"
  assert checkpoint_steps(job.workdir) == [0]
  (tmp_path / "arm" / "checkpoints" / "1").mkdir()  # the run went on, then stopped
  assert not prepare_workdir(job)


def test_a_library_arm_gets_stage_1s_annotations(tmp_path):
  (tmp_path / "stage1run" / "stage1").mkdir(parents=True)
  (tmp_path / "stage1run" / "stage1" / "library.json").write_text("{}")
  job = Job("skill_grpo/seed0", str(tmp_path / "arm"), (), 1,
            warm_stage1=str(tmp_path / "stage1run" / "stage1"))
  assert prepare_workdir(job) and (tmp_path / "arm" / "stage1" / "library.json").exists()
  assert not prepare_workdir(job)


def test_each_finished_run_gets_its_teacher_gap_once_while_its_weights_are_here(tmp_path):
  jobs = plan(tmp_path, arms=("grpo",), seeds=(0,))
  measured = []

  def measure(job):
    measured.append(job.name)
    (tmp_path / job.name / TEACHER_GAP_FILE).write_text("{}")
    return 0

  stop = threading.Event()
  dying = FakeTrainer(die_in="grpo/seed0", die_after=1)
  run_jobs(jobs, experiment.with_teacher_gap(dying, measure, stop), log=lambda _: None)
  assert measured == ["warm_start/seed0/bc"]  # the unfinished arm is not measured
  run_jobs(jobs, experiment.with_teacher_gap(FakeTrainer(), measure, stop),
           log=lambda _: None)
  assert measured == ["warm_start/seed0/bc", "grpo/seed0"]
  assert not any(needs_teacher_gap(job) for job in jobs)


def test_a_run_finished_without_its_teacher_gap_needs_one_only_while_its_checkpoint_is_here(
    tmp_path):
  jobs = plan(tmp_path, arms=("grpo",), seeds=(0,))
  run_jobs(jobs, FakeTrainer(), log=lambda _: None)
  assert all(needs_teacher_gap(job) for job in jobs)
  fresh_clone(jobs)  # a new machine: the records, no checkpoint
  assert not any(needs_teacher_gap(job) for job in jobs)


def test_a_stopped_experiment_measures_nothing_more(tmp_path):
  jobs = plan(tmp_path, arms=("grpo",), seeds=(0,))
  stop = threading.Event()
  stop.set()
  measured = []
  experiment.with_teacher_gap(FakeTrainer(), measured.append, stop)(jobs[0])
  assert is_finished(jobs[0]) and measured == []


def test_a_stop_reaches_the_running_run_as_the_sigterm_it_checkpoints_on(tmp_path):
  # A stand-in for seed_jax.main that, like the trainer, exits cleanly on SIGTERM.
  script = ("import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))\n"
            "print('run' + ' started', flush=True)\n"
            "time.sleep(60)\n")
  children, stop = set(), threading.Event()
  runner = experiment.subprocess_runner(lambda job: [sys.executable, "-c", script],
                                        str(tmp_path), False, dict(os.environ), children)
  status = {}
  thread = threading.Thread(
      target=lambda: status.update(rc=runner(Job("grpo/seed0", str(tmp_path), (), 1))))
  thread.start()
  log = tmp_path / "grpo_seed0.log"
  # Until the run is up (its SIGTERM handler set): a loaded 2-core machine has taken over
  # 30 s to start a Python; a SIGTERM before that kills it (rc -15) instead. The marker is
  # printed split in the script, so the log's echo of the command does not contain it.
  for _ in range(1200):
    if children and log.exists() and b"run started" in log.read_bytes():
      break
    threading.Event().wait(0.1)
  assert b"run started" in log.read_bytes(), "the stand-in run did not start in 120 s"
  experiment.stop_handler(children, stop)(experiment.signal.SIGINT, None)
  thread.join(30)
  assert stop.is_set() and status == {"rc": 7} and not children
  assert "grpo/seed0: exit 7" in log.read_text()


# ------------------------------------------------------------------ aggregation


def write_run(folder, train_success, eval_success=None, final=None, skills=None, fields=None,
              machines=(), weights=None, speeds=None):
  """A run folder as the trainer leaves it: metrics.jsonl, summary.json, analysis/;
  `fields`: more figures of every train record (the teacher gap, episodes, seconds);
  `machines` (CPU names, one per start), `speeds` ((matmul GFLOP/s, GB/s) per start, None
  where unmeasured; default: none measured) and `weights` ((first, final) fingerprints):
  provenance.json."""
  os.makedirs(folder, exist_ok=True)
  if machines:
    first, final_weights = weights or ("w0", "w1")
    speeds = speeds or [None] * len(machines)
    segments = [{"resumed_from": None if i == 0 else i, "initial_params": first,
                 "machine": {"cpu": cpu, "cores": 2, "devices": 1, "device_kind": "cpu",
                             **({"speed": {"matmul_gflops": speed[0], "stream_gbps": speed[1]}}
                                if speed else {})}}
                for i, (cpu, speed) in enumerate(zip(machines, speeds))]
    with open(os.path.join(folder, "provenance.json"), "w") as f:
      json.dump({"segments": segments, "final_params": final_weights}, f)
  records = [{"step": 0, "phase": "bc", "loss": 1.0}]
  records += [{"step": i + 1, "phase": "train", "success": s, "gate_mean": 0.5 + 0.01 * i,
               **(fields or {})} for i, s in enumerate(train_success)]
  records += [{"step": step, "phase": "eval", "valid_unseen/success": s}
              for step, s in (eval_success or {}).items()]
  with open(os.path.join(folder, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in records)
  if final is not None:
    with open(os.path.join(folder, "summary.json"), "w") as f:
      json.dump({"iterations": len(train_success), "valid_unseen/success": final}, f)
  for step, lines in (skills or {}).items():
    os.makedirs(os.path.join(folder, "analysis"), exist_ok=True)
    with open(os.path.join(folder, "analysis", f"iter_{step}.jsonl"), "w") as f:
      f.writelines(json.dumps(line) + "\n" for line in lines)


def test_task_objects_are_what_the_task_sentence_names_besides_its_verbs():
  assert run_results.task_objects("clean some apple and put it in fridge") == ["apple", "fridge"]
  assert run_results.task_objects("look at bowl under the desklamp") == ["bowl", "desklamp"]
  assert run_results.names_objects("Find the apples, rinse, put in the Fridge.",
                                   "clean some apple and put it in fridge")
  assert not run_results.names_objects("Go to the fridge first.",
                                       "clean some apple and put it in fridge")


def test_skill_quality_counts_parsed_skills_their_words_and_those_naming_the_objects():
  task = "put a mug on desk"
  quality = run_results.skill_quality([
      {"task": task, "skill": "take the mug to the desk"},        # 6 words, names both
      {"task": task, "skill": "always check every receptacle"},  # 4 words, names none
      {"task": task, "skill": None},
      {"task": task, "skill": None}])
  assert quality == {"parse_rate": 0.5, "skill_words": 5.0, "names_objects": 0.5}
  none = run_results.skill_quality([{"task": task, "skill": None}])
  assert none["parse_rate"] == 0.0 and np.isnan(none["skill_words"])


def test_the_results_page_gives_mean_and_std_over_seeds_and_the_curves(tmp_path):
  out = str(tmp_path)
  task = "put a mug on desk"
  write_run(f"{out}/seed/seed0", [0.25, 0.5], {2: 0.25}, final=0.25,
            skills={1: [{"task": task, "skill": "take the mug to the desk"}],
                    2: [{"task": task, "skill": None}]})
  write_run(f"{out}/seed/seed1", [0.25, 1.0], {2: 0.75}, final=0.75,
            skills={2: [{"task": task, "skill": "mug then desk"}]})
  write_run(f"{out}/grpo/seed0", [0.0, 0.0], {2: 0.0}, final=0.0)
  write_run(f"{out}/grpo/seed1", [0.5])  # interrupted: one iteration, no summary
  path = aggregate.write_results(out, ["seed", "grpo"], [0, 1], {"seed": "SEED"},
                                 command="python -m seed_jax.experiment --out=x")
  page = open(path).read()
  # 0.25 and 0.75: mean 0.5, sample std 0.354; grpo has one finished seed of two.
  assert "| seed | 2/2 | - | 0.500 ± 0.354 |" in page  # -: no warm start evaluated
  # The last iteration's training success is a final figure too: of the finished runs only
  # (grpo seed1's one iteration, 0.5, is on the curve below, not in this row).
  # One seed: its value, no spread (a sample std needs two).
  assert "| grpo | 1/2 | - | 0.000 (n=1) | 0.000 (n=1) |" in page
  # Training success per iteration: iteration 2 of seed is 0.5 and 1.0.
  assert "| 1 | 0.250 ± 0.000 | 0.250 ± 0.354 |" in page  # two seeds alike: std 0
  assert "| 2 | 0.750 ± 0.354 | 0.000 (n=1) |" in page
  # The skills of the last iteration: seed0 parsed none (no length to count), seed1 all,
  # in 3 words naming both objects.
  assert "| seed | 0.500 ± 0.707 | 3.000 (n=1) | 1.000 (n=1) |" in page
  assert "valid_seen" not in page  # no run evaluated it
  assert "python -m seed_jax.experiment --out=x" in page
  for name in ("success.png", "opd_gate.png", "skills.png"):
    assert f"![{name}]({name})" in page
    with open(os.path.join(out, name), "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_the_results_page_shows_the_teacher_gap_of_each_arm(tmp_path):
  out = str(tmp_path)
  skills = {1: [{"task": "put a mug on desk", "skill": "take the mug to the desk"}]}
  for seed, (action, rest) in enumerate([(0.25, -0.05), (0.75, -0.15)]):
    write_run(f"{out}/seed/seed{seed}", [0.5], skills=skills, fields={
        "gap_action_delta_mean": action, "gap_rest_delta_mean": rest,
        "gap_action_gate_above_0.6": 0.5, "gap_rest_gate_above_0.6": 0.02 * (seed + 1),
        "gap_rest_gate_below_0.4": 0.06, "gap_decision_delta_mean": -0.2 * (seed + 1),
        "gap_decision_gate_above_0.6": 0.25})
  write_run(f"{out}/grpo/seed0", [0.5], skills=skills)  # no teacher gap: joint mode, say
  path = aggregate.write_results(out, ["seed", "grpo"], [0, 1])
  page = open(path).read()
  assert ("| OPD gate mean | teacher gap, action block | teacher gap, rest | action tokens "
          "with gate > 0.6 | rest tokens with gate > 0.6 | rest tokens with gate < 0.4 |"
          in page)
  # Action block 0.25 and 0.75, rest -0.05 and -0.15; where a think block decides the
  # move, the rest's endorsed (0.02, 0.04) and opposed (0.06) shares and the decision's
  # shift (-0.2, -0.4) and shares (0.25 endorsed, opposed not recorded) show the teacher's
  # opinion; won / failed not recorded.
  assert ("| seed | 1.000 ± 0.000 | 6.000 ± 0.000 | 1.000 ± 0.000 | 0.500 ± 0.000 | "
          "0.500 ± 0.354 | -0.100 ± 0.071 | 0.500 ± 0.000 | 0.030 ± 0.014 | 0.060 ± 0.000 | "
          "-0.300 ± 0.141 | 0.250 ± 0.000 | - | - | - | - | - |") in page
  assert "| grpo | 1.000 (n=1) | 6.000 (n=1) | 1.000 (n=1) | 0.500 (n=1) | - |" in page
  assert "![teacher_gap.png](teacher_gap.png)" in page
  with open(os.path.join(out, "teacher_gap.png"), "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def teacher_gap_record(plain, oracle, wrong, empty=None, acting=None, own=None):
  """A teacher_gap.json: p(expert) per skill source (`own`: the policy's own skill);
  `acting`: success per source."""
  record = {"content_score": oracle - wrong}
  for source, p in (("plain", plain), ("oracle", oracle), ("wrong", wrong),
                    ("empty", empty), ("policy", own)):
    record[source] = {"p_expert": p, "success": (acting or {}).get(source),
                      "skills": 0 if source == "plain" or p is None else 16}
    if source != "plain":
      record[source]["decision_gap"] = None if p is None else p - plain
      if acting and source in acting:
        record[source]["acting_gap"] = acting[source] - acting["plain"]
  return record


def test_the_page_shows_the_teacher_gap_before_and_after_rl(tmp_path):
  out = str(tmp_path)
  for seed, (plain_start, plain_end) in enumerate([(0.5, 0.6), (0.25, 0.45)]):
    warm = f"{out}/warm_start/seed{seed}/bc"
    write_run(warm, [], {0: 0.25})
    with open(f"{warm}/{TEACHER_GAP_FILE}", "w") as f:
      json.dump(teacher_gap_record(plain_start, 1.0, 0.25, 0.5, acting={
          "plain": 0.5, "oracle": 1.0, "wrong": 0.125, "empty": 0.5}), f)
    write_run(f"{out}/grpo/seed{seed}", [0.5], final=0.5)
    with open(f"{out}/grpo/seed{seed}/{TEACHER_GAP_FILE}", "w") as f:
      json.dump(teacher_gap_record(plain_end, 1.0, 0.25), f)
  page = open(aggregate.write_results(out, ["grpo"], [0, 1], warm_starts={"grpo": BC})).read()
  assert "## Does the teacher know more than the student?" in page
  # The warm start per seed: plain / oracle / acting gap / wrong / empty / content.
  assert "| 0 | 0.500 | 1.000 | 0.500 | 0.125 | 0.500 | 0.750 |" in page
  # Per arm, warm start then after RL: plain p (0.375 -> 0.525), oracle p, decision gap
  # (0.625 -> 0.475), content score.
  # A policy that writes no skills has no own-skill figures.
  assert ("| grpo | 0.375 ± 0.177 | 0.525 ± 0.106 | 1.000 ± 0.000 | 1.000 ± 0.000 | "
          "0.625 ± 0.177 | 0.475 ± 0.106 | 0.750 ± 0.000 | 0.750 ± 0.000 | - | - | - | - |"
          ) in page


def test_the_page_shows_the_teacher_reading_the_policys_own_skill(tmp_path):
  out = str(tmp_path)
  stage1 = f"{out}/warm_start/seed0/stage1"
  write_run(stage1, [], {0: 0.25})
  with open(f"{stage1}/{TEACHER_GAP_FILE}", "w") as f:
    json.dump(teacher_gap_record(0.5, 1.0, 0.25, own=0.375), f)
  write_run(f"{out}/seed/seed0", [0.5], final=0.5)
  with open(f"{out}/seed/seed0/{TEACHER_GAP_FILE}", "w") as f:
    json.dump(teacher_gap_record(0.625, 1.0, 0.25, own=0.75), f)
  # A policy that wrote no skill (behaviour cloning) gets the plain figures as its "own
  # skill" from the tool: they measure nothing and are not shown.
  write_run(f"{out}/grpo/seed0", [0.5], final=0.5)
  with open(f"{out}/grpo/seed0/{TEACHER_GAP_FILE}", "w") as f:
    record = teacher_gap_record(0.625, 1.0, 0.25, own=0.625)
    json.dump({**record, "policy": {**record["policy"], "skills": 0}}, f)
  page = open(aggregate.write_results(out, ["seed", "grpo"], [0],
                                     warm_starts={"seed": STAGE1, "grpo": STAGE1})).read()
  # Own skill p(expert) 0.375 -> 0.750; its decision gap -0.125 (it misleads) -> +0.125.
  assert ("| 0.750 (n=1) | 0.750 (n=1) | 0.375 (n=1) | 0.750 (n=1) | "
          "-0.125 (n=1) | 0.125 (n=1) |") in page
  assert "| 0.750 (n=1) | 0.750 (n=1) | 0.375 (n=1) | - | -0.125 (n=1) | - |" in page


def test_the_page_pairs_what_rl_taught_the_plain_policy_of_the_expert_moves(tmp_path):
  # p(expert) on the held-out decisions, warm start -> final: seed 0.5 -> 0.7 and
  # 0.25 -> 0.5 (from stage 1), grpo 0.5 -> 0.6 and 0.25 -> 0.3 (from behaviour cloning).
  out = str(tmp_path)
  starts = {(0, BC): 0.5, (0, STAGE1): 0.5, (1, BC): 0.25, (1, STAGE1): 0.25}
  for (seed, kind), plain in starts.items():
    warm = f"{out}/warm_start/seed{seed}/{kind}"
    write_run(warm, [], {0: 0.25})
    with open(f"{warm}/{TEACHER_GAP_FILE}", "w") as f:
      json.dump(teacher_gap_record(plain, 1.0, 0.25), f)
  for arm, ends in (("seed", (0.7, 0.5)), ("grpo", (0.6, 0.3))):
    for seed, plain in enumerate(ends):
      write_run(f"{out}/{arm}/seed{seed}", [0.5], final=0.5)
      with open(f"{out}/{arm}/seed{seed}/{TEACHER_GAP_FILE}", "w") as f:
        json.dump(teacher_gap_record(plain, 1.0, 0.25), f)
  results = run_results.read_experiment(out, ["seed", "grpo"], [0, 1],
                                        {"seed": STAGE1, "grpo": BC})
  assert run_results.plain_p_expert_rise(results["seed"][1]) == pytest.approx(0.25)
  # Differences 0.1 and 0.2: mean 0.15, sd 0.0707, t(0.975, 1) = 12.706 (tables):
  # half-width 12.706 * 0.0707 / sqrt(2) = 0.635.
  assert ("| seed - grpo | plain p(expert) on the held-out expert decisions, rise over RL | "
          "2 | +0.150 | [-0.485, +0.785] | no |") in aggregate.results_markdown(results)
  no_records = run_results.read_experiment(out, ["seed"], [0])  # no warm start given
  assert run_results.plain_p_expert_rise(no_records["seed"][0]) is None


def test_a_page_without_teacher_gap_records_has_no_such_section(tmp_path):
  write_run(f"{tmp_path}/grpo/seed0", [0.5], final=0.5)
  page = open(aggregate.write_results(str(tmp_path), ["grpo"], [0])).read()
  assert "Does the teacher know more" not in page


def test_each_arm_starts_its_held_out_curve_from_the_evaluation_of_its_warm_start(tmp_path):
  out = str(tmp_path)
  for seed, (bc, stage1) in enumerate([(0.25, 0.5), (0.75, 0.5)]):
    write_run(f"{out}/warm_start/seed{seed}/bc", [], {0: bc})
    write_run(f"{out}/warm_start/seed{seed}/stage1", [], {0: stage1})
    write_run(f"{out}/seed/seed{seed}", [0.5], {1: 1.0}, final=1.0)
  write_run(f"{out}/grpo/seed0", [0.5])  # interrupted before its evaluation
  results = run_results.read_experiment(out, ["seed", "grpo"], [0, 1],
                                        {"seed": STAGE1, "grpo": BC})
  assert run_results.eval_curve(results["seed"]) == {0: [0.5, 0.5], 1: [1.0, 1.0]}
  assert run_results.eval_curve(results["grpo"]) == {0: [0.25, 0.75]}  # from BC, run or not
  assert run_results.final_success(results["grpo"][0]) is None  # the warm start's is not final
  page = aggregate.results_markdown(results)
  assert "| seed | 2/2 | 0.500 ± 0.000 | 1.000 ± 0.000 |" in page
  assert "| grpo | 0/2 | 0.500 ± 0.354 | - |" in page


def test_warm_starts_evaluate_the_checkpoint_the_arms_start_from(tmp_path):
  jobs = by_name(plan_jobs(str(tmp_path), [get_arm("seed"), get_arm("grpo")], [0],
                           iterations=2))
  for name in ("warm_start/seed0/bc", "warm_start/seed0/stage1"):
    assert dict(jobs[name].overrides)["eval.at_end"] is True
  assert "eval.at_end" not in dict(jobs["grpo/seed0"].overrides)


def test_a_figure_without_data_is_not_drawn(tmp_path):
  write_run(f"{tmp_path}/grpo/seed0", [0.0, 0.5], {2: 0.5}, final=0.5)
  images = aggregate.plot_experiment(run_results.read_experiment(str(tmp_path), ["grpo"], [0]),
                                     str(tmp_path))
  assert images == ["success.png", "opd_gate.png"]  # no analysis files: no skills.png


def test_the_curves_run_against_the_training_episodes_consumed(tmp_path):
  write_run(f"{tmp_path}/grpo/seed0", [0.0, 0.5, 0.5], {0: 0.25, 3: 0.5}, final=0.5,
            fields={"episodes": 16})
  run = run_results.read_experiment(str(tmp_path), ["grpo"], [0])["grpo"][0]
  assert run_results.episodes_consumed(run) == {0: 0, 1: 16, 2: 32, 3: 48}
  assert aggregate.episode_axis([run, run]) == {0: 0, 1: 16, 2: 32, 3: 48}


def test_run_figures_pool_episodes_and_integrate_the_held_out_curve(tmp_path):
  # Iterations of 16, 16, 32 and 32 episodes; held-out 0.25 at the warm start, 0.5 after
  # 64 episodes and 0.75 at the end (96).
  folder = f"{tmp_path}/seed/seed0"
  write_run(folder, [0.0, 0.5, 0.25, 1.0], {0: 0.25, 3: 0.5, 4: 0.75}, final=0.75)
  with open(os.path.join(folder, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f]
  for record, episodes in zip([r for r in records if r["phase"] == "train"],
                              [16, 16, 32, 32]):
    record.update(episodes=episodes, time_rollout_s=10.0, time_update_s=5.0,
                  gate_hist=[0.1, 0.0, 0.0, 0.1, 0.3, 0.2, 0.1, 0.0, 0.0, 0.2])
  with open(os.path.join(folder, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in records)
  run = run_results.read_run(folder, "seed", 0)
  # All episodes: (0*16 + 0.5*16 + 0.25*32 + 1*32) / 96 = 48 / 96.
  assert run_results.training_success_rate(run) == pytest.approx(0.5)
  assert run_results.training_success_rate(run, last=0.25) == 1.0  # the last iteration
  assert run_results.training_success_rate(run, last=0.5) == pytest.approx(0.625)
  assert run_results.training_success_rate(run, first=0.25) == 0.0  # the first iteration
  assert run_results.training_success_rate(run, first=0.5) == pytest.approx(0.25)  # 8 / 32
  # Trapezoids: 64 * (0.25 + 0.5) / 2 + 32 * (0.5 + 0.75) / 2 = 24 + 20 = 44, over 96.
  assert run_results.held_out_auc(run) == pytest.approx(44 / 96)
  # Two iterations pooled: none before the second; then (0*16 + 0.5*16) / 32,
  # (0.5*16 + 0.25*32) / 48 and (0.25*32 + 1*32) / 64.
  assert [run_results.windowed_training_success(run, step, window=2) for step in range(1, 5)
          ] == [None, pytest.approx(0.25), pytest.approx(1 / 3), pytest.approx(0.625)]
  assert run_results.windowed_train_curve([run, run], window=4) == {4: [0.5, 0.5]}
  assert run_results.rl_seconds(run) == 60.0
  # Bins centred outside [0.4, 0.6] hold 0.1 (at 0.05), 0.1 (0.35), 0.1 (0.65), 0.2 (0.95).
  assert run_results.gate_spread(run.train[1]) == pytest.approx(0.5)


def test_the_page_says_whether_each_arm_learns_within_its_runs(tmp_path):
  # 8 iterations, a quarter is 2: seed 0 rises from 0.25 to 0.75, seed 1 from 0.5 to 0.5;
  # held-out 0.25 -> 0.5 and 0.5 -> 0.25. Seed 2 has not finished: not counted.
  write_run(f"{tmp_path}/grpo/seed0", [0.0, 0.5, 1, 1, 1, 1, 0.5, 1.0], {0: 0.25, 8: 0.5},
            final=0.5)
  write_run(f"{tmp_path}/grpo/seed1", [0.5, 0.5, 0, 0, 0, 0, 0.25, 0.75], {0: 0.5, 8: 0.25},
            final=0.25)
  write_run(f"{tmp_path}/grpo/seed2", [1.0, 1.0], {0: 1.0})
  page = aggregate.results_markdown(run_results.read_experiment(str(tmp_path), ["grpo"],
                                                                [0, 1, 2]))
  # Rises 0.5 and 0 (mean 0.25, sd 0.354); held-out +0.25 and -0.25 (sd 0.354).
  assert ("| grpo | 2 | 0.375 ± 0.177 | 0.625 ± 0.177 | 0.250 ± 0.354 | 0.375 ± 0.177 | "
          "0.375 ± 0.177 | 0.000 ± 0.354 |") in page


def test_the_page_lists_every_finished_run_with_the_figures_its_means_come_from(tmp_path):
  # 4 iterations of 16 episodes, a quarter is one: seed 0 trains 0.25, 0.5, 0.5, 0.75
  # (area 2 / 4 = 0.5); held-out 0.25 at the warm start, 0.5 after iteration 2, 0.75 at
  # the end: trapezoids 32 * 0.375 + 32 * 0.625 = 32, over 64 episodes. Seed 1 has not
  # finished: no row.
  fields = {"episodes": 16, "time_rollout_s": 10.0, "time_update_s": 5.5,
            "gate_hist": [0.25, 0.5, 0.25]}  # centres 1/6, 1/2, 5/6: 0.5 outside [0.4, 0.6]
  write_run(f"{tmp_path}/seed/seed0", [0.25, 0.5, 0.5, 0.75], {0: 0.25, 2: 0.5, 4: 0.75},
            final=0.75, fields=fields)
  write_run(f"{tmp_path}/seed/seed1", [0.5], {0: 0.5}, fields=fields)
  gap = {"plain": {"p_expert": 0.6, "skills": 0},
         "oracle": {"p_expert": 0.9, "skills": 32, "decision_gap": 0.3},
         "policy": {"p_expert": 0.5, "skills": 32, "decision_gap": -0.1}}
  with open(f"{tmp_path}/seed/seed0/{TEACHER_GAP_FILE}", "w") as f:
    json.dump(gap, f)
  page = aggregate.results_markdown(run_results.read_experiment(str(tmp_path), ["seed"], [0, 1]))
  section = page.split("## Each run", 1)[1].split("\n## ", 1)[0]
  rows = [line for line in section.splitlines() if line.startswith("| seed | ")]
  assert rows == ["| seed | 0 | 0.250 | 0.750 | 0.500 | 0.250 | 0.750 | 0.500 | - | 0.600 | "
                  "0.300 | -0.100 | 0.500 | 62 |"]


def test_the_page_compares_each_recurring_task_with_itself(tmp_path):
  def draw(folder, iteration, task, outcomes):
    os.makedirs(f"{folder}/episodes", exist_ok=True)
    with open(f"{folder}/episodes/iter_{iteration}.jsonl", "a") as f:
      f.writelines(json.dumps({"iteration": iteration, "task_id": task, "won": bool(w)}) + "\n"
                   for w in outcomes)
  for seed in (0, 1):
    write_run(f"{tmp_path}/grpo/seed{seed}", [0.5, 0.5, 0.5], {0: 0.5}, final=0.5)
  assert "against itself" not in aggregate.results_markdown(
      run_results.read_experiment(str(tmp_path), ["grpo"], [0, 1]))  # runs without the records
  # seed 0: task a 0/2 -> 1/2 (rise 0.5, lost at first); seed 1: a 1/2 -> 1/2, b 1/2 -> 1/2
  # -> 2/2 (later 0.75; rises 0 and 0.25, mean 0.125 over its two tasks).
  draw(f"{tmp_path}/grpo/seed0", 1, "a", [0, 0])
  draw(f"{tmp_path}/grpo/seed0", 3, "a", [1, 0])
  draw(f"{tmp_path}/grpo/seed1", 1, "a", [1, 0])
  draw(f"{tmp_path}/grpo/seed1", 1, "b", [0, 1])
  draw(f"{tmp_path}/grpo/seed1", 2, "b", [1, 0])
  draw(f"{tmp_path}/grpo/seed1", 3, "b", [1, 1])
  draw(f"{tmp_path}/grpo/seed1", 3, "a", [0, 1])
  page = aggregate.results_markdown(run_results.read_experiment(str(tmp_path), ["grpo"], [0, 1]))
  # tasks 1 and 2; first 0 and 0.5; later 0.5 and 0.625; rise 0.5 and 0.125 (sd 0.265);
  # lost at first 1 and 0 (later 0.5 in seed 0; seed 1 has none: left out).
  assert ("| grpo | 2 | 1.5 ± 0.7 | 0.250 ± 0.354 | 0.562 ± 0.088 | 0.312 ± 0.265 | 0.5 ± 0.7 | "
          "0.500 (n=1) |") in page


def test_the_page_counts_moves_that_changed_nothing_from_the_raw_step_counts(tmp_path):
  folder = f"{tmp_path}/grpo/seed0"
  write_run(folder, [0.0, 0.5, 0.5, 1.0], {0: 0.25}, final=0.5)
  assert "Moves that changed nothing" not in aggregate.results_markdown(
      run_results.read_experiment(str(tmp_path), ["grpo"], [0]))  # runs before the metric
  with open(os.path.join(folder, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f]
  # per iteration: steps taken and the valid ones that changed nothing
  for record, (steps, blocked) in zip([r for r in records if r["phase"] == "train"],
                                      [(20, 6), (40, 20), (12, 3), (10, 1)]):
    record.update(steps=steps, ineffective_actions=blocked,
                  ineffective_action_rate=blocked / steps)
  records[-1]["valid_unseen/ineffective_action_rate"] = 0.5  # the warm start's evaluation
  with open(os.path.join(folder, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in records)
  with open(os.path.join(folder, "summary.json")) as f:
    summary = json.load(f)
  with open(os.path.join(folder, "summary.json"), "w") as f:
    json.dump({**summary, "valid_unseen/ineffective_action_rate": 0.2}, f)
  run = run_results.read_run(folder, "grpo", 0)
  assert run_results.training_ineffective_rate(run, first=0.5) == pytest.approx(26 / 60)
  assert run_results.training_ineffective_rate(run, last=0.5) == pytest.approx(4 / 22)
  page = aggregate.results_markdown(run_results.read_experiment(str(tmp_path), ["grpo"], [0]))
  assert "## Moves that changed nothing" in page
  # a quarter of 4 iterations is the first (6 / 20) and the last (1 / 10)
  assert "| grpo | 1 | 0.300 (n=1) | 0.100 (n=1) | 0.500 (n=1) | 0.200 (n=1) |" in page


def test_the_page_pairs_each_arm_with_grpo_by_seed(tmp_path):
  out = str(tmp_path)
  for seed, (seed_final, grpo_final) in enumerate([(0.5, 0.25), (0.75, 0.5), (0.5, 0.5)]):
    write_run(f"{out}/seed/seed{seed}", [0.5], {1: seed_final}, final=seed_final,
              fields={"episodes": 16, "time_rollout_s": 30.0 + 100 * (seed == 2),
                      "time_analysis_s": 6.0,
                      "gap_action_delta_mean": 0.5 + seed, "gap_rest_delta_mean": -seed,
                      **({"gap_decision_delta_mean": -0.5} if seed else {}),
                      "gate_hist": [0.5, 0.5]},
              machines=["Slow CPU" if seed == 2 else "Fast CPU"])  # seed 2: not comparable
    write_run(f"{out}/grpo/seed{seed}", [0.25], {1: grpo_final}, final=grpo_final,
              fields={"episodes": 16, "time_rollout_s": 24.0,
                      "batch_zero_advantage_groups": 1, "update_empty": 3},
              machines=["Fast CPU"])
  write_run(f"{out}/no_opd/seed0", [0.25], {1: 0.5}, final=0.5)  # one seed finished
  # The runner's log lines: seed 1 of seed shared its cores (0.9 CPU s a wall s against
  # grpo's 1.8), seed 0 ran alone over two starts ((20 + 160) / (10 + 90) = 1.8).
  os.makedirs(f"{out}/logs")
  logs = {"seed_seed0": ["[experiment] seed/seed0: exit 0, 10 s wall, 20 s CPU",
                         "[experiment] seed/seed0 teacher gap: exit 0, 50 s wall, 5 s CPU",
                         "[experiment] seed/seed0: exit 0, 90 s wall, 160 s CPU"],
          "seed_seed1": ["[experiment] seed/seed1: exit 0, 100 s wall, 90 s CPU"],
          **{f"grpo_seed{k}": [f"[experiment] grpo/seed{k}: exit 0, 100 s wall, 180 s CPU"]
             for k in range(3)}}
  for name, lines in logs.items():
    with open(f"{out}/logs/{name}.log", "w") as f:
      f.write("some output\n" + "\n".join(lines) + "\n")
  page = aggregate.results_markdown(
      run_results.read_experiment(out, ["seed", "grpo", "no_opd"], [0, 1, 2]))
  # Differences 0.25, 0.25, 0: mean 1/6, sd 0.1443; t(0.975, 2) = 4.3027 (tables):
  # half-width 4.3027 * 0.1443 / sqrt(3) = 0.3586.
  assert "| seed - grpo | final valid_unseen success | 3 | +0.167 | [-0.192, +0.525] | no |" \
      in page
  assert "| seed - grpo | training success, area under the curve | 3 | +0.250 | " \
      "[+0.250, +0.250] | yes (every seed the same difference: no spread) |" in page
  assert "| no_opd - grpo | final valid_unseen success | 1 | +0.250 | - | - |" in page
  # 36 s against 24 s on the same machine; seed 1 shared its cores (0.9 < 0.8 x 1.8) and
  # seed 2's 136 s ran on another machine: neither is a pair.
  assert "| seed | 69 ± 58 | 1.35 ± 0.64 | 1.50 (n=1) | 1 |" in page
  assert "| grpo | 24 ± 0 | 1.80 ± 0.00 | 1.00 ± 0.00 | 3 |" in page
  assert "| no_opd | 0 (n=1) | - | - | 0 |" in page  # no provenance.json: never paired
  assert cpu_per_wall(f"{out}/logs/none.log", "x/seed0") is None
  # 1 group an iteration, 3 steps a run skipped; no config.json: the steps taken unknown.
  assert "| grpo | 1.00 ± 0.00 | 3.0 ± 0.0 | - |" in page
  # The teacher: the gap of the only iteration is first and last (action block 0.5, 1.5,
  # 2.5; the rest 0, -1, -2; the decision -0.5 where recorded, seeds 1 and 2); both gate
  # bins lie outside [0.4, 0.6].
  assert ("| seed | 1.500 ± 1.000 | 1.500 ± 1.000 | -1.000 ± 1.000 | -1.000 ± 1.000 | "
          "-0.500 ± 0.000 | -0.500 ± 0.000 | 1.000 ± 0.000 | 1.000 ± 0.000 |") in page


def test_the_page_pairs_each_arm_with_an_opd_term_with_no_opd_the_term_alone(tmp_path):
  out = str(tmp_path)
  finals = {"no_opd": (0.25, 0.5), "seed_oracle": (0.5, 1.0), "seed": (0.25, 0.25),
            "grpo": (0.5, 0.5)}
  for arm, by_seed in finals.items():
    for seed, final in enumerate(by_seed):
      write_run(f"{out}/{arm}/seed{seed}", [0.5], {1: final}, final=final)
  page = aggregate.results_markdown(
      run_results.read_experiment(out, list(finals), [0, 1]))
  opd_section = page.split("## What the OPD term does")[1].split("\n## ")[0]
  # Differences from no_opd: seed_oracle 0.25 and 0.5 (mean 0.375, sd 0.1768; t(0.975, 1)
  # = 12.706: half-width 12.706 * 0.1768 / sqrt(2) = 1.588); seed 0 and -0.25.
  assert ("| seed_oracle - no_opd | final valid_unseen success | 2 | +0.375 | "
          "[-1.213, +1.963] | no |") in opd_section
  assert ("| seed - no_opd | final valid_unseen success | 2 | -0.125 | [-1.713, +1.463] | "
          "no |") in opd_section
  # Only the arms with an OPD term: grpo and no_opd itself are not differenced here.
  assert "grpo -" not in opd_section and "no_opd - no_opd" not in opd_section
  assert "| no_opd - grpo | final valid_unseen success |" in page  # the grpo pairing stays


def test_a_page_without_no_opd_has_no_opd_term_pairing(tmp_path):
  out = str(tmp_path)
  for arm in ("seed", "grpo"):
    write_run(f"{out}/{arm}/seed0", [0.5], {1: 0.5}, final=0.5)
  page = aggregate.results_markdown(run_results.read_experiment(out, ["seed", "grpo"], [0]))
  assert "## What the OPD term does" not in page


def test_the_page_counts_the_optimizer_steps_each_run_took(tmp_path):
  """Mini-batches are the batch's rows with their padding over `rl.mini_batch_size`; a
  step is taken on each but those without signal and those skipped as non-finite."""
  # Per iteration 28 + 4 rows in mini-batches of 16 (2), 1 empty: 1 step, 1 step.
  write_run(f"{tmp_path}/grpo/seed0", [0.5, 0.5], final=0.5,
            fields={"batch_rows": 28, "batch_padding_rows": 4, "update_empty": 1})
  # 44 + 4 rows (3 mini-batches), none empty; the second iteration's record (written again
  # on a resume: the last one counts) has one step skipped as non-finite: 3 + 2 steps.
  write_run(f"{tmp_path}/grpo/seed1", [0.5, 0.5], final=0.5,
            fields={"batch_rows": 44, "batch_padding_rows": 4})
  with open(f"{tmp_path}/grpo/seed1/metrics.jsonl", "a") as f:
    f.write(json.dumps({"step": 2, "phase": "train", "success": 0.5, "batch_rows": 44,
                        "batch_padding_rows": 4, "update_skipped": 1}) + "\n")
  for seed in (0, 1):
    with open(f"{tmp_path}/grpo/seed{seed}/config.json", "w") as f:
      json.dump({"rl": {"mini_batch_size": 16}}, f)
  page = aggregate.results_markdown(run_results.read_experiment(str(tmp_path), ["grpo"],
                                                                [0, 1]))
  # Skipped 2 and 0 (mean 1, sd 1.41); 2 and 5 steps taken (mean 3.5, sd 2.12).
  assert "| grpo | 0.00 ± 0.00 | 1.0 ± 1.4 | 3.5 ± 2.1 |" in page


def test_wall_times_pair_only_on_machines_of_alike_measured_speed(tmp_path):
  """One CPU name has covered machines 2x apart: where the runs measured their machine,
  a ratio needs speeds within machine_speed.ALIKE_SHARE; runs from before the measurement
  pair on the name alone; one measured and one not do not pair."""
  out = str(tmp_path)
  speeds = {0: ((360.0, 24.0), (350.0, 23.0)),  # alike: paired
            1: ((360.0, 24.0), (180.0, 24.0)),  # the matmul half as fast: not paired
            2: ((360.0, 24.0), (360.0, 12.0)),  # the memory half as fast: not paired
            3: (None, None),                    # neither measured: paired by name
            4: ((360.0, 24.0), None)}           # one measured: not paired
  for seed, (seed_speed, grpo_speed) in speeds.items():
    write_run(f"{out}/seed/seed{seed}", [0.5], {1: 0.5}, final=0.5,
              fields={"time_rollout_s": 30.0}, machines=["AMD EPYC"], speeds=[seed_speed])
    write_run(f"{out}/grpo/seed{seed}", [0.5], {1: 0.5}, final=0.5,
              fields={"time_rollout_s": 20.0}, machines=["AMD EPYC"], speeds=[grpo_speed])
  # Seed 5: each of grpo's two starts is alike to seed's (260 and 500 against 360, both
  # within 0.7), but not to each other (260 < 0.7 x 500): not paired.
  write_run(f"{out}/seed/seed5", [0.5], {1: 0.5}, final=0.5, fields={"time_rollout_s": 30.0},
            machines=["AMD EPYC"], speeds=[(360.0, 24.0)])
  write_run(f"{out}/grpo/seed5", [0.5], {1: 0.5}, final=0.5, fields={"time_rollout_s": 20.0},
            machines=["AMD EPYC", "AMD EPYC"], speeds=[(260.0, 24.0), (500.0, 24.0)])
  page = aggregate.results_markdown(
      run_results.read_experiment(out, ["seed", "grpo"], [*speeds, 5]))
  assert "| seed | 30 ± 0 | - | 1.50 ± 0.00 | 2 |" in page  # seeds 0 and 3
  assert "| seed/seed0 | AMD EPYC x2 / 1 cpu | 360 GFLOP/s, 24.0 GB/s |" in page
  assert "| grpo/seed4 | AMD EPYC x2 / 1 cpu | - |" in page


def test_the_page_tells_where_each_run_ran_and_which_warm_start_it_started_from(tmp_path):
  out = str(tmp_path)
  write_run(f"{out}/warm_start/seed0/bc", [], {0: 0.5}, machines=["Fast CPU"],
            weights=("base", "bc0"), speeds=[(360.0, 24.0)])
  write_run(f"{out}/warm_start/seed0/stage1", [], {0: 0.5}, machines=["Slow CPU"],
            weights=("bc0", "s1"))
  # Stage 1 as computed before, on another machine, then superseded (jobs.supersede).
  write_run(f"{out}/warm_start/seed0/stage1/superseded/0", [], {0: 0.25},
            machines=["Fast CPU"], weights=("bc-earlier", "s1-earlier"))
  write_run(f"{out}/grpo/seed0", [0.5], final=0.5, machines=["Fast CPU"],
            weights=("bc0", "g"))
  # Started from the earlier stage 1, stopped, resumed on the slow machine:
  write_run(f"{out}/seed/seed0", [0.5], final=0.5, machines=["Fast CPU", "Slow CPU"],
            weights=("s1-earlier", "s"), speeds=[(360.0, 24.0), (180.0, 12.0)])
  write_run(f"{out}/seed_oracle/seed0", [0.5], final=0.5, machines=["Fast CPU"],
            weights=("s1-unknown", "o"))
  write_run(f"{out}/no_opd/seed0", [0.5], final=0.5)  # from before the record
  arms = {"grpo": BC, "seed": STAGE1, "seed_oracle": STAGE1, "no_opd": STAGE1}
  page = open(aggregate.write_results(out, list(arms), [0], warm_starts=arms)).read()
  fast, slow = "Fast CPU x2 / 1 cpu", "Slow CPU x2 / 1 cpu"
  assert "## Where the runs ran" in page
  # Each start's measured speed; `-` where a start did not measure it.
  assert f"| warm_start/seed0/bc | {fast} | 360 GFLOP/s, 24.0 GB/s | - |" in page
  assert f"| warm_start/seed0/stage1 | {slow} | - | yes |" in page
  assert f"| grpo/seed0 | {fast} | - | yes |" in page
  assert (f"| seed/seed0 | {fast}; {slow} | 360 GFLOP/s, 24.0 GB/s; 180 GFLOP/s, 12.0 GB/s | "
          "yes (an earlier computation: superseded/0) |" in page)
  assert f"| seed_oracle/seed0 | {fast} | - | **no** |" in page
  assert "| no_opd/seed0 | not recorded | not recorded | not recorded |" in page
  # Each held-out curve starts from the warm start the run started from.
  assert "| seed | 1/1 | 0.250 (n=1) |" in page
  assert "| seed_oracle | 1/1 | 0.500 (n=1) |" in page  # unknown: the current one


# ------------------------------------------------------------------ a real experiment


def saved_params(step_folder):
  import jax  # pylint: disable=import-outside-toplevel
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
  state = ocp.PyTreeCheckpointer().restore(os.path.join(step_folder, "state"))
  return [np.asarray(x) for x in jax.tree.leaves(state["train"]["params"])]


def same(a, b):
  return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Sharding info not provided")  # saved_params: raw arrays
def test_two_arms_start_rl_from_the_shared_warm_start(tiny_model, tmp_path):  # noqa: F811
  out = tmp_path / "exp"
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split()
                              if "device_count" not in f)  # one device: quicker compiles
  command = [sys.executable, "-m", "seed_jax.experiment", "--config=configs/sokoban.py:cpu",
             "--algorithms=seed,grpo", "--seeds=0", f"--out={out}",
             f"--config.model.name={tiny_model}", "--config.rl.iterations=1",
             "--config.rollout.max_new_tokens=16", "--config.rollout.max_prompt_tokens=512",
             "--config.analyzer.max_new_tokens=16", "--config.env.max_steps=3",
             "--config.bc.episodes=2", "--config.sft.tasks_per_type=1",
             "--config.eval.max_episodes=1", "--config.eval.splits=('valid_seen',)",
             "--config.log.tensorboard=False", "--config.log.plots=False",
             "--config.checkpoint.export_hf=False"]
  done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                        timeout=900, check=False)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  bc = saved_params(out / "warm_start/seed0/bc/checkpoints/0")
  stage1 = saved_params(out / "warm_start/seed0/stage1/checkpoints/0")
  assert not same(bc, stage1)  # stage 1 trained: the two warm starts differ
  for arm, warm in (("seed", stage1), ("grpo", bc)):
    run = out / arm / "seed0"
    assert same(saved_params(run / "checkpoints/0"), warm), arm
    assert not same(saved_params(run / "checkpoints/1"), warm), arm  # RL trained it
    phases = {json.loads(line)["phase"] for line in open(run / "metrics.jsonl")}
    assert phases == {"train", "eval"}, arm  # no BC or stage 1 of its own: it resumed
    config = json.load(open(run / "config.json"))
    assert config["algorithm"] == arm and config["seed"] == 0
    assert json.load(open(run / "summary.json"))["iterations"] == 1
  assert "Resumed from checkpoint 0" in open(out / "logs" / "seed_seed0.log").read()
  # Each arm records that it started from its warm start's final weights, bitwise.
  for arm, warm in (("seed", "stage1"), ("grpo", "bc")):
    origin = json.load(open(out / arm / "seed0" / "provenance.json"))
    final = json.load(open(out / "warm_start" / "seed0" / warm / "provenance.json"))
    assert origin["segments"][0]["initial_params"] == final["final_params"], arm
  assert "| seed | 1/1 |" in open(out / "results.md").read()
  # Run again: everything is finished, nothing runs.
  again = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=300, check=False)
  assert again.returncode == 0 and "4 runs already finished, 0 finished now" in again.stdout
