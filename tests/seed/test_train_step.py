"""The train step on the tiny model: teacher modes, accumulation, sharding, skipping."""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from seed_jax.models import ModelConfig, Transformer
from seed_jax.parallel import shard_params
from seed_jax.seed import batch as batch_lib
from seed_jax.seed import losses
from seed_jax.seed import train_step as ts
from seed_jax.seed.logprobs import positions_from_mask
from seed_jax.seed.optim import OptimConfig

RESP = 8
LOSS = losses.LossConfig(lambda_opd=0.5, kl_coef=0.0)  # a large OPD weight so it shows
# Adam's first step is lr * g / (|g| + eps): with the usual tiny eps it is nearly lr * sign(g),
# which turns float reordering in a near-zero gradient into a whole step. A large eps keeps
# the update proportional to the gradient so sharded and single-device params can be compared.
OPTIM = OptimConfig(learning_rate=1e-2, eps=1.0)


def _trajectories(seed=0):
  rng = np.random.default_rng(seed)
  trajs = []
  for n in range(4):
    steps = []
    for _ in range(2):
      prompt = rng.integers(3, 256, size=rng.integers(3, 7)).tolist()
      response = rng.integers(3, 256, size=rng.integers(2, RESP + 1)).tolist()
      skill = n != 3
      steps.append(batch_lib.StepRecord(
          prompt_ids=prompt, response_ids=response,
          sampler_logprobs=rng.normal(-5.5, 0.3, size=len(response)).tolist(),
          action_valid=bool(rng.random() < 0.8),
          teacher_prompt_ids=rng.integers(3, 256, size=4).tolist() + prompt if skill else None))
    trajs.append(batch_lib.Trajectory(task_id=f"t{n % 2}", group_id=f"t{n % 2}",
                                      traj_id=str(n), won=n % 3 == 0,
                                      episode_reward=10.0 * (n % 3 == 0), steps=steps))
  return trajs


@pytest.fixture(scope="module")
def setup():
  model = Transformer(ModelConfig.tiny(), rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model, nnx.Param)
  batch, _ = batch_lib.build_batch(
      _trajectories(), batch_lib.BatchConfig(response_len=RESP, prompt_bucket=8))
  score = ts.make_score_fn(graphdef, chunk=3)
  batch = {k: jnp.asarray(v) for k, v in batch.items()}
  batch["teacher_logprobs"] = score(params, ts.side_inputs(batch, "teacher"), RESP)
  return graphdef, params, batch, score


@pytest.fixture(scope="module")
def grad_fns(setup):
  graphdef = setup[0]
  cache = {}

  def get(mode, micro_batches=1):
    key = (mode, micro_batches)
    if key not in cache:
      cfg = ts.TrainStepConfig(teacher_mode=mode, micro_batches=micro_batches,
                               logprob_chunk=3, loss=LOSS)
      cache[key] = jax.jit(ts.make_loss_and_grad_fn(graphdef, cfg))
    return cache[key]

  return get


def _assert_trees_close(a, b, rtol=1e-5, atol=1e-6):
  chex.assert_trees_all_close(a, b, rtol=rtol, atol=atol)


def test_score_fn_matches_full_log_softmax(setup):
  graphdef, params, batch, score = setup
  model = nnx.merge(graphdef, params)
  tokens, mask = batch["student_tokens"], batch["student_mask"]
  logits = model.unembed(model(tokens, positions_from_mask(mask), mask))
  log_probs = np.asarray(jax.nn.log_softmax(logits, axis=-1))
  prompt_len = tokens.shape[1] - RESP
  want = np.array([[log_probs[b, prompt_len + r - 1, tokens[b, prompt_len + r]]
                    for r in range(RESP)] for b in range(tokens.shape[0])])
  np.testing.assert_allclose(score(params, {"tokens": tokens, "mask": mask}, RESP), want,
                             rtol=1e-5, atol=1e-5)


