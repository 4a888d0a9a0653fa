"""The trainer runs no train step for a mini-batch that no loss term would count."""

import numpy as np
import pytest

from seed_jax.train.trainer import _has_signal


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
