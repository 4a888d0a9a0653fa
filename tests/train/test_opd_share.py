"""The OPD term's share of the gradient: the split of two gradients against numpy, and on a
tiny random model in Sokoban the OPD part growing with lambda_opd while the rest stays."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from seed_jax.experiments import opd_share
from seed_jax.seed.train_step import make_loss_and_grad_fn
from tests.train.conftest import tiny_spec


def test_the_split_figures_against_numpy():
  rng = np.random.default_rng(0)
  outcome = {"a": rng.normal(size=(3, 4)), "b": rng.normal(size=5)}
  opd = {"a": rng.normal(size=(3, 4)), "b": rng.normal(size=5)}
  flat_outcome = np.concatenate([outcome["a"].ravel(), outcome["b"]])
  flat_opd = np.concatenate([opd["a"].ravel(), opd["b"]])
  figures = {k: float(v) for k, v in opd_share.split_gradient_figures(outcome, opd).items()}
  assert figures["outcome_norm"] == pytest.approx(np.sqrt(np.sum(flat_outcome ** 2)))
  assert figures["opd_norm"] == pytest.approx(np.sqrt(np.sum(flat_opd ** 2)))
  assert opd_share.cosine(figures) == pytest.approx(
      flat_opd @ flat_outcome / np.linalg.norm(flat_opd) / np.linalg.norm(flat_outcome))


def test_the_share_is_folded_from_summed_norms_where_the_outcome_has_a_signal():
  rows = [{"outcome_norm": 0.5, "opd_norm": 0.01, "dot": 0.0025},   # cosine 0.5
          {"outcome_norm": 0.0, "opd_norm": 0.03, "dot": 0.0},      # OPD alone
          {"outcome_norm": 1.5, "opd_norm": 0.01, "dot": -0.0075}]  # cosine -0.5
  folded = opd_share.fold(rows)
  assert folded["mini_batches"] == 3 and folded["opd_only"] == 1
  assert folded["opd_share"] == pytest.approx(0.02 / 2.0)
  assert folded["outcome_norm"] == pytest.approx(1.0)
  assert folded["opd_norm"] == pytest.approx(0.01)
  assert folded["cosine"] == pytest.approx(0.0)
  assert opd_share.cosine(rows[1]) is None
  assert opd_share.fold([rows[1]])["opd_share"] is None


def test_the_decision_split_is_folded_over_every_mini_batch_with_opd():
  rows = [{"outcome_norm": 0.5, "opd_norm": 0.02, "dot": 0.0, "opd_decision_norm": 0.01,
           "opd_rest_norm": 0.015, "decision_tokens": 4.0, "opd_tokens": 60.0},
          {"outcome_norm": 0.0, "opd_norm": 0.04, "dot": 0.0, "opd_decision_norm": 0.05,
           "opd_rest_norm": 0.02, "decision_tokens": 6.0, "opd_tokens": 40.0}]
  folded = opd_share.fold(rows)
  assert folded["decision_token_share"] == pytest.approx(10 / 100)
  assert folded["decision_share"] == pytest.approx(0.06 / 0.06)  # the OPD-alone one counts
  assert folded["opd_decision_norm"] == pytest.approx(0.03)
  assert folded["opd_rest_norm"] == pytest.approx(0.0175)
  assert "decision_share" not in opd_share.fold([{"outcome_norm": 1.0, "opd_norm": 0.1,
                                                   "dot": 0.0}])


def _trainer(tiny_model, tmp_path, algorithm: str, lambda_opd: float):
  from seed_jax.train.trainer import Trainer  # pylint: disable=import-outside-toplevel
  # SEED reading the oracle's plan (the seed_oracle arm): every trajectory has a skill.
  spec = tiny_spec(tiny_model, algorithm, **{"env.max_steps": 2, "rl.lambda_opd": lambda_opd,
                                             "analyzer.backend": "oracle"})
  return Trainer(spec, str(tmp_path))


def _measure(tiny_model, tmp_path, algorithm: str, lambda_opd: float = 0.01):
  trainer = _trainer(tiny_model, tmp_path, algorithm, lambda_opd)
  try:
    return opd_share.measure(trainer)
  finally:
    trainer.close()


def test_the_opd_part_grows_with_lambda_and_the_outcome_part_stays(tiny_model, tmp_path):
  # The same weights, games and sampling seeds: only the OPD term's weight differs.
  low = _measure(tiny_model, tmp_path / "low", "seed", 0.01)
  high = _measure(tiny_model, tmp_path / "high", "seed", 0.04)
  assert low["mini_batches"] == high["mini_batches"] > 0
  assert high["outcome_norm"] == pytest.approx(low["outcome_norm"], rel=1e-4)
  assert low["opd_norm"] > 0
  assert high["opd_norm"] == pytest.approx(4 * low["opd_norm"], rel=1e-4)
  assert high["opd_norm_per_lambda"] == pytest.approx(low["opd_norm_per_lambda"], rel=1e-4)
  assert high["cosine"] == pytest.approx(low["cosine"], abs=1e-4)
  assert -1.0 <= low["cosine"] <= 1.0
  assert low["opd_share"] == pytest.approx(low["opd_norm"] / low["outcome_norm"])


def test_the_opd_part_is_the_whole_gradient_minus_the_outcome_part(tiny_model, tmp_path):
  # An independent route (no outcome_mask): the difference of two whole gradients, at
  # lambda_opd 1 so that float32 rounding of the difference stays within a percent.
  trainer = _trainer(tiny_model, tmp_path, "seed", 1.0)
  try:
    minis, decision_minis, window = opd_share.first_mini_batches(trainer)
    cfg, params = trainer.spec.train_step, trainer.state.params
    mini = minis[0]
    # The decision mini-batches are the same rows with fewer response tokens (a random
    # model names no action: none here); the split is checked on a mask of our own, the
    # first two response tokens of each row.
    for whole_mini, decision in zip(minis, decision_minis):
      assert np.array_equal(decision["advantages"], whole_mini["advantages"])
      assert np.all(decision["response_mask"] <= whole_mini["response_mask"])
    first_two = np.zeros_like(mini["response_mask"])
    first_two[:, :2] = 1
    decision_mini = {**mini, "response_mask": mini["response_mask"] * first_two}
    figures = {k: float(v) for k, v in opd_share.make_split_gradient_fn(
        trainer.graphdef, cfg)(params, mini, decision_mini, window).items()}
    grad = make_loss_and_grad_fn(trainer.graphdef, cfg)
    whole = grad(params, mini, window)[1]
    outcome = make_loss_and_grad_fn(trainer.graphdef, dataclasses.replace(
        cfg, loss=dataclasses.replace(cfg.loss, lambda_opd=0.0)))(params, mini, window)[1]
    # The other tokens' part by its own route (not G_opd minus the decision part): the
    # loss with every row out of the outcome terms over those tokens alone, times their
    # share of the OPD tokens.
    rest_mask = mini["response_mask"] * (1 - decision_mini["response_mask"])
    opd_rows = np.asarray(mini["opd_mask"])[:, None]
    rest_share = (rest_mask * opd_rows).sum() / (mini["response_mask"] * opd_rows).sum()
    no_outcome = {"outcome_mask": np.zeros_like(mini["advantages"])}
    rest = grad(params, {**mini, **no_outcome, "response_mask": rest_mask}, window)[1]
  finally:
    trainer.close()
  flat = lambda tree: np.concatenate([np.asarray(x, np.float64).ravel()
                                      for x in jax.tree.leaves(tree)])
  opd = flat(whole) - flat(outcome)
  assert figures["outcome_norm"] == pytest.approx(np.linalg.norm(flat(outcome)), rel=1e-4)
  assert figures["opd_norm"] == pytest.approx(np.linalg.norm(opd), rel=1e-2)
  assert opd_share.cosine(figures) == pytest.approx(
      opd @ flat(outcome) / np.linalg.norm(opd) / np.linalg.norm(flat(outcome)), abs=1e-2)
  assert 0 < figures["decision_tokens"] < figures["opd_tokens"]
  assert figures["opd_rest_norm"] == pytest.approx(
      rest_share * np.linalg.norm(flat(rest)), rel=1e-3)


def test_an_algorithm_without_opd_is_refused(tiny_model, tmp_path):
  with pytest.raises(ValueError, match="no OPD term"):
    _measure(tiny_model, tmp_path, "grpo")
