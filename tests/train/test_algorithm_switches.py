"""Each algorithm switch does what the README's table says, and costs nothing it need not."""

from __future__ import annotations

import dataclasses
import json

import pytest

from seed_jax.metrics import read_metrics
from seed_jax.train import trainer as trainer_lib
from seed_jax.train.trainer import Trainer
from tests.train.conftest import tiny_spec

pytestmark = pytest.mark.slow

LIBRARY = {"sokoban": "Push each box only after checking the cell behind it is free."}


@pytest.fixture
def library_file(tmp_path):
  path = tmp_path / "library.json"
  path.write_text(json.dumps(LIBRARY))
  return str(path)


def test_a_static_library_file_spares_skill_grpo_its_stage_one(tiny_model, tmp_path,
                                                               library_file, monkeypatch):
  def no_stage1(self, *args, **kwargs):
    raise AssertionError("stage 1 ran although the library file was given")
  monkeypatch.setattr(Trainer, "stage1", no_stage1)
  trainer = Trainer(tiny_spec(tiny_model, "skill_grpo", **{
      "analyzer.static_library": library_file}), str(tmp_path / "run"))
  trainer.before_rl()
  assert trainer.library == LIBRARY


def test_a_static_library_file_takes_precedence_over_the_stage_one_library(
    tiny_model, tmp_path, library_file):
  trainer = Trainer(tiny_spec(tiny_model, "static_library", **{
      "analyzer.static_library": library_file}), str(tmp_path / "run"))
  trainer.before_rl()  # stage 1 still runs: its SFT is part of the algorithm
  assert trainer.library == LIBRARY
  assert any(r["phase"] == "stage1" for r in read_metrics(str(tmp_path / "run" /
                                                               "metrics.jsonl")))


def test_skill_grpo_acts_with_its_library_in_training_and_in_evaluation(
    tiny_model, tmp_path, library_file, monkeypatch):
  acting = {}
  original = trainer_lib.play_episodes

  def recording(*args, desc, acting_skills=None, **kwargs):
    acting[desc.split()[0]] = acting_skills
    return original(*args, desc=desc, acting_skills=acting_skills, **kwargs)
  monkeypatch.setattr(trainer_lib, "play_episodes", recording)
  Trainer(tiny_spec(tiny_model, "skill_grpo", **{"analyzer.static_library": library_file}),
          str(tmp_path / "run")).run()
  assert acting["iter"] == LIBRARY and acting["eval"] == LIBRARY


def test_lambda_opd_zero_runs_no_analyzer_and_scores_no_teacher(tiny_model, tmp_path,
                                                                 monkeypatch):
  def refuse(*args, **kwargs):
    raise AssertionError("OPD is off, yet skills were analysed")
  monkeypatch.setattr(Trainer, "attach_skills", refuse)
  monkeypatch.setattr(trainer_lib.analyzer_lib, "make_analyzer", refuse)
  built = []
  original = trainer_lib.build_batch

  def recording(trajs, cfg, with_teacher):
    built.append(with_teacher)
    return original(trajs, cfg, with_teacher=with_teacher)
  monkeypatch.setattr(trainer_lib, "build_batch", recording)
  spec = tiny_spec(tiny_model, "no_sft", **{"rl.lambda_opd": 0.0, "eval.at_end": False})
  Trainer(spec, str(tmp_path / "run")).run()
  assert built == [False]
  train = [r for r in read_metrics(str(tmp_path / "run" / "metrics.jsonl"))
           if r["phase"] == "train"]
  assert "opd_loss" not in train[0] and "time_analysis_s" not in train[0]


def test_zero_advantage_groups_run_no_update_when_every_group_scores_alike(
    tiny_model, tmp_path, monkeypatch):
  """With `rl.skip_zero_advantage_groups`, an iteration whose groups all score alike (here:
  every episode made a loss with valid steps) runs no optimizer step, and says so."""
  original = trainer_lib.build_batch

  def alike(trajs, cfg, with_teacher):
    trajs = [dataclasses.replace(t, episode_reward=0.0, won=False, steps=[
        dataclasses.replace(s, action_valid=True) for s in t.steps]) for t in trajs]
    return original(trajs, cfg, with_teacher=with_teacher)
  monkeypatch.setattr(trainer_lib, "build_batch", alike)
  spec = tiny_spec(tiny_model, "grpo", **{"rl.skip_zero_advantage_groups": True,
                                          "eval.at_end": False})
  trainer = Trainer(spec, str(tmp_path / "run"))
  calls = []
  step = trainer.train_step
  trainer.train_step = lambda *args: calls.append(1) or step(*args)
  trainer.run()
  train = [r for r in read_metrics(str(tmp_path / "run" / "metrics.jsonl"))
           if r["phase"] == "train"]
  assert calls == [] and train[0]["update_empty"] >= 1 and "loss" not in train[0]
  assert train[0]["batch_zero_advantage_rows"] == train[0]["batch_rows"] > 0


def test_group_hindsight_gives_the_failures_of_a_group_with_a_win_the_winners_skill(
    tiny_model, tmp_path, monkeypatch):
  original = trainer_lib.play_episodes

  def one_win(*args, **kwargs):  # a tiny random model never wins: the first episode does
    trajs, stats = original(*args, **kwargs)
    trajs[0].won = True
    return trajs, stats
  monkeypatch.setattr(trainer_lib, "play_episodes", one_win)
  spec = tiny_spec(tiny_model, "no_sft", **{"analyzer.backend": "oracle",
                                            "analyzer.group_hindsight": True,
                                            "eval.at_end": False})
  Trainer(spec, str(tmp_path / "run")).run()
  lines = [json.loads(line) for line in open(tmp_path / "run" / "analysis" / "iter_1.jsonl")]
  winner = lines[0]
  siblings = [r for r in lines[1:] if r["group_id"] == winner["group_id"]]
  others = [r for r in lines[1:] if r["group_id"] != winner["group_id"]]
  assert siblings and others
  assert winner["skill_from"] is None
  assert all(r["skill_from"] == winner["traj_id"] for r in siblings)
  assert all(r["skill_from"] is None for r in others)  # no win in their groups
  train = [r for r in read_metrics(str(tmp_path / "run" / "metrics.jsonl"))
           if r["phase"] == "train"]
  assert train[0]["skill_from_sibling"] == pytest.approx(len(siblings) / len(lines))
  assert train[0]["skill_parse_rate"] == 1.0  # the oracle's own skills, not the shares
