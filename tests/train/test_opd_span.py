"""`rl.opd_span`: which response tokens the OPD term counts. "response" (the paper's): every
one. "decision": only where the response first names its action, the move itself."""

import numpy as np
import pytest

from seed_jax.seed import losses
from seed_jax.seed.batch import StepRecord, Trajectory
from seed_jax.train.spec import ConfigError
from tests.train.conftest import tiny_spec

RESPONSES = ("<think>The box is right of me, so I push right.</think><action>right</action>",
             "<action>up</action>",
             "no action block at all")


def _trajectories(tokenizer):
  steps = []
  for text in RESPONSES:
    ids = tokenizer.encode(text)
    steps.append(StepRecord(prompt_ids=tokenizer.encode("the board"),
                            response_ids=ids, sampler_logprobs=[-0.5] * len(ids),
                            teacher_prompt_ids=tokenizer.encode("the board; plan: right")))
  return [Trajectory(task_id="t", group_id="t", traj_id="0", won=True, episode_reward=10.0,
                     steps=steps)]


def _scored(tiny_model, tmp_path, opd_span):
  from seed_jax.train.trainer import Trainer  # pylint: disable=import-outside-toplevel
  spec = tiny_spec(tiny_model, "seed", **{"rl.opd_span": opd_span, "analyzer.backend": "oracle",
                                          "rollout.max_new_tokens": 40, "rl.kl_coef": 0.0})
  trainer = Trainer(spec, str(tmp_path))
  try:
    batch, _ = trainer.scored_batch(_trajectories(trainer.tokenizer))
    return batch, trainer.tokenizer
  finally:
    trainer.close()


def test_the_decision_span_marks_the_first_naming_of_the_move(tiny_model, tmp_path):
  batch, tokenizer = _scored(tiny_model, tmp_path, "decision")
  span = batch[losses.OPD_SPAN_KEY]
  assert span.shape == batch["response_mask"].shape
  ids = [tokenizer.encode(text) for text in RESPONSES]
  # Row 0 decides in its reasoning: the first "right" (after "The box is"), not the second
  # nor the action block's copy.
  marked = [ids[0][i] for i in np.flatnonzero(span[0])]
  assert tokenizer.decode(marked).strip() == "right"
  first_right = RESPONSES[0].index("right")
  assert len(tokenizer.decode(ids[0][:np.flatnonzero(span[0])[0]])) <= first_right
  assert len(tokenizer.decode(ids[0][:np.flatnonzero(span[0])[-1] + 1])) <= (
      RESPONSES[0].index("right", first_right + 1))
  # Row 1 names its move only in the block: the block's content is the decision.
  assert tokenizer.decode([ids[1][i] for i in np.flatnonzero(span[1])]).strip() == "up"
  # Row 2 takes no action, so it has no decision and no OPD token; padding rows none.
  assert not span[2:].any()
  # The OPD term counts only the marked tokens of rows with a skill.
  opd_tokens = np.asarray(losses.opd_token_mask(batch))
  np.testing.assert_array_equal(opd_tokens, span * batch["response_mask"]
                                * batch["opd_mask"][:, None])


def test_the_paper_span_marks_nothing_and_the_term_counts_every_response_token(
    tiny_model, tmp_path):
  batch, _ = _scored(tiny_model, tmp_path, "response")
  assert losses.OPD_SPAN_KEY not in batch
  np.testing.assert_array_equal(np.asarray(losses.opd_token_mask(batch)),
                                batch["response_mask"] * batch["opd_mask"][:, None])


def test_an_unknown_span_fails_before_anything_runs(tiny_model):
  with pytest.raises(ConfigError, match=r"config.rl.opd_span: one of \('response', "
                                        r"'decision'\)"):
    tiny_spec(tiny_model, "seed", **{"rl.opd_span": "action"})
