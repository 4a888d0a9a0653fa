"""The teacher gap on the sampled tokens: the action block, its tokens, the split figures."""

from __future__ import annotations

import math

import numpy as np
import pytest

from seed_jax.envs.agent_format import action_char_span, decision_char_span
from seed_jax.seed import batch as batch_lib
from seed_jax.seed import token_gap

BETA = 5.0


def _gate(d: float) -> float:
  return 1 / (1 + math.exp(-BETA * d))


# ------------------------------------------------------------------ the action block


@pytest.mark.parametrize("text, block", [
    ("<think>go</think><action>go to desk 1</action>", "<action>go to desk 1</action>"),
    ("<think>x</think><action>open drawer 2", "<action>open drawer 2"),  # unclosed: to the end
    ("<think>x</think><ACTION>look</ACTION> done", "<ACTION>look</ACTION>"),
    ("<think>hm</think>\n<search> who wrote it </search>\n", "<search> who wrote it </search>"),
    ("<answer>Paris</answer>", "<answer>Paris</answer>"),
    # The last block wins, whatever its kind; a closing tag of another kind does not close it.
    ("<action>a</action> then <action>b</action>", "<action>b</action>"),
    ("<search>q</search><answer>x</action>y", "<answer>x</action>y"),
])
def test_action_char_span_is_the_last_block_through_its_closing_tag(text, block):
  start, end = action_char_span(text)
  assert text[start:end] == block


@pytest.mark.parametrize("text", ["", "<think>only thinking</think>", "action: go", "<act>x"])
def test_a_response_without_an_action_block_has_no_span(text):
  assert action_char_span(text) is None


@pytest.mark.parametrize("text, decision, at", [
    # A think that names the move decides it; the block repeats it.
    ("<think>Next I should move left.</think><action>left</action>", "left", 26),
    # Named nowhere before: the block's content itself (closed or not, any case).
    ("<think>x</think><action>go to desk 1</action>", "go to desk 1", 24),
    ("<think>x</think><action> open drawer 2", "open drawer 2", 25),
    ("<think>I will Go To Desk 1.</think><action>go to desk 1</action>", "Go To Desk 1", 14),
    # A whole word only: "up" inside "update" is no mention of the move.
    ("<think>update the plan</think><action>up</action>", "up", 38),
])
def test_decision_char_span_is_where_the_response_first_names_its_action(text, decision, at):
  start, end = decision_char_span(text)
  assert (text[start:end], start) == (decision, at)


@pytest.mark.parametrize("text", ["", "<think>only thinking</think>", "<action> </action>",
                                  "<think>x</think><action></action>"])
def test_a_response_without_an_action_has_no_decision(text):
  assert decision_char_span(text) is None


@pytest.fixture(scope="module")
def tokenizer():
  from seed_jax.models.embedded import embedded_model_dir
  from seed_jax.models.tokenizer import load_tokenizer
  return load_tokenizer(embedded_model_dir())


def _masked_text(tokenizer, ids, mask):
  """The decoded masked tokens; the mask must be one contiguous run."""
  where = np.flatnonzero(mask)
  assert list(where) == list(range(where[0], where[-1] + 1))
  return tokenizer.decode(ids[where[0]:where[-1] + 1])


@pytest.mark.parametrize("response, block", [
    ("<think>go</think><action>go to desk 1</action>", "<action>go to desk 1</action>"),
    ("<think>I see a desk.</think> <action>go to desk 1</action>\n",
     "<action>go to desk 1</action>"),
    ("<think>hm</think><action>take mug 2 from", "<action>take mug 2 from"),
    ("<think>find it</think>\n<search>capital of france</search>",
     "<search>capital of france</search>"),
])
def test_action_token_mask_marks_exactly_the_tokens_of_the_block(tokenizer, response, block):
  ids = tokenizer.encode(response)
  mask = token_gap.action_token_mask(tokenizer, ids)
  assert mask.shape == (len(ids),) and mask.dtype == bool
  text = _masked_text(tokenizer, ids, mask)
  assert block in text
  # Exactly: a masked token at either end that were dropped would lose part of the block
  # (a token straddling the tag's edge may bring a character or two with it).
  first, last = np.flatnonzero(mask)[[0, -1]]
  assert block not in tokenizer.decode(ids[first + 1:last + 1])
  assert block not in tokenizer.decode(ids[first:last])
  assert len(text) - len(block) <= 2


