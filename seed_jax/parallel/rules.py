"""Logical axis names -> mesh axes.

Parameters carry `logical_axes` metadata (e.g. `("vocab", "embed")`); activations are
constrained with logical names too. One rules table maps each logical name to a mesh axis
(or a tuple of them, or None for replicated). The table lives in the config
(`config.mesh.rules`); `DEFAULT_RULES` is the default.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Sequence

import jax
from jax.sharding import PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")

Rules = tuple[tuple[str, str | tuple[str, ...] | None], ...]

DEFAULT_RULES: Rules = (
    # Parameters: FSDP over the model dimension, tensor parallel over heads / MLP / vocab.
    # The stacked layers' leading axis is replicated: every device holds every layer's
    # slice, so the layer scan never moves weights between devices.
    ("layers", None),
    ("embed", "fsdp"),
    ("vocab", "tensor"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("norm", None),
    # Activations: batch over data and fsdp, heads and MLP over tensor.
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("act_embed", None),
    ("act_heads", "tensor"),
    ("act_mlp", "tensor"),
    ("act_vocab", "tensor"),
)

_ACTIVE_RULES: contextvars.ContextVar[Rules] = contextvars.ContextVar(
    "seed_jax_rules", default=DEFAULT_RULES)


def validate_rules(rules: Sequence[Sequence]) -> Rules:
  """Checks a rules table (e.g. from a config) and returns it as a tuple of pairs."""
  out = []
  for i, rule in enumerate(rules):
    if len(rule) != 2 or not isinstance(rule[0], str):
      raise ValueError(f"mesh.rules[{i}] must be a (logical_name, mesh_axes) pair, got {rule!r}")
    name, axes = rule
    axes = tuple(axes) if isinstance(axes, (list, tuple)) else axes
    for axis in (axes if isinstance(axes, tuple) else (axes,)):
      if axis is not None and axis not in MESH_AXES:
        raise ValueError(f"mesh.rules[{i}] ({name!r}): unknown mesh axis {axis!r}; "
                         f"mesh axes are {MESH_AXES}")
    out.append((name, axes))
  return tuple(out)


def active_rules() -> Rules:
  """The rules table `constrain` uses right now (set by `logical_rules`)."""
  return _ACTIVE_RULES.get()


@contextlib.contextmanager
def logical_rules(rules: Rules):
  """Makes `rules` the active table for `constrain` and `logical_to_spec` in this block."""
  token = _ACTIVE_RULES.set(validate_rules(rules))
  try:
    yield
  finally:
    _ACTIVE_RULES.reset(token)


def logical_to_spec(logical_axes: Sequence[str | None], rules: Rules | None = None
                    ) -> PartitionSpec:
  """Maps logical names to a PartitionSpec; a mesh axis is used at most once per spec."""
  table = dict(rules if rules is not None else _ACTIVE_RULES.get())
  used: set[str] = set()
  spec = []
  for name in logical_axes:
    axes = table.get(name) if name is not None else None
    axes_tuple = axes if isinstance(axes, tuple) else ((axes,) if axes else ())
    free = tuple(a for a in axes_tuple if a not in used)
    used.update(free)
    spec.append(None if not free else (free[0] if len(free) == 1 else free))
  return PartitionSpec(*spec)


def constrain(x: jax.Array, logical_axes: Sequence[str | None]) -> jax.Array:
  """Sharding constraint by logical names; a no-op outside a mesh context (plain CPU runs)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh is None or mesh.empty:
    return x
  spec = logical_to_spec(logical_axes)
  # Drop mesh axes that do not divide the dimension (e.g. a batch of 1 while decoding).
  sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))
  fixed = []
  for dim, entry in zip(x.shape, tuple(spec) + (None,) * (x.ndim - len(spec))):
    axes = entry if isinstance(entry, tuple) else ((entry,) if entry else ())
    total = 1
    for a in axes:
      total *= sizes.get(a, 1)
    fixed.append(entry if total and dim % total == 0 else None)
  return jax.lax.with_sharding_constraint(x, PartitionSpec(*fixed))
