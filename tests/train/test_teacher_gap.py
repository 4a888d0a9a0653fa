"""The teacher-gap command: every figure for every skill source, on a tiny random model in
Sokoban (4 admissible actions a step, an expert), and its one-line refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from seed_jax.experiments import teacher_gap
from tests.train.conftest import tiny_spec

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def result(tiny_model, tmp_path_factory):
  from seed_jax.train.trainer import Trainer  # pylint: disable=import-outside-toplevel
  spec = tiny_spec(tiny_model, "seed", **{"env.max_steps": 2, "skill_placement": "end"})
  trainer = Trainer(spec, str(tmp_path_factory.mktemp("gap")))
  try:
    yield teacher_gap.measure(trainer, "valid_seen", episodes=2, seed=1, log=lambda _: None)
  finally:
    trainer.close()


def test_every_source_has_success_and_the_decision_probability(result):
  assert result["tasks"] == 2 and result["placement"] == "end"
  assert result["decision_points"] > 0  # Sokoban lists its 4 moves at every expert step
  for source in teacher_gap.SOURCES:
    entry = result[source]
    assert 0.0 <= entry["success"] <= 1.0
    assert 0.0 < entry["p_expert"] < 1.0
  # A random model gives each of 4 candidates some share; the mean is not 0 or 1.
  assert result["content_score"] == pytest.approx(
      result["oracle"]["p_expert"] - result["wrong"]["p_expert"])
  for source in teacher_gap.SKILL_SOURCES:
    entry = result[source]
    assert entry["decision_gap"] == pytest.approx(entry["p_expert"]
                                                  - result["plain"]["p_expert"])
    assert entry["acting_gap"] == pytest.approx(entry["success"] - result["plain"]["success"])
    assert 0.0 <= entry["raised"] <= 1.0
  assert result["oracle"]["skills"] == result["empty"]["skills"] == 2
  assert 0.0 <= result["policy"]["parse_rate"] <= 1.0
  json.dumps(result)  # the --json file


def test_the_token_gap_splits_the_action_span_from_the_rest(result):
  gap = result["oracle"]["token_gap"]
  # Every plain episode's tokens are scored with the oracle skill (each task has one).
  assert gap["action_tokens"] + gap["rest_tokens"] > 0
  # The decision (where a response first names its action) lies within its action block
  # or before it, in the rest: never more tokens than both hold.
  assert 0 <= gap["decision_tokens"] <= gap["action_tokens"] + gap["rest_tokens"]
  for part in ("action_", "rest_", "decision_"):
    if gap[f"{part}tokens"]:
      assert gap[f"{part}delta_q10"] <= gap[f"{part}delta_q50"] <= gap[f"{part}delta_q90"]
  assert "gate<0.4" in teacher_gap.format_table(result)
  assert result["update"] is None and "OPD term's share" not in teacher_gap.format_table(result)
  with_update = {**result, "update": {"lambda_opd": 0.01, "mini_batches": 3, "opd_only": 1,
                                      "opd_share": 0.004, "opd_norm": 0.002,
                                      "outcome_norm": 0.5, "cosine": None,
                                      "opd_norm_per_lambda": 0.2}}
  assert ("3 mini-batches, 1 of them OPD alone): |G_opd| / |G_outcome| 0.0040"
          in teacher_gap.format_table(with_update))
  assert "Where OPD pulls" not in teacher_gap.format_table(with_update)
  with_update["update"].update({"decision_share": 0.25, "decision_token_share": 0.056,
                                "opd_decision_norm": 0.0005, "opd_rest_norm": 0.0018})
  assert ("the decision tokens (5.6% of its tokens) carry |G_decision| / |G_opd| 0.250"
          in teacher_gap.format_table(with_update))


def test_the_decision_part_alone_plays_no_episode(tiny_model, tmp_path):
  from seed_jax.train.trainer import Trainer  # pylint: disable=import-outside-toplevel
  trainer = Trainer(tiny_spec(tiny_model, "seed", **{"env.max_steps": 2}), str(tmp_path))
  try:
    result = teacher_gap.measure(trainer, "valid_seen", episodes=2, parts=("decision",),
                                 log=lambda _: None)
  finally:
    trainer.close()
  assert result["plain"]["success"] is None and result["oracle"]["p_expert"] is not None
  assert result["policy"]["p_expert"] is None  # its skills come from the plain episodes
  assert "acting" not in result["seconds"] and "token_gap" not in result["oracle"]
  assert "| policy | 0 | - |" in teacher_gap.format_table(result)


def _episode(task_id: str, traj_id: str, won: bool):
  from seed_jax.seed.batch import StepRecord, Trajectory  # pylint: disable=import-outside-toplevel
  step = StepRecord([1], [2], [-0.1], True, observation="A board.",
                    response_text="<action>left</action>")
  return Trajectory(task_id=task_id, group_id=f"gap:{task_id}", traj_id=traj_id, won=won,
                    episode_reward=float(won), steps=[step], task="push the box")


@pytest.mark.parametrize("group_hindsight", [False, True])
def test_the_policy_source_is_the_plain_episodes_own_skill_or_its_won_siblings(
    tokenizer, group_hindsight):
  import dataclasses  # pylint: disable=import-outside-toplevel
  import types  # pylint: disable=import-outside-toplevel
  from seed_jax.seed import analyzer  # pylint: disable=import-outside-toplevel
  # Task a: the plain episode failed, its second sibling won. Task b: all failed.
  trajs = [_episode("a", "p0", False), _episode("b", "p1", False),
           _episode("a", "s0", False), _episode("b", "s1", False), _episode("a", "s2", True)]
  texts = {"p0": "a failed plan", "p1": "b failed plan", "s0": "another failed plan",
           "s1": "yet another failed plan", "s2": "the winning plan"}
  skills = [json.dumps({"episode_summary": "x", "episode_skill": f"{texts[t.traj_id]} is "
                        "written here"}) for t in trajs]
  trainer = types.SimpleNamespace(
      spec=types.SimpleNamespace(
          analyzer=dataclasses.replace(analyzer.AnalyzerConfig(),
                                       group_hindsight=group_hindsight),
          analyzer_max_prompt_tokens=2048),
      tokenizer=tokenizer, policy_generate=lambda ids, **_: skills[:len(ids)])
  by_task, parse_rate, from_sibling = teacher_gap.policy_skills(trainer, trajs, seed=0)
  assert parse_rate == 1.0 and from_sibling == int(group_hindsight)
  assert by_task["b"] == "b failed plan is written here"  # no win in its group: its own
  assert by_task["a"] == ("the winning plan is written here" if group_hindsight
                          else "a failed plan is written here")


def test_skills_and_controls_per_task():
  from seed_jax.train.expert import Demonstration  # pylint: disable=import-outside-toplevel
  demos = [Demonstration(f"t{i}", "push", f"goal {i}", [], [], [f"a{i}", "b"], True)
           for i in range(3)]
  skills = teacher_gap.oracle_and_control_skills(demos)
  assert skills["wrong"] == {"t0": skills["oracle"]["t1"], "t1": skills["oracle"]["t2"],
                             "t2": skills["oracle"]["t0"]}
  assert set(skills["empty"].values()) == {""}
  alone = teacher_gap.oracle_and_control_skills(demos[:1])
  assert alone["wrong"] == {"t0": None}  # no other task: acts plain


def test_decision_probability_is_the_expert_candidates_softmax_share(tiny_model):
  """Against a hand computation: each candidate's response scored as a whole row."""
  # pylint: disable=import-outside-toplevel
  from flax import nnx
  from seed_jax.envs.sokoban.prompt import SokobanFormat
  from seed_jax.models import load_model
  from seed_jax.models.tokenizer import chat_prompt_ids
  from seed_jax.seed.continuations import make_continuation_fn
  from seed_jax.seed.train_step import make_score_fn
  model, tokenizer = load_model(tiny_model)
  graphdef, params = nnx.split(model, nnx.Param)
  fmt = SokobanFormat()
  point = teacher_gap.DecisionPoint("t", "Your task is to: push\nWhere next?",
                                    ("up", "down", "left"), expert=2)
  got = teacher_gap.decision_probabilities(make_continuation_fn(graphdef), params, tokenizer,
                                           fmt, [point], None, "task_line", tokenizer.pad_id)
  prompt = chat_prompt_ids(tokenizer, point.message)
  score = make_score_fn(graphdef)
  sums = []
  for action in point.candidates:
    response = tokenizer.encode(fmt.render_response(action))
    row = np.asarray([prompt + response], np.int32)
    lp = np.asarray(score(params, {"tokens": row, "mask": np.ones_like(row, bool)},
                          len(response)), np.float64)
    sums.append(lp.sum())
  # log p(expert) = its sum minus log sum exp of all sums (random weights: sums near -100,
  # so compared in logs).
  log_want = sums[2] - np.logaddexp.reduce(sums)
  np.testing.assert_allclose(np.log(got), [log_want], atol=1e-3)