def test_teacher_modes_agree_and_teacher_gets_no_gradient(setup, grad_fns):
  _, params, batch, _ = setup
  results = {mode: grad_fns(mode)(params, batch) for mode in ts.TEACHER_MODES}
  joint_loss, joint_grads, joint_sums = results["joint"]
  assert float(joint_sums["opd_tokens"]) > 0 and np.isfinite(float(joint_loss))
  for mode in ("separate", "precomputed"):
    loss, grads, sums = results[mode]
    np.testing.assert_allclose(loss, joint_loss, rtol=1e-5)
    _assert_trees_close(grads, joint_grads)
    _assert_trees_close(sums, joint_sums)
  # The OPD part of the gradient is there (lambda_opd changes it) ...
  no_opd = dataclasses.replace(ts.TrainStepConfig(logprob_chunk=3),
                               loss=dataclasses.replace(LOSS, lambda_opd=0.0))
  _, grads_rl, _ = jax.jit(ts.make_loss_and_grad_fn(setup[0], no_opd))(params, batch)
  diff = jax.tree.leaves(jax.tree.map(lambda a, b: jnp.max(jnp.abs(a - b)), joint_grads, grads_rl))
  assert max(float(d) for d in diff) > 1e-6


def test_gradient_accumulation_equals_full_batch(setup, grad_fns):
  _, params, batch, _ = setup
  full = grad_fns("joint", 1)(params, batch)
  accumulated = grad_fns("joint", 2)(params, batch)
  np.testing.assert_allclose(accumulated[0], full[0], rtol=1e-5)
  _assert_trees_close(accumulated[1], full[1])
  _assert_trees_close(accumulated[2], full[2])


@pytest.mark.parametrize("lambda_opd", [0.5, 0.0], ids=["seed", "grpo"])
def test_a_micro_batch_no_loss_term_counts_is_skipped_not_run(setup, lambda_opd):
  """Micro-batch 1 (rows 1, 3, 5, 7: `_split_micro` is strided) holds only rows of groups
  that scored alike and, for SEED, without a skill. Its values never reach the step: NaN
  there leaves the loss, gradients and sums those of the same rows zeroed, unsplit."""
  graphdef, params, batch, _ = setup
  dead = np.arange(8) % 2 == 1
  with_skill = np.asarray(batch["opd_mask"]) * (~dead if lambda_opd else 1.0)
  rows = {**batch, "outcome_mask": jnp.asarray(~dead, jnp.float32),
          "opd_mask": jnp.asarray(with_skill, jnp.float32)}
  poisoned = {**rows, **{k: jnp.where(dead[:, None], jnp.nan, rows[k])
                         for k in ("old_logprobs", "teacher_logprobs")}}
  zeroed = {**rows, **{k: jnp.where(dead[:, None], 0.0, rows[k])
                       for k in ("old_logprobs", "teacher_logprobs")}}

  def loss_and_grad(micro_batches):
    cfg = ts.TrainStepConfig(teacher_mode="precomputed", micro_batches=micro_batches,
                             logprob_chunk=3, loss=dataclasses.replace(LOSS, lambda_opd=lambda_opd))
    return jax.jit(ts.make_loss_and_grad_fn(graphdef, cfg))

  loss, grads, sums = loss_and_grad(2)(params, poisoned)
  want_loss, want_grads, want_sums = loss_and_grad(1)(params, zeroed)
  assert np.isfinite(float(loss)) and float(want_sums["tokens"]) > 0
  np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
  _assert_trees_close(grads, want_grads)
  _assert_trees_close(sums, want_sums)


