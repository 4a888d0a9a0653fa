"""NLL fine-tuning (stage 1 and BC): row layout, golden loss, learning, stage-1 helpers."""

from __future__ import annotations

import json

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from seed_jax.models import ModelConfig, random_model
from seed_jax.seed.optim import OptimConfig
from seed_jax.seed.train_step import init_train_state
from seed_jax.train import stage1
from seed_jax.train.sft import (SFTExample, make_nll_eval, make_nll_step, pack_examples,
                                padded_lengths)


def test_rows_are_left_padded_prompts_then_right_padded_targets():
  batch = pack_examples([SFTExample([5, 6, 7], [8, 9]), SFTExample([4], [3, 2, 1])],
                        pad_id=0, max_len=64, bucket=4, rows_multiple=4)
  chex.assert_shape([batch["tokens"], batch["mask"], batch["target_mask"]],
                    [(4, 8), (4, 8), (4, 4)])
  np.testing.assert_array_equal(batch["tokens"][0], [0, 5, 6, 7, 8, 9, 0, 0])
  np.testing.assert_array_equal(batch["mask"][1], [0, 0, 0, 1, 1, 1, 1, 0])
  np.testing.assert_array_equal(batch["target_mask"][:2], [[1, 1, 0, 0], [1, 1, 1, 0]])
  assert batch["target_mask"][2:].sum() == 0 and batch["mask"][2:].sum(1).tolist() == [1, 1]


def test_every_batch_of_a_run_can_share_one_shape():
  examples = [SFTExample([5] * 3, [8] * 2), SFTExample([4] * 9, [3] * 5)]
  lengths = padded_lengths(examples, max_len=64, bucket=4)
  assert lengths == (12, 8)
  small = pack_examples(examples[:1], pad_id=0, max_len=64, bucket=4, lengths=lengths)
  chex.assert_shape([small["tokens"], small["mask"], small["target_mask"]],
                    [(1, 20), (1, 20), (1, 8)])
  assert small["mask"][0].tolist() == [0] * 9 + [1] * 5 + [0] * 6


def test_nll_equals_numpy_log_softmax():
  model = random_model(ModelConfig.tiny())
  graphdef, params = nnx.split(model, nnx.Param)
  batch = pack_examples([SFTExample([5, 6, 7], [8, 9]), SFTExample([4, 10], [3, 2, 1])],
                        pad_id=0, max_len=64, bucket=4)
  total, count = make_nll_eval(graphdef)(params, batch)
  chex.assert_shape([total, count], ())  # sums over the batch, not per row
  tokens, mask = batch["tokens"], batch["mask"]
  positions = np.maximum(np.cumsum(mask, 1) - 1, 0)
  logits = np.asarray(model.unembed(model(jnp.asarray(tokens), jnp.asarray(positions),
                                          jnp.asarray(mask))), np.float64)
  logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
      - logits.max(-1, keepdims=True)
  p = tokens.shape[1] - batch["target_mask"].shape[1]
  expected = 0.0
  for b in range(2):
    for r in range(batch["target_mask"].shape[1]):
      if batch["target_mask"][b, r]:
        expected -= logp[b, p + r - 1, tokens[b, p + r]]
  assert count == 5
  np.testing.assert_allclose(float(total), expected, rtol=1e-5)


def test_fine_tuning_lowers_the_nll_of_its_data():
  model = random_model(ModelConfig.tiny())
  graphdef, params = nnx.split(model, nnx.Param)
  optim_cfg = OptimConfig(learning_rate=3e-3, weight_decay=0.0)
  state = init_train_state(params, optim_cfg)
  step = make_nll_step(graphdef, optim_cfg)
  batch = pack_examples([SFTExample([5, 6, 7], [8, 9, 10, 11])], pad_id=0, max_len=32, bucket=4)
  first = None
  for _ in range(20):
    state, metrics = step(state, batch)
    first = float(metrics["nll"]) if first is None else first
  assert float(metrics["nll"]) < 0.5 * first and int(state.step) == 20


def test_stage1_library_prefers_successful_episodes_and_holdout_is_seeded():
  records = [{"task_type": "pick", "won": False, "answer": json.dumps(
                  {"episode_summary": "s", "episode_skill": "avoid doing the wrong thing"})},
             {"task_type": "pick", "won": True, "answer": json.dumps(
                  {"episode_summary": "s", "episode_skill": "take the object then place it"})}]
  assert stage1.skill_library(records) == {"pick": "take the object then place it"}
  train, held = stage1.split_holdout(list(range(20)), 0.1, seed=3)
  assert len(held) == 2 and sorted(train + held) == list(range(20))
  assert stage1.split_holdout(list(range(20)), 0.1, seed=3) == (train, held)


