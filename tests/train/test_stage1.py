"""Stage 1 teaches the analyzer's RL-time format: its SFT prompts are the very prompts the
policy analyzer decodes from (one builder, one budget), and what it saves is enough to
rebuild them."""

from __future__ import annotations

import json

import pytest

from seed_jax.seed import analyzer as an
from seed_jax.seed.batch import StepRecord, Trajectory
from seed_jax.train import stage1
from seed_jax.train.expert import Demonstration
from seed_jax.models.tokenizer import chat_prompt_ids

TASK = "put a cool apple in countertop"
BUDGET = 512


def _traj(traj_id: str, num_steps: int, won: bool) -> Trajectory:
  steps = [StepRecord([1], [2], [-0.1], action_valid=i % 4 != 0,
                      observation=f"You arrive at cabinet {i}. On it you see a mug {i}.",
                      response_text=f"<think>Not here.</think><action>go to cabinet {i + 1}"
                                    f"</action>")
           for i in range(1, num_steps + 1)]
  return Trajectory(task_id="t", group_id="t", traj_id=traj_id, won=won,
                    episode_reward=10.0 * won, steps=steps, task=TASK,
                    info={"goal": TASK, "task_type": "pick_cool_then_place",
                          "expert_plan": ["go to fridge 1", "cool apple 1 with fridge 1"]})


def _annotate(tokenizer, trajs, budget=BUDGET):
  """Stage 1's labelling: the external (here oracle) analyzer with the analyzer budget."""
  analyzer = an.make_analyzer(an.AnalyzerConfig(backend="oracle"), tokenizer=tokenizer,
                              max_prompt_tokens=budget)
  reports, stats = analyzer.analyze(trajs)
  return stage1.annotation_records(trajs, reports), stats


def test_sft_prompts_are_the_prompts_the_policy_analyzer_decodes_from(tokenizer, tmp_path):
  trajs = [_traj("long", num_steps=40, won=False), _traj("short", num_steps=2, won=True)]
  records, stats = _annotate(tokenizer, trajs)
  assert stats["truncated"] == 1 and [r["truncated"] for r in records] == [True, False]
  stage1.save_stage1(str(tmp_path), records, stage1.skill_library(records))
  loaded, _ = stage1.load_stage1(str(tmp_path))
  examples = stage1.sft_examples(tokenizer, loaded, BUDGET)

  seen = []

  def generate(prompt_ids, *, temperature, seed):
    seen.extend(prompt_ids)
    return ["{}"] * len(prompt_ids)

  policy = an.make_analyzer(an.AnalyzerConfig(backend="policy", max_retries=0), generate,
                            tokenizer=tokenizer, max_prompt_tokens=BUDGET)
  policy.analyze(trajs)
  assert [list(e.prompt_ids) for e in examples] == seen

  long_prompt = tokenizer.decode(examples[0].prompt_ids)
  assert len(examples[0].prompt_ids) <= BUDGET
  for part in (f"Task: {TASK}", "Outcome: FAILURE", "Steps taken: 40", "earlier steps omitted",
               "Step 40\n", "<action>go to cabinet 41</action>", '"episode_skill"'):
    assert part in long_prompt, part
  # The target is the external analyzer's JSON answer, then end of sequence.
  answer = json.loads(records[0]["answer"])
  assert tokenizer.decode(examples[0].target_ids[:-1]) == json.dumps(answer)
  assert examples[0].target_ids[-1] == tokenizer.eos_ids[0]
  # What was stored is what the external analyzer read.
  assert tokenizer.decode(examples[0].prompt_ids).count(records[0]["analyzer_prompt"]) == 1


def test_with_an_answer_prefix_stage_1_teaches_what_follows_it_where_the_analyzer_starts(
    tokenizer):
  """`analyzer.answer_prefix`: the policy analyzer decodes from the prompt + the prefix's
  ids and its answer is the prefix + the text; stage 1's examples are split the same way,
  so the model learns to continue exactly where it is made to start."""
  prefix = '{"episode_summary": "'
  trajs = [_traj("a", num_steps=3, won=True)]
  records, _ = _annotate(tokenizer, trajs)
  (example,) = stage1.sft_examples(tokenizer, records, BUDGET, answer_prefix=prefix)
  (plain,) = stage1.sft_examples(tokenizer, records, BUDGET)
  assert list(example.prompt_ids) == list(plain.prompt_ids) + tokenizer.encode(prefix)
  assert prefix + tokenizer.decode(example.target_ids[:-1]) == records[0]["answer"]

  continuation = tokenizer.decode(example.target_ids[:-1])
  seen = []

  def generate(prompt_ids, *, temperature, seed):
    seen.extend(prompt_ids)
    return [continuation] * len(prompt_ids)

  policy = an.make_analyzer(an.AnalyzerConfig(backend="policy", answer_prefix=prefix),
                            generate, tokenizer=tokenizer, max_prompt_tokens=BUDGET)
  (report,), stats = policy.analyze(trajs)
  assert seen == [list(example.prompt_ids)]
  assert report.raw == records[0]["answer"] and stats["valid"] == 1
  # An answer that does not start with the prefix is taught whole, after the bare prompt.
  other = [dict(records[0], answer=" " + records[0]["answer"])]
  (whole,) = stage1.sft_examples(tokenizer, other, BUDGET, answer_prefix=prefix)
  assert list(whole.prompt_ids) == list(plain.prompt_ids)


