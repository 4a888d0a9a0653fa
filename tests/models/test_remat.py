"""`ModelConfig.remat` decides what the backward pass stores and recomputes, never a value."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from seed_jax.models.config import REMAT_POLICIES, ModelConfig
from seed_jax.models.flops import training_flops
from seed_jax.models.transformer import Transformer


def _loss_and_grads(remat: str):
  cfg = ModelConfig.tiny(remat=remat)
  graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)), nnx.Param)
  tokens = jax.random.randint(jax.random.key(1), (2, 24), 0, cfg.vocab_size)
  positions = jnp.broadcast_to(jnp.arange(24), (2, 24))
  mask = jnp.ones((2, 24), bool).at[1, :5].set(False)

  # A random readout: a sum of squares after the final RMSNorm would be nearly invariant to
  # the layers, leaving their gradients as rounding noise.
  readout = jax.random.normal(jax.random.key(2), (2, 24, cfg.hidden_size))

  def loss(p):
    hidden = nnx.merge(graphdef, p)(tokens, positions, mask)
    return jnp.sum(jnp.where(mask[..., None], hidden * readout, 0.0))

  grad = jax.jit(jax.value_and_grad(loss))
  temp = grad.lower(params).compile().memory_analysis().temp_size_in_bytes
  return grad(params), temp


@pytest.fixture(scope="module")
def by_policy():
  """{policy: ((loss, grads), compiled temp bytes)} over REMAT_POLICIES."""
  return {policy: _loss_and_grads(policy) for policy in REMAT_POLICIES}


@pytest.mark.parametrize("policy", ["full", "projections"])
def test_remat_changes_neither_the_loss_nor_the_gradients(by_policy, policy):
  (loss, grads), _ = by_policy[policy]
  (loss_kept, grads_kept), _ = by_policy["none"]
  # A summed loss of ~36: float32 rounding of differently fused sums is a few 1e-5 (1e-6
  # relative, seen on a CPU with AMX); a wrong recomputation would be far larger.
  np.testing.assert_allclose(loss, loss_kept, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_kept)):
    # Recomputation may fuse differently: float32 rounding, relative to the largest entry.
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6 * float(np.max(np.abs(b))))


def test_the_backward_keeps_more_the_less_it_recomputes(by_policy):
  temp = {policy: by_policy[policy][1] for policy in REMAT_POLICIES}
  assert temp["full"] < temp["projections"] < temp["none"]


def test_an_unknown_policy_is_refused():
  with pytest.raises(ValueError, match="remat must be one of"):
    ModelConfig.tiny(remat=True)


def test_hardware_flops_add_what_the_backward_recomputes():
  rows, length, unembedded = 2, 16, 4
  cfg = ModelConfig.tiny(remat="none")
  model, hardware = training_flops(cfg, rows, length, unembedded)
  assert hardware == model
  # By hand: a forward is 2 FLOPs per weight and token in the projections and the LM head,
  # plus QK^T and PV over the causal half of the scores (2 * L * H * D * T^2 a row).
  proj = cfg.num_layers * (2 * cfg.hidden_size * cfg.num_heads * cfg.head_dim
                           + 2 * cfg.hidden_size * cfg.num_kv_heads * cfg.head_dim
                           + 3 * cfg.hidden_size * cfg.intermediate_size)
  attention = rows * 2 * cfg.num_layers * cfg.num_heads * cfg.head_dim * length**2
  forward = rows * (2 * proj * length + 2 * cfg.hidden_size * cfg.vocab_size * unembedded) \
      + attention
  assert model == pytest.approx(3 * forward)
  _, full = training_flops(dataclasses.replace(cfg, remat="full"), rows, length, unembedded)
  assert full == pytest.approx(4 * forward)
  _, projections = training_flops(dataclasses.replace(cfg, remat="projections"), rows,
                                  length, unembedded)
  assert projections == pytest.approx(3 * forward + attention)
