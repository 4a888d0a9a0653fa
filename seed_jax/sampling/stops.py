"""Stop strings: an exact on-device detector and the host-side truncation.

A stop string such as `</action>` can be written by the model with many tokenizations
(`</`,`action`,`>` or `<`,`/`,`action>` or one token `>\\n</action>` ...). Instead of
enumerating token sequences, we lift a character automaton to tokens:

* States are the prefixes of the stop strings (a trie; state 0 is the empty prefix). After
  each generated character the state is the longest suffix of the generated text that is a
  prefix of some stop string (Aho-Corasick / KMP), or MATCH once a stop string occurred.
* Running each vocabulary token's text through that automaton from every state gives a
  table `[num_states, V]`; on device one gather per step, `state = table[state, token]`,
  tracks every row exactly, whatever tokenization the model chose, including a stop string
  inside one token or spread over several. MATCH is absorbing.

Only generated text is matched (the automaton starts empty after the prompt). The table is
exact for tokenizers whose decoded text is the concatenation of per-token texts (byte-level
BPE for ASCII stop strings); as a backstop the host always searches the decoded text and
truncates at the first occurrence (`truncate_at_stop`), keeping the stop string itself in
both text and tokens since the env parser needs `</action>`.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

_STATE_ROW_BUCKET = 32  # table rows are padded to a multiple of this, so few shapes compile


def _char_automaton(stop_strings: Sequence[str]) -> tuple[dict[str, int], np.ndarray, int]:
  """Character-level automaton.

  Returns:
    (char -> class id (0 is "any other character"), transitions `[num_states + 1, C]`
    int32 whose last row is the absorbing MATCH state, the MATCH state id).
  """
  prefixes = sorted({s[:i] for s in stop_strings for i in range(len(s))}, key=len)
  state_of = {p: i for i, p in enumerate(prefixes)}  # "" is state 0
  match = len(prefixes)
  alphabet = sorted({c for s in stop_strings for c in s})
  char_class = {c: i + 1 for i, c in enumerate(alphabet)}
  table = np.zeros((match + 1, len(alphabet) + 1), np.int32)
  table[match, :] = match
  for prefix, state in state_of.items():
    for char, cls in char_class.items():
      text = prefix + char
      if any(text.endswith(s) for s in stop_strings):
        table[state, cls] = match
        continue
      for start in range(len(text) + 1):  # longest suffix that is a known prefix
        if text[start:] in state_of:
          table[state, cls] = state_of[text[start:]]
          break
    # class 0 (a character in no stop string) leads back to the empty prefix: zeros.
  return char_class, table, match


def build_stop_table(stop_strings: Sequence[str], token_texts: Sequence[str]
                     ) -> tuple[np.ndarray, int]:
  """Token-level stop automaton.

  Args:
    stop_strings: non-empty strings.
    token_texts: the text of every vocabulary id (index = token id), length V.
  Returns:
    (table int32 `[R, V]`, match_state): `table[state, token]` is the next state;
    `match_state` means a stop string has occurred. R is padded to a multiple of 32.
  """
  if not stop_strings or any(not s for s in stop_strings):
    raise ValueError(f"stop strings must be non-empty, got {list(stop_strings)!r}")
  char_class, char_table, match = _char_automaton(stop_strings)
  num_states = match + 1
  vocab = len(token_texts)
  lengths = np.array([len(t) for t in token_texts], np.int64)
  max_len = int(lengths.max(initial=0))
  classes = np.zeros((vocab, max(max_len, 1)), np.int32)
  for token_id, text in enumerate(token_texts):
    if text:
      classes[token_id, :len(text)] = [char_class.get(c, 0) for c in text]
  # Walk every token from every state; only tokens still "inside" their text move.
  order = np.argsort(-lengths, kind="stable")  # longest first: active tokens are a prefix
  sorted_lengths = lengths[order]
  state = np.broadcast_to(np.arange(num_states, dtype=np.int32)[:, None],
                          (num_states, vocab)).copy()
  state_sorted = state[:, order]
  classes_sorted = classes[order]
  for j in range(max_len):
    active = int(np.searchsorted(-sorted_lengths, -j, side="left"))  # count with len > j
    if active == 0:
      break
    current = state_sorted[:, :active]
    state_sorted[:, :active] = char_table[current, classes_sorted[None, :active, j]]
  table = np.empty_like(state)
  table[:, order] = state_sorted
  rows = -(-num_states // _STATE_ROW_BUCKET) * _STATE_ROW_BUCKET
  padded = np.zeros((rows, vocab), np.int32)
  padded[:num_states] = table
  return padded, match


def no_stop_table(vocab: int) -> tuple[np.ndarray, int]:
  """A table that never matches (one state, MATCH id 1 unreachable)."""
  return np.zeros((1, vocab), np.int32), 1


def token_texts_of(tokenizer, vocab_size: int) -> list[str]:
  """The text of every token id (empty beyond the tokenizer's vocabulary), as the
  sampler's output texts show it: special tokens have none, so the device's stop-string
  automaton and the host's truncation see the same stream.

  Uses the underlying transformers tokenizer's batched decode when there is one (fast),
  else `tokenizer.decode([id])` per id.
  """
  hf = getattr(tokenizer, "hf", None)
  size = min(vocab_size, len(hf) if hf is not None else vocab_size)
  ids = [[i] for i in range(size)]
  if hf is not None:
    texts = hf.batch_decode(ids, skip_special_tokens=True,
                            clean_up_tokenization_spaces=False)
  else:
    texts = [tokenizer.decode(i, skip_special_tokens=True) for i in ids]
  return list(texts) + [""] * (vocab_size - size)


def find_first_stop(text: str, stop_strings: Sequence[str]) -> int:
  """The end index of the earliest-ending stop string occurrence in `text`, or -1."""
  ends = [text.find(s) + len(s) for s in stop_strings if s and s in text]
  return min(ends) if ends else -1


def truncate_at_stop(tokens: list[int], decode: Callable[[list[int]], str],
                     stop_strings: Sequence[str]) -> tuple[list[int], str, bool]:
  """Cuts a row after the first stop string (kept in both tokens and text).

  Args:
    tokens: the generated ids of one row. decode: ids -> text.
  Returns:
    (tokens up to and including the token that completes the first stop string, the text
    up to and including that stop string, whether a stop string was found). Without one,
    (tokens, decode(tokens), False).
  """
  text = decode(tokens)
  if not stop_strings or find_first_stop(text, stop_strings) < 0:
    return tokens, text, False
  # The shortest prefix whose text holds a stop string (monotone in the prefix length).
  lo, hi = 1, len(tokens)
  while lo < hi:
    mid = (lo + hi) // 2
    if find_first_stop(decode(tokens[:mid]), stop_strings) >= 0:
      hi = mid
    else:
      lo = mid + 1
  kept = tokens[:lo]
  kept_text = decode(kept)
  return kept, kept_text[:find_first_stop(kept_text, stop_strings)], True
