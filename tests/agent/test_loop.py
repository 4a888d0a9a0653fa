"""The one acting loop, on a fake env in an in-process pool and scripted policies (no model)."""

from __future__ import annotations

import pytest

from seed_jax.agent.loop import Decision, episode_stats, reset_seeds, run_episodes
from seed_jax.agent.policies import expert_policy
from seed_jax.envs.agent_format import INVALID_ACTION, Turn
from seed_jax.envs.pool import InProcessPool
from seed_jax.train.expert import collect_demonstrations
from tests.agent.fakes import LineFormat, LineWorld, line_task


def always(action: str, valid: bool = True):
  """A policy that answers every live episode with the same action."""
  def policy(episodes, turn):
    del turn
    return [Decision(action, valid) for _ in episodes]
  return policy


def pool_of(envs: list[LineWorld] | None = None) -> InProcessPool:
  """An in-process pool of LineWorlds: the given ones first, in row order."""
  supply = list(envs or [])
  return InProcessPool(lambda: supply.pop(0) if supply else LineWorld())


def test_the_turn_limit_ends_every_episode():
  tasks = [line_task(0, goal=3), line_task(1, goal=5)]
  episodes = run_episodes(pool_of(), tasks, always("back"), max_turns=4, seed=0)
  assert [len(e.steps) for e in episodes] == [4, 4]
  assert all(e.done and not e.won and not e.failed for e in episodes)
  assert episode_stats(episodes)["mean_turns"] == 4


def test_stats_count_valid_moves_that_changed_nothing_apart_from_invalid_ones():
  def back_then_garble(episodes, turn):  # back into the wall twice, then no action
    return [Decision("back") if turn < 2 else Decision("INVALID", valid=False)
            for _ in episodes]

  episodes = run_episodes(pool_of(), [line_task(0, goal=3)], back_then_garble, max_turns=4,
                          seed=0)
  stats = episode_stats(episodes)
  assert (stats["ineffective_actions"], stats["ineffective_action_rate"]) == (2, 0.5)
  assert (stats["invalid_actions"], stats["invalid_action_rate"]) == (2, 0.5)


def test_an_episode_ends_when_the_env_says_done_and_is_stepped_no_further():
  calls = []

  def forward(episodes, turn):
    calls.append((turn, [e.traj_id for e in episodes]))
    return [Decision("forward") for _ in episodes]

  tasks = [line_task(0, goal=1), line_task(1, goal=3)]
  episodes = run_episodes(pool_of(), tasks, forward, max_turns=10, seed=0)
  assert [len(e.steps) for e in episodes] == [1, 3]
  assert [e.won for e in episodes] == [True, True]
  assert calls == [(0, ["0.0", "1.0"]), (1, ["1.0"]), (2, ["1.0"])]  # only live episodes


def test_invalid_decisions_are_flagged_sent_as_the_no_op_and_counted():
  def sloppy(episodes, turn):
    # Turn 0: a response that broke the format; then walk.
    return [Decision(INVALID_ACTION, valid=False) if turn == 0 else Decision("forward")
            for _ in episodes]

  episodes = run_episodes(pool_of(), [line_task(0, goal=2)], sloppy, max_turns=5, seed=0)
  episode = episodes[0]
  assert [s.decision.valid for s in episode.steps] == [False, True, True]
  assert episode.history[0].action == INVALID_ACTION
  assert episode.steps[0].info["action_valid"] is False  # the env saw a no-op
  assert episode.steps[1].observation == "Nothing happens."
  assert episode.won
  stats = episode_stats(episodes)
  assert stats["invalid_actions"] == 1
  assert stats["invalid_action_rate"] == pytest.approx(1 / 3)


def test_a_crashing_env_ends_its_episode_and_the_others_play_on():
  tasks = [line_task(0, goal=3), line_task(1, goal=3, crash_at=2), line_task(2, goal=3),
           line_task(3, goal=3, crash_at=0)]
  episodes = run_episodes(pool_of(), tasks, always("forward"), max_turns=10, seed=0)
  ok, crashed, ok_too, dead_at_reset = episodes
  assert ok.won and ok_too.won and not ok.failed
  assert crashed.done and not crashed.won and "step crashed" in crashed.failed
  assert len(crashed.steps) == 2  # the step that crashed is kept, the episode stops
  assert dead_at_reset.done and "reset crashed" in dead_at_reset.failed
  assert dead_at_reset.steps == []
  stats = episode_stats(episodes)
  assert stats["failed_episodes"] == 2 and stats["success"] == 0.5


def test_a_decision_without_action_ends_the_episode_without_a_step():
  def stop_second(episodes, turn):
    return [Decision(None) if (turn == 1 and e.traj_id == "0.0") else Decision("forward")
            for e in episodes]

  tasks = [line_task(0, goal=5), line_task(1, goal=3)]
  episodes = run_episodes(pool_of(), tasks, stop_second, max_turns=10, seed=0)
  assert len(episodes[0].steps) == 1 and episodes[0].done and not episodes[0].failed
  assert episodes[1].won and len(episodes[1].steps) == 3


