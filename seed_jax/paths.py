"""Where seed_jax keeps what it generates or converts once: models, games, corpora."""

from __future__ import annotations

import os
import pathlib


def cache_root() -> pathlib.Path:
  """`$SEED_JAX_CACHE`, or `~/.cache/seed_jax`."""
  root = os.environ.get("SEED_JAX_CACHE")
  return pathlib.Path(root) if root else pathlib.Path.home() / ".cache" / "seed_jax"
