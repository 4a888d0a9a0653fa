"""The policy analyzer decodes at most `analyzer.decode_batch` transcripts at a time."""

from __future__ import annotations

import types

from seed_jax.train.trainer import Trainer
from tests.train.conftest import tiny_spec


class RecordingSampler:
  def __init__(self):
    self.requests = []

  def generate(self, prompt_ids, sampling, seed):
    self.requests.append((len(prompt_ids), seed, sampling.temperature))
    return types.SimpleNamespace(texts=[f"answer to {p[0]}" for p in prompt_ids])


def _generate(decode_batch: int, prompts):
  trainer = Trainer.__new__(Trainer)  # only what policy_generate reads
  trainer.spec = tiny_spec("smollm2-135m-instruct", "seed",
                           **{"analyzer.decode_batch": decode_batch})
  trainer.sampler = RecordingSampler()
  texts = trainer.policy_generate(prompts, temperature=0.7, seed=10)
  return texts, trainer.sampler.requests


def test_transcripts_are_decoded_in_batches_and_answers_keep_their_order():
  prompts = [[i, 0] for i in range(5)]
  texts, requests = _generate(2, prompts)
  assert texts == [f"answer to {i}" for i in range(5)]
  assert requests == [(2, 10, 0.7), (2, 11, 0.7), (1, 12, 0.7)]  # a seed of their own


def test_zero_decodes_every_transcript_in_one_request():
  texts, requests = _generate(0, [[i] for i in range(5)])
  assert len(texts) == 5 and requests == [(5, 10, 0.7)]
