"""Golden tests of the SEED losses against independent numpy computations."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seed_jax.seed import losses

B, R = 4, 6


def _inputs(seed=0):
  rng = np.random.default_rng(seed)
  lp = rng.normal(-1.5, 0.8, size=(B, R)).astype(np.float32)
  batch = {
      "old_logprobs": (lp + rng.normal(0, 0.4, size=(B, R))).astype(np.float32),
      "response_mask": (rng.random((B, R)) < 0.75).astype(np.float32),
      "advantages": np.array([1.3, -0.7, -2.0, 0.4], np.float32),
      "opd_mask": np.array([1, 0, 1, 1], np.float32),
  }
  teacher = (lp + rng.normal(0, 0.6, size=(B, R))).astype(np.float32)
  ref = (lp + rng.normal(0, 0.5, size=(B, R))).astype(np.float32)
  entropy = rng.random((B, R)).astype(np.float32)
  return lp, entropy, batch, teacher, ref


def _np_pg(lp, old, adv, clip_lo, clip_hi, dual):
  """Token-wise dual-clip PPO loss, written out branch by branch.

  `dual` follows the config's documented meaning: a bound c > 1, or 0 for no dual clip.
  """
  out = np.zeros_like(lp, dtype=np.float64)
  for i in range(lp.shape[0]):
    for j in range(lp.shape[1]):
      r = np.exp(np.float64(lp[i, j]) - old[i, j])
      a = float(adv[i])
      loss = max(-a * r, -a * min(max(r, 1 - clip_lo), 1 + clip_hi))
      if dual > 0 and a < 0:
        loss = min(loss, -a * dual)
      out[i, j] = loss
  return out


def _np_total(lp, entropy, batch, teacher, ref, cfg):
  mask = batch["response_mask"].astype(np.float64)
  tokens = mask.sum()
  pg = _np_pg(lp, batch["old_logprobs"], batch["advantages"], cfg.clip_low, cfg.clip_high,
              cfg.dual_clip)
  diff = ref.astype(np.float64) - lp
  kl = np.clip(np.exp(diff) - diff - 1, -cfg.kl_clamp, cfg.kl_clamp)
  opd_mask = mask * batch["opd_mask"][:, None]
  gate = 1 / (1 + np.exp(-cfg.beta_opd * (teacher.astype(np.float64) - lp)))
  opd = (gate * (teacher - lp) * opd_mask).sum() / opd_mask.sum()
  parts = {
      "pg_loss": (pg * mask).sum() / tokens,
      "kl": (kl * mask).sum() / tokens,
      "entropy": (entropy * mask).sum() / tokens,
      "opd_loss": opd,
      "gate_mean": (gate * opd_mask).sum() / opd_mask.sum(),
  }
  total = (parts["pg_loss"] + cfg.lambda_opd * opd + cfg.kl_coef * parts["kl"]
           - cfg.entropy_coef * parts["entropy"])
  return total, parts, gate, opd_mask


def _jax_total(lp, entropy, batch, teacher, ref, cfg):
  sums = losses.seed_loss_sums(lp, entropy, batch, teacher, ref, cfg)
  total = losses.total_loss(sums, sums["tokens"], sums["opd_tokens"], cfg)
  chex.assert_shape(total, ())  # a scalar, not a per-row loss a scalar comparison would pass
  return total, sums


@pytest.mark.parametrize("cfg", [
    losses.LossConfig(),
    losses.LossConfig(clip_high=0.28, dual_clip=0.0, kl_coef=0.0, entropy_coef=0.0),
    losses.LossConfig(lambda_opd=1.0, beta_opd=1.0, kl_coef=0.5),
])
def test_total_and_parts_match_numpy(cfg):
  lp, entropy, batch, teacher, ref = _inputs()
  jbatch = {k: jnp.asarray(v) for k, v in batch.items()}
  total, sums = _jax_total(jnp.asarray(lp), jnp.asarray(entropy), jbatch, jnp.asarray(teacher),
                           jnp.asarray(ref), cfg)
  want_total, parts, gate, opd_mask = _np_total(lp, entropy, batch, teacher, ref, cfg)
  np.testing.assert_allclose(total, want_total, rtol=1e-5, atol=1e-6)
  metrics = losses.finalize_metrics(sums, cfg)
  for key, value in parts.items():
    np.testing.assert_allclose(metrics[key], value, rtol=1e-5, atol=1e-6, err_msg=key)
  hist = np.histogram(gate[opd_mask > 0], bins=cfg.gate_bins, range=(0, 1))[0]
  np.testing.assert_allclose(metrics["gate_hist"], hist / opd_mask.sum(), atol=1e-6)
  delta = (teacher - lp)[opd_mask > 0]
  np.testing.assert_allclose(metrics["delta_mean"], delta.mean(), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(metrics["delta_std"], delta.std(), rtol=1e-3, atol=1e-5)
  np.testing.assert_allclose(metrics["delta_max"], delta.max(), rtol=1e-6)


def test_opd_gradient_is_minus_gate_over_count_and_teacher_gets_none():
  cfg = losses.LossConfig(clip_low=0.2, kl_coef=0.0, entropy_coef=0.0, lambda_opd=1.0)
  lp, entropy, batch, teacher, _ = _inputs(1)
  jbatch = {k: jnp.asarray(v) for k, v in batch.items()}

  def opd_only(lp_, teacher_):
    sums = losses.seed_loss_sums(lp_, jnp.asarray(entropy), jbatch, teacher_, None, cfg)
    return sums["opd_sum"] / sums["opd_tokens"]

  g_lp, g_teacher = jax.grad(opd_only, argnums=(0, 1))(jnp.asarray(lp), jnp.asarray(teacher))
  gate = 1 / (1 + np.exp(-cfg.beta_opd * (teacher.astype(np.float64) - lp)))
  opd_mask = batch["response_mask"] * batch["opd_mask"][:, None]
  np.testing.assert_allclose(g_lp, -gate * opd_mask / opd_mask.sum(), rtol=1e-5, atol=1e-7)
  np.testing.assert_array_equal(g_teacher, np.zeros_like(teacher))


def test_a_gate_baseline_pulls_up_only_what_the_teacher_prefers_more_than_the_student():
  """`opd_gate_baseline` b: d term / d lp = -(gate - b); at b = 0.5 a token the teacher
  prefers less than the student (delta < 0) is pushed down, one it prefers more pulled up;
  the gate metrics stay the gate's."""
  cfg = losses.LossConfig(kl_coef=0.0, entropy_coef=0.0, lambda_opd=1.0, opd_gate_baseline=0.5)
  lp, entropy, batch, teacher, _ = _inputs(3)
  jbatch = {k: jnp.asarray(v) for k, v in batch.items()}

  def opd_only(lp_):
    sums = losses.seed_loss_sums(lp_, jnp.asarray(entropy), jbatch, jnp.asarray(teacher), None,
                                 cfg)
    return sums["opd_sum"] / sums["opd_tokens"], sums

  g_lp, sums = jax.grad(opd_only, has_aux=True)(jnp.asarray(lp))
  delta = teacher.astype(np.float64) - lp
  gate = 1 / (1 + np.exp(-cfg.beta_opd * delta))
  opd_mask = batch["response_mask"] * batch["opd_mask"][:, None]
  np.testing.assert_allclose(g_lp, -(gate - 0.5) * opd_mask / opd_mask.sum(), rtol=1e-5,
                             atol=1e-7)
  active = opd_mask > 0
  assert np.all(np.sign(np.asarray(g_lp)[active]) == np.sign(delta[active]) * -1)
  np.testing.assert_allclose(sums["gate_sum"], (gate * opd_mask).sum(), rtol=1e-5)