def test_answers_longer_than_the_analyzers_budget_are_counted():
  examples = [stage1.SFTExample([1], [5] * n) for n in (10, 96, 97, 130)]
  assert stage1.answers_over_budget(examples, 96) == 2
  assert stage1.answers_over_budget(examples, 256) == 0


def test_prompts_follow_the_current_budget_when_saved_annotations_are_reused(tokenizer):
  records, _ = _annotate(tokenizer, [_traj("long", num_steps=40, won=False)], budget=8192)
  assert not records[0]["truncated"]
  (example,) = stage1.sft_examples(tokenizer, records, 400)
  prompt = tokenizer.decode(example.prompt_ids)
  assert len(example.prompt_ids) <= 400
  assert f"Task: {TASK}" in prompt and "Outcome: FAILURE" in prompt and "Step 40\n" in prompt


def test_only_well_formed_annotations_are_kept():
  trajs = [_traj("a", 2, True), _traj("b", 2, False)]
  reports, _ = an.Analyzer(an.AnalyzerConfig(backend="oracle", max_retries=0),
                           lambda prompts, ts, decoding: [
                               json.dumps({"episode_summary": "s",
                                           "episode_skill": "Cool the apple in the fridge."}),
                               "no idea"]).analyze(trajs)
  records = stage1.annotation_records(trajs, reports)
  assert [r["transcript"]["steps"][0]["observation"] for r in records] == [
      "You arrive at cabinet 1. On it you see a mug 1."]
  assert records[0]["task_type"] == "pick_cool_then_place" and records[0]["won"] is True
  with pytest.raises(ValueError, match="no valid analysis"):
    stage1.annotation_record(trajs[1], reports[1])


def test_annotations_of_an_older_format_are_made_again(tmp_path):
  old = {"task_id": "t", "task_type": "pick", "won": True, "analyzer_prompt": "Task: x",
         "answer": json.dumps({"episode_summary": "s", "episode_skill": "a b c d e"})}
  stage1.save_stage1(str(tmp_path), [old], {"pick": "a b c d e"})
  assert stage1.load_stage1(str(tmp_path)) is None
  assert stage1.load_stage1(str(tmp_path / "never")) is None


def test_behaviour_cloning_pairs_every_expert_message_with_its_response(tokenizer):
  demo = Demonstration("t", "pick", TASK, messages=["turn one", "turn two"],
                       responses=["<action>go to fridge 1</action>",
                                  "<action>open fridge 1</action>"],
                       actions=["go to fridge 1", "open fridge 1"], won=False)
  examples = stage1.bc_examples(tokenizer, [demo])
  assert [list(e.prompt_ids) for e in examples] == [chat_prompt_ids(tokenizer, "turn one"),
                                                    chat_prompt_ids(tokenizer, "turn two")]
  assert tokenizer.decode(examples[1].target_ids) == "<action>open fridge 1</action>"


def test_a_skill_reading_warm_start_adds_steps_with_the_games_oracle_plan(tokenizer):
  demos = [Demonstration(f"t{g}", "pick", f"put a mug in shelf {g}.",
                         messages=[f"Your task is to: put a mug in shelf {g}.\nturn {i}"
                                   for i in range(4)],
                         responses=[f"<action>step {i}</action>" for i in range(4)],
                         actions=[f"go to shelf {g}", "take mug 1", "put mug 1", "look"],
                         won=True) for g in (1, 2)]
  plain = stage1.bc_examples(tokenizer, demos)
  half = stage1.bc_examples(tokenizer, demos, skill_fraction=0.5,
                            task_line_pattern="Your task is to:", seed=3)
  assert half[:8] == plain and len(half) == 12  # 4 of the 8 steps again, with a skill
  for example in half[8:]:
    prompt = tokenizer.decode(example.prompt_ids)
    game = prompt.split("shelf ")[1][0]  # the game the message is from ...
    assert f"act in this order: step 1: go to shelf {game}, step 2: take mug 1" in prompt  # ... its plan
    assert "## Episode-Level Skill" in prompt
    target = tokenizer.decode(example.target_ids)
    assert f"turn {target[-10]}" in prompt  # the step's own response
  assert stage1.bc_examples(tokenizer, demos, skill_fraction=0.5,
                            task_line_pattern="Your task is to:", seed=3) == half  # seeded
  assert len(stage1.bc_examples(tokenizer, demos, skill_fraction=1.0,
                                task_line_pattern="Your")) == 16


