"""Evaluating a saved checkpoint without training (`python -m seed_jax.evaluate`): the run's
own evaluation, of the step asked for, with the run's skills, into RUN/eval/step_N/ and
leaving the run's files alone; a mistake fails in one line before anything is loaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import ml_collections
import numpy as np
import pytest

from configs import run as run_config
from seed_jax.metrics import read_metrics
from seed_jax.models import export_hf, load_model, random_model
from seed_jax.train.evaluate import checkpoint_eval_config, eval_folder, evaluate_checkpoint
from seed_jax.train.spec import build_run_spec
from seed_jax.train.trainer import Trainer
from tests.test_cli import command, one_line_usage_error
# tiny_model: the trainer tests' fixture (tests/train/conftest.py), used here by name.
from tests.train.conftest import tiny_model, tiny_spec  # pylint: disable=unused-import
from tests.train.test_init_from import (_trained_lora_run, folder_params, same_params,
                                        saved_params)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TASK_TYPE = "sokoban_6x6_1box"  # the one task type of configs/sokoban.py
LIBRARY = {TASK_TYPE: "Push the box toward the goal, never into a corner it cannot leave."}


def write_library(folder) -> str:
  path = os.path.join(folder, "library.json")
  with open(path, "w") as f:
    json.dump(LIBRARY, f)
  return path


# ------------------------------------------------------------------ command-line mistakes


@pytest.fixture(scope="module")
def fake_run(tmp_path_factory) -> str:
  """A run folder as far as the command line reads it before loading anything: its
  config.json and two committed checkpoint folders (0 and 3)."""
  from configs import sokoban  # pylint: disable=import-outside-toplevel
  folder = tmp_path_factory.mktemp("fake_run")
  (folder / "config.json").write_text(sokoban.get_config("cpu").to_json_best_effort(indent=2))
  for step in (0, 3):
    (folder / "checkpoints" / str(step) / "state").mkdir(parents=True)
  return str(folder)


@pytest.mark.parametrize("args,line", [
    ([], "--workdir is required"),
    (["--workdir=/no/such/run"], "--workdir=/no/such/run: no such folder"),
    (["--workdir={run}/checkpoints"], "--workdir={run}/checkpoints: not a run folder "
                                      "(it has no config.json)"),
    (["--workdir={run}", "--step=5"], "--step=5: no such checkpoint in {run}/checkpoints; "
                                      "saved steps: 0, 3"),
    (["--workdir={run}", "--splits=valid_seen,test"],
     "--splits=valid_seen,test: unknown split 'test'; choose among train, valid_seen, "
     "valid_unseen"),
    (["--workdir={run}", "--config.eval.temprature=0"],
     "config.eval.temprature: no such key; did you mean config.eval.temperature?"),
    (["--workdir={run}", "--config.eval.temperature=-1"],
     "config.eval.temperature: a non-negative number, got -1.0"),
])
def test_a_mistake_fails_in_one_line_naming_it(fake_run, args, line):
  result = command("seed_jax.evaluate", *[a.format(run=fake_run) for a in args])
  assert one_line_usage_error(result) == line.format(run=fake_run)
  assert not os.path.exists(os.path.join(fake_run, "eval"))


def test_a_run_whose_library_file_is_gone_can_still_be_evaluated(fake_run):
  # The spec checks analyzer.static_library exists; the checkpoint holds the library.
  config = ml_collections.ConfigDict(run_config.get_config(fake_run).to_dict())
  config.analyzer.static_library = "/gone/library.json"
  assert build_run_spec(checkpoint_eval_config(config)).static_library == ""


def test_a_run_without_checkpoints_fails_in_one_line(fake_run, tmp_path):
  (tmp_path / "config.json").write_text(open(os.path.join(fake_run, "config.json")).read())
  result = command("seed_jax.evaluate", f"--workdir={tmp_path}")
  assert one_line_usage_error(result) == (f"--workdir={tmp_path}: no checkpoint in "
                                          f"{tmp_path}/checkpoints")


# ------------------------------------------------------------------ pieces


def test_the_evaluation_config_is_the_runs_writing_only_a_summary(fake_run):
  config = run_config.get_config(fake_run)
  expected = config.to_dict()
  expected["init_from"] = ""  # the checkpoint's weights are the ones evaluated
  expected["analyzer"]["static_library"] = ""  # and its library (Trainer.restore)
  expected["checkpoint"]["export_hf"] = False  # --export says where
  expected["log"].update(plots=False, tensorboard=False)
  expected["eval"]["splits"] = ("valid_unseen",)
  assert checkpoint_eval_config(config, ["valid_unseen"]).to_dict() == expected
  assert checkpoint_eval_config(config).eval.splits == config.eval.splits  # default: the run's
  assert config.checkpoint.export_hf  # the run's config itself is left as it was


def test_restore_brings_back_the_checkpoints_skill_library(tiny_model, tmp_path):
  """Skill-GRPO acts with its library in evaluation too: the checkpoint's, not the file's."""
  library = write_library(tmp_path)
  spec = tiny_spec(tiny_model, "skill_grpo", **{"analyzer.static_library": library,
                                                 "log.tensorboard": False, "rl.kl_coef": 0.0})
  source = Trainer(spec, str(tmp_path / "run"))
  source.library, source.host["iteration"] = LIBRARY, 4
  source.save()
  source.close()
  with open(library, "w") as f:
    json.dump({TASK_TYPE: "another skill"}, f)  # the file changed after the run
  evaluator = Trainer(spec, str(tmp_path / "eval"),
                      checkpoint_dir=str(tmp_path / "run" / "checkpoints"))
  evaluator.restore(4)
  assert evaluator.library == LIBRARY and evaluator.host["iteration"] == 4
  assert evaluator._acting_skills == LIBRARY  # pylint: disable=protected-access
  evaluator.close()


def test_a_lora_run_is_evaluated_on_the_base_its_adapters_were_trained_on(
    tiny_model, tmp_path):
  """A LoRA checkpoint holds the adapters only: the evaluation keeps the run's init_from,
  where its frozen base came from, and exports that base merged with the adapters."""
  base = export_hf(random_model(load_model(tiny_model)[0].cfg, seed=3), tmp_path / "base",
                   load_model(tiny_model)[1])
  run = _trained_lora_run(tiny_model, str(tmp_path / "run"), init_from=base)
  want = [np.asarray(x) for x in jax.tree.leaves(run.state.params)]
  run.close()
  config = run_config.get_config(str(tmp_path / "run"))
  spec = build_run_spec(checkpoint_eval_config(config))
  assert spec.init_from == base
  evaluator = Trainer(spec, str(tmp_path / "eval"),
                      checkpoint_dir=str(tmp_path / "run" / "checkpoints"))
  evaluator.restore(0)
  assert same_params([np.asarray(x) for x in jax.tree.leaves(evaluator.state.params)], want)
  evaluator.close()


# ------------------------------------------------------------------ a finished run


@pytest.fixture(scope="module")
def finished_run(tiny_model, tmp_path_factory) -> str:
  """A one-iteration Skill-GRPO run (checkpoints 0 and 1, the final evaluation in its
  summary), with 2-turn episodes to keep it short."""
  folder = tmp_path_factory.mktemp("finished_run")
  spec = tiny_spec(tiny_model, "skill_grpo", **{
      "analyzer.static_library": write_library(folder), "env.max_steps": 2,
      "log.plots": False, "log.tensorboard": False})
  Trainer(spec, str(folder / "run")).run()
  return str(folder / "run")


def run_spec(workdir: str, splits=None):
  """The spec `python -m seed_jax.evaluate --workdir=WORKDIR` evaluates with."""
  return build_run_spec(checkpoint_eval_config(run_config.get_config(workdir), splits))


@pytest.mark.slow
def test_the_command_reproduces_the_runs_final_evaluation(finished_run, tmp_path):
  metrics_before = read_metrics(os.path.join(finished_run, "metrics.jsonl"))
  env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=jax.config.jax_compilation_cache_dir or "",
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  result = subprocess.run(
      [sys.executable, "-m", "seed_jax.evaluate", f"--workdir={finished_run}",
       f"--export={tmp_path / 'export'}"], cwd=REPO, env=env, capture_output=True, text=True,
      timeout=900)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  assert "evaluation at iteration 1" in result.stdout and "summary" in result.stdout
  with open(os.path.join(finished_run, "summary.json")) as f:
    run_summary = json.load(f)
  with open(os.path.join(eval_folder(finished_run, 1), "summary.json")) as f:
    assert json.load(f) == run_summary  # same numbers, same training success so far
  assert "valid_seen/success" in run_summary
  assert same_params(folder_params(str(tmp_path / "export")), saved_params(finished_run, 1))
  assert read_metrics(os.path.join(finished_run, "metrics.jsonl")) == metrics_before


@pytest.mark.slow
def test_step_selects_the_checkpoint_evaluated(finished_run, tmp_path):
  summary = evaluate_checkpoint(run_spec(finished_run), finished_run, 0,
                                export=str(tmp_path / "export"))
  assert summary["iterations"] == 0 and "valid_seen/success" in summary
  assert "train/success_last" not in summary  # no RL iteration had run at checkpoint 0
  with open(os.path.join(eval_folder(finished_run, 0), "summary.json")) as f:
    assert json.load(f) == summary
  exported = folder_params(str(tmp_path / "export"))
  assert same_params(exported, saved_params(finished_run, 0))
  assert not same_params(exported, saved_params(finished_run, 1))  # the update changed them