def test_action_token_mask_of_the_hand_written_response(tokenizer):
  ids = tokenizer.encode("<think>go</think><action>go to desk 1</action>")
  mask = token_gap.action_token_mask(tokenizer, ids)
  # The tokens are "<", "think", ">", "go", "</", "think", "><", "action", ...: the "><" token
  # straddles the block's edge and counts as in.
  assert _masked_text(tokenizer, ids, mask) == "><action>go to desk 1</action>"
  assert tokenizer.decode([i for i, m in zip(ids, mask) if not m]) == "<think>go</think"
  assert not token_gap.action_token_mask(tokenizer, tokenizer.encode("<think>x</think>")).any()
  assert token_gap.action_token_mask(tokenizer, []).shape == (0,)


class _CountingTokenizer:
  def __init__(self, tokenizer):
    self.inner, self.calls = tokenizer, 0

  def decode(self, ids):
    self.calls += 1
    return self.inner.decode(ids)


def test_the_decision_tokens_of_a_think_then_act_response_are_its_move(tokenizer):
  ids = tokenizer.encode("<think>Next I should move left.</think><action>left</action>")
  mask = token_gap.action_token_mask(tokenizer, ids, span_of=decision_char_span)
  assert _masked_text(tokenizer, ids, mask).strip() == "left" and mask.sum() == 1


def test_action_token_mask_decodes_log_n_prefixes_not_every_token(tokenizer):
  response = "<think>" + "let me look around the room. " * 40 + "</think><action>look</action>"
  ids = tokenizer.encode(response)
  counting = _CountingTokenizer(tokenizer)
  mask = token_gap.action_token_mask(counting, ids)
  assert len(ids) > 200 and counting.calls <= 1 + 2 * math.ceil(math.log2(len(ids) + 1))
  assert _masked_text(tokenizer, ids, mask).endswith("<action>look</action>")


def test_response_span_masks_follow_build_batchs_rows(tokenizer):
  responses = [["<think>a</think><action>go to desk 1</action>", "<think>b</think>"],
               ["<think>" + "long " * 30 + "</think><action>look</action>"]]
  trajs = [batch_lib.Trajectory(
      task_id="t", group_id="t", traj_id=str(n), won=False, episode_reward=0.0,
      steps=[batch_lib.StepRecord(prompt_ids=[5, 6], response_ids=tokenizer.encode(r),
                                  sampler_logprobs=[-1.0] * len(tokenizer.encode(r)))
             for r in texts]) for n, texts in enumerate(responses)]
  resp_len = 24
  batch, _ = batch_lib.build_batch(trajs, batch_lib.BatchConfig(
      response_len=resp_len, prompt_bucket=4, rows_multiple=4), with_teacher=False)
  masks, decisions = token_gap.response_span_masks(trajs, resp_len, tokenizer, num_rows=4)
  assert masks.shape == decisions.shape == batch["response_mask"].shape == (4, resp_len)
  first = tokenizer.encode(responses[0][0])
  np.testing.assert_array_equal(masks[0, :len(first)],
                                token_gap.action_token_mask(tokenizer, first))
  np.testing.assert_array_equal(
      decisions[0, :len(first)],
      token_gap.action_token_mask(tokenizer, first, decision_char_span))
  assert decisions[0].any() and not decisions[1:].any()
  assert not masks[0, len(first):].any() and masks[0].any()
  assert not masks[1].any()  # no action block
  assert not masks[2].any()  # the block lies past the R tokens kept of a long response
  assert not masks[3].any()  # a padding row
  assert not (masks & (batch["response_mask"] == 0)).any()
  np.testing.assert_array_equal(token_gap.response_span_masks(trajs, resp_len, tokenizer)[0],
                                masks[:3])


