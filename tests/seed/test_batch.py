"""Advantages, H and the batch builder, against hand computations."""

from __future__ import annotations

import dataclasses
import math
import statistics

import numpy as np
import pytest

from seed_jax.agent.prompts import PromptEncoder
from seed_jax.seed import advantages as adv_lib
from seed_jax.seed import batch as batch_lib
from seed_jax.models.tokenizer import chat_prompt_ids
from seed_jax.seed import skills


def test_step_advantages_match_public_code_by_hand():
  rewards = [10.0, 0.0, 10.0, 5.0]
  valid = [[True, False, True], [True, True], [True], [False, True]]
  groups = ["a", "a", "b", "c"]
  got = adv_lib.step_advantages(rewards, adv_lib.step_penalties(valid, 0.1), groups)
  scores_a = [10.0, 9.9, 10.0, 0.0, 0.0]
  mean, std = statistics.mean(scores_a), statistics.stdev(scores_a)
  want_a = [(s - mean) / (std + 1e-6) for s in scores_a]
  np.testing.assert_allclose(np.concatenate(got[:2]), want_a, rtol=1e-6)
  np.testing.assert_allclose(got[2], [10.0], rtol=1e-6)  # group of one: mean 0, std 1
  scores_c = [4.9, 5.0]
  mean, std = statistics.mean(scores_c), statistics.stdev(scores_c)
  np.testing.assert_allclose(got[3], [(s - mean) / (std + 1e-6) for s in scores_c], rtol=1e-5)


def test_a_step_pays_one_charge_invalid_before_ineffective():
  valid = [[True, True, False], [True]]
  effective = [[True, False, False], [False]]
  got = adv_lib.step_penalties(valid, 0.1, effective, ineffective_penalty=0.25)
  # the format failure pays 0.1 (not 0.1 + 0.25); the blocked valid moves pay 0.25
  np.testing.assert_allclose(got[0], [0.0, 0.25, 0.1])
  np.testing.assert_allclose(got[1], [0.25])
  paper = adv_lib.step_penalties(valid, 0.1, effective)  # no ineffective charge by default
  np.testing.assert_allclose(np.concatenate(paper), [0.0, 0.0, 0.1, 0.0])


def test_in_a_group_that_all_failed_the_blocked_moves_alone_score_below_the_mean():
  # two lost episodes of one task: the only spread is the charge of the blocked moves
  penalties = adv_lib.step_penalties([[True] * 3, [True] * 3], 0.1,
                                     [[True, False, False], [True, True, True]], 0.1)
  got = np.concatenate(adv_lib.step_advantages([-0.3, -0.3], penalties, ["g", "g"]))
  scores = [-0.3, -0.4, -0.4, -0.3, -0.3, -0.3]
  mean, std = statistics.mean(scores), statistics.stdev(scores)
  np.testing.assert_allclose(got, [(s - mean) / (std + 1e-6) for s in scores], rtol=1e-5)
  assert (got[[1, 2]] < 0).all() and (got[[0, 3, 4, 5]] > 0).all()


def test_trajectory_advantages_and_mean_only():
  rewards = [10.0, 0.0, 0.0]
  valid = [[True, False], [True], [False, False, True]]
  penalties = adv_lib.step_penalties(valid, 0.5)
  got = adv_lib.step_advantages(rewards, penalties, ["g"] * 3, mode="trajectory")
  scores = [9.5, 0.0, -1.0]
  mean, std = statistics.mean(scores), statistics.stdev(scores)
  for traj, score in zip(got, scores):
    np.testing.assert_allclose(traj, (score - mean) / (std + 1e-6), rtol=1e-6)
  assert [len(t) for t in got] == [2, 1, 3]
  centred = adv_lib.step_advantages(rewards, penalties, ["g"] * 3, mode="trajectory",
                                    norm_by_std=False)
  np.testing.assert_allclose(centred[0], [9.5 - mean] * 2, rtol=1e-6)
  with pytest.raises(ValueError, match="advantage mode"):
    adv_lib.step_advantages(rewards, penalties, ["g"] * 3, mode="episode")


PROMPT = ("You are an expert agent operating in the ALFRED Embodied Environment.\n"
          "Your task is to: put a clean apple in fridge.\n"
          "Prior to this step, you have already taken 2 step(s).\n"
          "Your admissible actions of the current situation are: [go to fridge 1].")
SKILL = "Clean the apple at the sinkbasin before you open the fridge."
TASK_LINE = r"Your task is to:"  # what the acting format names as its task line


