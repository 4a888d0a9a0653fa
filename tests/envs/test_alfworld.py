"""ALFWorld on the real engine: generated games of all six types, the expert, official data."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from seed_jax.envs import alfworld
from seed_jax.envs.alfworld import games, generator, scenes
from seed_jax.envs.base import REQUIRED_INFO_KEYS
from seed_jax.envs.registry import get_env_module

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
OFFICIAL_SAMPLE = REPO_ROOT / ".." / "shared" / "data" / "alfworld-official-sample"
GAMES_PER_TYPE = 1


@pytest.fixture(scope="session")
def config(tmp_path_factory):
  config = alfworld.default_config()
  config.data_dir = alfworld.EMBEDDED
  config.cache_dir = str(tmp_path_factory.mktemp("alfworld_cache"))
  config.num_games.train = GAMES_PER_TYPE * 6
  config.num_games.valid_unseen = 6
  config.generate_workers = 2
  return config


@pytest.fixture(scope="session")
def train_tasks(config):
  return alfworld.load_tasks(config, "train")


@pytest.fixture(scope="session")
def unseen_tasks(config):
  return alfworld.load_tasks(config, "valid_unseen")


def play(env, task, policy, seed=0):
  """Plays one episode; `policy(info, rng)` picks the action. Returns the last info."""
  rng = random.Random(seed)
  _, info = env.reset(task, seed)
  done = False
  while not done:
    result = env.step(policy(info, rng))
    done, info = result.done, result.info
  return info


def expert_policy(info, rng):
  del rng
  return info["expert_action"]


def random_policy(info, rng):
  return rng.choice(info["admissible_actions"])


def test_the_module_follows_the_env_contract():
  module = get_env_module("alfworld")
  assert module.NAME == "alfworld"
  assert set(module.TASK_TYPES) == set(games.TASK_TYPES.values())
  assert module.make_agent_format(module.default_config()).stop_strings == ("</action>",)


def test_generated_games_cover_every_task_type_in_alfworld_layout(train_tasks):
  assert len(train_tasks) == GAMES_PER_TYPE * 6
  counts = {t: sum(task.task_type == t for task in train_tasks) for t in alfworld.TASK_TYPES}
  assert counts == {t: GAMES_PER_TYPE for t in alfworld.TASK_TYPES}
  for task in train_tasks:
    game_dir = Path(task.payload["game_file"]).parent
    game = json.loads((game_dir / games.GAME_FILE).read_text())
    traj = json.loads((game_dir / games.TRAJ_FILE).read_text())
    assert game["solvable"] is True and "UNKNOWN GOAL" not in game["grammar"]
    assert games.TASK_TYPES[traj["task_type"]] == task.task_type
    assert set(traj["pddl_params"]) == {"object_target", "parent_target", "toggle_target",
                                        "mrecep_target", "object_sliced"}
    assert games.task_type_of_folder(game_dir.parent.name) == task.task_type


@pytest.mark.parametrize("task_type", alfworld.TASK_TYPES)
def test_the_expert_wins_every_generated_game_of_each_type(config, train_tasks, unseen_tasks,
                                                           task_type):
  env = alfworld.make_env(config, with_expert=True)
  tasks = [t for t in train_tasks + unseen_tasks if t.task_type == task_type]
  assert len(tasks) == GAMES_PER_TYPE + 1
  # The generator checked each game with expert seed 0; another seed changes its choices.
  for task in tasks:
    info = play(env, task, expert_policy, seed=1)
    assert info["won"], task.task_id


def test_the_random_policy_mostly_fails(config, train_tasks):
  config = config.copy_and_resolve_references()
  config.max_steps = 20  # the expert needs 4 to 30 steps; keeps the test short
  env = alfworld.make_env(config)
  wins = sum(play(env, task, random_policy, seed=3)["won"] for task in train_tasks)
  assert wins <= 1


def test_valid_unseen_comes_from_held_out_floor_plans_only(train_tasks, unseen_tasks):
  def plan_number(task):
    return int(task.payload["floor_plan"].removeprefix("FloorPlan"))

  assert {t.task_type for t in unseen_tasks} == set(alfworld.TASK_TYPES)
  assert {plan_number(t) for t in unseen_tasks} <= set(scenes.HELD_OUT_FLOOR_PLANS)
  assert not {plan_number(t) for t in train_tasks} & set(scenes.HELD_OUT_FLOOR_PLANS)
  assert all(t.split == "valid_unseen" for t in unseen_tasks)


def test_generation_is_deterministic_and_cached(config, tmp_path, train_tasks):
  again = generator.generate_game(tmp_path, generator.GameSet(config.seed), "train", 0)
  first = Path(train_tasks[0].payload["game_file"]).parent
  assert again.name == first.name and again.parent.name == first.parent.name
  assert (again / games.GAME_FILE).read_text() == (first / games.GAME_FILE).read_text()
  # A second call finds the cached game instead of generating it.
  assert generator.generate_game(tmp_path, generator.GameSet(config.seed), "train", 0) == again


def test_a_set_of_short_games_has_only_its_types_and_the_expert_wins_within_the_bound(config):
  short = config.copy_and_resolve_references()
  short.task_types = ("pick_and_place", "look_at_obj_in_light")
  short.solvable_within = 8
  short.num_games.train = 4
  tasks = alfworld.load_tasks(short, "train")
  assert [t.task_type for t in tasks] == ["pick_and_place", "look_at_obj_in_light"] * 2
  # Its own cache folder: the default set of the same seed is untouched.
  assert "seed0-within8-pick_and_place+look_at_obj_in_light" in tasks[0].payload["game_file"]
  short.max_steps = 8
  env = alfworld.make_env(short, with_expert=True)
  assert all(play(env, task, expert_policy, seed=0)["won"] for task in tasks)


def test_an_unknown_task_type_or_bound_is_named():
  with pytest.raises(ValueError, match="unknown.*'make_coffee'"):
    generator.GameSet(0, ("pick_and_place", "make_coffee"))
  with pytest.raises(ValueError, match="solvable_within"):
    generator.GameSet(0, generator.ALL_TYPES, 0)


def test_steps_report_the_info_contract_and_invalid_actions_are_no_ops(config, train_tasks):
  config = config.copy_and_resolve_references()
  config.max_steps = 3
  env = alfworld.make_env(config, with_expert=True)
  obs, info = env.reset(train_tasks[0], seed=0)
  assert set(REQUIRED_INFO_KEYS) <= set(info) and info["instruction"] in obs
  assert not obs.startswith("-=") and "Your task is to:" in obs
  assert info["expert_action"] == "look" and info["task_type"] == train_tasks[0].task_type
  result = env.step("fly to the moon")
  assert result.observation == "Nothing happens."
  assert not result.info["action_valid"] and not result.done and result.reward == 0.0
  assert env.step("look").info["action_valid"]
  assert env.step("look").done  # turn limit reached, not won
  with pytest.raises(RuntimeError):
    env.step("look")


def test_an_episode_replays_identically_from_its_seed_and_actions(config, train_tasks):
  # The env pool restores episodes of a crashed worker by replay; this is what it relies on.
  env = alfworld.make_env(config, with_expert=True)
  task = next(t for t in train_tasks if t.task_type == "pick_and_place")

  def transcript():
    _, info = env.reset(task, seed=5)
    outputs = []
    done = False
    while not done:
      result = env.step(info["expert_action"])
      info, done = result.info, result.done
      outputs.append((result.observation, info["expert_action"], info["admissible_actions"]))
    return outputs

  assert transcript() == transcript()


def test_alfworld_data_variable_selects_official_data(monkeypatch, tmp_path):
  config = alfworld.default_config()
  monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
  assert alfworld.official_data_dir(config) is None  # no json_2.1.1/ there
  (tmp_path / "json_2.1.1").mkdir()
  assert alfworld.official_data_dir(config) == tmp_path
  config.data_dir = alfworld.EMBEDDED
  assert alfworld.official_data_dir(config) is None


@pytest.mark.skipif(not OFFICIAL_SAMPLE.is_dir(),
                    reason=f"official ALFWorld sample not found at {OFFICIAL_SAMPLE}")
def test_official_games_load_upgraded_and_the_expert_wins_them():
  config = alfworld.default_config()
  config.data_dir = str(OFFICIAL_SAMPLE)
  tasks = alfworld.load_tasks(config, "train")
  assert len(tasks) == 12
  assert {t.task_type for t in tasks} == set(alfworld.TASK_TYPES)
  assert all(t.split == "train" and t.payload["floor_plan"].startswith("FloorPlan") for t in tasks)
  old = json.loads(Path(tasks[0].payload["game_file"]).read_text())
  upgraded = games.embed_installed_logic(old)
  assert upgraded["grammar"] != old["grammar"]  # the sample embeds the old grammar
  assert games.task_sentence(upgraded["grammar"]) == games.task_sentence(old["grammar"])
  assert games.embed_installed_logic(upgraded) is upgraded
  env = alfworld.make_env(config, with_expert=True)
  one_per_type = {t.task_type: t for t in tasks}.values()  # half the sample keeps it short
  wins = sum(play(env, task, expert_policy)["won"] for task in one_per_type)
  assert wins >= 5


def test_splits_of_missing_official_data_fail_clearly(tmp_path):
  with pytest.raises(FileNotFoundError, match="valid_seen"):
    games.scan_games(tmp_path, "valid_seen")
  with pytest.raises(ValueError, match="split"):
    games.scan_games(tmp_path, "test")


def _play(argv, capsys):
  """Runs `python -m seed_jax.play` in process; returns (printed text, JSON summary)."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from seed_jax import play  # pylint: disable=g-import-not-at-top
  flags.FLAGS(["play", *argv])
  try:
    play.main(["play"])
  finally:
    flags.FLAGS.unparse_flags()
  out = capsys.readouterr().out
  return out, json.loads(out.strip().splitlines()[-1])


def test_play_with_the_expert_through_the_pool_wins_every_type(config, train_tasks, capsys):
  out, summary = _play(["--env=alfworld", "--policy=expert", "--episodes=6", "--workers=2",
                        f"--set=cache_dir={config.cache_dir}", "--set=data_dir=embedded"], capsys)
  assert summary["success"] == 1.0 and summary["failed"] == 0
  assert set(summary["success_per_type"]) == set(alfworld.TASK_TYPES)
  assert "pick_heat_then_place" in out and "overall" in out and "100.0%" in out


def test_play_with_the_random_policy_in_process(config, train_tasks, capsys):
  _, summary = _play(["--env=alfworld", "--policy=random", "--episodes=3", "--seed=1",
                      f"--set=cache_dir={config.cache_dir}", "--set=data_dir=embedded",
                      "--set=max_steps=5"], capsys)
  assert summary["episodes"] == 3 and summary["success"] == 0.0


def test_the_game_set_does_not_depend_on_the_turn_limit(config, train_tasks):
  short = config.copy_and_resolve_references()
  short.max_steps = 5  # shorter than most expert solutions: the same games all the same
  assert [t.task_id for t in alfworld.load_tasks(short, "train")] == [
      t.task_id for t in train_tasks]