@pytest.mark.parametrize("live,micro_batches,order", [
    # micro-batch j holds positions j, j + k, ...: micro-batch 0 (positions 0, 2, 4) gets
    # live rows 1 and 4, then row 0; micro-batch 1 (positions 1, 3, 5) rows 2, 3, 5.
    ([0, 1, 0, 0, 1, 0], 2, [1, 2, 4, 3, 0, 5]),
    ([0, 1, 0, 0, 1, 0], 3, [1, 0, 3, 4, 2, 5]),
    ([1, 1, 1, 1], 2, [0, 2, 1, 3]),
    ([0, 0, 1, 0], 1, [2, 0, 1, 3]),
])
def test_micro_batch_row_order_by_hand(live, micro_batches, order):
  got = ts.micro_batch_row_order(np.array(live, bool), micro_batches)
  assert got.tolist() == order


@pytest.mark.parametrize("seed", range(5))
def test_micro_batch_row_order_fills_the_first_micro_batches_with_live_rows(seed):
  rng = np.random.default_rng(seed)
  k, per_micro = rng.integers(1, 5), rng.integers(1, 6)
  live = rng.random(k * per_micro) < 0.3
  order = ts.micro_batch_row_order(live, k)
  assert sorted(order.tolist()) == list(range(k * per_micro))
  micro = [order[j::k] for j in range(k)]  # _split_micro's layout
  want_live = [min(per_micro, max(0, live.sum() - j * per_micro)) for j in range(k)]
  assert [int(live[m].sum()) for m in micro] == want_live
  flat = np.concatenate(micro)  # live rows, then the others, each in batch order
  assert flat.tolist() == np.flatnonzero(live).tolist() + np.flatnonzero(~live).tolist()


def _fresh_state(params):
  return ts.init_train_state(jax.tree.map(jnp.copy, params), OPTIM)


SHARDED_CFG = dict(micro_batches=2, logprob_chunk=3, loss=dataclasses.replace(LOSS, kl_coef=0.1))


@pytest.fixture(scope="module")
def single_steps(setup):
  cache = {}

  def get(mode):
    if mode not in cache:
      cfg = ts.TrainStepConfig(teacher_mode=mode, **SHARDED_CFG)
      cache[mode] = ts.make_train_step(setup[0], OPTIM, cfg)
    return cache[mode]

  return get


def _with_ref(batch):
  return dict(batch, ref_logprobs=batch["teacher_logprobs"] - 0.05)


@pytest.mark.parametrize("mode", ["joint", "separate"])
def test_sharded_step_equals_single_device(setup, single_steps, mode, mesh):
  graphdef, params, batch, _ = setup
  batch = _with_ref(batch)
  want_state, want_out = single_steps(mode)(_fresh_state(params), batch)

  placed = shard_params(jax.tree.map(jnp.copy, params), mesh)
  shardings = ts.train_state_shardings(placed, mesh, OPTIM)
  state = ts.init_train_state(placed, OPTIM, shardings)
  for got, want in zip(jax.tree.leaves(state), jax.tree.leaves(shardings), strict=True):
    assert got.sharding == want
  cfg = ts.TrainStepConfig(teacher_mode=mode, **SHARDED_CFG)
  sharded = ts.make_train_step(graphdef, OPTIM, cfg, mesh, shardings)
  got_state, got_out = sharded(state, batch)
  got_metrics, want_metrics = (ts.update_metrics([jax.device_get(out)], cfg.loss)
                               for out in (got_out, want_out))
  assert set(got_metrics) == set(want_metrics)
  for key in want_metrics:
    np.testing.assert_allclose(got_metrics[key], want_metrics[key], rtol=1e-4, atol=1e-6,
                               err_msg=key)
  _assert_trees_close(got_state.params, want_state.params, rtol=1e-5, atol=1e-7)
  assert int(got_state.step) == 1 and int(got_state.skipped) == 0
  for got, want in zip(jax.tree.leaves(got_state), jax.tree.leaves(shardings), strict=True):
    assert got.sharding == want
  assert any(not x.sharding.is_fully_replicated for x in jax.tree.leaves(got_state.params))
  assert want_metrics["kl"] > 0 and 0 < want_metrics["gate_mean"] < 1
  np.testing.assert_allclose(float(np.sum(want_metrics["gate_hist"])), 1.0, rtol=1e-5)


