"""Packed sequences: the same turns, no padding FLOPs, the same loss and gradients."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from seed_jax.models import ModelConfig, Transformer
from seed_jax.seed import batch as batch_lib
from seed_jax.seed import losses
from seed_jax.seed import packing
from seed_jax.seed import train_step as ts
from tests.seed.steps import assert_sharded_step_equals_single_device

RESP = 8
LOSS = losses.LossConfig(lambda_opd=0.5, kl_coef=0.1)


def _trajectories(seed=0, num=6):
  rng = np.random.default_rng(seed)
  trajs = []
  for n in range(num):
    steps = []
    for _ in range(2):
      prompt = rng.integers(3, 256, size=rng.integers(3, 12)).tolist()
      response = rng.integers(3, 256, size=rng.integers(1, RESP + 3)).tolist()  # some cut
      skill = n % 3 != 2
      steps.append(batch_lib.StepRecord(
          prompt_ids=prompt, response_ids=response,
          sampler_logprobs=rng.normal(-5.5, 0.3, size=len(response)).tolist(),
          action_valid=bool(rng.random() < 0.8),
          teacher_prompt_ids=rng.integers(3, 256, size=5).tolist() + prompt if skill else None))
    trajs.append(batch_lib.Trajectory(task_id=f"t{n % 2}", group_id=f"t{n % 2}",
                                      traj_id=str(n), won=n % 3 == 0,
                                      episode_reward=10.0 * (n % 3 == 0), steps=steps))
  return trajs


def _row_batch(rows_multiple=16, num_trajectories=6):
  batch, _ = batch_lib.build_batch(
      _trajectories(num=num_trajectories), batch_lib.BatchConfig(response_len=RESP, prompt_bucket=8,
                                             rows_multiple=rows_multiple))
  rng = np.random.default_rng(1)
  for key in ("teacher_logprobs", "ref_logprobs"):
    batch[key] = rng.normal(-5.0, 0.5, size=batch["old_logprobs"].shape).astype(np.float32)
  # `rl.opd_span` "decision": the tokens the OPD term counts, a per-token array like the above.
  batch[losses.OPD_SPAN_KEY] = (rng.random(batch["old_logprobs"].shape) < 0.5).astype(
      np.float32)
  return batch


def _pack(batch, num_sequences, shared=False, bucket=8):
  plan = packing.plan_packing(batch, num_sequences)
  widths = packing.packed_widths([plan], bucket, shared, response_bucket=4)
  return packing.pack_batch(batch, plan, widths), plan


def test_every_turn_is_one_segment_with_its_prompt_response_and_positions():
  batch = _row_batch()
  packed, plan = _pack(batch, 4)
  for row in range(batch["advantages"].shape[0]):
    length = int(batch["response_mask"][row].sum())
    if length == 0:
      assert plan.sequence[row] == -1  # a padding row is left out
      continue
    for side in ("student", "teacher"):
      p = batch[f"{side}_tokens"].shape[1] - RESP
      mask = batch[f"{side}_mask"][row]
      want = np.concatenate([batch[f"{side}_tokens"][row, :p][mask[:p]],
                             batch[f"{side}_tokens"][row, p:p + length]])
      seq = plan.sequence[row]
      segment = packed[f"{side}_segments"][seq]
      # Which segment id is this row's: the one whose tokens are exactly these.
      found = [k for k in set(segment.tolist()) - {0}
               if np.array_equal(packed[f"{side}_tokens"][seq][segment == k], want)]
      assert len(found) == 1, (row, side)
      np.testing.assert_array_equal(packed[f"{side}_positions"][seq][segment == found[0]],
                                    np.arange(len(want)))
  # Response slots: the token after each predicting position is a response token, and the
  # per-token arrays carry their row's values there.
  for side in ("student", "teacher"):
    tokens, predict = packed[f"{side}_tokens"], packed[f"{side}_predict"]
    targets = np.take_along_axis(tokens, predict + 1, axis=1)
    np.testing.assert_array_equal(targets * packed["response_mask"],
                                  np.take_along_axis(packed["student_tokens"],
                                                     packed["student_predict"] + 1, axis=1)
                                  * packed["response_mask"])
  assert packed["response_mask"].sum() == batch["response_mask"].sum()
  for key in ("advantages", "opd_mask", "outcome_mask"):
    np.testing.assert_allclose((packed[key] * packed["response_mask"]).sum(),
                               (batch[key][:, None] * batch["response_mask"]).sum(), rtol=1e-6)
  for key in ("old_logprobs", "teacher_logprobs", "ref_logprobs", losses.OPD_SPAN_KEY):
    np.testing.assert_allclose((packed[key] * packed["response_mask"]).sum(),
                               (batch[key] * batch["response_mask"]).sum(), rtol=1e-6)


def test_longest_first_to_the_emptiest_sequence_balances_the_loads():
  rng = np.random.default_rng(3)
  lengths = rng.integers(20, 400, size=64)
  width = 400 + RESP
  batch = {"student_mask": np.zeros((64, width), bool),
           "response_mask": np.zeros((64, RESP), np.float32)}
  for row, n in enumerate(lengths):
    batch["student_mask"][row, width - RESP - n:width - RESP + 1] = True
    batch["response_mask"][row, 0] = 1.0
  plan = packing.plan_packing(batch, 8)
  total = int(batch["student_mask"].sum())
  assert plan.widths[0] <= total / 8 + lengths.max() / 2  # LPT's bound, loosely
  assert plan.widths[0] < 1.1 * total / 8


def test_packed_widths_round_up_and_share_when_asked():
  plans = [packing.PackPlan(np.zeros(1, np.int64), 1, (100, 130, 9)),
           packing.PackPlan(np.zeros(1, np.int64), 1, (120, 90, 3))]
  assert packing.packed_widths(plans, 64, shared=False, response_bucket=8) == (128, 192, 16)
  assert packing.packed_widths(plans, 64, shared=True, response_bucket=8) == (192, 192, 16)


def test_a_plan_too_wide_for_the_widths_is_a_clear_error():
  batch = _row_batch()
  plan = packing.plan_packing(batch, 2)
  with pytest.raises(ValueError, match="student width"):
    packing.pack_batch(batch, plan, (8, 1024, 64))


@pytest.fixture(scope="module")
def model_parts():
  model = Transformer(ModelConfig.tiny(), rngs=nnx.Rngs(0))
  return nnx.split(model, nnx.Param)


@pytest.mark.parametrize("mode,micro_batches,windowed", [
    ("joint", 1, True), ("separate", 2, True), ("precomputed", 2, True),
    ("precomputed", 2, False)])
def test_the_step_on_packed_sequences_equals_the_step_on_rows(model_parts, mode,
                                                               micro_batches, windowed):
  """Loss, gradients and every metric sum are the same numbers in both layouts, also when
  the packed sequences attend only within the longest turn (`max_segment_len`)."""
  graphdef, params = model_parts
  rows = _row_batch(num_trajectories=12)
  packed, _ = _pack(rows, 2, shared=mode == "joint")
  window = packing.max_segment_len(rows) if windowed else None
  if windowed:  # the second query block (64 queries) starts past the window
    assert packed["student_tokens"].shape[1] > 64 + window
  cfg = ts.TrainStepConfig(teacher_mode=mode, micro_batches=micro_batches, logprob_chunk=3,
                           loss=LOSS)
  fn = jax.jit(ts.make_loss_and_grad_fn(graphdef, cfg), static_argnums=2)
  want_loss, want_grads, want_sums = fn(params, {k: jnp.asarray(v) for k, v in rows.items()})
  loss, grads, sums = fn(params, {k: jnp.asarray(v) for k, v in packed.items()}, window)
  assert float(want_sums["tokens"]) > 0 and float(want_sums["opd_tokens"]) > 0
  np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
  chex.assert_trees_all_close(grads, want_grads, rtol=1e-4, atol=1e-5)
  # Entropy is logz - E[logit]: with the tiny model's near-certain predictions it cancels,
  # so float32 rounding of a different summation order shows at ~1e-6 a token.
  np.testing.assert_allclose(sums.pop("entropy_sum"), want_sums.pop("entropy_sum"), atol=5e-4)
  chex.assert_trees_all_close(sums, want_sums, rtol=1e-5, atol=1e-5)


def test_no_packed_turn_is_longer_than_the_widest_row():
  rows = _row_batch()
  packed, _ = _pack(rows, 4)
  window = packing.max_segment_len(rows)
  assert window == max(rows["student_tokens"].shape[1], rows["teacher_tokens"].shape[1])
  for side in ("student", "teacher"):
    segments = packed[f"{side}_segments"]
    lengths = [np.sum(row == s) for row in segments for s in set(row.tolist()) - {0}]
    assert 0 < max(lengths) <= window


def test_packing_fills_the_sequences():
  rows = _row_batch()
  packed, _ = _pack(rows, 4)
  fill, row_fill = packing.token_fill(packed), packing.token_fill(rows)
  assert fill["student_fill"] > row_fill["student_fill"]
  assert fill["teacher_fill"] > row_fill["teacher_fill"]


def test_a_sharded_packed_step_equals_the_single_device_one(model_parts, mesh):
  """Packed sequences shard by rows like padded rows: 8 sequences over data x fsdp = 4,
  2 micro-batches."""
  graphdef, params = model_parts
  packed, _ = _pack(_row_batch(), 8)
  batch = {k: jnp.asarray(v) for k, v in packed.items()}
  cfg = ts.TrainStepConfig(teacher_mode="separate", micro_batches=2, logprob_chunk=3,
                           loss=LOSS)
  assert_sharded_step_equals_single_device(graphdef, params, batch, cfg, mesh)
