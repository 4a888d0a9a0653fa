"""Continuous batching (`SlotDecoder`): responses enter and leave a fixed set of slots over
a ring cache, and each one is what the turn-synchronous sampler gives for its prompt,
whatever else shares the batch."""

from __future__ import annotations

import numpy as np
import pytest
from flax import nnx

from seed_jax.sampling import Sampler, SamplingParams
from seed_jax.sampling.slots import SlotDecoder
from tests.sampling.conftest import TINY

# Lengths 3 to 40: prompt buckets of 4 to 64, and refills at different ring offsets.
PROMPTS = [[5, 6, 7], list(range(10, 19)), list(range(30, 47)), list(range(50, 90)),
           [8, 9, 10, 11, 12], list(range(100, 125))]


@pytest.fixture(scope="module")
def sampler(tiny_model, toy_tokenizer):
  graphdef, params = nnx.split(tiny_model)
  return Sampler(graphdef, params, TINY, tokenizer=toy_tokenizer, max_cache_len=256)


def _run_slots(sampler, sampling, num_slots, turns=1, seed=0, max_steps=1 << 30):
  """Every prompt answered `turns` times through `num_slots` slots, refilled as responses
  finish (a prompt's next turn waits for its previous response, like an episode's)."""
  slots = SlotDecoder(sampler, sampling, num_slots, max_prompt_len=64, seed=seed,
                      max_steps=max_steps)
  waiting = [(i, 0) for i in range(len(PROMPTS))]
  where, results = {}, {}
  while waiting or where:
    free = slots.free_slots()
    batch = [(free.pop(0), *waiting.pop(0)) for _ in range(min(len(free), len(waiting)))]
    slots.insert([(slot, PROMPTS[i], i, turn) for slot, i, turn in batch])
    where.update({slot: (i, turn) for slot, i, turn in batch})
    for slot in slots.run():
      i, turn = where.pop(slot)
      results[i, turn] = slots.take(slot)
      if turn + 1 < turns:
        waiting.append((i, turn + 1))
  return results


def test_greedy_responses_equal_the_turn_synchronous_samplers(sampler):
  sampling = SamplingParams(max_new_tokens=24, temperature=0.0)
  want = sampler.generate(PROMPTS, sampling)
  for num_slots, max_steps in ((2, 1 << 30), (4, 3)):  # refills; and a host look every 3 steps
    got = _run_slots(sampler, sampling, num_slots, max_steps=max_steps)
    for i in range(len(PROMPTS)):
      tokens, logprobs, reason, text = got[i, 0]
      assert tokens == want.tokens[i], (num_slots, i)
      assert reason == want.stop_reasons[i] and text == want.texts[i]
      np.testing.assert_allclose(logprobs, want.logprobs[i], atol=2e-5)


def test_a_response_depends_on_its_stream_and_turn_not_on_its_neighbours(sampler):
  sampling = SamplingParams(max_new_tokens=16, temperature=1.0, stop_strings=("</",))
  one, four = (_run_slots(sampler, sampling, num_slots, turns=2, seed=7)
               for num_slots in (1, 4))
  assert {k: v[0] for k, v in four.items()} == {k: v[0] for k, v in one.items()}
  # Distinct streams: the turns of one prompt differ from each other.
  assert any(one[i, 0][0] != one[i, 1][0] for i in range(len(PROMPTS)))
  another_seed = _run_slots(sampler, sampling, 3, turns=1, seed=8)
  assert any(another_seed[i, 0][0] != one[i, 0][0] for i in range(len(PROMPTS)))


def test_a_second_decoder_compiles_nothing(sampler, compiles):
  # Every rollout builds its own SlotDecoder: the programs of the first serve the next.
  sampling = SamplingParams(max_new_tokens=8, temperature=0.0)
  first = _run_slots(sampler, sampling, 4)
  with compiles() as compiled:
    again = _run_slots(sampler, sampling, 4)
  assert compiled == []
  assert {k: v[0] for k, v in again.items()} == {k: v[0] for k, v in first.items()}


def test_slots_are_named_once_and_only_when_free(sampler):
  slots = SlotDecoder(sampler, SamplingParams(max_new_tokens=4), 2, max_prompt_len=16, seed=0)
  with pytest.raises(ValueError, match="free and named once"):
    slots.insert([(0, [5], 0, 0), (0, [6], 1, 0)])
  slots.insert([(0, [5], 0, 0)])
  with pytest.raises(ValueError, match="free and named once"):
    slots.insert([(0, [6], 1, 0)])
  with pytest.raises(ValueError, match="holds no response"):
    slots.take(1)
