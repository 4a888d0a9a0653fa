"""Low-rank adapters: a fresh adapter is a no-op, only adapters get gradients, merging
gives the same function, and the rank axis is never sharded."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from seed_jax.models.config import ModelConfig
from seed_jax.models.lora import LoraParam, merged_model, split_adapters
from seed_jax.models.transformer import Transformer
from seed_jax.parallel.mesh import param_shardings

TOKENS = jax.random.randint(jax.random.key(1), (2, 12), 0, 256)
POSITIONS = jnp.broadcast_to(jnp.arange(12), (2, 12))
MASK = jnp.ones((2, 12), bool)


def _pair(rank=4, targets=("q", "k", "v", "o", "gate", "up", "down")):
  """A plain model and a LoRA model holding the same base weights."""
  plain = Transformer(ModelConfig.tiny(), rngs=nnx.Rngs(0))
  lora = Transformer(ModelConfig.tiny(lora_rank=rank, lora_alpha=8.0, lora_targets=targets),
                     rngs=nnx.Rngs(1))
  nnx.update(lora, nnx.state(plain, nnx.Param))  # the base only: the adapters stay
  return plain, lora


def _randomise_b(model):
  """A trained-looking adapter: B away from its zero initialisation."""
  for path, value in nnx.to_flat_state(nnx.state(model, LoraParam)):
    if path[-1] == "lora_b":
      key = jax.random.key(hash(path) % 2**31)
      value.set_value(0.1 * jax.random.normal(key, value.get_value().shape))


def test_a_fresh_adapter_leaves_the_forward_unchanged():
  plain, lora = _pair()
  np.testing.assert_array_equal(lora(TOKENS, POSITIONS, MASK), plain(TOKENS, POSITIONS, MASK))


def test_adapters_sit_on_the_targets_only_with_the_layer_axis():
  _, lora = _pair(rank=3, targets=("q", "down"))
  shapes = {path: v.get_value().shape for path, v in nnx.to_flat_state(nnx.state(lora, LoraParam))}
  assert shapes == {("layers", "attn", "q_proj", "lora_a"): (2, 3, 64),
                    ("layers", "attn", "q_proj", "lora_b"): (2, 64, 3),
                    ("layers", "mlp", "down_proj", "lora_a"): (2, 3, 128),
                    ("layers", "mlp", "down_proj", "lora_b"): (2, 64, 3)}


def test_the_gradient_of_the_trainable_split_holds_the_adapters_only():
  _, lora = _pair()
  _randomise_b(lora)
  graphdef, adapters, base = split_adapters(lora)

  def loss(adapters):
    hidden = nnx.merge(graphdef, adapters, base)(TOKENS, POSITIONS, MASK)
    return jnp.sum(hidden * jnp.linspace(-1, 1, hidden.shape[-1]))

  grads = jax.grad(loss)(adapters)
  leaves = nnx.to_flat_state(grads)
  assert {path[-1] for path, _ in leaves} == {"lora_a", "lora_b"}
  assert all(float(jnp.max(jnp.abs(g.get_value()))) > 0 for _, g in leaves)
  assert not any(isinstance(v, LoraParam) for _, v in nnx.to_flat_state(base))


@pytest.mark.parametrize("targets", [("q", "k", "v", "o", "gate", "up", "down"), ("v", "up")])
def test_merging_gives_the_same_function(targets):
  _, lora = _pair(targets=targets)
  _randomise_b(lora)
  merged = merged_model(lora)
  assert merged.cfg.lora_rank == 0 and not nnx.state(merged, LoraParam)
  want = lora(TOKENS, POSITIONS, MASK)
  np.testing.assert_allclose(merged(TOKENS, POSITIONS, MASK), want, rtol=1e-4,
                             atol=1e-5 * float(jnp.max(jnp.abs(want))))
  assert float(jnp.max(jnp.abs(want - _pair()[0](TOKENS, POSITIONS, MASK)))) > 1e-3


def test_the_rank_axis_is_never_sharded(mesh):
  _, lora = _pair()
  shardings = param_shardings(nnx.state(lora, nnx.Param), mesh)
  for path, sharding in nnx.to_flat_state(shardings):
    if path[-1] == "lora_a":
      assert sharding.get_value().spec[1] is None  # [L, rank, in]
    elif path[-1] == "lora_b":
      spec = sharding.get_value().spec
      assert len(spec) < 3 or spec[2] is None  # [L, out, rank]


def test_bad_adapter_settings_are_refused():
  with pytest.raises(ValueError, match="lora_targets"):
    ModelConfig.tiny(lora_rank=2, lora_targets=("q", "lm_head"))
  with pytest.raises(ValueError, match="lora_rank"):
    ModelConfig.tiny(lora_rank=-1)