# ------------------------------------------------------------------ the figures


def test_gap_summary_by_hand():
  delta = np.array([0.5, -0.2, 1.0, 2.0, -1.0, 0.0, 0.3, -0.4, -0.6])
  got = token_gap.gap_summary(delta, BETA, "x_")
  # Sorted: -1, -0.6, -0.4, -0.2, 0, 0.3, 0.5, 1, 2; linear interpolation at 0.8, 4, 7.2.
  want = {"x_tokens": 9, "x_delta_mean": 1.6 / 9, "x_delta_q10": -1 + 0.8 * 0.4,
          "x_delta_q50": 0.0, "x_delta_q90": 1.0 + 0.2 * 1.0,
          "x_gate_mean": sum(_gate(d) for d in delta) / 9,
          # gate > 0.6 where delta > ln(1.5) / 5 = 0.081; < 0.4 where delta < -0.081.
          "x_gate_above_0.6": 4 / 9, "x_gate_below_0.4": 4 / 9}
  assert set(got) == set(want)
  for key, value in want.items():
    assert math.isclose(got[key], value, abs_tol=1e-12), key
  assert token_gap.gap_summary(np.zeros(0), BETA, "none_") == {"none_tokens": 0}


# Per trajectory, each step's token deltas and which of them are the action block.
# Trajectory 2 has no skill: its tokens are no OPD tokens and must count nowhere.
_STEPS = [
    (True, True, [([0.5, -0.2, 1.0, 2.0], [0, 0, 1, 1])]),
    (False, True, [([-1.0, 0.0, 0.3], [0, 0, 1]), ([-0.4, -0.6], [1, 1])]),
    (False, False, [([3.0, 3.0], [1, 0])]),
]
RESP = 5


def _hand_batch():
  """Trajectories, build_batch's batch (8 rows, 4 real) and teacher log-probs giving the
  deltas of `_STEPS`, and the action mask `[4, R]` (no padding rows)."""
  trajs = []
  for n, (won, skill, steps) in enumerate(_STEPS):
    trajs.append(batch_lib.Trajectory(
        task_id="t", group_id="t", traj_id=str(n), won=won, episode_reward=10.0 * won,
        steps=[batch_lib.StepRecord(
            prompt_ids=[7, 8], response_ids=[9] * len(deltas),
            sampler_logprobs=[-1.0 - 0.1 * i for i in range(len(deltas))],
            teacher_prompt_ids=[6, 7, 8] if skill else None) for deltas, _ in steps]))
  batch, _ = batch_lib.build_batch(trajs, batch_lib.BatchConfig(
      response_len=RESP, prompt_bucket=4, rows_multiple=8))
  # Beyond the responses and on padding rows, a teacher far off: it must not count.
  teacher = np.full((8, RESP), 50.0, np.float32)
  action = np.zeros((4, RESP), bool)
  rows = [step for _, _, steps in _STEPS for step in steps]
  for row, (deltas, marks) in enumerate(rows):
    teacher[row, :len(deltas)] = batch["old_logprobs"][row, :len(deltas)] + deltas
    action[row, :len(marks)] = marks
  return trajs, batch, teacher, action