def test_the_gate_baseline_is_a_fraction():
  with pytest.raises(ValueError, match="opd_gate_baseline: in \\[0, 1\\]"):
    losses.LossConfig(opd_gate_baseline=1.5)


def test_pg_and_kl_gradients_match_numpy():
  cfg = losses.LossConfig(lambda_opd=0.0, entropy_coef=0.0, kl_coef=0.3)
  lp, entropy, batch, _, ref = _inputs(2)
  jbatch = {k: jnp.asarray(v) for k, v in batch.items()}

  def loss(lp_):
    sums = losses.seed_loss_sums(lp_, jnp.asarray(entropy), jbatch, None, jnp.asarray(ref), cfg)
    return losses.total_loss(sums, sums["tokens"], jnp.float32(0), cfg)

  got = jax.grad(loss)(jnp.asarray(lp))
  mask = batch["response_mask"]
  adv = batch["advantages"][:, None].astype(np.float64)
  ratio = np.exp(lp.astype(np.float64) - batch["old_logprobs"])
  clipped_ratio = np.clip(ratio, 0.8, 1.2)
  # The gradient flows where the unclipped branch -A * ratio is the loss: the ratio is inside
  # the clip range or the unclipped branch is the larger, and the dual clip does not bind.
  unclipped_wins = (ratio == clipped_ratio) | (-adv * ratio > -adv * clipped_ratio)
  dual_binds = (adv < 0) & (np.maximum(-adv * ratio, -adv * clipped_ratio) > -adv * 3.0)
  d_pg = np.where(unclipped_wins & ~dual_binds, -adv * ratio, 0.0)
  d_kl = 1 - np.exp(ref - lp.astype(np.float64))  # d/dlp of exp(ref-lp) - (ref-lp) - 1
  want = (d_pg + cfg.kl_coef * d_kl) * mask / mask.sum()
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_dual_clip_caps_negative_advantage_loss():
  cfg = losses.LossConfig()
  lp = jnp.asarray([[2.0, 0.0]])
  old = jnp.asarray([[0.0, 0.0]])
  loss, clipped, dual = losses.ppo_clip_token_loss(lp, old, jnp.asarray([[-1.0]]), cfg)
  # ratio e^2 = 7.39 > 3: the loss is capped at -A * 3 = 3.
  np.testing.assert_allclose(loss, [[3.0, 1.0]], rtol=1e-6)
  np.testing.assert_array_equal(dual, [[1.0, 0.0]])
  np.testing.assert_array_equal(clipped, [[0.0, 0.0]])


