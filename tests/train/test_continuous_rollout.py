"""Rollouts without the turn barrier (`rollout.continuous`): each episode steps as soon as
its response is complete; the episodes are those of the turn-synchronous loop when greedy,
and a function of the seeds when sampled."""

from __future__ import annotations

import dataclasses

import pytest

from seed_jax.train.rollout import play_episodes
from seed_jax.train.trainer import Trainer
from tests.train.conftest import tiny_spec


@pytest.fixture(scope="module")
def trainer(tiny_model, tmp_path_factory):
  spec = tiny_spec(tiny_model, "grpo", **{"model.dtype": "float32", "log.tensorboard": False,
                                          "rl.kl_coef": 0.0})
  trainer = Trainer(spec, str(tmp_path_factory.mktemp("continuous")))
  yield trainer
  trainer.close()


def _play(trainer, seed: int, **rollout):
  spec = dataclasses.replace(trainer.spec.rollout, max_turns=4, **rollout)
  trajs, stats = play_episodes(trainer.sampler, trainer.tokenizer, trainer.pool(),
                               trainer.fmt, trainer.tasks("train")[:2], 2, spec, seed=seed,
                               desc=None)
  return [[(s.response_ids, s.response_text, s.action_valid) for s in t.steps]
          for t in trajs], stats


def test_greedy_episodes_equal_the_turn_synchronous_loops(trainer):
  synchronous, sync_stats = _play(trainer, 3, temperature=0.0)
  continuous, cont_stats = _play(trainer, 3, temperature=0.0, continuous=True)
  assert continuous == synchronous
  assert cont_stats == sync_stats
  # (Ragged responses, refilled slots at other ring offsets: tests/sampling/test_slots.py.)


def test_sampled_episodes_are_a_function_of_the_seed(trainer):
  first, _ = _play(trainer, 5, temperature=1.0, continuous=True)
  again, _ = _play(trainer, 5, temperature=1.0, continuous=True)
  assert first == again
  # (That another seed samples otherwise, whatever shares the batch: test_slots.py; this
  # tiny model's tied random embeddings repeat one token at any temperature.)


def test_a_second_rollout_compiles_nothing(trainer, compiles):
  # On the tests' mesh: the empty slots are placed where insert and generate return them.
  _play(trainer, 5, temperature=1.0, continuous=True)
  with compiles() as compiled:
    _play(trainer, 5, temperature=1.0, continuous=True)
  assert compiled == []