def test_token_gap_stats_split_the_opd_tokens_by_hand():
  trajs, batch, teacher, action = _hand_batch()
  got = token_gap.token_gap_stats(trajs, batch, teacher, BETA, action)
  # Written out: the OPD tokens of each split (trajectory 2 has no skill).
  splits = {"action": [1.0, 2.0, 0.3, -0.4, -0.6], "rest": [0.5, -0.2, -1.0, 0.0],
            "won": [0.5, -0.2, 1.0, 2.0], "failed": [-1.0, 0.0, 0.3, -0.4, -0.6]}
  splits["all"] = splits["won"] + splits["failed"]
  assert got["gap_all_tokens"] == 9 and got["gap_action_tokens"] == 5
  assert got["gap_rest_tokens"] == 4 and got["gap_won_tokens"] == 4
  for name, deltas in splits.items():
    assert math.isclose(got[f"gap_{name}_delta_mean"], sum(deltas) / len(deltas),
                        abs_tol=1e-6), name
    assert math.isclose(got[f"gap_{name}_gate_mean"],
                        sum(_gate(d) for d in deltas) / len(deltas), abs_tol=1e-6), name
  # Action block sorted: -0.6, -0.4, 0.3, 1, 2; positions 0.4, 2, 3.6.
  for key, value in {"delta_q10": -0.52, "delta_q50": 0.3, "delta_q90": 1.6,
                     "gate_above_0.6": 3 / 5, "gate_below_0.4": 2 / 5}.items():
    assert math.isclose(got[f"gap_action_{key}"], value, abs_tol=1e-6), key
  # Rest sorted: -1, -0.2, 0, 0.5: the median halfway between -0.2 and 0.
  assert math.isclose(got["gap_rest_delta_q50"], -0.1, abs_tol=1e-6)
  assert got["gap_rest_gate_above_0.6"] == 0.25 and got["gap_rest_gate_below_0.4"] == 0.5


def test_the_decision_split_holds_the_marked_opd_tokens():
  trajs, batch, teacher, action = _hand_batch()
  decision = np.zeros((4, RESP), bool)
  decision[0, 1] = decision[1, 0] = True  # deltas -0.2 and -1.0
  decision[3, 0] = True  # trajectory 2's step: no skill, no OPD token
  got = token_gap.token_gap_stats(trajs, batch, teacher, BETA, action, decision)
  assert got["gap_decision_tokens"] == 2
  assert math.isclose(got["gap_decision_delta_mean"], -0.6, abs_tol=1e-6)
  assert got["gap_decision_gate_below_0.4"] == 1.0
  # Trajectory 0 won (its decision -0.2), trajectory 1 failed (-1.0).
  assert got["gap_decision_won_tokens"] == got["gap_decision_failed_tokens"] == 1
  assert math.isclose(got["gap_decision_won_delta_mean"], -0.2, abs_tol=1e-6)
  assert math.isclose(got["gap_decision_failed_delta_mean"], -1.0, abs_tol=1e-6)
  without = token_gap.token_gap_stats(trajs, batch, teacher, BETA, action)
  assert not any(key.startswith("gap_decision_") for key in without)
  assert without == {k: v for k, v in got.items() if not k.startswith("gap_decision_")}


def test_without_opd_tokens_each_split_reports_only_its_count():
  trajs, batch, teacher, action = _hand_batch()
  batch = dict(batch, opd_mask=np.zeros_like(batch["opd_mask"]))
  got = token_gap.token_gap_stats(trajs, batch, teacher, BETA, action, action)
  assert got == {f"gap_{name}_tokens": 0 for name in token_gap.SPLITS}


def test_trajectory_token_gaps_by_hand():
  trajs, batch, teacher, action = _hand_batch()
  got = token_gap.trajectory_token_gaps(trajs, batch, teacher, BETA, action)
  assert len(got) == 3 and got[2] is None  # no skill
  want = [({"action": [1.0, 2.0], "rest": [0.5, -0.2]}),
          ({"action": [0.3, -0.4, -0.6], "rest": [-1.0, 0.0]})]
  for figures, parts in zip(got, want):
    for part, deltas in parts.items():
      assert figures[f"gap_{part}_tokens"] == len(deltas)
      assert math.isclose(figures[f"gap_{part}_delta_mean"], sum(deltas) / len(deltas),
                          abs_tol=1e-6)
      assert math.isclose(figures[f"gap_{part}_gate_mean"],
                          sum(_gate(d) for d in deltas) / len(deltas), abs_tol=1e-6)
