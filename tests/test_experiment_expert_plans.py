"""The policy's skills read against the expert's plans (seed_jax/experiments/expert_plans.py):
the numbered steps of a skill, their agreement with the plan, the plans played from a run's
own env settings, and the experiment page's table of them."""

import json
import os
import threading

import pytest

from seed_jax import experiment
from seed_jax.envs import sokoban
from seed_jax.envs.sokoban import generator
from seed_jax.experiments import aggregate, expert_plans, run_results
from seed_jax.seed.analyzer import oracle_skill
from seed_jax.experiments.jobs import needs_expert_plans, run_jobs
from tests.test_experiment import FakeTrainer, plan, write_run

ALFWORLD_PLAN = ["go to desk 1", "take mug 1 from desk 1", "go to shelf 2", "put mug 1 in/on shelf 2"]


@pytest.mark.parametrize("won", [True, False])
def test_the_numbered_steps_of_the_oracle_skill_are_the_plan_it_was_written_from(won):
  info = {"goal": "put a mug in shelf", "task_type": "pick_and_place", "expert_plan": ALFWORLD_PLAN}
  assert expert_plans.plan_steps(oracle_skill(info, won)[1]) == ALFWORLD_PLAN


def test_a_skill_without_numbered_steps_has_no_plan():
  assert expert_plans.plan_steps("Push the box towards the target, avoid corners.") == []
  assert expert_plans.plan_steps("") == []


def test_a_plan_agrees_in_its_first_step_in_all_its_steps_or_repeats_one_action():
  plan = ["left", "down", "left", "up"]
  agree = expert_plans.plan_agreement
  assert agree("step 1: left, step 2: down, step 3: left, step 4: up.", plan) == {
      "first_step_right": True, "plan_right": True, "one_action_repeated": False}
  # the right start, one step short: not the plan
  assert agree("order: step 1: Left, step 2: down, step 3: left; check each", plan) == {
      "first_step_right": True, "plan_right": False, "one_action_repeated": False}
  assert agree("step 1: left, step 2: left, step 3: left, step 4: left.", plan) == {
      "first_step_right": True, "plan_right": False, "one_action_repeated": True}
  assert agree("step 1: up.", plan) == {
      "first_step_right": False, "plan_right": False, "one_action_repeated": False}
  assert agree("no steps here", plan)["first_step_right"] is False


def test_skill_quality_counts_the_skills_whose_task_has_a_plan():
  plans = {"t1": ["left", "up"], "t2": ["down", "down"]}
  records = [
      {"task_id": "t1", "skill": "step 1: left, step 2: up."},      # right
      {"task_id": "t1", "skill": "step 1: up, step 2: up."},        # wrong start, repeated
      {"task_id": "t2", "skill": "step 1: down, step 2: right."},   # right start only
      {"task_id": "t3", "skill": "step 1: down."},                  # no plan: not counted
      {"task_id": "t2", "skill": None}]                              # no skill: not counted
  quality = run_results.skill_quality(records, plans)
  assert quality["first_step_right"] == pytest.approx(2 / 3)
  assert quality["plan_right"] == pytest.approx(1 / 3)
  assert quality["one_action_repeated"] == pytest.approx(1 / 3)
  assert "plan_right" not in run_results.skill_quality(records)  # no plans, no figure


def _sokoban_run(folder, task_ids):
  settings = sokoban.default_config()
  settings.num_tasks.train = 6
  settings.name = "sokoban"
  os.makedirs(os.path.join(folder, "analysis"), exist_ok=True)
  with open(os.path.join(folder, "config.json"), "w") as f:
    json.dump({"seed": 3, "env": settings.to_dict()}, f)
  with open(os.path.join(folder, "analysis", "iter_1.jsonl"), "w") as f:
    f.writelines(json.dumps({"iteration": 1, "task_id": t, "skill": None}) + "\n"
                 for t in task_ids)
  return settings


