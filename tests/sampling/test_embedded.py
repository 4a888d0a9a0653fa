"""The sampler on the real embedded SmolLM2-135M (float32): transformers' greedy tokens,
training-forward log-probs and a stop string through the real tokenizer's vocabulary."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from seed_jax.sampling import Sampler, SamplingParams
from seed_jax.seed.logprobs import response_logprobs

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def real():
  from seed_jax.models.loader import load_model  # pylint: disable=import-outside-toplevel
  model, tokenizer = load_model("smollm2-135m-instruct", dtype="float32")
  return model, tokenizer, Sampler.from_model(model, tokenizer=tokenizer, max_cache_len=256)


def test_greedy_logprobs_and_stop_string_on_the_embedded_model(real):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  from seed_jax.models.embedded import embedded_model_dir  # pylint: disable=import-outside-toplevel
  model, tokenizer, sampler = real
  prompt = tokenizer.encode(tokenizer.apply_chat_template(
      [{"role": "user", "content": "Name three colours of the rainbow."}]))
  sampling = SamplingParams(max_new_tokens=20, temperature=0.0, ignore_eos=True)
  out = sampler.generate([prompt], sampling)
  tokens = out.tokens[0]

  hf = transformers.AutoModelForCausalLM.from_pretrained(embedded_model_dir(),
                                                         dtype=torch.float32).eval()
  with torch.no_grad():
    expected = hf.generate(torch.tensor([prompt]), max_new_tokens=20, min_new_tokens=20,
                           do_sample=False, pad_token_id=0)[0, len(prompt):].tolist()
  assert tokens == expected

  ids = jnp.asarray([prompt + tokens])
  lp, _ = response_logprobs(model, ids, jnp.ones_like(ids, bool), len(tokens))
  np.testing.assert_allclose(out.logprobs[0], np.asarray(lp[0]), atol=1e-4)

  # A stop string made of the text of tokens 6-7 (it may merge differently when encoded
  # alone; the device automaton works on characters, so it must still stop there).
  stop = tokenizer.decode(tokens[6:8]).strip()
  cut = tokenizer.decode(tokens).find(stop) + len(stop)
  stopped = sampler.generate([prompt], SamplingParams(
      max_new_tokens=20, temperature=0.0, ignore_eos=True, stop_strings=(stop,)))
  assert stopped.stop_reasons == ["stop_string"]
  assert stopped.texts[0] == tokenizer.decode(tokens)[:cut]
  assert stopped.tokens[0] == tokens[:len(stopped.tokens[0])]