def test_dual_clip_zero_is_off_and_keeps_negative_advantage_gradients():
  cfg = losses.LossConfig(dual_clip=0.0)
  lp, old, adv = jnp.asarray([[0.1, -0.1]]), jnp.asarray([[0.0, 0.0]]), jnp.asarray([[-1.0]])
  loss, _, dual = losses.ppo_clip_token_loss(lp, old, adv, cfg)
  ratio = np.exp([0.1, -0.1])
  np.testing.assert_allclose(loss, [np.maximum(ratio, np.clip(ratio, 0.8, 1.2))], rtol=1e-6)
  np.testing.assert_array_equal(dual, [[0.0, 0.0]])
  grad = jax.grad(lambda x: losses.ppo_clip_token_loss(x, old, adv, cfg)[0].sum())(lp)
  np.testing.assert_allclose(grad, [ratio], rtol=1e-6)  # d(-A * r)/d lp = r for A = -1


@pytest.mark.parametrize("bound", [0.5, 1.0, -1.0])
def test_a_dual_clip_bound_must_exceed_one(bound):
  from seed_jax.checks import SpecError
  with pytest.raises(SpecError, match="dual_clip"):
    losses.LossConfig(dual_clip=bound)


def test_combined_microbatch_sums_give_full_batch_mean():
  cfg = losses.LossConfig()
  lp, entropy, batch, teacher, ref = _inputs(3)
  full = losses.seed_loss_sums(jnp.asarray(lp), jnp.asarray(entropy),
                               {k: jnp.asarray(v) for k, v in batch.items()},
                               jnp.asarray(teacher), jnp.asarray(ref), cfg)
  parts = []
  for rows in (slice(0, 1), slice(1, 4)):
    parts.append(losses.seed_loss_sums(
        jnp.asarray(lp[rows]), jnp.asarray(entropy[rows]),
        {k: jnp.asarray(v[rows]) for k, v in batch.items()},
        jnp.asarray(teacher[rows]), jnp.asarray(ref[rows]), cfg))
  combined = losses.combine_sums(*parts)
  for key in full:
    np.testing.assert_allclose(combined[key], full[key], rtol=1e-5, atol=1e-6, err_msg=key)
  split_total = sum(losses.total_loss(p, full["tokens"], full["opd_tokens"], cfg) for p in parts)
  np.testing.assert_allclose(
      split_total, losses.total_loss(full, full["tokens"], full["opd_tokens"], cfg), rtol=1e-5)