def test_non_finite_loss_skips_update(setup, single_steps):
  """A non-finite loss leaves params and moments untouched and is counted."""
  _, params, batch, _ = setup
  nan_batch = _with_ref(dict(batch, advantages=batch["advantages"].at[0].set(jnp.nan)))
  before = _fresh_state(params)
  kept = jax.tree.map(np.asarray, (before.params, before.opt_state))
  after, metrics = single_steps("separate")(before, nan_batch)
  assert int(after.skipped) == 1 and int(after.step) == 0
  assert float(metrics["update_skipped"]) == 1.0 and float(metrics["skipped_total"]) == 1.0
  assert not np.isfinite(float(metrics["loss"]))
  _assert_trees_close((after.params, after.opt_state), kept, rtol=0, atol=0)


def test_a_batch_without_signal_leaves_the_state_and_is_counted_not_skipped(setup):
  """Every row out of the outcome terms and no OPD term: AdamW must not step on weight
  decay and stale moments; with OPD on, the same rows still update."""
  graphdef, params, batch, _ = setup
  silent = dict(batch, outcome_mask=jnp.zeros_like(batch["outcome_mask"]))
  grpo = ts.make_train_step(graphdef, OPTIM, ts.TrainStepConfig(
      teacher_mode="precomputed", loss=dataclasses.replace(LOSS, lambda_opd=0.0, kl_coef=0.0)))
  before = _fresh_state(params)
  kept = jax.tree.map(np.asarray, (before.params, before.opt_state))
  after, out = grpo(before, silent)
  assert float(out["update_empty"]) == 1.0 and float(out["update_skipped"]) == 0.0
  assert int(after.step) == 0 and int(after.skipped) == 0
  _assert_trees_close((after.params, after.opt_state), kept, rtol=0, atol=0)

  seed = ts.make_train_step(graphdef, OPTIM, ts.TrainStepConfig(
      teacher_mode="precomputed", loss=dataclasses.replace(LOSS, kl_coef=0.0)))
  after, out = seed(_fresh_state(params), silent)
  assert float(out["update_empty"]) == 0.0 and int(after.step) == 1
  assert float(out["sums"]["tokens"]) == 0.0 and float(out["sums"]["opd_tokens"]) > 0


def test_missing_inputs_fail_with_names(setup):
  graphdef, params, batch, _ = setup
  with pytest.raises(ValueError, match="ref_logprobs"):
    ts.make_loss_and_grad_fn(graphdef, ts.TrainStepConfig(loss=losses.LossConfig()))(
        params, batch)
  no_teacher = {k: v for k, v in batch.items() if k != "teacher_logprobs"}
  with pytest.raises(ValueError, match="teacher_logprobs"):
    ts.make_loss_and_grad_fn(graphdef, ts.TrainStepConfig(teacher_mode="precomputed",
                                                          loss=LOSS))(params, no_teacher)
  with pytest.raises(ValueError, match="teacher_mode"):
    ts.TrainStepConfig(teacher_mode="both")


