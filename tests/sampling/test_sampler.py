"""End to end on a tiny random model: exactness, stops, fan-out, compile count, mesh."""

from __future__ import annotations

import dataclasses
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from seed_jax.models import ModelConfig
from seed_jax.sampling import Sampler, SamplingParams
from seed_jax.sampling import engine as engine_module
from seed_jax.sampling import sampler as sampler_module
from seed_jax.seed.logprobs import response_logprobs
from tests.sampling.conftest import EOS, PAD, TINY

PROMPTS = [[5, 6, 7], list(range(10, 19)), list(range(30, 47))]  # lengths 3, 9, 17


@pytest.fixture(scope="module")
def sampler(tiny_model, toy_tokenizer):
  graphdef, params = nnx.split(tiny_model)
  return Sampler(graphdef, params, TINY, tokenizer=toy_tokenizer, max_cache_len=256)


def _greedy_by_recompute(model, prompt, steps, width=96):
  """Greedy decoding by running the full forward (no cache) on the growing sequence."""
  graphdef, params = nnx.split(model)

  @jax.jit
  def last_logits(params, tokens, length):
    m = nnx.merge(graphdef, params)
    mask = (jnp.arange(width) < length)[None]
    hidden = m(tokens, jnp.arange(width)[None], mask)
    return m.unembed(hidden[0, length - 1])

  seq = list(prompt)
  for _ in range(steps):
    tokens = np.full((1, width), PAD, np.int32)
    tokens[0, :len(seq)] = seq
    seq.append(int(jnp.argmax(last_logits(params, tokens, len(seq)))))
  return seq[len(prompt):]


@pytest.mark.parametrize("prompts", [PROMPTS, PROMPTS + [list(range(50, 120))]],
                         ids=["short", "long"])  # long: prompt bucket 128, two prefill blocks
def test_greedy_with_cache_equals_full_recompute(sampler, tiny_model, prompts):
  out = sampler.generate(prompts, SamplingParams(max_new_tokens=12, temperature=0.0,
                                                 ignore_eos=True))
  assert out.lengths == [12] * len(prompts)
  assert out.stop_reasons == ["max_tokens"] * len(prompts)
  for prompt, tokens in zip(prompts, out.tokens):
    assert tokens == _greedy_by_recompute(tiny_model, prompt, 12)
  assert len(set(map(tuple, out.tokens))) == len(prompts)  # not a degenerate model