def _step_outputs(inputs, cfg, grad_norm):
  """A train step's outputs (train_step.make_train_step) for one mini-batch's raw tokens:
  its `seed_loss_sums` and its scalars."""
  lp, entropy, batch, teacher, ref = inputs
  sums = losses.seed_loss_sums(jnp.asarray(lp), jnp.asarray(entropy),
                               {k: jnp.asarray(v) for k, v in batch.items()},
                               jnp.asarray(teacher), jnp.asarray(ref), cfg)
  return {"sums": jax.device_get(sums), "loss": grad_norm / 10, "grad_norm": grad_norm,
          "learning_rate": grad_norm / 100, "update_skipped": 0.0, "update_empty": 0.0,
          "skipped_total": 2.0}


def test_an_update_reports_token_means_over_all_its_steps_tokens():
  from seed_jax.seed.train_step import update_metrics
  cfg = losses.LossConfig()
  # Three optimizer steps of an update; the second has no OPD-active token.
  inputs = [_inputs(seed) for seed in (4, 5, 6)]
  inputs[1][2]["opd_mask"] = np.zeros(B, np.float32)
  update = update_metrics([_step_outputs(x, cfg, g) for x, g in zip(inputs, (1.0, 2.0, 6.0))],
                          cfg)
  # The numpy reference over the raw tokens of all three steps together.
  mask = np.concatenate([x[2]["response_mask"] for x in inputs]) > 0
  opd = mask & (np.concatenate([x[2]["opd_mask"] for x in inputs])[:, None] > 0)
  lp, entropy, teacher = (np.concatenate([x[i] for x in inputs]).astype(np.float64)
                          for i in (0, 1, 3))
  delta = (teacher - lp)[opd]
  gate = 1 / (1 + np.exp(-cfg.beta_opd * delta))
  pg = np.concatenate([_np_pg(x[0], x[2]["old_logprobs"], x[2]["advantages"], cfg.clip_low,
                              cfg.clip_high, cfg.dual_clip) for x in inputs])
  np.testing.assert_allclose(update["entropy"], entropy[mask].mean(), rtol=1e-5)
  np.testing.assert_allclose(update["pg_loss"], pg[mask].mean(), rtol=1e-5)
  np.testing.assert_allclose(update["gate_mean"], gate.mean(), rtol=1e-5)
  np.testing.assert_allclose(update["delta_mean"], delta.mean(), rtol=1e-5)
  np.testing.assert_allclose(update["delta_std"], delta.std(), rtol=1e-3)
  np.testing.assert_allclose([update["delta_max"], update["delta_min"]],
                             [delta.max(), delta.min()], rtol=1e-6)
  hist = np.histogram(gate, bins=cfg.gate_bins, range=(0, 1))[0]
  np.testing.assert_allclose(update["gate_hist"], hist / len(gate), atol=1e-6)
  assert update["tokens"] == mask.sum() and update["opd_tokens"] == opd.sum()
  assert update["grad_norm"] == 3.0 and np.isclose(update["loss"], 0.3)  # their mean
  assert update["learning_rate"] == 0.06 and update["skipped_total"] == 2.0  # the last
  assert update["update_skipped"] == 0.0  # summed: no step skipped


