"""Training with LoRA: an update moves the adapters only, the optimizer holds moments for
the adapters only, on one device and sharded over the 8 fake devices alike."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from seed_jax.models import ModelConfig, Transformer
from seed_jax.models.lora import LoraParam, split_trainable
from seed_jax.seed import batch as batch_lib
from seed_jax.seed import losses
from seed_jax.seed import train_step as ts
from seed_jax.seed.optim import OptimConfig
from tests.seed.test_train_step import RESP, _trajectories

LOSS = losses.LossConfig(lambda_opd=0.5, kl_coef=0.0)
STEP = ts.TrainStepConfig(teacher_mode="joint", micro_batches=2, logprob_chunk=3, loss=LOSS)
OPTIM = OptimConfig(learning_rate=1e-2)


def _lora_params(rank=4, targets=("q", "v", "down")):
  model = Transformer(ModelConfig.tiny(lora_rank=rank, lora_targets=targets),
                      rngs=nnx.Rngs(0))
  return nnx.split(model, nnx.Param)


def _batch():
  batch, _ = batch_lib.build_batch(
      _trajectories(), batch_lib.BatchConfig(response_len=RESP, prompt_bucket=8))
  return {k: jnp.asarray(v) for k, v in batch.items()}


def _flat(state):
  return {path: np.asarray(v.get_value()) for path, v in nnx.to_flat_state(state)}


def _assert_only_adapters_moved(before, after):
  moved = {path for path in before if not np.array_equal(before[path], after[path])}
  adapters = {path for path in before if path[-1] in ("lora_a", "lora_b")}
  # Every B leaves zero on the first step (the loss reaches B through A x); A is only
  # reached through B, zero at the start, so it waits for the second step.
  assert {p for p in adapters if p[-1] == "lora_b"} <= moved <= adapters


def test_split_trainable_without_adapters_is_everything():
  _, params = nnx.split(Transformer(ModelConfig.tiny(), rngs=nnx.Rngs(0)), nnx.Param)
  trainable, frozen = split_trainable(params)
  assert trainable is params and not jax.tree.leaves(frozen)


def test_a_lora_update_moves_the_adapters_only_and_holds_their_moments_only():
  graphdef, params = _lora_params()
  before = _flat(params)
  state = ts.init_train_state(params, OPTIM)
  adapter_sizes = sum(v.size for p, v in before.items() if p[-1].startswith("lora"))
  moments = [x for x in jax.tree.leaves(state.opt_state) if x.ndim]  # not the step counts
  assert sum(x.size for x in moments) == 2 * adapter_sizes  # Adam's mu and nu

  step = ts.make_train_step(graphdef, OPTIM, STEP)
  state, out = step(state, _batch())
  assert float(out["update_skipped"]) == 0 and float(out["grad_norm"]) > 0
  _assert_only_adapters_moved(before, _flat(state.params))


def test_a_sharded_lora_update_equals_the_single_device_one(mesh):
  graphdef, params = _lora_params()
  batch = _batch()
  single, _ = ts.make_train_step(graphdef, OPTIM, STEP)(ts.init_train_state(params, OPTIM),
                                                       batch)
  shardings = ts.train_state_shardings(params, mesh, OPTIM)
  sharded_step = ts.make_train_step(graphdef, OPTIM, STEP, mesh, shardings)
  sharded, _ = sharded_step(ts.init_train_state(params, OPTIM, shardings), batch)
  want, got = _flat(split_trainable(single.params)[0]), _flat(split_trainable(sharded.params)[0])
  for path in want:
    np.testing.assert_allclose(got[path], want[path], rtol=2e-3, atol=2e-5, err_msg=str(path))
  rank_axis = {p: v.sharding.spec for p, v in
               ((p, v.get_value()) for p, v in nnx.to_flat_state(sharded.params))
               if p[-1] in ("lora_a", "lora_b")}
  for path, spec in rank_axis.items():
    axis = 1 if path[-1] == "lora_a" else 2
    assert len(spec) <= axis or spec[axis] is None, (path, spec)


@pytest.mark.parametrize("targets", [("q", "k", "v", "o", "gate", "up", "down")])
def test_fine_tuning_with_adapters_leaves_the_base_untouched(targets):
  from seed_jax.train.sft import make_nll_step  # pylint: disable=import-outside-toplevel
  graphdef, params = _lora_params(targets=targets)
  before = _flat(params)
  tokens = jax.random.randint(jax.random.key(0), (2, 16), 3, 256)
  batch = {"tokens": tokens, "mask": jnp.ones((2, 16), bool),
           "target_mask": jnp.ones((2, 6), jnp.float32)}
  step = make_nll_step(graphdef, OPTIM, chunk=3)
  state = ts.init_train_state(params, OPTIM)
  for _ in range(2):
    state, metrics = step(state, batch)
  after = _flat(state.params)
  _assert_only_adapters_moved(before, after)
  assert all(not np.array_equal(before[p], after[p]) for p in before
             if isinstance(dict(nnx.to_flat_state(params))[p], LoraParam))
