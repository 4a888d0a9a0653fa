"""A known XLA:CPU miscompile (jax/jaxlib 0.10.2) that some mesh.rules tables walk into.

A projection whose weight is `P("fsdp", "tensor")`, applied to rows split over ("data",
"fsdp") and added to a residual constrained to `P(batch, None, "tensor")`, comes back with
rows 1 and 2 swapped (GSPMD and Shardy alike). With the default rules the residual stream
("act_embed") is replicated and nothing goes wrong; a table that puts "act_embed" on
"tensor" (or "heads" on "fsdp" with "embed" on "tensor") gives wrong numbers on CPU. This
test is strict: when an upgrade fixes the bug it fails, and this note can go.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from seed_jax.parallel import MeshConfig, make_mesh

ROWS = ("data", "fsdp")


@pytest.mark.xfail(strict=True, reason="XLA SPMD miscompile on CPU (see module docstring)")
def test_residual_on_tensor_with_fsdp_tensor_weight_is_computed_correctly():
  mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2)).mesh
  rng = np.random.default_rng(0)
  x, o = (rng.normal(size=(4, 4, 64)).astype(np.float32) for _ in range(2))
  w = rng.normal(size=(64, 64)).astype(np.float32)

  def residual_plus_projection(x, o, w):
    x = jax.lax.with_sharding_constraint(x, P(ROWS, None, "tensor"))
    projected = jnp.einsum("ni,oi->no", o.reshape(16, 64), w).reshape(4, 4, 64)
    return jax.lax.with_sharding_constraint(x + projected, P(ROWS, None, "tensor"))

  with jax.set_mesh(mesh):
    got = jax.jit(residual_plus_projection)(
        jax.device_put(x, NamedSharding(mesh, P(ROWS))),
        jax.device_put(o, NamedSharding(mesh, P(ROWS))),
        jax.device_put(w, NamedSharding(mesh, P("fsdp", "tensor"))))
  np.testing.assert_allclose(np.asarray(got), x + np.einsum("bti,oi->bto", o, w), atol=1e-4)
