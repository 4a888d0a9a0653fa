"""The config a run saved in its folder (RUN/config.json): `--config=configs/run.py:RUN`.

`seed_jax.evaluate --workdir=RUN` reads its run's config this way, so that `--config.KEY=`
overrides and their one-line errors work as for any config file. Keys the run predates
take their defaults from the run's env file (configs/<env>.py, no preset).
"""

from __future__ import annotations

import importlib
import json
import os

import ml_collections


def _tuples(value):
  """JSON has lists where the config had tuples (eval.splits, mesh.rules): back to tuples,
  whose command-line overrides and spec checks the config files were written for."""
  if isinstance(value, list):
    return tuple(_tuples(v) for v in value)
  if isinstance(value, dict):
    return {k: _tuples(v) for k, v in value.items()}
  return value


def _update(config: ml_collections.ConfigDict, saved: dict) -> None:
  """Sets every key of `saved` in `config`, group by group (a group keeps its other keys)."""
  for key, value in saved.items():
    if isinstance(value, dict) and isinstance(config.get(key), ml_collections.ConfigDict):
      _update(config[key], value)
    else:
      config[key] = value


def get_config(workdir: str) -> ml_collections.ConfigDict:
  with open(os.path.join(os.path.expanduser(workdir), "config.json")) as f:
    saved = _tuples(json.load(f))
  config = importlib.import_module(f"configs.{saved['env']['name']}").get_config()
  with config.unlocked():
    _update(config, saved)
  return config
