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

  def score(params, inputs, resp_len):
    calls.append(inputs["tokens"].shape)
    return np.asarray(inputs["tokens"])[:, -resp_len:] * 1.0

  trainer.score = score
  tokens = np.arange(16 * 6).reshape(16, 6)
  batch = {"teacher_tokens": tokens, "teacher_mask": tokens > 0,
           "response_mask": np.ones((16, 2), np.float32)}
  logprobs = trainer.score_rows(None, batch, "teacher")
  assert calls == [(4, 6)] * 4  # not the 8-row mini-batch: 16x less memory at paper scale
  np.testing.assert_array_equal(logprobs, tokens[:, -2:])
