"""Device mesh from config, parameter shardings from logical axes, and a sanity check.

The mesh has three axes, `("data", "fsdp", "tensor")`. Sizes come from config; one of them
may be -1 for "all remaining devices".
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from seed_jax.parallel.rules import DEFAULT_RULES, MESH_AXES, Rules, logical_to_spec


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


def in_mesh(fn, mesh: Mesh | None):
  """`fn` run with `mesh` as the ambient mesh (the model's activation constraints read it);
  with no mesh, `fn` itself."""
  if mesh is None:
    return fn

  @functools.wraps(fn)
  def wrapped(*args, **kwargs):
    with jax.set_mesh(mesh):
      return fn(*args, **kwargs)
  return wrapped


def make_mesh(config: MeshConfig = MeshConfig(), devices=None) -> Mesh:
  """Builds the `("data", "fsdp", "tensor")` mesh with Auto axis types (GSPMD propagation)."""
  devices = jax.devices() if devices is None else devices
  shape = config.resolved_shape(len(devices))
  return Mesh(np.asarray(devices).reshape(shape), MESH_AXES,
              axis_types=(AxisType.Auto,) * len(MESH_AXES))


def _is_variable(x) -> bool:
  return isinstance(x, nnx.Variable)


def param_specs(state: nnx.State, rules: Rules = DEFAULT_RULES) -> nnx.State:
  """PartitionSpec for every variable, from its `logical_axes` metadata (replicated if none)."""

  def spec(var):
    axes = var.get_metadata().get("logical_axes")
    return var.replace(logical_to_spec(axes, rules) if axes else PartitionSpec())

  return jax.tree.map(spec, state, is_leaf=_is_variable)


def param_shardings(state: nnx.State, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> nnx.State:
  """NamedSharding for every variable; axes whose mesh size does not divide are replicated."""
  sizes = dict(zip(mesh.axis_names, mesh.devices.shape))

  def sharding(var, spec_var):
    entries = []
    for dim, entry in zip(var.shape, tuple(spec_var.get_value()) + (None,) * var.ndim):
      axes = entry if isinstance(entry, tuple) else ((entry,) if entry else ())
      entries.append(entry if dim % math.prod(sizes[a] for a in axes) == 0 else None)
    return var.replace(NamedSharding(mesh, PartitionSpec(*entries[:var.ndim])))

  return jax.tree.map(sharding, state, param_specs(state, rules), is_leaf=_is_variable)


def shard_params(state: nnx.State, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> nnx.State:
  """Places every parameter on the mesh by its logical axes."""
  shardings = param_shardings(state, mesh, rules)
  return jax.tree.map(lambda v, s: v.replace(jax.device_put(v.get_value(), s.get_value())),
                      state, shardings, is_leaf=_is_variable)


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
  """Sharding for `[B, ...]` arrays: batch over ("data", "fsdp"), the rest replicated."""
  return NamedSharding(mesh, PartitionSpec(("data", "fsdp"), *([None] * (ndim - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def check_sharded_enough(state: nnx.State, mesh: Mesh, min_size: int = 2**16) -> None:
  """Fails when fsdp > 1 yet a large parameter is fully replicated (a rules-table bug that
  would silently cost `fsdp`x memory). Names every offending parameter."""
  fsdp = dict(zip(mesh.axis_names, mesh.devices.shape))["fsdp"]
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
