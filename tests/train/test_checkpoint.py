"""Checkpoints: exact round trip into shardings, keep-last-k, and atomicity under a kill."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import textwrap

import chex
import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from seed_jax import checkpoint
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
      ckpt.wait()  # saves are asynchronous: step 1 is committed only now
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


def test_a_save_keeps_the_host_state_of_its_call_and_refuses_non_json_at_once(tmp_path):
  ckpt = Checkpointer(str(tmp_path / "ckpt"), keep=2)
  host = {"iteration": 1, "train_success": [0.5]}
  ckpt.save(1, {"x": jnp.arange(4.0)}, host)
  host["train_success"].append(1.0)  # the trainer goes on while the save is in flight
  with pytest.raises(TypeError, match="JSON serializable"):
    ckpt.save(2, {"x": jnp.arange(4.0)}, {"iteration": 2, "rng": object()})
  assert ckpt.latest_step() == 1  # reading the directory waits for the pending save
  _, restored = ckpt.restore(1, {"x": jnp.zeros(4)})
  assert restored == {"iteration": 1, "train_success": [0.5]}
  ckpt.close()
  ckpt.close()  # a second close does nothing


def test_a_program_that_ends_without_closing_still_commits_its_last_save(tmp_path):
  """The child's last save is still in flight when its main thread ends; only the
  checkpointer's exit hook waits for it (before Python stops the thread pools it needs)."""
  directory = str(tmp_path / "ckpt")
  child = textwrap.dedent(f"""
      import sys
      sys.path.insert(0, {REPO!r})
      import jax.numpy as jnp
      from seed_jax.checkpoint import Checkpointer
      ckpt = Checkpointer({directory!r})
      ckpt.save(1, {{"x": jnp.arange(1000.0)}}, {{"iteration": 1}})
      ckpt.wait()
      ckpt.save(2, {{"x": jnp.arange(1000.0) * 2}}, {{"iteration": 2}})
  """)
  result = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode == 0, result.stdout + result.stderr
  ckpt = Checkpointer(directory)
  assert ckpt.latest_step() == 2
  restored, _ = ckpt.restore(2, {"x": jnp.zeros(1000)})
  chex.assert_trees_all_equal(restored, {"x": jnp.arange(1000.0) * 2}, strict=True)


def _disk_with_free_bytes(monkeypatch, free: int) -> None:
  usage = shutil.disk_usage("/")
  monkeypatch.setattr(checkpoint.shutil, "disk_usage",
                      lambda path: usage._replace(free=free))


def test_a_save_the_disk_cannot_hold_fails_at_once_naming_the_room_needed(tmp_path,
                                                                          monkeypatch):
  ckpt = Checkpointer(str(tmp_path / "ckpt"), keep=3)
  ckpt.save(1, {"x": jnp.arange(100_000.0)}, {"iteration": 1})  # the first: nothing to size
  ckpt.wait()
  size = checkpoint.folder_bytes(str(tmp_path / "ckpt" / "1"))
  assert size > 100_000  # the 100,000 float32 values are in it (compressed)
  _disk_with_free_bytes(monkeypatch, size - 1)
  with pytest.raises(OSError, match=r"no room for checkpoint 2: .* GB needed, .* GB free "
                     r".*resume from checkpoint 1"):
    ckpt.save(2, {"x": jnp.arange(100_000.0)}, {"iteration": 2})
  assert ckpt.all_steps() == [1]


def test_room_for_one_more_checkpoint_only_is_warned_about(tmp_path, monkeypatch, caplog):
  ckpt = Checkpointer(str(tmp_path / "ckpt"), keep=3)
  ckpt.save(1, {"x": jnp.arange(100_000.0)}, {"iteration": 1})
  ckpt.wait()
  size = checkpoint.folder_bytes(str(tmp_path / "ckpt" / "1"))
  _disk_with_free_bytes(monkeypatch, 2 * size - 1)
  with caplog.at_level(logging.WARNING, logger="seed_jax.checkpoint"):
    ckpt.save(2, {"x": jnp.arange(100_000.0)}, {"iteration": 2})
  assert "checkpoint 2 fits, the next may not" in caplog.text
  ckpt.wait()
  # each save is sized against the latest checkpoint: 2 now (its metadata may differ
  # from 1's by a few bytes)
  size = checkpoint.folder_bytes(str(tmp_path / "ckpt" / "2"))
  _disk_with_free_bytes(monkeypatch, 2 * size)
  caplog.clear()
  with caplog.at_level(logging.WARNING, logger="seed_jax.checkpoint"):
    ckpt.save(3, {"x": jnp.arange(100_000.0)}, {"iteration": 3})
  assert "may not" not in caplog.text and ckpt.all_steps() == [1, 2, 3]
