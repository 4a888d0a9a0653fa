"""The command line as a user meets it: a mistake is one line naming the key (exit status 2),
and a command's output is not buried under library start-up chatter.

Every command here fails (or generates with a tiny model) before anything trains.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from seed_jax import cli
from seed_jax.parallel.mesh import MeshConfig

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = "--config=configs/sokoban.py:cpu"

# What cli.quiet_startup sets: a user's own setting wins, so the tests start without them.
QUIET_VARIABLES = ("TF_CPP_MIN_LOG_LEVEL", "TRANSFORMERS_VERBOSITY",
                   "TRANSFORMERS_NO_ADVISORY_WARNINGS")

# Lines that must not reach a user's terminal unless asked for with --verbosity.
NOISE = ("Unable to initialize backend", "PyTorch was not found", "Traceback",
         "Pass --helpshort", "FATAL Flags parsing error")


def command(*args: str, hide_torch: bool = False, timeout: int = 120
            ) -> subprocess.CompletedProcess:
  """Runs `python -m ARGS` in the repository as a user would: jax picks its own platforms
  (probing TPU and GPU first); with `hide_torch`, as after a plain install (no PyTorch)."""
  env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", *QUIET_VARIABLES)}
  if hide_torch:
    module, rest = args[0], args[1:]
    argv = [sys.executable, "-c",
            "import runpy, sys; sys.modules['torch'] = None; "
            f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)", *rest]
  else:
    argv = [sys.executable, "-m", *args]
  return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True,
                        timeout=timeout)


def one_line_usage_error(result: subprocess.CompletedProcess) -> str:
  """The single stderr line of a command that failed on its command line."""
  lines = result.stderr.splitlines()
  assert result.returncode == 2, result.stderr[-3000:]
  assert len(lines) == 1, result.stderr[-3000:]
  return lines[0]


# ------------------------------------------------------------------ bad command lines


def test_a_misspelt_config_key_names_it_and_the_nearest_known_key():
  line = one_line_usage_error(command("seed_jax.main", CONFIG, "--config.rl.lamda_opd=0.1"))
  assert line == "config.rl.lamda_opd: no such key; did you mean config.rl.lambda_opd?"


def test_a_key_in_a_misspelt_group_is_matched_against_every_key():
  line = one_line_usage_error(command("seed_jax.main", CONFIG, "--config.rll.lambda_opd=0.1"))
  assert line == "config.rll.lambda_opd: no such key; did you mean config.rl.lambda_opd?"


def test_a_value_of_the_wrong_type_names_the_key():
  line = one_line_usage_error(command("seed_jax.main", CONFIG, "--config.rl.lambda_opd=abc"))
  assert line.startswith("config.rl.lambda_opd: ") and "abc" in line


def test_a_value_the_run_spec_rejects_names_the_key_without_the_flag_help():
  line = one_line_usage_error(command("seed_jax.main", CONFIG, "--config.rl.lambda_opd=-1"))
  assert line.startswith("config.rl.lambda_opd: ") and "-1" in line


@pytest.mark.parametrize("override,key", [
    ("--config.rl.learning_rate=-1", "config.rl.learning_rate"),
    ("--config.model.name=/nonexistent", "config.model.name"),
    ("--config.model.name=qwen2.5-7b-instruct", "config.model.name"),  # a shape: no weights
])
def test_a_bad_rate_or_model_is_refused_before_the_run_folder_is_made(override, key, tmp_path):
  workdir = tmp_path / "run"
  result = command("seed_jax.main", "--config=configs/alfworld.py:cpu", override,
                   f"--workdir={workdir}")
  assert one_line_usage_error(result).startswith(f"{key}: ")
  assert result.stdout == "" and not workdir.exists()


def test_an_unknown_preset_lists_the_known_ones():
  line = one_line_usage_error(command("seed_jax.main", "--config=configs/sokoban.py:nope"))
  assert line.startswith("--config=configs/sokoban.py:nope: ")
  assert "'nope'" in line and "cpu" in line


def test_a_missing_config_file_is_named():
  line = one_line_usage_error(command("seed_jax.main", "--config=configs/nope.py"))
  assert line.startswith("--config=configs/nope.py: ") and "no such file" in line


def test_a_mesh_the_devices_cannot_hold_names_the_mesh_key_before_loading_anything():
  # Neither the tests' 8 fake CPU devices (XLA_FLAGS) nor one accelerator divide by 3.
  result = command("seed_jax.main", CONFIG, "--config.mesh.data=3")
  line = one_line_usage_error(result)
  assert line.startswith("config.mesh.data: data=3 does not divide the ")
  assert result.stdout == ""  # failed before the run started (it prints its workdir)


def test_a_missing_config_flag_is_one_line():
  assert one_line_usage_error(command("seed_jax.main")) == "--config is required"


def test_an_unknown_flag_of_generate_is_one_line():
  line = one_line_usage_error(command("seed_jax.generate", "--prompt=hi", "--max_new_tokns=4"))
  assert "max_new_tokns" in line


def test_a_usage_error_of_generate_is_one_line():
  line = one_line_usage_error(command("seed_jax.generate"))
  assert "--prompt" in line


# ------------------------------------------------------------------ quiet output


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
  """A tiny random model with the embedded tokenizer, as an HF folder."""
  from seed_jax.models import ModelConfig, export_hf, random_model
  from seed_jax.models.embedded import embedded_model_dir
  from seed_jax.models.tokenizer import load_tokenizer
  cfg = ModelConfig.tiny(vocab_size=49152, eos_token_id=2, pad_token_id=2)
  folder = tmp_path_factory.mktemp("tiny") / "model"
  export_hf(random_model(cfg, seed=0), folder, load_tokenizer(embedded_model_dir()))
  return str(folder)


def test_generate_prints_the_completion_and_nothing_else(tiny_model):
  result = command("seed_jax.generate", f"--model={tiny_model}", "--prompt=hi",
                   "--max_new_tokens=2", hide_torch=True)
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.startswith("hi")
  assert result.stderr == ""


def test_a_failing_run_prints_no_start_up_chatter():
  result = command("seed_jax.main", CONFIG, "--config.mesh.data=3")
  assert not any(noise in result.stderr for noise in NOISE), result.stderr


def test_verbosity_brings_the_logs_back():
  result = command("seed_jax.main", CONFIG, "--config.mesh.data=3", "--verbosity=1")
  assert result.returncode == 2
  error = [line for line in result.stderr.splitlines() if line.startswith("config.mesh.data: ")]
  logs = [line for line in result.stderr.splitlines() if line not in error]
  assert len(error) == 1 and logs, result.stderr
  assert all(line[:1] in "DIWE" for line in logs), result.stderr  # absl's log format


# ------------------------------------------------------------------ pieces


@pytest.mark.parametrize("argv,requested", [
    (["prog", "--verbosity=1"], True), (["prog", "-v", "1"], True), (["prog", "-v=0"], True),
    (["prog", "--verbosity", "2"], True), (["prog", "--prompt=-v"], False),
    (["prog", "--very=1"], False), (["prog"], False)])
def test_verbosity_is_requested_by_the_verbosity_flag_only(argv, requested):
  assert cli.verbosity_requested(argv) == requested


def test_quiet_startup_leaves_variables_the_user_set(monkeypatch):
  for name in QUIET_VARIABLES:  # restored after the test
    monkeypatch.delenv(name, raising=False)
  monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")
  cli.quiet_startup(["prog"])
  assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "0"
  assert os.environ["TRANSFORMERS_VERBOSITY"] == "error"
  assert os.environ["TRANSFORMERS_NO_ADVISORY_WARNINGS"] == "1"


def test_quiet_startup_silences_nothing_when_logs_are_asked_for(monkeypatch):
  for name in QUIET_VARIABLES:
    monkeypatch.delenv(name, raising=False)
  cli.quiet_startup(["prog", "--verbosity=1"])
  assert not any(name in os.environ for name in QUIET_VARIABLES)


@pytest.mark.parametrize("data,fsdp,tensor,devices,named", [
    (3, -1, 1, 8, "config.mesh.data: data=3 does not divide the 8 devices"),
    (2, 2, 2, 4, "config.mesh.data, config.mesh.fsdp, config.mesh.tensor: "),
    (1, 1, 1, 8, "config.mesh.data, config.mesh.fsdp, config.mesh.tensor: "),
    (1, 4, 1, 8, "config.mesh.fsdp: fsdp=4 needs 4 devices, but 8 devices are available"),
    (-1, -1, 1, 8, "config.mesh.data, config.mesh.fsdp: at most one"),
    (0, -1, 1, 8, "config.mesh.data: a positive size or -1, got 0"),
])
def test_a_mesh_error_names_the_keys_to_change(data, fsdp, tensor, devices, named):
  error = cli.mesh_error(MeshConfig(data, fsdp, tensor), devices)
  assert error is not None and error.startswith(named), error


def test_the_mesh_check_agrees_with_the_mesh_builder():
  sizes = (-2, -1, 0, 1, 2, 3, 4, 8)
  for data in sizes:
    for fsdp in sizes:
      for tensor in sizes:
        for devices in (1, 2, 4, 6, 8):
          mesh = MeshConfig(data, fsdp, tensor)
          try:
            mesh.resolved_shape(devices)
            fits = True
          except ValueError:
            fits = False
          assert (cli.mesh_error(mesh, devices) is None) == fits, (mesh, devices)
