"""Which training games RL iterates over: all of them, or with `bc.disjoint` those the
warm start did not clone."""

from __future__ import annotations

import dataclasses

import pytest

from seed_jax.envs.base import Task
from seed_jax.train.trainer import Trainer
from tests.train.conftest import tiny_spec

GAMES = [Task("sokoban", f"g{i}", "train", "push", {}) for i in range(5)]


def _trainer(spec):
  trainer = Trainer.__new__(Trainer)  # only what rl_tasks reads
  trainer.spec, trainer._tasks = spec, {"train": GAMES}  # pylint: disable=protected-access
  return trainer


@pytest.mark.parametrize("disjoint,want", [(False, GAMES), (True, GAMES[2:])])
def test_rl_trains_on_the_games_the_warm_start_did_not_clone(disjoint, want):
  spec = tiny_spec("smollm2-135m-instruct", "seed", **{"bc.episodes": 2,
                                                       "bc.disjoint": disjoint})
  assert _trainer(spec).rl_tasks() == want


def test_disjoint_needs_a_game_left_for_rl():
  spec = tiny_spec("smollm2-135m-instruct", "seed", **{"bc.episodes": 5, "bc.disjoint": True})
  with pytest.raises(ValueError, match="config.bc.disjoint: the warm start clones all 5"):
    _trainer(spec).rl_tasks()
  no_bc = dataclasses.replace(spec, bc=None)
  assert _trainer(no_bc).rl_tasks() == GAMES
