"""`python -m seed_jax.generate`, the first command a user runs, on the embedded model."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_generate_command_prints_the_completion():
  result = subprocess.run(
      [sys.executable, "-m", "seed_jax.generate", "--prompt=The capital of France is",
       "--max_new_tokens=4"], cwd=REPO, capture_output=True, text=True, timeout=300,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.startswith("The capital of France is") and "Paris" in result.stdout


def test_generate_names_a_missing_model_in_one_line():
  result = subprocess.run(
      [sys.executable, "-m", "seed_jax.generate", "--model=/no/such/folder", "--prompt=hi"],
      cwd=REPO, capture_output=True, text=True, timeout=300,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode == 2 and result.stdout == ""
  assert len(result.stderr.splitlines()) == 1 and "/no/such/folder" in result.stderr
