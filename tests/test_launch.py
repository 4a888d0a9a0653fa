"""The launch scripts: they parse, explain themselves, and run the gcloud / srun / pip commands
a TPU slice, a SLURM cluster and an install need.

`gcloud`, `srun` and pip are replaced by fakes that record their argv, so nothing here
reaches a cloud or a package index.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import tarfile

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
LAUNCH = REPO / "launch"
# Scripts that do nothing useful without arguments, so must print their usage instead.
NEEDS_ARGUMENTS = ["tpu_create.sh", "tpu_setup.sh", "tpu_run.sh", "tpu_logs.sh",
                   "tpu_delete.sh", "slurm_gpu.sbatch"]
ZONE = "us-east5-a"

# Writes its argv, NUL-separated, to the next numbered file of $FAKE_CALLS; for `scp` it also
# lists the archive it was given, while the archive still exists.
FAKE = r"""#!/usr/bin/env bash
call="$FAKE_CALLS/$(printf %03d "$(ls "$FAKE_CALLS" | grep -vc listing)")"
printf '%s\0' "$(basename "$0")" "$@" > "$call"
if [ "${4:-}" = scp ]; then tar tzf "$5" > "$call.listing"; fi
"""


@pytest.fixture()
def fakes(tmp_path):
  """PATH with fake gcloud and srun; returns a function giving the argv of every call."""
  bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
  bin_dir.mkdir()
  calls.mkdir()
  for tool in ("gcloud", "srun"):
    (bin_dir / tool).write_text(FAKE)
    (bin_dir / tool).chmod(0o755)
  env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_CALLS=str(calls))

  def run(script, *args, cwd=REPO, **extra_env):
    return subprocess.run(["bash", str(LAUNCH / script), *args], cwd=cwd, text=True,
                          capture_output=True, env={**env, **extra_env}, timeout=60)

  def recorded():
    return [(calls / name).read_text().split("\0")[:-1]
            for name in sorted(os.listdir(calls)) if not name.endswith("listing")]

  run.calls = recorded
  run.listing = lambda i: (calls / f"{i:03d}.listing").read_text().split()
  return run


def ok(result):
  assert result.returncode == 0, result.stderr
  return result


@pytest.mark.parametrize("script", sorted(p.name for p in LAUNCH.iterdir()))
def test_every_script_parses(script):
  subprocess.run(["bash", "-n", str(LAUNCH / script)], check=True)


@pytest.mark.parametrize("script", NEEDS_ARGUMENTS)
def test_without_arguments_prints_usage_and_fails(fakes, script):
  result = fakes(script)
  assert result.returncode != 0
  assert "Usage:" in result.stderr and f"launch/{script}" in result.stderr
  assert fakes.calls() == []


@pytest.mark.parametrize("script,args,named", [
    ("tpu_create.sh", ["seed", ZONE, "v5p"], "'v5p'"),
    ("tpu_create.sh", ["seed", "useast5", "v5p-8"], "'useast5'"),
    ("tpu_create.sh", ["Seed_1", ZONE, "v5p-8"], "'Seed_1'"),
    ("tpu_create.sh", ["seed", ZONE, "v5p-8", "--preemptible"], "'--preemptible'"),
    ("tpu_setup.sh", ["seed", ZONE, "--ref=main"], "--ref needs --repo"),
    ("tpu_run.sh", ["seed", ZONE, "--workdir=gs://b/r"], "--config="),
    ("tpu_run.sh", ["seed", ZONE, "--config=configs/alfworld.py"], "--workdir="),
    ("tpu_logs.sh", ["seed", ZONE, "first"], "'first'"),
    ("tpu_delete.sh", ["seed", ZONE, "--all"], "'--all'"),
    ("slurm_gpu.sbatch", ["--config=configs/alfworld.py"], "--workdir="),
])
def test_a_bad_argument_is_named_and_nothing_runs(fakes, script, args, named):
  result = fakes(script, *args)
  assert result.returncode == 2
  assert named in result.stderr.splitlines()[0]
  assert fakes.calls() == []


def test_create_a_slice(fakes):
  ok(fakes("tpu_create.sh", "seed", ZONE, "v5p-8"))
  assert fakes.calls() == [["gcloud", "compute", "tpus", "tpu-vm", "create", "seed",
                            f"--zone={ZONE}", "--accelerator-type=v5p-8",
                            "--version=v2-alpha-tpuv5"]]


@pytest.mark.parametrize("accelerator,runtime", [("v5litepod-16", "v2-alpha-tpuv5-lite"),
                                                 ("v6e-8", "v2-alpha-tpuv6e"),
                                                 ("v4-32", "tpu-ubuntu2204-base")])
def test_the_runtime_follows_the_tpu_generation(fakes, accelerator, runtime):
  ok(fakes("tpu_create.sh", "seed", ZONE, accelerator))
  assert f"--version={runtime}" in fakes.calls()[0]


def test_create_a_queued_spot_slice_with_a_chosen_runtime(fakes):
  ok(fakes("tpu_create.sh", "seed", ZONE, "v5p-16", "--queued", "--spot", "--version=rt-1"))
  assert fakes.calls() == [["gcloud", "compute", "tpus", "queued-resources", "create", "seed",
                            "--node-id=seed", f"--zone={ZONE}", "--accelerator-type=v5p-16",
                            "--runtime-version=rt-1", "--spot"]]


def test_setup_copies_this_checkout_to_every_worker_and_installs_for_tpu(fakes):
  ok(fakes("tpu_setup.sh", "seed", ZONE))
  (scp, ssh) = fakes.calls()
  assert scp[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "scp", scp[5]]
  assert scp[5].endswith(".tar.gz") and scp[6:] == ["seed:seed_jax.tar.gz", f"--zone={ZONE}",
                                                    "--worker=all"]
  shipped = fakes.listing(0)
  assert {"seed_jax/main.py", "launch/install.sh", "requirements.txt"} <= set(shipped)
  assert not any(path.startswith((".venv/", "runs/", ".git/")) for path in shipped)
  assert ssh[:8] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "seed", f"--zone={ZONE}",
                     "--worker=all"]
  command = ssh[8]
  assert command.index("tar xzf ~/seed_jax.tar.gz") < command.index(
      "bash launch/install.sh --tpu")


def test_setup_from_a_git_url_clones_on_every_worker(fakes):
  ok(fakes("tpu_setup.sh", "seed", ZONE, "--repo=https://example.com/seed_jax.git",
           "--ref=v1.0"))
  (ssh,) = fakes.calls()
  assert "--worker=all" in ssh and f"--zone={ZONE}" in ssh
  assert "git clone --quiet https://example.com/seed_jax.git ~/seed_jax" in ssh[-1]
  assert "checkout --quiet --detach origin/v1.0" in ssh[-1]
  assert "bash launch/install.sh --tpu" in ssh[-1]


def test_run_starts_seed_jax_multihost_on_every_worker_in_the_background(fakes):
  ok(fakes("tpu_run.sh", "seed", ZONE, "--config=configs/alfworld.py",
           "--workdir=gs://bucket/run 1", "--config.mesh.fsdp=-1"))
  (ssh,) = fakes.calls()
  assert ssh[:8] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "seed", f"--zone={ZONE}",
                     "--worker=all"]
  command = ssh[8].removeprefix("--command=")
  # The overrides reach the remote shell quoted, a space included.
  assert re.search(r"nohup \.venv/bin/python -m seed_jax\.main --multihost "
                   r"--config=configs/alfworld\.py --workdir=gs://bucket/run\\ 1 "
                   r"--config\.mesh\.fsdp=-1 > logs/worker-\$W\.log 2>&1 < /dev/null &",
                   command), command
  assert "agent-worker-number" in command  # each worker logs under its own index


def test_run_stop_signals_every_worker(fakes):
  ok(fakes("tpu_run.sh", "seed", ZONE, "--stop"))
  (ssh,) = fakes.calls()
  assert "--worker=all" in ssh and "kill $(cat ~/seed_jax/logs/seed_jax.pid)" in ssh[-1]


def test_logs_follow_worker_0(fakes):
  ok(fakes("tpu_logs.sh", "seed", ZONE))
  assert fakes.calls() == [["gcloud", "compute", "tpus", "tpu-vm", "ssh", "seed",
                            f"--zone={ZONE}", "--worker=0",
                            "--command=tail -n 200 -F ~/seed_jax/logs/worker-0.log", "--",
                            "-t"]]


@pytest.mark.parametrize("args,expected", [
    ([], ["tpu-vm", "delete", "seed", f"--zone={ZONE}"]),
    (["--yes"], ["tpu-vm", "delete", "seed", f"--zone={ZONE}", "--quiet"]),
    (["--queued", "--yes"], ["queued-resources", "delete", "seed", f"--zone={ZONE}", "--force",
                             "--quiet"]),
])
def test_delete(fakes, args, expected):
  ok(fakes("tpu_delete.sh", "seed", ZONE, *args))
  assert fakes.calls() == [["gcloud", "compute", "tpus", *expected]]


def test_slurm_runs_one_multihost_process_per_task(fakes, tmp_path):
  submit_dir = tmp_path / "checkout"
  (submit_dir / ".venv" / "bin").mkdir(parents=True)
  (submit_dir / ".venv" / "bin" / "python").touch(mode=0o755)
  ok(fakes("slurm_gpu.sbatch", "--config=configs/alfworld.py", "--workdir=/shared/r",
           SLURM_SUBMIT_DIR=str(submit_dir)))
  assert fakes.calls() == [["srun", "--kill-on-bad-exit=1", ".venv/bin/python", "-m",
                            "seed_jax.main", "--multihost", "--config=configs/alfworld.py",
                            "--workdir=/shared/r"]]
  sbatch = (LAUNCH / "slurm_gpu.sbatch").read_text()
  # jax gives the task with SLURM_LOCALID k the node's GPU k: one task per GPU.
  tasks = re.search(r"#SBATCH --ntasks-per-node=(\d+)", sbatch).group(1)
  assert f"#SBATCH --gpus-per-node={tasks}\n" in sbatch


# -- install.sh -------------------------------------------------------------------------------

def jax_pin() -> str:
  return re.search(r"^jax==(\S+)", (REPO / "requirements.txt").read_text(), re.M).group(1)


@pytest.fixture()
def install(tmp_path):
  """Runs a copy of install.sh whose .venv python records each pip call instead of running it."""
  checkout = tmp_path / "checkout"
  (checkout / "launch").mkdir(parents=True)
  shutil.copy(LAUNCH / "install.sh", checkout / "launch")
  for name in ("requirements.txt", "requirements-test.txt"):
    shutil.copy(REPO / name, checkout)
  (checkout / ".venv" / "bin").mkdir(parents=True)
  log = tmp_path / "pip.log"
  recorder = checkout / ".venv" / "bin" / "python"
  recorder.write_text(f'#!/usr/bin/env bash\necho "$*" >> {log}\n')
  recorder.chmod(0o755)
  always_new_enough = tmp_path / "python3"
  always_new_enough.write_text("#!/usr/bin/env bash\nexit 0\n")
  always_new_enough.chmod(0o755)

  def run(*flags):
    log.write_text("")
    result = subprocess.run(["bash", str(checkout / "launch" / "install.sh"), *flags],
                            capture_output=True, text=True, timeout=60,
                            env=dict(os.environ, PYTHON=str(always_new_enough)))
    return result, log.read_text().splitlines()

  return run


@pytest.mark.parametrize("flags,extras", [
    ([], []),
    (["--tpu"], ["jax[tpu]"]),
    (["--cuda"], ["jax[cuda12]"]),
    (["--test"], ["jax[tpu]"]),  # libtpu, to compile for a TPU in tests
    (["--test", "--cuda"], ["jax[tpu]", "jax[cuda12]"]),
])
def test_install_adds_the_accelerator_jax_of_the_pinned_version(install, flags, extras):
  result, pip_calls = install(*flags)
  assert result.returncode == 0, result.stderr
  assert any(call.endswith("-r requirements.txt") for call in pip_calls)
  assert any(call.endswith("-r requirements-test.txt") for call in pip_calls) == (
      "--test" in flags)
  installed = [call.split()[-1] for call in pip_calls if "jax[" in call]
  assert installed == [f"{extra}=={jax_pin()}" for extra in extras]


@pytest.mark.parametrize("flags,named", [(["--tpu", "--cuda"], "exclude each other"),
                                         (["--gpu"], "'--gpu'")])
def test_install_refuses_before_installing_anything(install, flags, named):
  result, pip_calls = install(*flags)
  assert result.returncode == 2 and pip_calls == []
  assert named in result.stderr.splitlines()[0]