def test_batches_chain_the_epochs_so_only_the_last_is_short():
  from seed_jax.train.sft import iterate_batches
  examples = [SFTExample([i], [i]) for i in range(5)]
  batches = iterate_batches(examples, 4, epochs=2, seed=0)
  assert [len(b) for b in batches] == [4, 4, 2]
  seen = [e.prompt_ids[0] for b in batches for e in b]
  assert sorted(seen[:5]) == sorted(seen[5:]) == list(range(5))  # each epoch sees all
  assert batches == iterate_batches(examples, 4, epochs=2, seed=0)


def _examples_of_varied_length(rng, count):
  """Prompts of 3 to 20 tokens and targets of 1 to 6: rows that are mostly padding."""
  return [SFTExample(rng.integers(1, 200, rng.integers(3, 21)).tolist(),
                     rng.integers(1, 200, rng.integers(1, 7)).tolist()) for _ in range(count)]


def test_packed_examples_keep_their_tokens_and_targets_in_order():
  from seed_jax.seed import packing
  from seed_jax.train.sft import pack_sequences, plan_sequences, token_fill
  examples = _examples_of_varied_length(np.random.default_rng(0), 6)
  rows = pack_examples(examples, pad_id=0, max_len=64, bucket=4)
  plan = plan_sequences(rows, 2)
  packed = pack_sequences(rows, plan, packing.packed_widths([plan], 4, shared=False), pad_id=0)
  for seq in range(2):
    members = [e for e, s in zip(examples, plan.sequence) if s == seq]
    real = packed["segments"][seq] > 0
    # Each example is one segment: its prompt, then its target, positions from 0.
    assert packed["tokens"][seq][real].tolist() == sum(
        (list(e.prompt_ids) + list(e.target_ids) for e in members), [])
    assert packed["positions"][seq][real].tolist() == sum(
        (list(range(len(e.prompt_ids) + len(e.target_ids))) for e in members), [])
    slots = packed["target_mask"][seq] > 0
    predicted = packed["tokens"][seq][packed["predict"][seq][slots] + 1]
    assert predicted.tolist() == sum((list(e.target_ids) for e in members), [])
  assert token_fill(packed) > token_fill(rows)


@pytest.mark.parametrize("pack_rows", [2, 4])
def test_a_packed_nll_step_equals_the_row_step(pack_rows):
  from seed_jax.seed import packing
  from seed_jax.train.sft import pack_sequences, plan_sequences
  model = random_model(ModelConfig.tiny())
  graphdef, params = nnx.split(model, nnx.Param)
  optim_cfg = OptimConfig(learning_rate=1e-3, weight_decay=0.0)
  rows = pack_examples(_examples_of_varied_length(np.random.default_rng(1), 8), pad_id=0,
                       max_len=64, bucket=4)
  plan = plan_sequences(rows, 8 // pack_rows)
  packed = pack_sequences(rows, plan, packing.packed_widths([plan], 4, shared=False), pad_id=0)
  row_state, row_metrics = make_nll_step(graphdef, optim_cfg)(
      init_train_state(params, optim_cfg), rows)
  packed_state, packed_metrics = make_nll_step(
      graphdef, optim_cfg, max_segment_len=rows["tokens"].shape[1])(
          init_train_state(params, optim_cfg), packed)
  assert float(packed_metrics["target_tokens"]) == float(row_metrics["target_tokens"])
  np.testing.assert_allclose(float(packed_metrics["nll"]), float(row_metrics["nll"]),
                             rtol=1e-5)
  np.testing.assert_allclose(float(packed_metrics["grad_norm"]),
                             float(row_metrics["grad_norm"]), rtol=1e-4)
  # Adam's first update is lr * g / |g| per weight: float noise in a tiny gradient moves a
  # weight by a few 1e-6, a different gradient would move it by up to lr (1e-3).
  chex.assert_trees_all_close(packed_state.params, row_state.params, atol=2e-5)


def test_packed_fine_tuning_on_the_mesh_trains_the_same_weights_as_rows(mesh):
  from seed_jax.train.sft import FineTuneSpec, fine_tune
  model = random_model(ModelConfig.tiny())
  graphdef, params = nnx.split(model, nnx.Param)
  examples = _examples_of_varied_length(np.random.default_rng(2), 12)

  def train(pack_rows):
    logged = []
    spec = FineTuneSpec(epochs=1, batch_size=8, learning_rate=1e-3, max_tokens=64,
                        pack_rows=pack_rows)
    out = fine_tune(graphdef, params, examples, spec=spec, mesh=mesh, pad_id=0, seed=0,
                    log=lambda step, metrics, suffix="": logged.append(metrics))
    return jax.device_get(out), logged

  row_params, row_log = train(0)
  packed_params, packed_log = train(4)
  assert len(row_log) == len(packed_log) == 2
  for row, packed in zip(row_log, packed_log):
    np.testing.assert_allclose(packed["nll"], row["nll"], rtol=1e-5)
    assert packed["fill"] > row["fill"]
  chex.assert_trees_all_close(packed_params, row_params, atol=1e-5)