def _byte_ids(text):
  return list(text.encode())


def _word_ids(text):
  return [hash(w) % 1000 for w in text.split()]


@pytest.mark.parametrize("tokenize", [_byte_ids, _word_ids])
def test_h_changes_only_the_inserted_block(tokenize):
  aug = skills.augment_prompt(PROMPT, SKILL, TASK_LINE)
  assert aug.text[aug.start:aug.end] == skills.skill_block(SKILL)
  assert aug.text[:aug.start] + aug.text[aug.end:] == PROMPT
  assert aug.text[:aug.start].endswith("put a clean apple in fridge.\n")
  assert "Episode-Level Skill" in aug.text and SKILL in aug.text
  before, block, after = aug.text[:aug.start], aug.text[aug.start:aug.end], aug.text[aug.end:]
  ids = tokenize(aug.text)
  n_before, n_block = len(tokenize(before)), len(tokenize(block))
  assert ids[:n_before] == tokenize(PROMPT[:aug.start])
  assert ids[n_before + n_block:] == tokenize(after) == tokenize(PROMPT[aug.start:])
  assert skills.augment_prompt(PROMPT, SKILL, TASK_LINE) == aug  # deterministic


def test_h_inserts_after_the_line_the_caller_names_not_a_built_in_one():
  prompt = "Intro.\nYour task is to: a decoy\nMission: reach the exit\nMap below."
  aug = skills.augment_prompt(prompt, SKILL, r"Mission:")
  assert aug.text[:aug.start] == "Intro.\nYour task is to: a decoy\nMission: reach the exit\n"
  assert aug.text[aug.end:] == "Map below."


def test_h_at_the_end_appends_the_block_after_a_blank_line():
  aug = skills.augment_prompt(PROMPT, SKILL, TASK_LINE, placement="end")
  assert aug.text[:aug.start] == PROMPT  # the message itself is unchanged
  assert aug.text[aug.start:] == "\n\n" + skills.skill_block(SKILL).rstrip("\n")
  assert aug.end == len(aug.text) and aug.system is None


def test_h_as_a_system_message_leaves_the_user_message_alone(tokenizer):
  aug = skills.augment_prompt(PROMPT, SKILL, TASK_LINE, placement="system")
  assert aug.text == PROMPT and aug.start == aug.end
  assert aug.system == skills.skill_block(SKILL).rstrip("\n")
  text, ids = skills.skill_prompt_ids(PromptEncoder(tokenizer), PROMPT, SKILL, TASK_LINE,
                                      "system")
  assert text == PROMPT
  rendered = tokenizer.decode(ids)
  assert rendered.index(SKILL) < rendered.index("put a clean apple in fridge")
  assert ids != chat_prompt_ids(tokenizer, PROMPT)


def test_h_placements_are_checked():
  with pytest.raises(ValueError, match="skill placement 'middle'"):
    skills.augment_prompt(PROMPT, SKILL, TASK_LINE, placement="middle")


def test_the_empty_skill_places_the_block_without_a_skill():
  aug = skills.augment_prompt(PROMPT, "", TASK_LINE)
  assert aug.text[aug.start:aug.end] == f"{skills.SKILL_HEADER}\n{skills.SKILL_INSTRUCTION}\n\n"


def test_h_edge_cases():
  last = skills.augment_prompt("Hello.\nYour task is to: look", SKILL, TASK_LINE)
  assert last.text.startswith("Hello.\nYour task is to: look\n## Episode-Level Skill")
  assert not last.text.endswith("\n")
  no_task = skills.augment_prompt("first line\nsecond line", SKILL, TASK_LINE)
  assert no_task.text.startswith("first line\n## Episode-Level Skill")
  assert skills.is_valid_skill("one two three four five")
  assert not skills.is_valid_skill("too short skill")
  assert not skills.is_valid_skill(None)


def _traj(group, reward, steps, skill=True):
  records = []
  for i, (plen, rlen, valid) in enumerate(steps):
    prompt = list(range(10, 10 + plen))
    records.append(batch_lib.StepRecord(
        prompt_ids=prompt, response_ids=list(range(100, 100 + rlen)),
        sampler_logprobs=[-0.5 - i] * rlen, action_valid=valid,
        teacher_prompt_ids=[7, 7, 7] + prompt if skill else None))
  return batch_lib.Trajectory(task_id=group, group_id=group, traj_id=f"{group}{reward}",
                              won=reward > 0, episode_reward=reward, steps=records)


