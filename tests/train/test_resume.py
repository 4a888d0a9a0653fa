"""A run that stops, however it stops, resumes from its last checkpoint to the same end:
interrupted between iterations (bitwise equal to an uninterrupted run), or killed while a
checkpoint was being written (resumes from the previous one). The tiny model of the
end-to-end tests; SIGTERM mid-iteration: test_preemption.py."""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest

from seed_jax.metrics import read_metrics
from seed_jax.train.trainer import Trainer
from tests.train.conftest import final_params, tiny_spec

pytestmark = pytest.mark.slow


def test_interrupted_then_resumed_equals_uninterrupted(tiny_model, tmp_path):
  straight = str(tmp_path / "straight")
  Trainer(tiny_spec(tiny_model, "no_sft", iterations=2), straight).run()
  resumed = str(tmp_path / "resumed")
  Trainer(tiny_spec(tiny_model, "no_sft", iterations=1), resumed).run()  # "interrupted"
  Trainer(tiny_spec(tiny_model, "no_sft", iterations=2), resumed).run()  # resumed
  (step_a, a), (step_b, b) = final_params(straight), final_params(resumed)
  assert step_a == step_b == 2
  for x, y in zip(a, b):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  steps = [r["step"] for r in read_metrics(os.path.join(resumed, "metrics.jsonl"))
           if r["phase"] == "train"]
  assert steps == [1, 2]


def test_a_run_killed_while_saving_resumes_from_the_previous_checkpoint(tiny_model, tmp_path):
  """The child dies inside the save of iteration 1 (after iteration 0's was committed);
  the same command then resumes from iteration 0 and finishes."""
  import subprocess
  import sys
  import textwrap
  workdir = str(tmp_path / "run")
  repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  child = textwrap.dedent(f"""
      import os, sys
      sys.path.insert(0, {repo!r})
      from orbax.checkpoint._src.path import atomicity
      from seed_jax.checkpoint import Checkpointer
      from seed_jax.train.trainer import Trainer
      from tests.train.conftest import tiny_spec
      saves = []
      original = Checkpointer.save
      def save(self, step, *args):
        saves.append(step)
        if len(saves) == 2:  # the save after RL iteration 1: die before it commits
          self.wait()  # (iteration 0's asynchronous save commits first)
          async def die(*a, **k):
            os._exit(17)
          for cls in (atomicity.AtomicRenameTemporaryPath, atomicity.CommitFileTemporaryPath):
            cls.finalize = die
        return original(self, step, *args)
      Checkpointer.save = save
      Trainer(tiny_spec({tiny_model!r}, "grpo", iterations=2), {workdir!r}).run()
  """)
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_force_host_platform_device_count=8",
             # the compilation cache the tiny_model fixture set up for this process
             JAX_COMPILATION_CACHE_DIR=jax.config.jax_compilation_cache_dir or "",
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  result = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                          timeout=900, env=env, cwd=repo)
  assert result.returncode == 17, result.stdout[-2000:] + result.stderr[-2000:]
  trainer = Trainer(tiny_spec(tiny_model, "grpo", iterations=2), workdir)
  assert trainer.checkpointer.latest_step() == 0  # iteration 1's save never committed
  summary = trainer.run()
  assert summary["iterations"] == 2
  steps = [r["step"] for r in read_metrics(os.path.join(workdir, "metrics.jsonl"))
           if r["phase"] == "train"]
  assert steps == [1, 2]
