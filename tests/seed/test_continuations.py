"""Prefix-shared continuation scoring equals scoring each full row on its own, and the
choice among candidates is a softmax over their summed log-probs."""

from __future__ import annotations

import numpy as np
import pytest
from flax import nnx

from seed_jax.models import ModelConfig, random_model
from seed_jax.seed import continuations as cont_lib
from seed_jax.seed.train_step import make_score_fn


@pytest.fixture(scope="module")
def model():
  return nnx.split(random_model(ModelConfig.tiny(), seed=3), nnx.Param)


def _full_row_sums(graphdef, params, prompt, candidates, width=16, resp=8):
  """Each candidate scored as its own row `prompt ++ candidate` by the train step's scorer:
  no shared cache. Rows are laid out as the scorer expects (prompt left-padded to `width`,
  candidate right-padded to `resp`), so one shape compiles."""
  score = make_score_fn(graphdef, chunk=4)
  rows = np.zeros((len(candidates), width + resp), np.int32)
  mask = np.zeros_like(rows, bool)
  for i, cand in enumerate(candidates):
    rows[i, width - len(prompt):width], rows[i, width:width + len(cand)] = prompt, cand
    mask[i, width - len(prompt):width + len(cand)] = True
  lp = np.asarray(score(params, {"tokens": rows, "mask": mask}, resp)).astype(np.float64)
  return [float(lp[i, :len(cand)].sum()) for i, cand in enumerate(candidates)]


@pytest.mark.parametrize("prompts_per_call", [2])  # 2: a padding prompt too
def test_shared_prefix_scores_equal_full_rows(model, prompts_per_call):
  graphdef, params = model
  rng = np.random.default_rng(0)
  prompts = [rng.integers(3, 256, size=n).tolist() for n in (7, 13, 2)]
  candidates = [[rng.integers(3, 256, size=n).tolist() for n in sizes]
                for sizes in ((1, 4, 2), (3,), (5, 1, 1, 2, 3, 4, 2, 6, 1))]
  fn = cont_lib.make_continuation_fn(graphdef, chunk=4)
  got = cont_lib.continuation_logprobs(fn, params, prompts, candidates, pad_id=0,
                                       prompts_per_call=prompts_per_call, bucket=8)
  for prompt, cands, sums in zip(prompts, candidates, got):
    np.testing.assert_allclose(sums, _full_row_sums(graphdef, params, prompt, cands),
                               rtol=1e-4, atol=1e-4)


def test_candidate_probabilities_are_a_softmax_over_sums():
  sums = [-3.0, -1.0, -2.5, -40.0]
  want = np.exp(sums) / np.exp(sums).sum()  # small enough to take directly
  np.testing.assert_allclose(cont_lib.candidate_probabilities(sums), want, rtol=1e-12)


def test_bad_inputs_name_the_prompt():
  fn = lambda *a: None  # never reached
  with pytest.raises(ValueError, match="prompt 0 has 1 token"):
    cont_lib.continuation_logprobs(fn, None, [[5]], [[[1]]], pad_id=0)
  with pytest.raises(ValueError, match="candidate 1: an empty continuation"):
    cont_lib.continuation_logprobs(fn, None, [[5, 6]], [[[1], []]], pad_id=0)
