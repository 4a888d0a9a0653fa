"""Device mesh from config, parameter shardings from logical axes, and a sanity check.

The mesh has three axes, `("data", "fsdp", "tensor")`. Sizes come from config; one of them
may be -1 for "all remaining devices".

A `LogicalMesh` is the device mesh together with the rules table that maps logical axis
names onto it (`seed_jax.parallel.rules`). `make_mesh` returns one, and everything that
places arrays (weight import, the sampler, the train state, batches, the model's
activation constraints) takes its rules from it, so a user's rules cannot be dropped on
the way. A plain `jax.sharding.Mesh` is still accepted and means "the active rules"
(`DEFAULT_RULES` unless inside `logical_rules`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any, Callable, Iterator, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from seed_jax.parallel.rules import (DEFAULT_RULES, MESH_AXES, Rules, active_rules,
                                     logical_rules, logical_to_spec, validate_rules)


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """Mesh axis sizes; -1 means "the rest of the devices" (at most one axis)."""

  data: int = 1
  fsdp: int = -1
  tensor: int = 1
  rules: Rules = DEFAULT_RULES

  def resolved_shape(self, num_devices: int) -> tuple[int, int, int]:
    sizes = [self.data, self.fsdp, self.tensor]
    for name, size in zip(MESH_AXES, sizes):
      if size == 0 or size < -1:
        raise ValueError(f"mesh.{name} must be a positive size or -1, got {size}")
    if sizes.count(-1) > 1:
      raise ValueError(f"at most one mesh axis may be -1, got {dict(zip(MESH_AXES, sizes))}")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
      if num_devices % known:
        raise ValueError(f"mesh {dict(zip(MESH_AXES, sizes))}: {num_devices} devices are not "
                         f"divisible by the fixed axes' product {known}")
      sizes[sizes.index(-1)] = num_devices // known
    if math.prod(sizes) != num_devices:
      raise ValueError(f"mesh {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} devices, "
                       f"but {num_devices} are available")
    return tuple(sizes)


@dataclasses.dataclass(frozen=True)
class LogicalMesh:
  """A device mesh and the rules that place logical axis names on it.

  Reads like a `Mesh` where code only looks at it (`shape`, `axis_names`, `devices`,
  `size`); `mesh` is the jax Mesh for jax APIs (`NamedSharding(lm.mesh, ...)`).
  """

  mesh: Mesh
  rules: Rules = DEFAULT_RULES

  def __post_init__(self):
    object.__setattr__(self, "rules", validate_rules(self.rules))

  @property
  def shape(self):
    return self.mesh.shape

  @property
  def axis_names(self) -> tuple[str, ...]:
    return self.mesh.axis_names

  @property
  def devices(self) -> np.ndarray:
    return self.mesh.devices

  @property
  def size(self) -> int:
    return self.mesh.size

  @contextlib.contextmanager
  def activate(self) -> Iterator[LogicalMesh]:
    """The block runs with this mesh as jax's ambient mesh and these rules active, so
    functions traced inside (the model's `constrain` calls) place activations by them."""
    with jax.set_mesh(self.mesh), logical_rules(self.rules):
      yield self

  def spec(self, logical_axes: Sequence[str | None]) -> PartitionSpec:
    return logical_to_spec(logical_axes, self.rules)

  @property
  def batch_axes(self) -> tuple[str, ...]:
    """The mesh axes that the rules' "batch" entry splits rows over."""
    entry = self.spec(("batch",))[0]
    return entry if isinstance(entry, tuple) else ((entry,) if entry else ())

  @property
  def batch_shards(self) -> int:
    """How many row shards a `[B, ...]` batch has (B must be a multiple of it)."""
    return math.prod(self.shape[a] for a in self.batch_axes)

  def batch_sharding(self, ndim: int = 2) -> NamedSharding:
    """`[B, ...]` arrays: rows by the "batch" rule, other dimensions replicated."""
    axes = self.batch_axes
    rows = None if not axes else (axes[0] if len(axes) == 1 else axes)
    return NamedSharding(self.mesh, PartitionSpec(rows, *([None] * (ndim - 1))))

  def replicated(self) -> NamedSharding:
    return NamedSharding(self.mesh, PartitionSpec())


def as_logical_mesh(mesh: Mesh | LogicalMesh | None, rules: Rules | None = None
                    ) -> LogicalMesh | None:
  """`mesh` with its rules: a `LogicalMesh` as is, a plain `Mesh` with `rules` (default:
  the active rules), None as None. Explicit `rules` that contradict a `LogicalMesh`'s are
  an error: two tables would place the same arrays two ways."""
  if mesh is None:
    return None
  if isinstance(mesh, LogicalMesh):
    if rules is not None and validate_rules(rules) != mesh.rules:
      raise ValueError("rules were passed alongside a LogicalMesh that carries different "
                       "ones; pass the mesh alone (make_mesh(MeshConfig(..., rules=...)))")
    return mesh
  return LogicalMesh(mesh, active_rules() if rules is None else rules)


class MeshBound:
  """A function (usually jitted) that always runs under a `LogicalMesh`: calling it, and
  `lower` / `trace` for ahead-of-time compilation, activate the mesh and its rules, since
  tracing is when the model's activation constraints read them."""

  def __init__(self, fn: Callable, mesh: LogicalMesh):
    self.__wrapped__ = fn
    self.mesh = mesh
    self.__doc__ = getattr(fn, "__doc__", None)

  def __call__(self, *args, **kwargs):
    with self.mesh.activate():
      return self.__wrapped__(*args, **kwargs)

  def lower(self, *args, **kwargs):
    with self.mesh.activate():
      return self.__wrapped__.lower(*args, **kwargs)

  def trace(self, *args, **kwargs):
    with self.mesh.activate():
      return self.__wrapped__.trace(*args, **kwargs)

  def __getattr__(self, name: str) -> Any:
    return getattr(self.__wrapped__, name)


def in_mesh(fn, mesh: Mesh | LogicalMesh | None):
  """`fn` run (and lowered) with `mesh` and its rules active (see `MeshBound`); with no
  mesh, `fn` itself."""
  mesh = as_logical_mesh(mesh)
  return fn if mesh is None else MeshBound(fn, mesh)


def make_mesh(config: MeshConfig = MeshConfig(), devices=None) -> LogicalMesh:
  """The `("data", "fsdp", "tensor")` mesh (Auto axis types: GSPMD propagation) with the
  config's rules."""
  devices = jax.devices() if devices is None else devices
  shape = config.resolved_shape(len(devices))
  mesh = Mesh(np.asarray(devices).reshape(shape), MESH_AXES,
              axis_types=(AxisType.Auto,) * len(MESH_AXES))
  return LogicalMesh(mesh, config.rules)


def single_device_mesh() -> Mesh:
  """The first device as a mesh of the project's axes: where weights go without a mesh."""
  return Mesh(np.asarray(jax.devices()[:1]).reshape(1, 1, 1), MESH_AXES)


def _is_variable(x) -> bool:
  return isinstance(x, nnx.Variable)


def param_specs(state: nnx.State, rules: Rules | None = None) -> nnx.State:
  """PartitionSpec for every variable, from its `logical_axes` metadata (replicated if
  none), by `rules` (default: the active rules)."""
  rules = active_rules() if rules is None else rules

  def spec(var):
    if not _is_variable(var):  # a bare array carries no logical axes
      return PartitionSpec()
    axes = var.get_metadata().get("logical_axes")
    return var.replace(logical_to_spec(axes, rules) if axes else PartitionSpec())

  return jax.tree.map(spec, state, is_leaf=_is_variable)


def param_shardings(state: nnx.State, mesh: Mesh | LogicalMesh, rules: Rules | None = None
                    ) -> nnx.State:
  """NamedSharding for every variable by its logical axes and the mesh's rules; axes whose
  mesh size does not divide are replicated."""
  mesh = as_logical_mesh(mesh, rules)
  sizes = dict(mesh.shape)

  def sharding(var, spec_var):
    spec = spec_var.get_value() if _is_variable(spec_var) else spec_var
    entries = []
    for dim, entry in zip(var.shape, tuple(spec) + (None,) * len(var.shape)):
      axes = entry if isinstance(entry, tuple) else ((entry,) if entry else ())
      entries.append(entry if dim % math.prod(sizes[a] for a in axes) == 0 else None)
    placed = NamedSharding(mesh.mesh, PartitionSpec(*entries[:len(var.shape)]))
    return var.replace(placed) if _is_variable(var) else placed

  return jax.tree.map(sharding, state, param_specs(state, mesh.rules), is_leaf=_is_variable)


def shard_params(state: nnx.State, mesh: Mesh | LogicalMesh, rules: Rules | None = None
                 ) -> nnx.State:
  """Places every parameter on the mesh by its logical axes and the mesh's rules."""
  shardings = param_shardings(state, mesh, rules)
  def place(var, sharding):
    if not _is_variable(var):
      return jax.device_put(var, sharding)
    return var.replace(jax.device_put(var.get_value(), sharding.get_value()))

  return jax.tree.map(place, state, shardings, is_leaf=_is_variable)


def batch_sharding(mesh: Mesh | LogicalMesh, ndim: int = 2) -> NamedSharding:
  """Sharding for `[B, ...]` arrays: rows by the "batch" rule (by default over ("data",
  "fsdp")), the rest replicated."""
  return as_logical_mesh(mesh).batch_sharding(ndim)


def replicated(mesh: Mesh | LogicalMesh) -> NamedSharding:
  return as_logical_mesh(mesh).replicated()


def check_sharded_enough(state: nnx.State, mesh: Mesh | LogicalMesh,
                         min_size: int = 2**16) -> None:
  """Fails when fsdp > 1 yet a large parameter is fully replicated (a rules-table bug that
  would silently cost `fsdp`x memory). Names every offending parameter."""
  fsdp = dict(mesh.shape)["fsdp"]
  if fsdp <= 1:
    return
  offenders = []
  for path, var in nnx.to_flat_state(state):
    value = var.get_value() if _is_variable(var) else var
    if value.size >= min_size and value.sharding.is_fully_replicated:
      offenders.append(f"{'.'.join(map(str, path))} {tuple(value.shape)}")
  if offenders:
    raise ValueError(f"fsdp={fsdp} but these parameters are fully replicated: "
                     f"{', '.join(offenders)}; check mesh.rules")