def test_build_batch_layout_and_masks():
  trajs = [_traj("a", 10.0, [(5, 3, True), (6, 4, False)]),
           _traj("a", 0.0, [(4, 2, True)], skill=False)]
  cfg = batch_lib.BatchConfig(response_len=5, prompt_bucket=4, rows_multiple=4, pad_id=2)
  batch, stats = batch_lib.build_batch(trajs, cfg)
  assert stats["rows"] == 3 and stats["padding_rows"] == 1 and stats["opd_rows"] == 2
  prompt_len = 12  # the longest teacher prompt, 9, rounded up to a multiple of 4
  assert batch["student_tokens"].shape == (4, prompt_len + 5)
  # Row 1: prompt of 6 left-padded, response of 4 right-padded.
  np.testing.assert_array_equal(batch["student_tokens"][1, prompt_len - 6:prompt_len],
                                range(10, 16))
  np.testing.assert_array_equal(batch["student_tokens"][1, prompt_len:], [100, 101, 102, 103, 2])
  np.testing.assert_array_equal(batch["student_mask"][1],
                                [False] * 6 + [True] * 10 + [False])
  np.testing.assert_array_equal(batch["teacher_tokens"][1, prompt_len - 9:prompt_len],
                                [7, 7, 7] + list(range(10, 16)))
  # Student and teacher responses sit at the same positions.
  np.testing.assert_array_equal(batch["teacher_tokens"][:, prompt_len:],
                                batch["student_tokens"][:, prompt_len:])
  np.testing.assert_array_equal(batch["response_mask"][:, :], [
      [1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [0, 0, 0, 0, 0]])
  np.testing.assert_allclose(batch["old_logprobs"][1], [-1.5] * 4 + [0.0])
  np.testing.assert_array_equal(batch["opd_mask"], [1, 1, 0, 0])
  want = adv_lib.step_advantages([10.0, 0.0], [[0.0, 0.1], [0.0]], ["a", "a"])
  np.testing.assert_allclose(batch["advantages"], list(np.concatenate(want)) + [0.0])
  # The padding row attends to one token only and the pad id never defines a mask.
  assert batch["student_mask"][3].sum() == 1


def test_student_rows_need_not_be_padded_to_the_teacher_prompts():
  trajs = [_traj("a", 10.0, [(5, 3, True), (6, 4, False)]),
           _traj("a", 0.0, [(4, 2, True)], skill=False)]
  cfg = batch_lib.BatchConfig(response_len=5, prompt_bucket=4, shared_prompt_len=False)
  batch, stats = batch_lib.build_batch(trajs, cfg)
  assert batch["student_tokens"].shape == (3, 8 + 5)  # longest student prompt 6 -> 8
  assert batch["teacher_tokens"].shape == (3, 12 + 5)  # longest teacher prompt 9 -> 12
  assert (stats["prompt_len"], stats["teacher_prompt_len"]) == (8, 12)
  # Responses still align: the last R positions of both kinds of row.
  np.testing.assert_array_equal(batch["teacher_tokens"][:, -5:], batch["student_tokens"][:, -5:])
  np.testing.assert_array_equal(batch["teacher_mask"][:, -5:], batch["student_mask"][:, -5:])
  # The row without a skill repeats its student prompt in the teacher layout.
  np.testing.assert_array_equal(batch["teacher_tokens"][2, 12 - 4:12],
                                batch["student_tokens"][2, 8 - 4:8])


def test_build_batch_truncation_and_errors():
  trajs = [_traj("a", 1.0, [(20, 9, True)], skill=False)]
  cfg = batch_lib.BatchConfig(response_len=4, prompt_bucket=8, max_prompt_len=8)
  batch, stats = batch_lib.build_batch(trajs, cfg, with_teacher=False)
  assert "teacher_tokens" not in batch
  assert stats["truncated_prompts"] == 1 and stats["truncated_responses"] == 1
  np.testing.assert_array_equal(batch["student_tokens"][0, :8], range(22, 30))
  trajs[0].steps[0].sampler_logprobs = [0.0]
  with pytest.raises(ValueError, match="sampler log-probs"):
    batch_lib.build_batch(trajs, cfg)


def test_trajectory_gate_stats_average_each_trajectorys_opd_tokens():
  trajs = [_traj("a", 10.0, [(5, 3, True), (6, 4, False)]),
           _traj("a", 0.0, [(4, 2, True)], skill=False)]
  batch, _ = batch_lib.build_batch(trajs, batch_lib.BatchConfig(
      response_len=5, prompt_bucket=4, rows_multiple=4))
  teacher = np.full((4, 5), -0.25, np.float32)
  got = batch_lib.trajectory_gate_stats(trajs, batch, teacher, beta=5.0)
  # Trajectory 0: 3 tokens at old -0.5 and 4 at old -1.5, written out one by one.
  deltas = [0.25] * 3 + [1.25] * 4
  gates = [1 / (1 + math.exp(-5.0 * d)) for d in deltas]
  assert got[0]["opd_tokens"] == 7
  assert math.isclose(got[0]["delta_mean"], sum(deltas) / 7)
  assert math.isclose(got[0]["gate_mean"], sum(gates) / 7)
  assert got[1] is None  # no skill, no OPD token


def test_zero_advantage_groups_leave_the_outcome_terms_only_when_asked():
  # Group "a": both trajectories score alike, every step valid: advantages all zero.
  # Group "b": a win and a loss. Group "c": no win, but an invalid step (the penalty
  # separates its steps' scores): advantages not zero.
  trajs = [_traj("a", 0.0, [(5, 3, True), (6, 2, True)]), _traj("a", 0.0, [(4, 2, True)]),
           _traj("b", 10.0, [(5, 3, True)]), _traj("b", 0.0, [(5, 3, True)]),
           _traj("c", 0.0, [(5, 3, True), (5, 3, False)]), _traj("c", 0.0, [(5, 2, True)])]
  on = batch_lib.BatchConfig(response_len=4, prompt_bucket=8, rows_multiple=3,
                             skip_zero_advantage_groups=True)
  batch, stats = batch_lib.build_batch(trajs, on)
  # Rows follow the trajectories' steps: a a a | b b | c c c, then one padding row.
  np.testing.assert_array_equal(batch["outcome_mask"], [0, 0, 0, 1, 1, 1, 1, 1, 0])
  np.testing.assert_array_equal(batch["advantages"][:3], 0.0)
  assert stats["zero_advantage_groups"] == 1 and stats["zero_advantage_rows"] == 3
  np.testing.assert_array_equal(batch["opd_mask"][:3], 1.0)  # OPD keeps the rows

  off, stats_off = batch_lib.build_batch(trajs, dataclasses.replace(
      on, skip_zero_advantage_groups=False))
  np.testing.assert_array_equal(off["outcome_mask"], [1, 1, 1, 1, 1, 1, 1, 1, 0])
  assert stats_off["zero_advantage_groups"] == 0 and stats_off["zero_advantage_rows"] == 0


def test_zero_advantage_groups_tolerate_rounding_only():
  assert batch_lib.zero_advantage_groups(["a", "a", "b"], [[1e-9, -1e-9], [0.0], [0.3]]) == {"a"}
  assert batch_lib.zero_advantage_groups(["a", "b"], [[0.0], [1e-3]]) == {"a"}


@pytest.mark.parametrize("mask,size,order", [
    # The signal rows side by side: batch order would leave the second mini-batch without.
    ([1, 1, 1, 0, 0, 0, 0, 0], 4, [0, 2, 3, 4, 1, 5, 6, 7]),
    ([0, 0, 0, 1, 1], 2, [0, 3, 1, 4, 2]),
    # The short last mini-batch is full after one round: the deal passes over it.
    ([1, 1, 1, 1, 1, 1, 1], 3, [0, 3, 5, 1, 4, 6, 2]),
    ([0, 0, 0, 0], 2, [0, 1, 2, 3]),
])
def test_spread_row_order_deals_the_signal_rows_round_robin_by_hand(mask, size, order):
  got = batch_lib.spread_row_order(np.array(mask, np.float32), size)
  assert got.tolist() == order


@pytest.mark.parametrize("seed", range(20))
def test_spread_row_order_gives_every_mini_batch_its_share_of_the_signal(seed):
  rng = np.random.default_rng(seed)
  size = int(rng.integers(1, 6))
  rows = size * int(rng.integers(1, 7))
  mask = (rng.random(rows) < rng.random()).astype(np.float32)
  order = batch_lib.spread_row_order(mask, size)
  assert sorted(order.tolist()) == list(range(rows))  # a permutation
  counts = [int(mask[order[s:s + size]].sum()) for s in range(0, rows, size)]
  assert max(counts) - min(counts) <= 1 and sum(counts) == mask.sum()
  if mask.sum() >= len(counts):
    assert min(counts) >= 1
  for s in range(0, rows, size):  # each mini-batch in batch order
    assert np.all(np.diff(order[s:s + size]) > 0)
