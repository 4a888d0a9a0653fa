"""Test setup: CPU only, 8 fake devices (chex) so sharded code paths really run over a mesh.

The device count must be set before jax initialises its backends, hence at import time
here, before any test module runs a jax operation. `chex.set_n_cpu_devices` writes it into
XLA_FLAGS, so subprocesses started by tests inherit the same 8 devices unless they set
XLA_FLAGS themselves.
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# libtpu (installed so that tests compile for TPU slices) stays quiet, as for the commands
# (seed_jax.cli.NO_TPU_ENV), and lets several test processes describe TPU topologies at once.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
from seed_jax.cli import NO_TPU_ENV  # pylint: disable=wrong-import-position
for _key, _value in NO_TPU_ENV.items():
  os.environ.setdefault(_key, _value)

import chex  # pylint: disable=wrong-import-position
import pytest  # pylint: disable=wrong-import-position

NUM_DEVICES = 8
chex.set_n_cpu_devices(NUM_DEVICES)


@pytest.fixture(scope="session")
def mesh():
  """The (data=2, fsdp=2, tensor=2) mesh over the 8 fake devices, shared by every test."""
  import jax  # pylint: disable=import-outside-toplevel

  from seed_jax.parallel import MeshConfig, make_mesh  # pylint: disable=import-outside-toplevel
  assert jax.device_count() == NUM_DEVICES, jax.devices()
  return make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))


@pytest.fixture(scope="session")
def tokenizer():
  """The embedded SmolLM2 tokenizer (real byte-level BPE and chat template), no weights."""
  # pylint: disable=import-outside-toplevel
  from seed_jax.models.embedded import embedded_model_dir
  from seed_jax.models.tokenizer import load_tokenizer
  return load_tokenizer(embedded_model_dir())


@pytest.fixture
def compiles():
  """A context manager factory: `with compiles() as events:` collects one entry per XLA
  compile that runs inside the block (jax.monitoring's backend-compile event)."""
  import contextlib  # pylint: disable=import-outside-toplevel

  import jax  # pylint: disable=import-outside-toplevel

  @contextlib.contextmanager
  def collect():
    seen = []

    def listener(event: str, _seconds: float, **_):
      if event.endswith("backend_compile_duration"):
        seen.append(event)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
      yield seen
    finally:
      jax.monitoring.unregister_event_duration_listener(listener)

  return collect
