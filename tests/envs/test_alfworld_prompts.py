"""The ALFWorld acting prompt follows the verl-agent layout; parsing goes through parse_action."""

from __future__ import annotations

from seed_jax.envs.alfworld.prompts import AlfWorldFormat
from seed_jax.envs.agent_format import AgentFormat, ParsedAction, Turn

ACTIONS = ["go to fridge 1", "help", "look"]


def test_first_step_shows_the_observation_and_actions_without_history():
  prompt = AlfWorldFormat().render("put a cool apple in countertop", [],
                                   "You are in the middle of a room.", ACTIONS, step=1)
  assert prompt.startswith("You are an expert agent operating in the ALFRED Embodied Environment.")
  assert "Your current observation is: You are in the middle of a room." in prompt
  assert "[Observation" not in prompt and "step(s)" not in prompt
  assert "Your admissible actions of the current situation are: ['go to fridge 1'\n 'look']." in prompt
  assert "'help'" not in prompt
  assert "<think> </think>" in prompt and "<action> </action>" in prompt


def test_later_steps_show_the_task_and_the_last_history_length_turns():
  history = [Turn(f"obs {i}", f"act {i}") for i in range(1, 6)]
  prompt = AlfWorldFormat(history_length=2).render(
      "put a cool apple in countertop", history, "You arrive at fridge 1.", ACTIONS, step=6)
  assert "Your task is to: put a cool apple in countertop" in prompt
  assert "already taken 5 step(s)" in prompt and "most recent 2 observations" in prompt
  assert ("[Observation 4: 'obs 4', Action 4: 'act 4']\n"
          "[Observation 5: 'obs 5', Action 5: 'act 5']") in prompt
  assert "obs 3" not in prompt
  assert "You are now at step 6 and your current observation is: You arrive at fridge 1." in prompt


def test_format_parses_with_think_required_and_stops_at_the_action_tag():
  agent_format = AlfWorldFormat()
  assert isinstance(agent_format, AgentFormat)
  assert agent_format.stop_strings == ("</action>",)
  assert agent_format.parse("<think>go</think><action>Look</action>") == ParsedAction("look", True)
  assert not agent_format.parse("<action>look</action>").valid
