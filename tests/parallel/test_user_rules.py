"""A user's logical-axis rules (mesh.rules) govern every placement, not only weight import.

The rules below put the model dimension "embed" on the tensor axis instead of fsdp (and
the residual stream's "act_embed" there too), so a placement made with the default rules
is told apart from one made with the user's: the embedding table `("vocab", "embed")` is
`P("tensor", "fsdp")` by default and `P("tensor", None)` here (a mesh axis is used once
per array, and "vocab" claims tensor first).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from seed_jax.models import ModelConfig, random_model
from seed_jax.models.weights import ArraySource, load_params, params_to_hf_tensors
from seed_jax.parallel import DEFAULT_RULES, MeshConfig, constrain, in_mesh, make_mesh
from seed_jax.sampling import Sampler, SamplingParams
from seed_jax.seed import losses
from seed_jax.seed import train_step as ts
from seed_jax.seed.optim import OptimConfig

USER_RULES = tuple(dict(DEFAULT_RULES, embed="tensor", act_embed="tensor").items())
EMBED_SPEC = P("tensor", None)  # default rules: P("tensor", "fsdp")
CFG = ModelConfig.tiny(tie_word_embeddings=False)
OPTIM = OptimConfig(learning_rate=1e-2)


@pytest.fixture(scope="module")
def mesh():
  assert jax.device_count() == 8, "tests/conftest.py must force 8 fake CPU devices"
  return make_mesh(MeshConfig(data=2, fsdp=2, tensor=2, rules=USER_RULES))


@pytest.fixture(scope="module")
def model():
  return random_model(CFG)


def _spec(array) -> P:
  return array.sharding.spec


def test_imported_weights_follow_the_mesh_rules(mesh, model):
  source = ArraySource(params_to_hf_tensors(model), "in memory")
  loaded = load_params(CFG, source, mesh)  # no rules argument: they come with the mesh
  assert _spec(loaded.embed.get_value()) == EMBED_SPEC
  assert _spec(loaded.layers.attn.o_proj.kernel.get_value()) == P(None, "tensor", None)


def test_train_state_follows_the_mesh_rules(mesh, model):
  # Parameters not yet placed (one device): the state shardings come from the rules,
  # not from wherever the parameters happen to be.
  _, params = nnx.split(model, nnx.Param)
  shardings = ts.train_state_shardings(params, mesh, OPTIM)
  state = ts.init_train_state(params, OPTIM, shardings)
  adam = state.opt_state[1][0]  # chain(clip, adamw): adamw's ScaleByAdamState
  for tree in (state.params, adam.mu, adam.nu):
    assert _spec(tree["embed"].get_value()) == EMBED_SPEC
    assert _spec(tree["lm_head"]["kernel"].get_value()) == EMBED_SPEC


def test_sampler_places_parameters_by_the_mesh_rules(mesh, model):
  graphdef, params = nnx.split(model)
  sampler = Sampler(graphdef, params, CFG, mesh=mesh, max_cache_len=64)
  assert _spec(sampler.params["embed"].get_value()) == EMBED_SPEC
  sampler.update_params(jax.tree.map(jnp.copy, params))  # each RL iteration
  assert _spec(sampler.params["embed"].get_value()) == EMBED_SPEC
  out = sampler.generate([[5, 6, 7], [8, 9]], SamplingParams(max_new_tokens=4,
                                                             temperature=0.0))
  single = Sampler(graphdef, params, CFG, max_cache_len=64).generate(
      [[5, 6, 7], [8, 9]], SamplingParams(max_new_tokens=4, temperature=0.0))
  assert out.tokens == single.tokens


def test_activation_constraints_follow_the_mesh_rules(mesh):
  place = in_mesh(jax.jit(lambda x: constrain(x * 2, ("batch", "act_embed"))), mesh)
  out = place(jnp.ones((8, 4)))
  assert _spec(out) == P(("data", "fsdp"), "tensor")
  # Ahead-of-time compilation (e.g. for TPU) lowers under the same mesh and rules.
  compiled = place.lower(jnp.ones((8, 4))).compile()
  assert _spec(compiled(jnp.ones((8, 4)))) == P(("data", "fsdp"), "tensor")


def test_train_step_lowers_ahead_of_time_on_the_mesh(mesh, model):
  graphdef, params = nnx.split(model, nnx.Param)
  shardings = ts.train_state_shardings(params, mesh, OPTIM)
  cfg = ts.TrainStepConfig(teacher_mode="precomputed", logprob_chunk=4,
                           loss=losses.LossConfig(kl_coef=0.0))
  step = ts.make_train_step(graphdef, OPTIM, cfg, mesh, shardings)
  rows, prompt, resp = 8, 6, 4
  rng = np.random.default_rng(0)
  batch = {
      "student_tokens": jnp.asarray(rng.integers(3, 200, (rows, prompt + resp)), jnp.int32),
      "student_mask": jnp.ones((rows, prompt + resp), bool),
      "response_mask": jnp.ones((rows, resp), jnp.float32),
      "old_logprobs": jnp.full((rows, resp), -5.0),
      "advantages": jnp.asarray(rng.normal(size=rows), jnp.float32),
      "opd_mask": jnp.zeros((rows,), jnp.float32),
      "teacher_logprobs": jnp.full((rows, resp), -5.0),
  }
  state = ts.init_train_state(params, OPTIM, shardings)
  compiled = step.lower(state, batch).compile()
  new_state, metrics = compiled(state, batch)
  assert np.isfinite(float(metrics["loss"]))
  assert _spec(new_state.params["embed"].get_value()) == EMBED_SPEC
  single_step = ts.make_train_step(graphdef, OPTIM, cfg)
  _, want = single_step(ts.init_train_state(params, OPTIM), batch)
  np.testing.assert_allclose(float(metrics["loss"]), float(want["loss"]), rtol=1e-5)


def test_rules_given_twice_must_agree(mesh, model):
  source = ArraySource(params_to_hf_tensors(model), "in memory")
  with pytest.raises(ValueError, match="carries different"):
    load_params(CFG, source, mesh, DEFAULT_RULES)
