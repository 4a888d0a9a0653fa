"""Tiny random models and a toy tokenizer for the sampler tests."""

from __future__ import annotations

import numpy as np
import pytest
from flax import nnx

from seed_jax.models import ModelConfig, Transformer

PAD, BOS, EOS = 0, 1, 2
# An untied head: with tied random embeddings a tiny model just repeats its last token.
TINY = ModelConfig.tiny(tie_word_embeddings=False)


class ToyTokenizer:
  """Vocabulary of short strings over a small alphabet, so that multi-character stop
  strings show up often and across token boundaries. Ids 0-2 are special (no text)."""

  def __init__(self, vocab_size: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    alphabet = list("ab</>x ")
    self.texts = ["<pad>", "<s>", "</s>"] + [
        "".join(rng.choice(alphabet, size=rng.integers(1, 4))) for _ in range(vocab_size - 3)]
    self.eos_ids = (EOS,)
    self.pad_id = PAD

  def encode(self, text: str) -> list[int]:  # greedy longest match (only for round trips)
    ids, i = [], 0
    by_text = {t: k for k, t in reversed(list(enumerate(self.texts))) if k > 2}
    while i < len(text):
      for n in (3, 2, 1):
        if text[i:i + n] in by_text:
          ids.append(by_text[text[i:i + n]])
          i += n
          break
      else:
        raise ValueError(f"cannot encode {text[i]!r}")
    return ids

  def decode(self, ids, skip_special_tokens: bool = False) -> str:
    return "".join(self.texts[i] for i in ids if not (skip_special_tokens and i < 3))


@pytest.fixture(scope="session")
def tiny_model():
  return Transformer(TINY, rngs=nnx.Rngs(0))


@pytest.fixture(scope="session")
def toy_tokenizer():
  return ToyTokenizer(TINY.vocab_size)