def _training_logprobs(model, prompts, out, num_samples):
  """Log-probs of the sampled tokens by the training forward (prompt ++ response rows)."""
  p_len = max(map(len, prompts))
  r_len = max(out.lengths)
  rows = len(out.tokens)
  tokens = np.full((rows, p_len + r_len), PAD, np.int32)
  mask = np.zeros_like(tokens, bool)
  for r, response in enumerate(out.tokens):
    prompt = prompts[r // num_samples]
    tokens[r, p_len - len(prompt):p_len] = prompt
    tokens[r, p_len:p_len + len(response)] = response
    mask[r, p_len - len(prompt):p_len + len(response)] = True
  logprobs, _ = response_logprobs(model, jnp.asarray(tokens), jnp.asarray(mask), r_len)
  return np.asarray(logprobs)


def test_logprobs_equal_the_training_forward(sampler, tiny_model):
  # top_k and temperature change what is drawn, never the recorded raw log-prob.
  sampling = SamplingParams(max_new_tokens=16, temperature=0.8, top_k=40, num_samples=2)
  out = sampler.generate(PROMPTS, sampling, seed=3)
  expected = _training_logprobs(tiny_model, PROMPTS, out, 2)
  for r, lp in enumerate(out.logprobs):
    assert lp.dtype == np.float32 and len(lp) == out.lengths[r]
    np.testing.assert_allclose(lp, expected[r, :len(lp)], atol=1e-4, rtol=0)


@pytest.fixture(scope="module")
def vision_token_lover():
  """A tiny vision-language model rigged to rank its vision tokens first at every step:
  the final norm keeps only hidden unit 0, and the head reads that unit as +-1000 for the
  image and video placeholders (whichever the sign, one of them leads by far)."""
  # pylint: disable=import-outside-toplevel
  from seed_jax.models.config import VisionConfig
  from seed_jax.models.vision_language import VisionLanguageModel
  cfg = ModelConfig.tiny(model_type="qwen2_5_vl", vision=VisionConfig.tiny(out_hidden_size=64),
                         mrope_section=(2, 3, 3), tie_word_embeddings=False,
                         image_token_id=250, video_token_id=251, vision_start_token_id=252,
                         vision_end_token_id=253)
  model = VisionLanguageModel(cfg, rngs=nnx.Rngs(0))
  model.text.final_norm.scale[...] = jnp.zeros((cfg.hidden_size,)).at[0].set(1.0)
  model.text.lm_head.kernel[...] = model.text.lm_head.kernel[...].at[250, 0].set(1000.0)
  model.text.lm_head.kernel[...] = model.text.lm_head.kernel[...].at[251, 0].set(-1000.0)
  return model


@pytest.mark.parametrize("sampling", [
    SamplingParams(max_new_tokens=12, temperature=0.0),
    SamplingParams(max_new_tokens=12, temperature=1.0, num_samples=4),
    SamplingParams(max_new_tokens=12, temperature=1.0, top_k=3, num_samples=4),
    SamplingParams(max_new_tokens=12, temperature=1.0, top_p=0.9, num_samples=4),
], ids=["greedy", "temperature", "top_k", "top_p"])
def test_a_vision_language_model_never_writes_its_vision_tokens(vision_token_lover, sampling):
  """The image placeholder in a response would read as one more image patch than the
  row's image has: the sampler never draws a vision token, while the recorded log-prob
  stays the raw one the training forward gives (so the PPO ratio is still 1)."""
  model = vision_token_lover
  sampler = Sampler.from_model(model, max_cache_len=64)
  out = sampler.generate(PROMPTS, dataclasses.replace(sampling, ignore_eos=True), seed=1)
  drawn = np.concatenate([np.asarray(t) for t in out.tokens])
  assert len(drawn) == 12 * len(out.tokens)
  assert not np.isin(drawn, [250, 251, 252, 253]).any()
  # What was drawn is improbable under the raw distribution: the rig holds the mass.
  assert np.median(np.concatenate(out.logprobs)) < -50
  expected = _training_logprobs(model, PROMPTS, out, sampling.num_samples)
  for r, lp in enumerate(out.logprobs):  # float32 over logits of +-1000: 1e-4 apart
    np.testing.assert_allclose(lp, expected[r, :len(lp)], atol=1e-3, rtol=1e-5)


def test_seed_reproduces_and_group_samples_differ(sampler):
  sampling = SamplingParams(max_new_tokens=16, temperature=1.0, top_p=0.9, num_samples=4)
  a = sampler.generate(PROMPTS[:2], sampling, seed=7)
  b = sampler.generate(PROMPTS[:2], sampling, seed=7)
  c = sampler.generate(PROMPTS[:2], sampling, seed=8)
  assert a.tokens == b.tokens and a.tokens != c.tokens
  assert a.prompt_index == [0, 0, 0, 0, 1, 1, 1, 1]
  assert len(set(map(tuple, a.tokens[:4]))) > 1  # the group's samples diverge


def test_group_fan_out_shares_the_prompt(sampler):
  single = sampler.generate(PROMPTS, SamplingParams(max_new_tokens=8, temperature=0.0))
  group = sampler.generate(PROMPTS, SamplingParams(max_new_tokens=8, temperature=0.0,
                                                   num_samples=3))
  assert len(group.tokens) == 9
  for r, tokens in enumerate(group.tokens):
    assert tokens == single.tokens[r // 3]
    np.testing.assert_allclose(group.logprobs[r], single.logprobs[r // 3], atol=1e-6)


def test_max_tokens_eos_and_stop_strings(sampler, toy_tokenizer, monkeypatch):
  free = sampler.generate(PROMPTS, SamplingParams(max_new_tokens=24, temperature=0.0,
                                                  ignore_eos=True))
  row = free.tokens[2]
  # An "eos" id that appears mid-row stops the row right there.
  eos_token = row[5]
  out = sampler.generate(PROMPTS[2:], SamplingParams(max_new_tokens=24, temperature=0.0,
                                                     stop_token_ids=(eos_token,),
                                                     ignore_eos=True))
  assert out.tokens[0] == row[:row.index(eos_token) + 1] and out.stop_reasons == ["eos"]
  # A stop string spanning a token boundary, taken from the free-running text.
  texts = [toy_tokenizer.decode([t], skip_special_tokens=True) for t in row]
  start = sum(map(len, texts[:6])) - 1
  stop = "".join(texts)[start:start + 2]
  text = "".join(texts)
  cut = text.find(stop) + len(stop)
  n_tokens = next(i + 1 for i in range(len(row)) if len("".join(texts[:i + 1])) >= cut)
  # The device alone must stop there: disable the host-side truncation.
  monkeypatch.setattr(sampler_module.stops, "truncate_at_stop",
                      lambda toks, decode, stops: (toks, decode(toks), False))
  sampling = SamplingParams(max_new_tokens=24, temperature=0.0, ignore_eos=True,
                            stop_strings=(stop, "never-seen"))
  out = sampler.generate(PROMPTS[2:], sampling)
  assert out.tokens[0] == row[:n_tokens] and out.stop_reasons == ["stop_string"]
  monkeypatch.undo()
  out = sampler.generate(PROMPTS, sampling)
  assert out.tokens[2] == row[:n_tokens] and out.texts[2] == text[:cut]
  assert out.texts[2].endswith(stop)
  assert out.lengths[0] == len(out.tokens[0]) == len(out.logprobs[0])


def test_chunked_prefill_matches_one_pass(sampler, monkeypatch):
  # 12 prompts of 60-71 tokens: batch bucket 16, prompt bucket 128, so 1024 // 128 = 8
  # prompts per prefill chunk (two chunks through lax.map).
  prompts = [list(range(3 + i, 63 + 2 * i)) for i in range(12)]
  sampling = SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True)
  chunked = sampler.generate(prompts, sampling)
  monkeypatch.setattr(sampler_module, "_PREFILL_TOKENS", 1 << 20)
  whole = sampler.generate(prompts, sampling)
  assert chunked.tokens == whole.tokens
  for a, b in zip(chunked.logprobs, whole.logprobs):
    np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.fixture
def traced_once_sampler(tiny_model, toy_tokenizer, monkeypatch):
  """A fresh sampler whose prefill and decode fail the test when jax traces either twice."""
  chex.clear_trace_counter()
  for name in ("prefill", "decode"):
    monkeypatch.setattr(engine_module, name,
                        chex.assert_max_traces(getattr(engine_module, name), n=1))
  graphdef, params = nnx.split(tiny_model)
  return Sampler(graphdef, params, TINY, tokenizer=toy_tokenizer, max_cache_len=256)


def test_one_compile_serves_every_call_within_the_buckets(traced_once_sampler):
  # Batches of 3-4 rows (bucket 4), prompts of 17-32 tokens (bucket 32), 5-8 new tokens
  # and any temperature: prefill and decode are each compiled once, on the first call.
  rng = np.random.default_rng(0)
  for i in range(12):
    batch = int(rng.integers(3, 5))
    prompts = [rng.integers(3, 256, size=int(rng.integers(17, 33))).tolist()
               for _ in range(batch)]
    sampling = SamplingParams(max_new_tokens=int(rng.integers(5, 9)),
                              temperature=float(rng.choice([0.0, 0.7, 1.0])))
    out = traced_once_sampler.generate(prompts, sampling, seed=i)
    assert len(out.tokens) == batch


def test_update_params_does_not_recompile(traced_once_sampler):
  sampling = SamplingParams(max_new_tokens=8, temperature=0.0)
  before = traced_once_sampler.generate(PROMPTS, sampling)
  traced_once_sampler.update_params(jax.tree.map(lambda x: x * 1.5, traced_once_sampler.params))
  after = traced_once_sampler.generate(PROMPTS, sampling)
  assert after.tokens != before.tokens


def test_a_prompt_over_half_the_cache_still_gets_its_token_budget(sampler, tiny_model):
  # 150 tokens round up to a 256 bucket, the whole cache; the bucket must shrink instead
  # of silently cutting the response to one token.
  prompt = [3 + i % 50 for i in range(150)]
  out = sampler.generate([prompt], SamplingParams(max_new_tokens=20, temperature=0.0,
                                                  ignore_eos=True))
  assert out.lengths == [20] and out.stop_reasons == ["max_tokens"]
  assert out.tokens[0] == _greedy_by_recompute(tiny_model, prompt, 20, width=192)


def test_prompt_longer_than_the_cache_is_an_error(sampler):
  with pytest.raises(ValueError, match="does not fit the cache"):
    sampler.generate([[3] * 257], SamplingParams(max_new_tokens=4))
  with pytest.raises(ValueError, match="at least one token"):
    sampler.generate([[]], SamplingParams())


def test_sharded_over_the_mesh_matches_one_device(sampler, tiny_model, toy_tokenizer, mesh):
  graphdef, params = nnx.split(tiny_model)
  sharded = Sampler(graphdef, params, TINY, tokenizer=toy_tokenizer, mesh=mesh,
                    max_cache_len=256)
  sampling = SamplingParams(max_new_tokens=8, temperature=0.0, num_samples=2)
  expected = sampler.generate(PROMPTS, sampling)
  got = sharded.generate(PROMPTS, sampling)
  assert got.tokens == expected.tokens
  for a, b in zip(got.logprobs, expected.logprobs):
    np.testing.assert_allclose(a, b, atol=1e-4)
  leaf = jax.tree.leaves(sharded.params)[0]
  assert len(leaf.sharding.device_set) == 8


def _v5e_sampler(cfg, max_cache_len: int) -> Sampler:
  """A sampler over v5e:2x2's four described chips (fsdp 4) with abstract weights: its
  programs compile for the TPU (libtpu) and are never run."""
  # pylint: disable=import-outside-toplevel
  from seed_jax.parallel.mesh import MeshConfig, make_mesh
  from seed_jax.planning import programs, targets
  mesh = make_mesh(MeshConfig(fsdp=4), devices=targets.topology_target("v5e:2x2").devices)
  graphdef, params = programs.abstract_params(cfg, mesh)
  return Sampler(graphdef, params, cfg, mesh=mesh, max_cache_len=max_cache_len)


@pytest.mark.parametrize("num_samples", [1, 4])
def test_the_tpu_fan_out_keeps_each_devices_cache_rows(num_samples):
  """The prefill compiled for v5e:2x2 (fsdp 4) moves no cache between devices: a device's
  prompts fan out into decode rows on that same device. A gather of the rows instead made
  XLA all-gather every layer's whole cache onto every chip (0.24 GiB a layer a chip for
  the embedded model's acting batch)."""
  import re  # pylint: disable=import-outside-toplevel
  sampler = _v5e_sampler(TINY, max_cache_len=128)
  request = sampler.lower(8, 64, SamplingParams(max_new_tokens=64, num_samples=num_samples))
  hlo = request.prefill.compile().as_text()
  kv_dims = f"{TINY.num_kv_heads},{request.shapes['cache_len']},{TINY.head_dim}]"
  collectives = re.findall(r"= \w+\[([\d,]+\])\S* (?:all-gather|all-to-all|collective-permute)"
                           r"(?:-start)?\(", hlo)
  assert collectives, "expected the weights' all-gathers"
  assert not [dims for dims in collectives if dims.endswith(kv_dims)]


@pytest.mark.slow
def test_the_tpu_prefill_holds_one_block_of_attention_scores_at_a_time():
  """One layer of the embedded model's shape, 16 prompts of 4,096 tokens, on v5e:2x2.
  Without an order between the attention forward's query blocks the TPU scheduler
  computed their scores side by side: 1.27 GiB of temporaries here instead of 0.10."""
  # pylint: disable=import-outside-toplevel
  import dataclasses
  from seed_jax.models.attention import query_block
  from seed_jax.models.shapes import model_config
  prompts, t = 16, 4096
  cfg = dataclasses.replace(model_config("smollm2-135m-instruct", dtype="bfloat16",
                                         param_dtype="float32"), num_layers=1)
  prefill = _v5e_sampler(cfg, max_cache_len=t + 512).lower(
      prompts, t, SamplingParams(max_new_tokens=512)).prefill
  temp = prefill.compile().memory_analysis().temp_size_in_bytes
  rows_per_chip = prompts // 4
  block_scores = rows_per_chip * cfg.num_heads * query_block(t) * t * 4  # 72 MiB
  assert temp < 4 * block_scores
