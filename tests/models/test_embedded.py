"""The embedded SmolLM2-135M-Instruct: real weights, a sensible answer, its chat template."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from seed_jax.models import load_model
from tests.models.test_parity import our_logits

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm():
  return load_model("smollm2-135m-instruct")


def greedy(model, tokenizer, text, steps):
  ids = tokenizer.encode(text)
  for _ in range(steps):
    logits = our_logits(model, np.asarray([ids]), np.ones((1, len(ids))))
    ids.append(int(logits[0, -1].argmax()))
  return tokenizer.decode(ids)


def test_config_is_smollm2_135m(smollm):
  cfg = smollm[0].cfg
  assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads) == (30, 576, 9, 3)
  assert cfg.vocab_size == 49152 and cfg.tie_word_embeddings and cfg.rope_theta == 100000.0


def test_greedy_continuation_knows_paris(smollm):
  assert "Paris" in greedy(*smollm, "The capital of France is", steps=3)


def test_chat_template_round_trips(smollm):
  _, tokenizer = smollm
  messages = [{"role": "system", "content": "You are an agent."},
              {"role": "user", "content": "Go to the kitchen.\nThen <think> carefully."}]
  prompt = tokenizer.apply_chat_template(messages)
  assert prompt == ("<|im_start|>system\nYou are an agent.<|im_end|>\n<|im_start|>user\n"
                    "Go to the kitchen.\nThen <think> carefully.<|im_end|>\n"
                    "<|im_start|>assistant\n")
  ids = tokenizer.encode(prompt)
  assert ids[0] == 1 and ids.count(2) == 2  # <|im_start|> and two <|im_end|>, special ids
  assert tokenizer.decode(ids) == prompt
  assert tokenizer.eos_ids == (2,) and tokenizer.pad_id == 2


def test_matches_transformers_on_the_same_weights(smollm):
  from tests.models.conftest import hf_logits
  from seed_jax.models import resolve_model_path
  model, tokenizer = smollm
  tokens = np.asarray([tokenizer.encode("The capital of France is Paris. It is")])
  ours = our_logits(model, tokens, np.ones_like(tokens))
  ref = hf_logits(resolve_model_path("smollm2-135m-instruct"), tokens)
  assert np.abs(ours - ref).max() < 1e-3 and (ours.argmax(-1) == ref.argmax(-1)).all()
