"""`ModelConfig.remat` decides what the backward pass stores, never a value."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from seed_jax.models.config import ModelConfig
from seed_jax.models.flops import training_flops
from seed_jax.models.transformer import Transformer


def _loss_and_grads(remat: bool):
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


def test_remat_changes_neither_the_loss_nor_the_gradients():
  (loss_on, grads_on), _ = _loss_and_grads(True)
  (loss_off, grads_off), _ = _loss_and_grads(False)
  np.testing.assert_allclose(loss_on, loss_off, rtol=1e-6)
  for a, b in zip(jax.tree.leaves(grads_on), jax.tree.leaves(grads_off)):
    # Recomputation may fuse differently: float32 rounding, relative to the largest entry.
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6 * float(np.max(np.abs(b))))


def test_without_remat_the_backward_keeps_more():
  _, temp_on = _loss_and_grads(True)
  _, temp_off = _loss_and_grads(False)
  assert temp_off > temp_on


@pytest.mark.parametrize("remat,forwards", [(True, 4), (False, 3)])
def test_hardware_flops_count_the_recomputed_forward_only_with_remat(remat, forwards):
  cfg = ModelConfig.tiny(remat=remat)
  model, hardware = training_flops(cfg, rows=2, length=16, unembedded=4)
  assert hardware == pytest.approx(model * forwards / 3)