def test_groups_ids_and_reset_seeds():
  envs = [LineWorld() for _ in range(4)]
  tasks = [line_task(0, goal=1), line_task(1, goal=2)]
  episodes = run_episodes(pool_of(envs), tasks, always("forward"), max_turns=3, seed=7,
                          group_size=2, group_prefix="it3:")
  assert [e.group_id for e in episodes] == ["it3:0", "it3:0", "it3:1", "it3:1"]
  assert [e.traj_id for e in episodes] == ["it3:0.0", "it3:0.1", "it3:1.0", "it3:1.1"]
  assert [e.task.task_id for e in episodes] == ["line-0", "line-0", "line-1", "line-1"]
  assert [env.seeds[0] for env in envs] == reset_seeds(7, 4)
  assert len(set(reset_seeds(7, 4)) | set(reset_seeds(8, 4))) == 8


def test_stats_over_mixed_outcomes():
  tasks = [line_task(0, goal=1), line_task(1, goal=2), line_task(2, goal=9)]
  episodes = run_episodes(pool_of(), tasks, always("forward"), max_turns=3, seed=0)
  assert episode_stats(episodes) == {
      "episodes": 3, "steps": 1 + 2 + 3, "success": pytest.approx(2 / 3),
      "mean_return": pytest.approx(20 / 3), "invalid_actions": 0,
      "invalid_action_rate": 0.0, "ineffective_actions": 0, "ineffective_action_rate": 0.0,
      "failed_episodes": 0, "mean_turns": 2.0}


def test_on_step_sees_every_step_after_it_is_booked():
  seen = []
  run_episodes(pool_of(), [line_task(0, goal=2)], always("forward"), max_turns=5, seed=0,
               on_step=lambda episode, step: seen.append((len(episode.steps), step.reward)))
  assert seen == [(1, 0.0), (2, 10.0)]


def test_a_policy_answering_the_wrong_number_of_episodes_is_an_error():
  with pytest.raises(ValueError, match="decisions"):
    run_episodes(pool_of(), [line_task(0, goal=2)], lambda episodes, turn: [], max_turns=2,
                 seed=0)


def test_the_expert_wins_every_task_and_its_demonstrations_clone_through_the_format():
  fmt = LineFormat()
  tasks = [line_task(i, goal=i + 1) for i in range(3)]
  demos = collect_demonstrations(pool_of(), fmt, tasks, max_turns=5, seed=0)
  assert [d.won for d in demos] == [True, True, True]
  assert [d.actions for d in demos] == [["forward"] * (i + 1) for i in range(3)]
  demo = demos[2]
  assert demo.task_id == "line-2" and demo.task_type == "goal3"
  assert demo.instruction == "walk to 3"
  # The message of step 2 is what the format renders after one forward step.
  assert demo.messages[1] == fmt.render("walk to 3", [Turn("at 0", "forward")], "at 1",
                                        ["forward", "back"], step=2)
  for message, response in demo.cloning_pairs():
    assert message.startswith("Task: walk to 3")
    assert fmt.parse(response).action == "forward" and fmt.parse(response).valid


def test_the_expert_stops_where_the_env_offers_no_expert_action():
  pool = InProcessPool(lambda: LineWorld(with_expert=False))
  episodes = run_episodes(pool, [line_task(0, goal=2)], expert_policy(LineFormat()),
                          max_turns=5, seed=0)
  assert episodes[0].done and episodes[0].steps == [] and not episodes[0].won


# ----- the in-process pool the loop runs on for `play --workers=0` and these tests -----

def test_the_in_process_pool_keeps_the_env_pool_contract():
  pool = pool_of()
  resets = pool.reset([line_task(0, goal=1), line_task(1, goal=3)], [5, 6])
  assert [obs for obs, _ in resets] == ["at 0", "at 0"]
  assert all("elapsed_s" in info and "step_s" in info for _, info in resets)
  first = pool.step(["forward", "forward"])
  assert first[0].done and first[0].info["won"] and not first[1].done
  assert pool.step([None, "forward"])[0] is None  # a finished row is passed None
  with pytest.raises(ValueError, match="done"):
    pool.step(["forward", "forward"])
  with pytest.raises(ValueError, match="actions"):
    pool.step(["forward"])


def test_the_in_process_pool_fails_an_episode_whose_env_raises():
  pool = pool_of()
  resets = pool.reset([line_task(0, goal=3, crash_at=0), line_task(1, goal=3, crash_at=1)],
                      [0, 1])
  assert resets[0][0] == "" and "reset crashed" in resets[0][1]["failed"]
  result = pool.step([None, "forward"])[1]
  assert result.done and not result.info["won"] and "step crashed" in result.info["failed"]
