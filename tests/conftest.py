"""Test setup: CPU only, 8 fake devices so sharded code paths really run over a mesh.

The XLA flag must be set before jax initialises its backends, hence at import time here.
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
  os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()
