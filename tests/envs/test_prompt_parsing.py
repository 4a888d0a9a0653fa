"""The shared response parsing of the formats: the verl-agent
`<think>...</think><action>...</action>` convention, and the history window of prompts."""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from seed_jax.envs.agent_format import (INVALID_ACTION, ParsedAction, Turn, has_chinese,
                                        history_window, parse_action,
                                        render_think_action)


def test_well_formed_response_yields_the_lower_cased_action():
  parsed = parse_action("<think>The apple is in the fridge.</think>\n<action> Go to Fridge 1 </action>")
  assert parsed == ParsedAction(action="go to fridge 1", valid=True)


def test_action_text_is_whitespace_normalised():
  parsed = parse_action("<think>x</think><action>take  apple 1\nfrom countertop 2</action>")
  assert parsed.action == "take apple 1 from countertop 2"


def test_first_action_block_wins():
  parsed = parse_action("<think>x</think><action>look</action><action>inventory</action>")
  assert parsed.action == "look" and parsed.valid


def test_stop_string_cut_off_by_the_sampler_is_tolerated():
  parsed = parse_action("<think>x</think><action>open fridge 1")
  assert parsed == ParsedAction(action="open fridge 1", valid=True)


def test_missing_think_block_is_invalid_unless_not_required():
  response = "<action>look</action>"
  assert parse_action(response) == ParsedAction(INVALID_ACTION, False, "missing <think>...</think> block")
  assert parse_action(response, require_think=False) == ParsedAction("look", True)


def test_unclosed_think_block_is_invalid():
  assert not parse_action("<think>hmm <action>look</action>").valid


def test_think_after_action_is_invalid():
  assert not parse_action("<action>look</action><think>x</think>").valid


def test_missing_action_tag_is_invalid():
  parsed = parse_action("<think>I should look.</think> look")
  assert parsed.action == INVALID_ACTION and not parsed.valid and "action" in parsed.reason


def test_empty_action_is_invalid():
  assert not parse_action("<think>x</think><action>   </action>").valid


def test_chinese_characters_make_the_response_invalid():
  parsed = parse_action("<think>我应该去冰箱</think><action>go to fridge 1</action>")
  assert not parsed.valid and "chinese" in parsed.reason


def test_non_string_input_is_invalid_not_an_error():
  assert not parse_action(None).valid  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_any_text_parses_without_raising(response):
  parsed = parse_action(response)
  assert isinstance(parsed.action, str) and parsed.action
  assert parsed.valid or parsed.action == INVALID_ACTION


_PIECES = st.sampled_from(["<think>", "</think>", "<action>", "</action>", "go to", " ", "\n", "冰", "x"])


@settings(max_examples=300, deadline=None)
@given(st.lists(_PIECES, max_size=12).map("".join))
def test_any_mix_of_tags_parses_without_raising(response):
  parsed = parse_action(response)
  if parsed.valid:
    assert "<think>" in response and "<action>" in response and "冰" not in response
    assert parsed.action == parsed.action.strip() and parsed.action


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_characters="<>", blacklist_categories=("Cs",)),
               min_size=1).filter(lambda text: " ".join(text.lower().split())))
def test_a_rendered_think_action_response_parses_back(action):
  assume(not has_chinese(action))  # rejected whatever the tags (tested above)
  parsed = parse_action(render_think_action("I should act.", action))
  assert parsed == ParsedAction(" ".join(action.lower().split()), True)


def test_history_window_keeps_the_last_turns_in_order_with_their_step_numbers():
  turns = [Turn(f"obs {i}", f"act {i}") for i in range(1, 6)]
  assert history_window(turns, 2) == [(4, turns[3]), (5, turns[4])]
  assert history_window(turns, 0) == []
  assert history_window(turns, 10) == list(enumerate(turns, start=1))
  assert history_window(turns, -1) == list(enumerate(turns, start=1))