def test_an_update_counts_its_skipped_steps():
  from seed_jax.seed.train_step import update_metrics
  cfg = losses.LossConfig()
  steps = [dict(_step_outputs(_inputs(seed), cfg, 1.0), update_skipped=skipped,
                skipped_total=total) for seed, skipped, total in ((0, 1.0, 1.0), (1, 0.0, 1.0),
                                                                  (2, 1.0, 2.0))]
  update = update_metrics(steps, cfg)
  assert update["update_skipped"] == 2.0 and update["skipped_total"] == 2.0


def test_an_update_without_opd_tokens_reports_its_opd_means_as_zero():
  from seed_jax.seed.train_step import update_metrics
  cfg = losses.LossConfig()
  inputs = _inputs(7)
  inputs[2]["opd_mask"] = np.zeros(B, np.float32)
  inputs[1][:] = 1.0  # entropy 1 at every token
  update = update_metrics([_step_outputs(inputs, cfg, 1.0)] * 2, cfg)
  assert update["gate_mean"] == update["delta_std"] == update["delta_max"] == 0.0
  assert update["opd_tokens"] == 0.0 and update["entropy"] == 1.0


def test_rows_out_of_the_outcome_terms_leave_pg_entropy_and_kl_but_keep_opd():
  """The numpy reference drops the rows from the batch (no mask arithmetic) for the outcome
  terms and scores OPD on the whole batch."""
  cfg = losses.LossConfig(lambda_opd=0.5, kl_coef=0.2, entropy_coef=0.01)
  lp, entropy, batch, teacher, ref = _inputs(3)
  outcome = np.array([1, 0, 1, 0], np.float32)
  kept = outcome > 0
  sub = {k: v[kept] for k, v in batch.items()}
  _, outcome_parts, _, _ = _np_total(lp[kept], entropy[kept], sub, teacher[kept], ref[kept],
                                     cfg)
  _, full_parts, _, _ = _np_total(lp, entropy, batch, teacher, ref, cfg)
  want = (outcome_parts["pg_loss"] + cfg.kl_coef * outcome_parts["kl"]
          - cfg.entropy_coef * outcome_parts["entropy"] + cfg.lambda_opd * full_parts["opd_loss"])

  jbatch = {k: jnp.asarray(v) for k, v in dict(batch, outcome_mask=outcome).items()}
  total, sums = _jax_total(jnp.asarray(lp), jnp.asarray(entropy), jbatch, jnp.asarray(teacher),
                           jnp.asarray(ref), cfg)
  np.testing.assert_allclose(total, want, rtol=1e-5, atol=1e-6)
  assert float(sums["tokens"]) == batch["response_mask"][kept].sum()
  assert float(sums["opd_tokens"]) == (batch["response_mask"] * batch["opd_mask"][:, None]).sum()

  # Row 1 is out of the outcome terms and has no skill: no gradient reaches it. Row 3 is out
  # too but has a skill: only OPD's -gate / opd_tokens reaches it.
  grad = jax.grad(lambda x: _jax_total(x, jnp.asarray(entropy), jbatch, jnp.asarray(teacher),
                                       jnp.asarray(ref), cfg)[0])(jnp.asarray(lp))
  np.testing.assert_array_equal(np.asarray(grad)[1], 0.0)
  gate = 1 / (1 + np.exp(-cfg.beta_opd * (teacher[3].astype(np.float64) - lp[3])))
  opd_tokens = (batch["response_mask"] * batch["opd_mask"][:, None]).sum()
  np.testing.assert_allclose(np.asarray(grad)[3],
                             -cfg.lambda_opd * gate * batch["response_mask"][3] / opd_tokens,
                             rtol=1e-5, atol=1e-8)


