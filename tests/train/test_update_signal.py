"""The trainer runs no train step for a mini-batch that no loss term would count."""

import numpy as np
import pytest

from seed_jax.train.trainer import Trainer, _has_signal
from tests.train.conftest import tiny_spec


def _mini(outcome, opd, tokens=(3, 3)):
  return {"response_mask": np.array([[1.0] * n + [0.0] * (4 - n) for n in tokens]),
          "outcome_mask": np.array(outcome, np.float32),
          "opd_mask": np.array(opd, np.float32)}


@pytest.mark.parametrize("outcome,opd,with_opd,tokens,signal", [
    ((1, 0), (0, 0), False, (3, 3), True),    # an outcome row
    ((0, 0), (1, 0), False, (3, 3), False),   # GRPO: skills do not count
    ((0, 0), (1, 0), True, (3, 3), True),     # SEED: the OPD row counts
    ((1, 0), (0, 0), False, (0, 3), False),   # the outcome row has no response token
    ((0, 0), (0, 0), True, (3, 3), False),
])
def test_a_mini_batch_has_signal_when_some_term_counts_a_token(outcome, opd, with_opd, tokens,
                                                                 signal):
  assert _has_signal(_mini(outcome, opd, tokens), with_opd) is signal


def _batch(outcome):
  rows = len(outcome)
  return {"advantages": np.ones((rows, 4), np.float32),
          "response_mask": np.ones((rows, 4), np.float32),
          "outcome_mask": np.array(outcome, np.float32),
          "opd_mask": np.ones((rows,), np.float32),
          "row_id": np.arange(rows)}


@pytest.mark.parametrize("spread,signal_per_mini", [(False, [4, 0]), (True, [2, 2])])
def test_spreading_the_outcome_rows_gives_every_mini_batch_a_grpo_signal(
    tiny_model, tmp_path, spread, signal_per_mini):
  """Four groups' rows side by side, the first two with an outcome signal: in batch order
  the second mini-batch has none (GRPO skips it, SEED steps on OPD alone); spread, both
  have one, and every row is still used once."""
  spec = tiny_spec(tiny_model, "seed", **{"rl.mini_batch_size": 4, "rl.micro_batch_size": 4,
                                          "rl.spread_outcome_rows": spread})
  trainer = Trainer(spec, str(tmp_path / "run"))
  minis, window = trainer.mini_batches(_batch([1, 1, 1, 1, 0, 0, 0, 0]))
  assert window is None  # rows not packed
  assert [int(m["outcome_mask"].sum()) for m in minis] == signal_per_mini
  assert sorted(np.concatenate([m["row_id"] for m in minis]).tolist()) == list(range(8))
  assert [_has_signal(m, False) for m in minis] == [True, bool(spread)]


def test_a_mini_batchs_live_rows_fill_its_first_micro_batches(tiny_model, tmp_path):
  """GRPO, mini-batches of 4 rows in 2 micro-batches: spread, each mini-batch has 2 rows
  with an outcome signal, and both land in micro-batch 0 (positions 0 and 2, `_split_micro`
  being strided), so the step runs one micro-batch of two."""
  spec = tiny_spec(tiny_model, "grpo", **{"rl.mini_batch_size": 4, "rl.micro_batch_size": 2,
                                          "rl.spread_outcome_rows": True})
  trainer = Trainer(spec, str(tmp_path / "run"))
  minis, _ = trainer.mini_batches(_batch([1, 1, 1, 1, 0, 0, 0, 0]))
  for mini in minis:
    assert mini["outcome_mask"][0::2].tolist() == [1, 1]
    assert mini["outcome_mask"][1::2].tolist() == [0, 0]
  assert sorted(np.concatenate([m["row_id"] for m in minis]).tolist()) == list(range(8))