def test_the_expert_plans_of_a_run_solve_the_boards_it_analysed(tmp_path):
  tasks = [t.task_id for t in sokoban.load_tasks(_sokoban_run(tmp_path, []), "train")]
  settings = _sokoban_run(tmp_path, [tasks[4], tasks[1], tasks[4]])
  path = expert_plans.write_expert_plans(str(tmp_path))
  plans = json.load(open(path))
  assert sorted(plans) == sorted({tasks[1], tasks[4]})
  payloads = {t.task_id: t.payload for t in sokoban.load_tasks(settings, "train")}
  for task_id, plan in plans.items():
    board = generator.generate(payloads[task_id]["seed"],
                               max_solution_steps=settings.max_solution_steps,
                               min_solution_steps=settings.min_solution_steps)[0]
    assert plan and not board.solved
    for move in plan:  # replayed on the board itself, not through the expert
      board = board.push(move)
    assert board.solved
  assert expert_plans.read_expert_plans(str(tmp_path)) == plans


def test_a_folder_without_a_config_or_analysis_is_named_in_the_error(tmp_path):
  with pytest.raises(ValueError, match="no config.json"):
    expert_plans.write_expert_plans(str(tmp_path))
  _sokoban_run(tmp_path, [])
  with pytest.raises(ValueError, match="no analysis records"):
    expert_plans.write_expert_plans(str(tmp_path))


def test_the_page_reads_the_plans_at_the_first_and_last_iteration(tmp_path):
  out = str(tmp_path)
  skills = {1: [{"task_id": "t1", "task": "push", "skill": "step 1: left, step 2: up."}],
            2: [{"task_id": "t1", "task": "push", "skill": "step 1: up, step 2: up."}]}
  write_run(f"{out}/seed/seed0", [0.25, 0.5], {2: 0.25}, final=0.25, skills=skills)
  write_run(f"{out}/seed/seed1", [0.25, 0.5], {2: 0.25}, final=0.25, skills=skills)
  with open(f"{out}/seed/seed0/{expert_plans.EXPERT_PLANS_FILE}", "w") as f:
    json.dump({"t1": ["left", "up"]}, f)
  results = {"seed": [run_results.read_run(f"{out}/seed/seed{s}", "seed", s) for s in (0, 1)]}
  lines = aggregate.plan_lines(results)
  assert lines[1] == "## The skills' plans against the expert's"
  # one run of two has plans: first step right 1 -> 0, plan right 1 -> 0, repeated 0 -> 1
  assert lines[-1] == ("| seed | 1 | 1.000 (n=1) | 0.000 (n=1) | 1.000 (n=1) | 0.000 (n=1) "
                       "| 0.000 (n=1) | 1.000 (n=1) |")
  no_plans = {"seed": results["seed"][1:]}
  assert aggregate.plan_lines(no_plans) == []


def test_the_runner_writes_the_plans_of_finished_runs_whose_policy_wrote_skills(tmp_path):
  jobs = {job.name: job for job in plan(tmp_path, arms=("seed", "seed_oracle", "grpo"),
                                        seeds=(0,))}
  run_jobs(list(jobs.values()), FakeTrainer(die_in="seed/seed0", die_after=1),
           log=lambda _: None)
  assert not needs_expert_plans(jobs["seed/seed0"])  # not finished
  run_jobs(list(jobs.values()), FakeTrainer(), log=lambda _: None)
  assert [n for n, job in jobs.items() if needs_expert_plans(job)] == ["seed/seed0"]
  tasks = [t.task_id for t in sokoban.load_tasks(_sokoban_run(tmp_path / "seed/seed0", []),
                                                 "train")]
  _sokoban_run(tmp_path / "seed/seed0", tasks[:2])
  experiment.write_expert_plans(list(jobs.values()), threading.Event())
  assert sorted(expert_plans.read_expert_plans(jobs["seed/seed0"].workdir)) == tasks[:2]
  assert not any(needs_expert_plans(job) for job in jobs.values())
