"""Shared checks of the train step tests."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np

from seed_jax.parallel import shard_params
from seed_jax.seed import train_step as ts
from seed_jax.seed.optim import OptimConfig

# A large epsilon keeps AdamW's first step proportional to the gradient, so the updated
# parameters show any difference in it (see test_train_step's OPTIM).
OPTIM = OptimConfig(learning_rate=1e-2, eps=1.0)


def assert_sharded_step_equals_single_device(graphdef, params, batch, cfg: ts.TrainStepConfig,
                                             mesh, atol: float = 1e-7) -> None:
  """One train step on `mesh` (parameters sharded by their rules, rows by the batch rule)
  gives the single-device step's loss and updated parameters."""
  want_state, want_out = ts.make_train_step(graphdef, OPTIM, cfg)(
      ts.init_train_state(jax.tree.map(jnp.copy, params), OPTIM), batch)
  placed = shard_params(jax.tree.map(jnp.copy, params), mesh)
  shardings = ts.train_state_shardings(placed, mesh, OPTIM)
  got_state, got_out = ts.make_train_step(graphdef, OPTIM, cfg, mesh, shardings)(
      ts.init_train_state(placed, OPTIM, shardings), batch)
  np.testing.assert_allclose(got_out["loss"], want_out["loss"], rtol=1e-5)
  chex.assert_trees_all_close(got_state.params, want_state.params, rtol=1e-5, atol=atol)