def test_sft_rows_too_short_for_the_analyzer_prompt_are_refused(tokenizer):
  records, _ = _annotate(tokenizer, [_traj("long", num_steps=40, won=False)])
  examples = stage1.sft_examples(tokenizer, records, BUDGET)
  stage1.check_rows_hold_prompts(examples, max_tokens=BUDGET + 128)
  with pytest.raises(ValueError, match="raise sft.max_tokens to at least"):
    stage1.check_rows_hold_prompts(examples, max_tokens=BUDGET)


def test_stage_1_rehearses_behaviour_cloning_examples_beside_the_analyzers(tiny_model,
                                                                           tmp_path):
  """`sft.rehearsal = r`: stage 1's SFT trains on r behaviour-cloning examples (the warm
  start's, a seeded choice) per analyzer example, after them in the example list."""
  from seed_jax.train.trainer import Trainer  # pylint: disable=import-outside-toplevel
  from tests.train.conftest import tiny_spec  # pylint: disable=import-outside-toplevel
  spec = tiny_spec(tiny_model, "seed", **{"sft.rehearsal": 2.0, "bc.episodes": 2,
                                          "sft.holdout_fraction": 0.0,
                                          "env.max_steps": 2, "sft.max_turns": 2})
  trainer = Trainer(spec, str(tmp_path))
  try:
    trained = []
    trainer._fine_tune = lambda examples, *_, **__: trained.extend(examples)  # pylint: disable=protected-access
    trainer.stage1()
    _, cloning = trainer.behaviour_cloning_examples(2, spec.stage1.rehearsal_skill_fraction)
    chosen_again = trainer.rehearsal_examples(4)
  finally:
    trainer.close()
  analyzer_examples = len(trained) // 3
  assert analyzer_examples == 2  # two oracle-labelled trajectories (sft.tasks_per_type)
  cloned = {(tuple(e.prompt_ids), tuple(e.target_ids)) for e in cloning}
  rehearsed = trained[analyzer_examples:]
  assert len(rehearsed) == 2 * analyzer_examples
  assert all((tuple(e.prompt_ids), tuple(e.target_ids)) in cloned for e in rehearsed)
  assert not any((tuple(e.prompt_ids), tuple(e.target_ids)) in cloned
                 for e in trained[:analyzer_examples])
  assert [e.prompt_ids for e in chosen_again] == [e.prompt_ids for e in rehearsed]


def test_the_warm_start_clones_games_played_with_its_own_env_settings(tiny_model, tmp_path):
  """`bc.env_settings`: the warm start clones puzzles of 2 moves while the run's own are of
  5-6, and stage 1 rehearses the examples of those same cloned games."""
  from seed_jax.train.trainer import Trainer  # pylint: disable=import-outside-toplevel
  from tests.train.conftest import tiny_spec  # pylint: disable=import-outside-toplevel
  spec = tiny_spec(tiny_model, "seed", **{
      "bc.episodes": 3, "env.min_solution_steps": 5, "env.max_solution_steps": 6,
      "env.max_steps": 8,
      "bc.env_settings": {"min_solution_steps": 2, "max_solution_steps": 2}})
  trainer = Trainer(spec, str(tmp_path))
  try:
    demos, examples = trainer.behaviour_cloning_examples()
    runs_own, _ = trainer.behaviour_cloning_examples(env_settings={})
    rehearsed = trainer.rehearsal_examples(len(examples))
  finally:
    trainer.close()
  assert [(len(d.actions), d.won) for d in demos] == [(2, True)] * 3
  assert [d.task_id for d in demos] == [d.task_id for d in runs_own]  # the same seeds
  assert all(len(d.actions) in (5, 6) and d.won for d in runs_own)
  pairs = lambda chosen: sorted((tuple(e.prompt_ids), tuple(e.target_ids)) for e in chosen)
  assert pairs(rehearsed) == pairs(examples)
