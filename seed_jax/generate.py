"""Generate a completion from a model: the first thing to run to check a checkpoint.

  python -m seed_jax.generate --model=smollm2-135m-instruct \
      --prompt="The capital of France is" [--chat] [--max_new_tokens=32] [--temperature=0]

`--model` is an embedded model name, a local HF folder (e.g. an exported policy) or a
`.gguf` file. Generation runs through the project's KV-cache sampler.
"""

from __future__ import annotations

from seed_jax import cli

if __name__ == "__main__":  # a command, not an import: before jax and transformers load
  cli.quiet_startup()

# pylint: disable=wrong-import-position
import sys
from typing import Sequence

from absl import app, flags

from seed_jax.models import DEFAULT_MODEL
from seed_jax.sampling import SamplingParams, sampler_for

_MODEL = flags.DEFINE_string("model", DEFAULT_MODEL, "embedded model name, HF folder or .gguf")
_PROMPT = flags.DEFINE_string("prompt", None, "prompt text")
_CHAT = flags.DEFINE_bool("chat", False, "wrap the prompt as a user message (chat template)")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 64, "tokens to generate at most")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "0 is greedy")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "nucleus sampling mass")
_SEED = flags.DEFINE_integer("seed", 0, "PRNG seed")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "compute dtype")


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if _PROMPT.value is None:
    raise app.UsageError("--prompt is required")
  try:
    sampler = sampler_for(_MODEL.value, dtype=_DTYPE.value)
  except FileNotFoundError as e:  # a --model that is not there: the user's mistake
    raise app.UsageError(str(e)) from None
  sampling = SamplingParams(max_new_tokens=_MAX_NEW.value, temperature=_TEMPERATURE.value,
                            top_p=_TOP_P.value)
  prompt = [{"role": "user", "content": _PROMPT.value}] if _CHAT.value else _PROMPT.value
  text = sampler.generate_text([prompt], sampling, _SEED.value).texts[0]
  if not _CHAT.value:
    text = _PROMPT.value + text
  sys.stdout.write(text + "\n")


if __name__ == "__main__":
  cli.run(main)
