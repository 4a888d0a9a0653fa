"""Text in, text out over one model: `python -m seed_jax.generate`, `play --policy=model`."""

from __future__ import annotations

import dataclasses
from typing import Sequence

from seed_jax.models import DEFAULT_MODEL, Tokenizer, load_model
from seed_jax.sampling.sampler import Sampler, SamplingParams


@dataclasses.dataclass
class TextGenerator:
  """Text-level generation over one model: what `play --policy=model` and tools use."""

  sampler: Sampler
  tokenizer: Tokenizer

  def complete(self, prompts: Sequence[str], max_new_tokens: int, temperature: float,
               stop: tuple[str, ...] = (), seed: int = 0, top_p: float = 1.0) -> list[str]:
    """Plain-text continuations of `prompts` (no chat template)."""
    sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature,
                              top_p=top_p, stop_strings=tuple(stop))
    return self.sampler.generate_text(list(prompts), sampling, seed).texts

  def chat(self, user_messages: Sequence[str], max_new_tokens: int, temperature: float,
           stop: tuple[str, ...] = (), seed: int = 0, top_p: float = 1.0) -> list[str]:
    """One assistant reply per user message, through the chat template."""
    prompts = [self.tokenizer.apply_chat_template([{"role": "user", "content": m}])
               for m in user_messages]
    return self.complete(prompts, max_new_tokens, temperature, stop, seed, top_p)


def load_text_generator(model_name_or_path: str = DEFAULT_MODEL, dtype: str = "float32",
                        max_cache_len: int = 4096) -> TextGenerator:
  """Loads a model and its tokenizer behind a `TextGenerator`."""
  model, tokenizer = load_model(model_name_or_path, dtype=dtype)
  sampler = Sampler.from_model(model, tokenizer=tokenizer, max_cache_len=max_cache_len)
  return TextGenerator(sampler, tokenizer)
