"""Teacher and reference log-probs are scored a micro-batch of rows at a time."""

from __future__ import annotations

import numpy as np

from seed_jax.train.trainer import Trainer
from tests.train.conftest import tiny_spec


def test_rows_are_scored_a_micro_batch_at_a_time_and_keep_their_order():
  trainer = Trainer.__new__(Trainer)  # only what score_rows reads
  trainer.spec = tiny_spec("smollm2-135m-instruct", "seed",
                           **{"rl.mini_batch_size": 8, "rl.micro_batch_size": 4})
  trainer.mesh = None
  calls = []

  def score(params, tokens, mask, resp_len):
    calls.append(tokens.shape)
    return np.asarray(tokens)[:, -resp_len:] * 1.0

  trainer.score = score
  tokens = np.arange(16 * 6).reshape(16, 6)
  logprobs = trainer.score_rows(None, tokens, tokens > 0, 2)
  assert calls == [(4, 6)] * 4  # not the 8-row mini-batch: 16x less memory at paper scale
  np.testing.assert_array_equal(logprobs, tokens[:, -2:])