def test_end_to_end_oracle_skills_h_batch_step(setup):
  """Trajectories -> oracle analyzer -> H -> (byte) token ids -> batch -> one update."""
  from seed_jax.seed import analyzer as an
  from seed_jax.seed import skills

  graphdef, params, _, _ = setup
  encode = lambda text: list(text.encode())[-40:]  # bytes fit the tiny vocab of 256
  rng = np.random.default_rng(3)
  trajs, user_texts = [], {}
  for n in range(4):
    task = f"put a cool apple {n % 2} in fridge"
    texts = [f"You are an agent.\nYour task is to: {task}.\nStep {i}: you see a fridge."
             for i in range(2)]
    steps = [batch_lib.StepRecord(
        prompt_ids=encode(text), response_ids=[65 + i, 66, 67],
        sampler_logprobs=rng.normal(-5.5, 0.1, size=3).tolist(), action_valid=i == 0,
        observation="you see a fridge", response_text="<action>go to fridge 1</action>")
        for i, text in enumerate(texts)]
    info = {"goal": task, "expert_plan": ["go to fridge 1", "cool apple 1 with fridge 1"]}
    trajs.append(batch_lib.Trajectory(task_id=task, group_id=task, traj_id=str(n),
                                      won=n < 2, episode_reward=10.0 * (n < 2), steps=steps,
                                      task=task, info=info if n != 3 else {}))
    user_texts[str(n)] = texts
  stats = an.make_analyzer(an.AnalyzerConfig(backend="oracle")).annotate(trajs)
  assert stats["valid"] == 4
  trajs[3].skill = None  # as if its analysis had failed: no OPD for its rows
  for traj in trajs:
    for step, text in zip(traj.steps, user_texts[traj.traj_id]):
      if traj.skill:
        step.teacher_prompt_ids = encode(skills.augment_prompt(text, traj.skill, r"Your task is to:").text)
  batch, batch_stats = batch_lib.build_batch(
      trajs, batch_lib.BatchConfig(response_len=4, prompt_bucket=16, rows_multiple=4))
  assert batch_stats["opd_rows"] == 6 and batch_stats["rows"] == 8
  cfg = ts.TrainStepConfig(teacher_mode="separate", logprob_chunk=4,
                           loss=dataclasses.replace(LOSS, kl_coef=0.0))
  step = ts.make_train_step(graphdef, OPTIM, cfg)
  state, out = step(_fresh_state(params), {k: jnp.asarray(v) for k, v in batch.items()})
  assert int(state.step) == 1 and np.isfinite(float(out["loss"]))
  sums = out["sums"]  # the raw sums: update_metrics turns an update's into means
  assert float(sums["opd_tokens"]) == 6 * 3 and float(sums["tokens"]) == 8 * 3


@pytest.mark.parametrize("eps", [1.0, 1e-8], ids=["gradient-proportional", "adam-sign-like"])
def test_a_grpo_step_raises_the_tokens_of_positive_advantage_and_lowers_the_others(setup, eps):
  """The direction of the outcome update, whatever the optimizer's scaling: after one GRPO
  step (no OPD, KL or entropy) on an on-policy batch (old log-probs = the current policy's,
  so no ratio is clipped), the advantage-weighted change of the response log-probs is
  positive, and rows of positive advantage gain more log-prob than rows of negative."""
  graphdef, params, batch, score = setup
  before = score(params, ts.side_inputs(batch, "student"), RESP)
  on_policy = dict(batch, old_logprobs=before)
  cfg = ts.TrainStepConfig(teacher_mode="precomputed", logprob_chunk=3, loss=losses.LossConfig(
      lambda_opd=0.0, kl_coef=0.0, entropy_coef=0.0))
  optim = OptimConfig(learning_rate=1e-3, eps=eps, weight_decay=0.0)
  state, _ = ts.make_train_step(graphdef, optim, cfg)(
      ts.init_train_state(jax.tree.map(jnp.copy, params), optim), on_policy)
  after = score(state.params, ts.side_inputs(batch, "student"), RESP)

  mask = np.asarray(batch["response_mask"]) * np.asarray(batch["outcome_mask"])[:, None]
  advantages = np.asarray(batch["advantages"])
  change = (np.asarray(after) - np.asarray(before)) * mask
  row_change = change.sum(1) / np.maximum(mask.sum(1), 1)
  assert (advantages > 0).any() and (advantages < 0).any()
  assert float((advantages[:, None] * change).sum()) > 0
  assert row_change[advantages > 0].mean() > row_change[advantages < 0].mean()
