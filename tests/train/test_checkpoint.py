"""Checkpoints: exact round trip into shardings, keep-last-k, and atomicity under a kill."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from seed_jax.checkpoint import Checkpointer
from seed_jax.models import ModelConfig, random_model
from seed_jax.parallel import shard_params

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_round_trip_is_exact_and_keeps_shardings(tmp_path, mesh):
  params = shard_params(nnx.split(random_model(ModelConfig.tiny()), nnx.Param)[1], mesh)
  state = {"params": params, "step": jnp.asarray(7, jnp.int32)}
  ckpt = Checkpointer(str(tmp_path / "ckpt"), keep=2)
  ckpt.save(7, state, {"iteration": 7, "rng": [1, 2], "task_cursor": 31})
  restored, host = ckpt.restore(7, state)
  assert host == {"iteration": 7, "rng": [1, 2], "task_cursor": 31}
  chex.assert_trees_all_equal(restored, state, strict=True)  # structure, dtypes, values
  assert [a.sharding for a in jax.tree.leaves(restored)] == [
      a.sharding for a in jax.tree.leaves(state)]


def test_keeps_only_the_last_k(tmp_path):
  ckpt = Checkpointer(str(tmp_path / "ckpt"), keep=2)
  for step in (1, 2, 3):
    ckpt.save(step, {"x": jnp.full((2,), step)}, {"iteration": step})
  assert ckpt.all_steps() == [2, 3] and ckpt.latest_step() == 3


def test_a_run_killed_during_save_resumes_from_the_previous_checkpoint(tmp_path):
  """A child process saves step 1, then dies inside the save of step 2 (right before
  orbax commits it). The directory must still restore step 1, intact."""
  directory = str(tmp_path / "ckpt")
  child = textwrap.dedent(f"""
      import os, sys
      sys.path.insert(0, {REPO!r})
      import jax.numpy as jnp
      from orbax.checkpoint._src.path import atomicity
      from seed_jax.checkpoint import Checkpointer
      ckpt = Checkpointer({directory!r}, keep=3)
      ckpt.save(1, {{"x": jnp.arange(1000.0)}}, {{"iteration": 1}})
      async def die(*args, **kwargs):
        os._exit(17)  # SIGKILL-like: no cleanup, no finally blocks
      for cls in (atomicity.AtomicRenameTemporaryPath, atomicity.CommitFileTemporaryPath):
        cls.finalize = die
      ckpt.save(2, {{"x": jnp.arange(1000.0) * 2}}, {{"iteration": 2}})
      print("save 2 finished: the kill did not happen")
  """)
  result = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode == 17, result.stdout + result.stderr
  ckpt = Checkpointer(directory, keep=3)
  assert ckpt.latest_step() == 1
  restored, host = ckpt.restore(1, {"x": jnp.zeros(1000)})
  assert host == {"iteration": 1}
  chex.assert_trees_all_equal(restored, {"x": jnp.arange(1000.0)}, strict=True)
