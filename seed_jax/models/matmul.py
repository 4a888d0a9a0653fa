"""Matmuls in the compute dtype with float32 accumulation, forward and backward.

Parameters may be float32 while the compute dtype is bfloat16. Autodiff of
`einsum(x_bf16, w.astype(bf16), preferred_element_type=f32)` hands the transposed
matmuls of the backward pass a float32 cotangent, so they run in float32; and XLA:CPU runs
a bf16 dot in its bf16 kernels only when both operands are row-major with the contraction
on the left operand's last axis, upcasting every other dot to float32 (~3x slower on a CPU
with bf16 matrix units; the weight gradients, which contract the token axis, always hit
this). `mixed_einsum` fixes both: its backward pass casts the cotangent to the compute
dtype, and every dot goes through `canonical_einsum`, which lays its operands out as the
fast kernels want them.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def _permute(x: jax.Array, spec: str, order: str) -> jax.Array:
  return x if spec == order else x.transpose([spec.index(c) for c in order])


def _materialized(x: jax.Array, spec: str, order: str) -> jax.Array:
  """`x` (axes named by `spec`) permuted to `order` as a row-major copy, for a dot operand.

  A plain transpose reaches XLA:CPU as a column-major view, and its dot support check
  then upcasts a bf16 dot to float32 (~3x slower here); a transpose folded into the dot's
  dimension numbers fares the same. Going through a reshape that splits an even axis in
  two makes the permuted array a new row-major buffer, which the bf16 kernels accept.
  Other backends get the plain transpose, which their layout assignment handles.
  """
  if spec == order:
    return x
  if jax.default_backend() != "cpu":
    return _permute(x, spec, order)
  even = [c for c in spec if x.shape[spec.index(c)] % 2 == 0]
  if not even:
    return _permute(x, spec, order)
  axis = max(even, key=lambda c: x.shape[spec.index(c)])
  a = spec.index(axis)
  split = x.reshape(*x.shape[:a], x.shape[a] // 2, 2, *x.shape[a + 1:])
  # The split axis becomes two adjacent axes that move together.
  wide = [i if i < a else i + 1 for i in range(len(spec))]
  perm = []
  for c in order:
    i = spec.index(c)
    perm += [a, a + 1] if i == a else [wide[i]]
  shape = [x.shape[spec.index(c)] for c in order]
  return split.transpose(perm).reshape(shape)


def canonical_einsum(lhs: str, rhs: str, out: str, x: jax.Array, y: jax.Array
                      ) -> jax.Array:
  """`einsum(lhs,rhs->out)` with float32 accumulation (and result), in the dot layouts
  that XLA:CPU runs in bf16 at full speed: `a [batch, M, K]` times `b [batch, K, N]` or
  `b [batch, N, K]`, every operand row-major. An operand in another order is permuted
  into a row-major copy first (`_materialized`); x and y swap roles when that leaves the
  result in `out`'s order, or copies less. Otherwise XLA:CPU upcasts such a bf16 dot to
  float32 (the weight gradients, which contract the leading token axis of both operands,
  would all run in float32)."""
  batch = "".join(c for c in lhs if c in rhs and c in out)
  contract = "".join(c for c in lhs if c in rhs and c not in out)

  def plan(a_spec, b_spec, a, b):
    a_free = "".join(c for c in a_spec if c not in b_spec)
    b_free = "".join(c for c in b_spec if c not in a_spec)
    a_order = batch + a_free + contract
    b_order = batch + b_free + contract  # [N, K]: as a weight `[out, in]` is stored
    if b_spec != b_order:
      b_order = batch + contract + b_free
    natural = batch + a_free + b_free
    copied = (a.size if a_spec != a_order else 0) + (b.size if b_spec != b_order else 0)
    # A permuted result is avoided first: XLA folds that transpose into the dot by
    # swapping its operands, which undoes the operand layouts chosen here.
    return (natural != out, copied), (a_spec, a_order, a), (b_spec, b_order, b), natural

  _, (a_spec, a_order, a), (b_spec, b_order, b), natural = min(
      plan(lhs, rhs, x, y), plan(rhs, lhs, y, x), key=lambda p: p[0])
  z = jnp.einsum(f"{a_order},{b_order}->{natural}", _materialized(a, a_spec, a_order),
                 _materialized(b, b_spec, b_order), preferred_element_type=jnp.float32)
  return _materialized(z, natural, out)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def mixed_einsum(spec: str, x: jax.Array, y: jax.Array) -> jax.Array:
  """`einsum(spec, x, y)` in x's dtype with float32 accumulation; float32 result.

  `y` is cast to x's dtype (float32 weights under bfloat16 compute). The backward pass
  casts the cotangent to x's dtype too, so both transposed matmuls also run in it with
  float32 accumulation; each operand's gradient comes back in that operand's own dtype.
  Every index must appear in at least two of the three terms (no ellipsis).
  """
  lhs, rhs, out = _parse(spec)
  return canonical_einsum(lhs, rhs, out, x, y.astype(x.dtype))


def _parse(spec: str) -> tuple[str, str, str]:
  inputs, out = spec.split("->")
  lhs, rhs = inputs.split(",")
  return lhs, rhs, out


def _mixed_einsum_fwd(spec, x, y):
  return mixed_einsum(spec, x, y), (x, y)


def _mixed_einsum_bwd(spec, residuals, g):
  x, y = residuals
  lhs, rhs, out = _parse(spec)
  g = g.astype(x.dtype)
  dx = canonical_einsum(out, rhs, lhs, g, y.astype(x.dtype))
  dy = canonical_einsum(lhs, out, rhs, x, g)
  return dx.astype(x.dtype), dy.astype(y.dtype)


mixed_einsum.defvjp(_mixed_einsum_fwd, _mixed_einsum_bwd)


def matmul(x: jax.Array, w: jax.Array, out_dtype=None) -> jax.Array:
  """`x [..., in] @ w[out, in]^T` in x's dtype with float32 accumulation; the result in
  `out_dtype` (default x's dtype)."""
  lead = x.shape[:-1]
  y = mixed_einsum("ni,oi->no", x.reshape(-1, x.shape[-1]), w)
  return y.reshape(*lead, w.shape[0]).astype(out_dtype or x.dtype)
