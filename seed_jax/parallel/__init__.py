"""Mesh, logical-axis sharding rules and multi-host initialisation."""

from seed_jax.parallel.mesh import (LogicalMesh, MeshBound, MeshConfig, as_logical_mesh,
                                    batch_sharding, check_sharded_enough, in_mesh, make_mesh,
                                    param_shardings, param_specs, replicated, shard_params)
from seed_jax.parallel.rules import (DEFAULT_RULES, MESH_AXES, active_rules, constrain,
                                     logical_rules, logical_to_spec, validate_rules)
