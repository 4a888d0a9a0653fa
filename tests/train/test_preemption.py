"""SIGTERM (a preempted TPU VM): the run stops at the next safe point, exits 0 with its
last completed iteration checkpointed, and the next start resumes to the very parameters
of a run that was never interrupted.

A child process trains the tiny 2-iteration run (tests/train/conftest.py); a wrapped
`Trainer.update` prints a marker in the iteration named by the test and holds the
iteration there until the SIGTERM the test then sends has arrived, so the signal lands
mid-iteration every time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from seed_jax.checkpoint import Checkpointer
from seed_jax.metrics import read_metrics
from seed_jax.train.trainer import Trainer
from tests.train.conftest import final_params, tiny_spec

pytestmark = pytest.mark.slow
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MARKER = "update of the iteration to preempt"
# Every run here, the reference included: 2-turn episodes, no export, no final evaluation
# (neither changes the parameters; they only cost time).
SHORT = {"env.max_steps": 2, "checkpoint.export_hf": False, "eval.at_end": False}


def spec(model: str, **overrides):
  return tiny_spec(model, "grpo", iterations=2, **SHORT, **overrides)


def train_steps(workdir: str) -> list[int]:
  return [r["step"] for r in read_metrics(os.path.join(workdir, "metrics.jsonl"))
          if r["phase"] == "train"]


def run_and_preempt(model: str, workdir: str, iteration: int, **overrides
                    ) -> tuple[int, str, dict]:
  """Runs the tiny 2-iteration GRPO run in a child and sends it SIGTERM during the update
  of RL iteration `iteration` (0-based). Returns (exit code, output, its summary)."""
  child = textwrap.dedent(f"""
      import json, sys, time
      sys.path.insert(0, {REPO!r})
      from seed_jax.train.trainer import Trainer
      from tests.train.conftest import tiny_spec
      update = Trainer.update
      def held_update(self, trajs):
        if self.host["iteration"] == {iteration}:
          print({MARKER!r}, flush=True)
          deadline = time.time() + 120
          while self._guard.received is None and time.time() < deadline:
            time.sleep(0.05)
        return update(self, trajs)
      Trainer.update = held_update
      summary = Trainer(tiny_spec({model!r}, "grpo", iterations=2, **{overrides!r}),
                        {workdir!r}).run()
      print("summary:", json.dumps(summary), flush=True)
  """)
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_force_host_platform_device_count=8",
             # the compilation cache the tiny_model fixture set up for this process
             JAX_COMPILATION_CACHE_DIR=jax.config.jax_compilation_cache_dir or "",
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  proc = subprocess.Popen([sys.executable, "-c", child], cwd=REPO, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  lines = []
  for line in proc.stdout:
    lines.append(line)
    if line.strip() == MARKER:
      proc.send_signal(signal.SIGTERM)
      break
  lines.extend(proc.stdout)
  proc.wait(timeout=600)
  output = "".join(lines)
  summaries = [json.loads(l.split(":", 1)[1]) for l in lines if l.startswith("summary:")]
  return proc.returncode, output, summaries[-1] if summaries else {}


@pytest.fixture(scope="module")
def uninterrupted(tiny_model, tmp_path_factory):
  """The reference: the same run, never interrupted."""
  workdir = str(tmp_path_factory.mktemp("uninterrupted"))
  Trainer(spec(tiny_model), workdir).run()
  return final_params(workdir)


def test_sigterm_mid_iteration_exits_0_and_the_resumed_run_equals_an_uninterrupted_one(
    tiny_model, tmp_path, uninterrupted):
  workdir = str(tmp_path / "run")
  code, output, summary = run_and_preempt(tiny_model, workdir, iteration=1, **SHORT)
  assert code == 0, output[-4000:]
  # The second iteration was abandoned after its first mini-batch: its half-updated
  # parameters are not saved, the first iteration's checkpoint is the latest.
  assert summary == {"algorithm": "grpo", "env": "sokoban", "iterations": 1,
                     "preempted": True}, output[-4000:]
  assert "[preempted]" in output and "[iter 2/2]" not in output
  assert Checkpointer(os.path.join(workdir, "checkpoints")).latest_step() == 1
  assert train_steps(workdir) == [1]

  resumed = Trainer(spec(tiny_model), workdir).run()
  assert resumed["iterations"] == 2 and "preempted" not in resumed
  step, params = final_params(workdir)
  assert step == uninterrupted[0] == 2
  for resumed_leaf, reference_leaf in zip(params, uninterrupted[1], strict=True):
    np.testing.assert_array_equal(resumed_leaf, reference_leaf)
  assert train_steps(workdir) == [1, 2]


def test_without_a_checkpoint_of_its_start_the_iteration_is_finished_and_saved(
    tiny_model, tmp_path, uninterrupted):
  """With `checkpoint.every=2` iteration 1 is not checkpointed, so a SIGTERM in the
  second iteration cannot throw it away: the run finishes the iteration, saves it and
  stops before the end of the program (summary), which the next start then runs."""
  workdir = str(tmp_path / "run")
  code, output, summary = run_and_preempt(tiny_model, workdir, iteration=1,
                                          **SHORT, **{"checkpoint.every": 2})
  assert code == 0, output[-4000:]
  assert summary["preempted"] and summary["iterations"] == 2, output[-4000:]
  assert Checkpointer(os.path.join(workdir, "checkpoints")).all_steps() == [0, 2]
  assert not os.path.exists(os.path.join(workdir, "summary.json"))

  resumed = Trainer(spec(tiny_model, **{"checkpoint.every": 2}), workdir).run()
  assert resumed["iterations"] == 2 and "preempted" not in resumed
  assert os.path.exists(os.path.join(workdir, "summary.json"))
  step, params = final_params(workdir)
  assert step == 2
  for resumed_leaf, reference_leaf in zip(params, uninterrupted[1], strict=True):
    np.testing.assert_array_equal(resumed_leaf, reference_leaf)
  assert train_steps(workdir) == [1, 2]
