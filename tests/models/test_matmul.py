"""Mixed-precision matmuls: exact in float32, bf16 dots in the backward pass too."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from seed_jax.models import ModelConfig, random_model
from seed_jax.models.matmul import canonical_einsum, matmul, mixed_einsum
from seed_jax.seed.logprobs import response_logprobs

SPECS = ["ni,oi->no", "ni,no->oi", "bkgtd,bksd->bkgts", "bkgts,bkgtd->bksd",
         "bkgts,bksd->bkgtd", "abc,cd->dba"]


def _operands(spec, seed=0):
  lhs, rhs = spec.split("->")[0].split(",")
  sizes = dict(zip("nioabcdgkst", (6, 4, 5, 2, 3, 4, 5, 2, 3, 4, 6)))
  rng = np.random.default_rng(seed)
  return (jnp.asarray(rng.normal(size=[sizes[c] for c in lhs]), jnp.float32),
          jnp.asarray(rng.normal(size=[sizes[c] for c in rhs]), jnp.float32))


@pytest.mark.parametrize("spec", SPECS)
def test_canonical_einsum_equals_einsum(spec):
  x, y = _operands(spec)
  lhs, rest = spec.split(",")
  rhs, out = rest.split("->")
  np.testing.assert_allclose(np.asarray(canonical_einsum(lhs, rhs, out, x, y)),
                             np.einsum(spec, np.asarray(x), np.asarray(y)), rtol=1e-5,
                             atol=1e-5)


@pytest.mark.parametrize("spec", SPECS)
def test_mixed_einsum_gradients_equal_autodiff_in_float32(spec):
  x, y = _operands(spec, seed=1)
  weights = jnp.asarray(np.random.default_rng(2).normal(
      size=jnp.einsum(spec, x, y).shape), jnp.float32)
  loss = lambda fn: (lambda x, y: jnp.sum(fn(x, y) * weights))
  got = jax.grad(loss(lambda x, y: mixed_einsum(spec, x, y)), argnums=(0, 1))(x, y)
  want = jax.grad(loss(lambda x, y: jnp.einsum(spec, x, y)), argnums=(0, 1))(x, y)
  for g, w in zip(got, want):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)


def test_bfloat16_matmul_returns_gradients_in_each_operand_dtype():
  x = jnp.ones((4, 3), jnp.bfloat16)
  w = jnp.full((5, 3), 0.5, jnp.float32)  # float32 parameters, bfloat16 compute
  y = matmul(x, w)
  assert y.dtype == jnp.bfloat16
  dx, dw = jax.grad(lambda x, w: jnp.sum(matmul(x, w).astype(jnp.float32)),
                    argnums=(0, 1))(x, w)
  assert dx.dtype == jnp.bfloat16 and dw.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(dw), np.full((5, 3), 4.0))
  np.testing.assert_allclose(np.asarray(dx, np.float32), np.full((4, 3), 2.5))


def _dot_operand_dtypes(hlo: str) -> list[tuple[str, str]]:
  """(lhs, rhs) element types of every dot in optimised HLO text."""
  found, types = [], {}
  for line in hlo.splitlines():
    if re.match(r"^\S.*\{$", line):  # a new computation: its own value names
      types = {}
    match = re.match(r"\s*(?:ROOT )?%([\w.\-]+) = (\w+)\[", line)
    if match:
      types[match.group(1)] = match.group(2)
    operands = re.search(r" dot\(%([\w.\-]+), %([\w.\-]+)\)", line)
    if operands:
      found.append((types.get(operands.group(1)), types.get(operands.group(2))))
  return found


def test_bfloat16_training_gradient_runs_every_dot_in_bfloat16():
  """float32 parameters, bfloat16 compute: no dot of the forward or backward pass of the
  log-prob gradient is upcast to float32 (which runs ~3x slower on CPU)."""
  cfg = ModelConfig.tiny(dtype="bfloat16", param_dtype="float32", hidden_size=64,
                         intermediate_size=128, vocab_size=256)
  graphdef, params = nnx.split(random_model(cfg), nnx.Param)
  tokens = jnp.asarray(np.random.default_rng(0).integers(3, 256, (4, 24)), jnp.int32)
  mask = jnp.ones((4, 24), bool)

  def loss(p):
    lp, _ = response_logprobs(nnx.merge(graphdef, p), tokens, mask, 8)
    return -jnp.sum(lp)

  compiled = jax.jit(jax.grad(loss)).lower(params).compile()
  dots = _dot_operand_dtypes(compiled.as_text())
  assert dots and all(d == ("bf16", "bf16") for d in dots), dots
  grads = compiled(params)
  assert all(jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grads))
