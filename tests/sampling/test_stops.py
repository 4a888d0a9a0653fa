"""The token-level stop automaton against plain string search, and host truncation."""

from __future__ import annotations

import numpy as np
import pytest

from seed_jax.sampling.stops import (build_stop_table, find_first_stop, token_texts_of,
                                     truncate_at_stop)
from tests.sampling.conftest import ToyTokenizer

STOPS = ("</a>", "ab", "x</")


def _walk(table, match, tokens):
  """Index of the token at which the automaton first reaches MATCH, or -1."""
  state = 0
  for i, t in enumerate(tokens):
    state = table[state, t]
    if state == match:
      return i
  return -1


def _first_stop_token(texts, tokens, stops):
  """Brute force: the first token after which the concatenated text holds a stop."""
  for i in range(len(tokens)):
    if find_first_stop("".join(texts[t] for t in tokens[:i + 1]), stops) >= 0:
      return i
  return -1


@pytest.mark.parametrize("stops", [STOPS, ("/a>",), ("a",), ("b>b>", "x x")])
def test_automaton_matches_string_search(stops):
  tok = ToyTokenizer(256)
  table, match = build_stop_table(stops, tok.texts)
  assert table.shape[0] % 32 == 0 and table.shape[1] == 256
  rng = np.random.default_rng(0)
  hits = 0
  for _ in range(400):
    tokens = rng.integers(0, 256, size=rng.integers(1, 60)).tolist()
    expected = _first_stop_token(tok.texts, tokens, stops)
    assert _walk(table, match, tokens) == expected, (tokens, stops)
    hits += expected >= 0
  assert hits >= 5  # the check really exercised matches


def test_stop_inside_one_token_and_across_tokens():
  texts = ["", "</action>", "</", "action", ">", "xx</act", "ion>yy", "q"]
  table, match = build_stop_table(("</action>",), texts)
  assert _walk(table, match, [7, 1]) == 1
  assert _walk(table, match, [2, 3, 4]) == 2
  assert _walk(table, match, [5, 6, 7]) == 1
  assert _walk(table, match, [2, 7, 3, 4]) == -1


def test_truncate_keeps_the_stop_string():
  texts = ["", "go", " north", "</act", "ion>", "more", "</action>"]
  decode = lambda ids: "".join(texts[i] for i in ids)
  tokens, text, found = truncate_at_stop([1, 2, 3, 4, 5, 6], decode, ("</action>",))
  assert (tokens, text, found) == ([1, 2, 3, 4], "go north</action>", True)
  tokens, text, found = truncate_at_stop([1, 5], decode, ("</action>",))
  assert (tokens, text, found) == ([1, 5], "gomore", False)
  # The text stops right after the stop string even when its last token runs on.
  texts[4] = "ion>tail"
  assert truncate_at_stop([3, 4, 5], decode, ("</action>",))[:2] == ([3, 4], "</action>")


def test_empty_stop_string_is_an_error():
  with pytest.raises(ValueError, match="non-empty"):
    build_stop_table(("",), ["a"])


def test_special_tokens_carry_no_text_for_the_stop_automaton():
  """The device matches stop strings on the text the host returns, which skips special
  tokens: a stop string never completes across one on the device alone."""
  tokenizer = ToyTokenizer(16)
  texts = token_texts_of(tokenizer, 16)
  assert texts[:3] == ["", "", ""]  # <pad>, <s>, </s>
  assert texts[3:] == tokenizer.texts[3:]
