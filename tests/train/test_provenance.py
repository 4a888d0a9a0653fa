"""provenance.json: each start of a run records its machine and the fingerprint of the
weights it starts from; the end records the final weights'. The
fingerprint is exact and does not depend on the machine or the sharding."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from seed_jax import machine_speed, provenance
from seed_jax.train.trainer import Trainer
from tests.train.conftest import tiny_spec


def numpy_leaf_digest(x: np.ndarray) -> int:
  """The leaf sum written independently: Python integers over the bytes read as unsigned
  words, reduced modulo 2**32 at the end."""
  words = np.ascontiguousarray(x).view({1: np.uint8, 2: np.uint16, 4: np.uint32,
                                        }[x.dtype.itemsize]).ravel()
  total = sum(int(w) * (i * 2654435761 + 1) for i, w in enumerate(words))
  return total % 2**32


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16, np.float16, np.int8])
def test_a_leaf_digest_equals_the_numpy_reference(dtype):
  x = (np.random.default_rng(0).normal(size=(3, 37)) * 9).astype(dtype)
  assert int(provenance._leaf_digest(jnp.asarray(x))) == numpy_leaf_digest(x)


def tree():
  rng = np.random.default_rng(1)
  return {"embed": jnp.asarray(rng.normal(size=(16, 8)), jnp.bfloat16),
          "layers": [{"w": jnp.asarray(rng.normal(size=(8, 8)), jnp.float32)}]}


def test_equal_trees_have_equal_fingerprints_and_a_flipped_bit_or_a_swap_changes_it():
  a, b = tree(), tree()
  assert provenance.params_fingerprint(a) == provenance.params_fingerprint(b)
  w = np.asarray(a["layers"][0]["w"])
  flipped = w.copy()
  flipped.view(np.uint32)[2, 3] ^= 1  # the last bit of one float
  swapped = w.copy()
  swapped[[0, 1]] = swapped[[1, 0]]  # the same values, in other places
  for changed in (flipped, swapped):
    b["layers"][0]["w"] = jnp.asarray(changed)
    assert provenance.params_fingerprint(a) != provenance.params_fingerprint(b)
  b["layers"][0]["w"] = a["layers"][0]["w"].astype(jnp.bfloat16)  # same values, other dtype
  assert provenance.params_fingerprint(a) != provenance.params_fingerprint(b)


def test_the_fingerprint_does_not_depend_on_the_sharding():
  mesh = jax.make_mesh((2, 4), ("data", "model"))
  a = tree()
  sharded = jax.tree.map(
      lambda x: jax.device_put(x, NamedSharding(mesh, P("data", "model"))), a)
  assert len(sharded["embed"].sharding.device_set) == 8
  assert provenance.params_fingerprint(sharded) == provenance.params_fingerprint(a)


RUN = {"log.tensorboard": False, "log.plots": False, "rl.kl_coef": 0.0,
       "checkpoint.export_hf": False, "eval.at_end": False}


def test_an_arm_started_from_a_warm_start_records_the_warm_starts_final_weights(
    tiny_model, tmp_path):
  warm = str(tmp_path / "warm")  # a warm start: two cloned episodes, no RL
  Trainer(tiny_spec(tiny_model, "grpo", iterations=0, **{"bc.enabled": True}, **RUN),
          warm).run()
  warm_record = provenance.read(warm)
  [segment] = warm_record["segments"]
  assert segment["resumed_from"] is None and segment["machine"]["cores"] >= 1
  assert segment["machine"]["devices"] == jax.device_count()
  # Its speed, measured at the start: one CPU name has covered machines 2x apart.
  [speed] = provenance.segment_speeds(warm_record)
  assert speed["matmul_gflops"] > 0 and speed["stream_gbps"] > 0

  arm = str(tmp_path / "arm")
  Trainer(tiny_spec(tiny_model, "grpo", iterations=0, init_from=warm, **RUN), arm).run()
  assert provenance.initial_params(provenance.read(arm)) == warm_record["final_params"]

  # Started again where it finished: a second segment, from its own checkpoint.
  Trainer(tiny_spec(tiny_model, "grpo", iterations=0, **RUN), warm).run()
  again = provenance.read(warm)
  assert len(again["segments"]) == 2
  assert again["segments"][1]["initial_params"] == warm_record["final_params"]
  assert again["segments"][0]["initial_params"] != warm_record["final_params"]  # BC trained
  assert again["final_params"] == warm_record["final_params"]
  assert provenance.machine_kinds(again) == [provenance.machine_kind(segment["machine"])]


def test_a_start_drops_the_segments_whose_work_it_redoes(tmp_path):
  provenance.record_start(tmp_path, None, "base")  # fresh: warm start, checkpoint 0
  provenance.record_start(tmp_path, 0, "w0")
  provenance.record_start(tmp_path, 3, "w3")  # from checkpoint 3, stopped before the 4th
  provenance.record_start(tmp_path, 3, "w3")  # so from 3 again, elsewhere
  assert [s["resumed_from"] for s in provenance.read(tmp_path)["segments"]] == [None, 0, 3]
  provenance.record_start(tmp_path, None, "base")  # begun again: its checkpoints were lost
  record = provenance.read(tmp_path)
  assert [s["resumed_from"] for s in record["segments"]] == [None]


def test_a_run_from_before_provenance_reads_as_none(tmp_path):
  assert provenance.read(tmp_path) is None
  assert provenance.initial_params(None) is None and provenance.machine_kinds(None) == []


def test_two_speeds_are_alike_within_the_share_on_every_figure():
  fast = {"matmul_gflops": 360.0, "stream_gbps": 24.0}
  assert machine_speed.alike(fast, {"matmul_gflops": 300.0, "stream_gbps": 20.0})
  assert not machine_speed.alike(fast, {"matmul_gflops": 180.0, "stream_gbps": 24.0})
  assert not machine_speed.alike(fast, {"matmul_gflops": 360.0, "stream_gbps": 12.0})
  assert machine_speed.alike(fast, {"matmul_gflops": 180.0, "stream_gbps": 12.0}, share=0.5)