def _command(*args):
  return subprocess.run([sys.executable, "-m", "seed_jax.teacher_gap", *args], cwd=REPO,
                        capture_output=True, text=True, timeout=900, check=False)


@pytest.mark.parametrize("args,named", [
    (["--split=test"], "--split=test"),
    (["--episodes=-1"], "--episodes=-1"),
    (["--placement=middle"], "--placement=middle"),
    (["--init=/nonexistent/run"], "--init"),
    (["--json=/nonexistent/dir/gap.json"], "--json="),
    (["--parts=decision,speed"], "--parts=decision,speed"),
])
def test_bad_arguments_fail_in_one_line_naming_them(args, named):
  proc = _command("--config=configs/sokoban.py:cpu", *args)
  assert proc.returncode == 2, proc.stderr
  assert named in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_the_command_prints_the_table_and_writes_the_json(tiny_model, tmp_path):
  out = tmp_path / "gap.json"
  proc = _command("--config=configs/sokoban.py:cpu", f"--config.model.name={tiny_model}",
                  "--config.env.max_steps=2", "--config.rollout.max_new_tokens=8",
                  "--config.analyzer.max_new_tokens=8", "--split=valid_seen", "--episodes=2",
                  f"--json={out}")
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "content score" in proc.stdout and "| oracle |" in proc.stdout
  written = json.loads(out.read_text())
  assert set(teacher_gap.SOURCES) <= set(written) and "content_score" in written
  assert all("success" in written[s] and "p_expert" in written[s] for s in teacher_gap.SOURCES)
