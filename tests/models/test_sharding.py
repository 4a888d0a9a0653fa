"""The model over a (data=2, fsdp=2, tensor=2) mesh of fake CPU devices."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from seed_jax.models import ModelConfig, load_model, random_model
from seed_jax.parallel import (DEFAULT_RULES, LogicalMesh, MeshConfig, batch_sharding,
                               check_sharded_enough, shard_params)


def forward(graphdef, params, tokens, positions, mask):
  model = nnx.merge(graphdef, params)
  return model.unembed(model(tokens, positions, mask))


def inputs(vocab, batch=4, length=16):
  tokens = np.random.default_rng(0).integers(0, vocab, (batch, length)).astype(np.int32)
  mask = np.ones((batch, length), bool)
  mask[1, :6] = False
  positions = np.maximum(np.cumsum(mask, 1) - 1, 0).astype(np.int32)
  return tokens, positions, mask


@pytest.mark.parametrize("cfg", [ModelConfig.tiny(),
                                 ModelConfig.tiny(model_type="qwen3", qk_norm=True,
                                                  tie_word_embeddings=False, head_dim=8)],
                         ids=["llama", "qwen3"])
def test_sharded_forward_equals_unsharded(mesh, cfg):
  graphdef, params = nnx.split(random_model(cfg), nnx.Param)
  args = inputs(cfg.vocab_size)
  expected = jax.jit(forward, static_argnums=0)(graphdef, params, *args)
  sharded = shard_params(params, mesh)
  data = batch_sharding(mesh)
  with mesh.activate():
    got = jax.jit(forward, static_argnums=0, out_shardings=batch_sharding(mesh, 3))(
        graphdef, sharded, *(jax.device_put(a, data) for a in args))
  assert got.sharding.spec[0] == ("data", "fsdp")
  np.testing.assert_allclose(np.asarray(got), np.asarray(expected), atol=2e-5, rtol=1e-5)


def test_parameters_are_sharded_by_their_logical_axes(mesh):
  params = shard_params(nnx.split(random_model(ModelConfig.tiny()), nnx.Param)[1], mesh)
  embed = params["embed"].get_value()
  assert embed.sharding.spec == jax.sharding.PartitionSpec("tensor", "fsdp")
  assert embed.addressable_shards[0].data.shape == (128, 32)  # [256, 64] / (2, 2)
  check_sharded_enough(params, mesh, min_size=1024)


def test_replicated_large_parameters_are_caught(mesh):
  everything_replicated = tuple((name, None) for name, _ in DEFAULT_RULES)
  params = shard_params(nnx.split(random_model(ModelConfig.tiny()), nnx.Param)[1],
                        LogicalMesh(mesh.mesh, everything_replicated))
  with pytest.raises(ValueError, match=r"fsdp=2.*embed \(256, 64\)"):
    check_sharded_enough(params, mesh, min_size=1024)


def test_weights_stream_into_mesh_shardings(mesh, tmp_path):
  from seed_jax.models import export_hf
  model = random_model(ModelConfig.tiny())
  export_hf(model, tmp_path / "m")
  import shutil
  from seed_jax.models.embedded import embedded_model_dir
  shutil.copy(f"{embedded_model_dir()}/tokenizer.json", tmp_path / "m" / "tokenizer.json")
  loaded, _ = load_model(str(tmp_path / "m"), mesh=mesh)
  kernel = loaded.layers.mlp.up_proj.kernel.get_value()  # [L, mlp, embed]
  assert kernel.sharding.spec == jax.sharding.PartitionSpec(None, "tensor", "fsdp")
  np.testing.assert_array_equal(np.asarray(kernel),
                                np.asarray(model.layers.mlp.up_proj.kernel.get_value()))


@pytest.mark.parametrize("sizes,devices,shape", [((1, -1, 1), 8, (1, 8, 1)),
                                                 ((2, -1, 2), 8, (2, 2, 2)),
                                                 ((-1, 1, 4), 8, (2, 1, 4))])
def test_mesh_sizes_resolve(sizes, devices, shape):
  assert MeshConfig(*sizes).resolved_shape(devices) == shape


@pytest.mark.parametrize("sizes,match", [((3, -1, 1), "not divisible"),
                                         ((-1, -1, 1), "at most one"),
                                         ((2, 2, 1), "needs 4 devices"),
                                         ((0, -1, 1), "mesh.data")])
def test_bad_mesh_sizes_name_the_problem(sizes, match):
  with pytest.raises(ValueError, match=match):
    MeshConfig(*sizes).resolved_shape(8)


def test_layer_parameters_are_stacked_with_a_replicated_layers_axis(mesh):
  cfg = ModelConfig.tiny(num_layers=3)
  _, params = nnx.split(random_model(cfg), nnx.Param)
  q = params["layers"]["attn"]["q_proj"]["kernel"]
  assert q.shape == (3, cfg.num_heads * cfg.head_dim, cfg.hidden_size)
  assert q.get_metadata()["logical_axes"] == ("layers", "heads", "embed")
  assert not np.allclose(np.asarray(q[...][0]), np.asarray(q[...][1]))  # own init per layer
  placed = shard_params(params, mesh)
  spec = placed["layers"]["attn"]["q_proj"]["kernel"].get_value().sharding.spec
  assert spec == jax.sharding.PartitionSpec(None, "tensor", "fsdp")