def test_an_update_counts_its_steps_without_signal():
  from seed_jax.seed.train_step import update_metrics
  cfg = losses.LossConfig()
  steps = [dict(_step_outputs(_inputs(seed), cfg, 1.0), update_empty=empty)
           for seed, empty in ((0, 1.0), (1, 0.0), (2, 1.0))]
  assert update_metrics(steps, cfg)["update_empty"] == 2.0


def test_the_token_masks_count_response_tokens_of_the_rows_each_term_keeps():
  """Outcome terms: the response tokens of rows with `outcome_mask` 1; OPD: those of rows
  with a skill. A per-row flag given per token (packed sequences) reads the same."""
  _, _, batch, _, _ = _inputs(5)
  outcome = np.array([1, 0, 1, 0], np.float32)
  want_outcome = batch["response_mask"] * outcome[:, None]
  want_opd = batch["response_mask"] * batch["opd_mask"][:, None]
  per_row = {k: jnp.asarray(v) for k, v in dict(batch, outcome_mask=outcome).items()}
  per_tok = dict(per_row, outcome_mask=jnp.asarray(np.repeat(outcome[:, None], R, axis=1)),
                 opd_mask=jnp.asarray(np.repeat(batch["opd_mask"][:, None], R, axis=1)))
  for rows in (per_row, per_tok):
    np.testing.assert_array_equal(losses.outcome_token_mask(rows), want_outcome)
    np.testing.assert_array_equal(losses.opd_token_mask(rows), want_opd)
    assert float(losses.signal_tokens(rows, with_opd=False)) == want_outcome.sum()
    assert float(losses.signal_tokens(rows, with_opd=True)) == np.maximum(
        want_outcome, want_opd).sum()


def _total_loss(lp, batch, args):
  entropy, teacher, ref, cfg = args
  return _jax_total(lp, entropy, batch, teacher, ref, cfg)[0]


def test_an_opd_span_keeps_the_opd_term_to_its_tokens_and_leaves_the_outcome_terms():
  """`rl.opd_span` "decision": the OPD term, its gradient and its token-mean denominator
  count only the marked tokens of the rows with a skill; PG, entropy and KL are as without."""
  cfg = losses.LossConfig(lambda_opd=1.0, beta_opd=5.0, opd_gate_baseline=0.5)
  lp, entropy, batch, teacher, ref = _inputs(7)
  span = np.zeros((B, R), np.float32)
  span[:, 2] = 1.0  # one decision token a row
  span[0, 3] = 1.0
  plain = {k: jnp.asarray(v) for k, v in batch.items()}
  spanned = dict(plain, **{losses.OPD_SPAN_KEY: jnp.asarray(span)})
  args = (jnp.asarray(entropy), jnp.asarray(teacher), jnp.asarray(ref), cfg)

  counted = batch["response_mask"] * batch["opd_mask"][:, None] * span
  _, sums = _jax_total(jnp.asarray(lp), args[0], spanned, *args[1:])
  _, plain_sums = _jax_total(jnp.asarray(lp), args[0], plain, *args[1:])
  assert float(sums["opd_tokens"]) == counted.sum() > 0
  for key in ("pg_sum", "entropy_sum", "kl_sum", "tokens"):
    np.testing.assert_allclose(sums[key], plain_sums[key], rtol=1e-6, err_msg=key)

  grad = jax.grad(lambda x: _total_loss(x, spanned, args))(jnp.asarray(lp))
  grad_plain = jax.grad(lambda x: _total_loss(x, plain, args))(jnp.asarray(lp))
  gate = 1 / (1 + np.exp(-cfg.beta_opd * (teacher.astype(np.float64) - lp)))
  opd_grad = -cfg.lambda_opd * (gate - 0.5) * counted / counted.sum()
  plain_opd = batch["response_mask"] * batch["opd_mask"][:, None]
  outcome_grad = np.asarray(grad_plain) + (
      cfg.lambda_opd * (gate - 0.5) * plain_opd / plain_opd.sum())
  np.testing.assert_allclose(grad, outcome_grad + opd_grad, rtol=1e-4, atol=1e-7)
