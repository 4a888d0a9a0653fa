"""Finished trajectories -> padded student and teacher rows for the train step (host side).

One row per environment step (as the public SEED code trains). Every row is laid out as
`prompt left-padded to P ++ response right-padded to R`, so response token `r` sits at
position `P + r` and student and teacher log-probs `[B, R]` align by construction. The
teacher's longer, skill-augmented prompts get their own P unless `shared_prompt_len`
(the "joint" teacher mode concatenates both kinds of row in one forward pass). Masks are
explicit arrays, never inferred from token ids (the pad id may equal eos).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from seed_jax.checks import non_negative, one_of, positive_int, require
from seed_jax.models.vision.mrope import mrope_position_ids
from seed_jax.seed import advantages as adv_lib
from seed_jax.seed.advantages import ADVANTAGE_MODES


@dataclasses.dataclass
class StepRecord:
  """One turn of an episode, already tokenized by the caller.

  Attributes:
    prompt_ids: token ids of the acting prompt h_t after the chat template.
    response_ids: the sampled response token ids (the action tokens).
    sampler_logprobs: `[len(response_ids)]` the sampler's log-probs of those tokens.
    action_valid: whether the parsed action was valid (else the step pays the penalty).
    action_effective: whether the env said the action changed its state (info
      "action_effective"; False: a Sokoban move into a wall), which
      `BatchConfig.ineffective_penalty` may charge.
    teacher_prompt_ids: ids of H(h_t, skill) after the chat template, or None when the
      trajectory has no valid skill (the row then takes no part in OPD).
    observation, response_text: text for the analyzer prompt.
    prompt_text: the user message h_t before the chat template (H inserts the skill in it).
    image: the turn's image as the model read it (an `ImageInputs` of one image), for an
      env that shows images; the prompt ids hold its vision tokens, and the teacher
      prompt the same ones.
  """
  prompt_ids: Sequence[int]
  response_ids: Sequence[int]
  sampler_logprobs: Sequence[float]
  action_valid: bool = True
  action_effective: bool = True
  teacher_prompt_ids: Sequence[int] | None = None
  observation: str = ""
  response_text: str = ""
  prompt_text: str = ""
  image: Any = None


@dataclasses.dataclass
class Trajectory:
  """One finished episode.

  Attributes:
    task_id: the task (game) id. group_id: the GRPO group, usually the task id.
    traj_id: unique per trajectory. won: success. episode_reward: e.g. 10 x won.
    task: the task text (for the analyzer). skill: the analyzer's skill, if valid.
    info: privileged env information for the oracle analyzer (expert plan, goal, ...).
    skill_from: the traj_id of the sibling whose analysis gave `skill` (group hindsight),
      None when the skill is the trajectory's own or there is none.
  """
  task_id: str
  group_id: str
  traj_id: str
  won: bool
  episode_reward: float
  steps: list[StepRecord]
  task: str = ""
  skill: str | None = None
  info: dict[str, Any] = dataclasses.field(default_factory=dict)
  skill_from: str | None = None


@dataclasses.dataclass(frozen=True)
class BatchConfig:
  """How rows are padded and scored.

  Attributes:
    response_len: R, responses are right-padded (and truncated) to it (paper 512).
    prompt_bucket: P is the longest prompt rounded up to a multiple of this, so only a
      few shapes compile.
    shared_prompt_len: one P for student and teacher rows (needed by the "joint" teacher
      mode); otherwise the student rows, the ones the backward pass runs over, are not
      padded to the longer teacher prompts.
    max_prompt_len: longer prompts keep their last tokens (counted in the stats).
    rows_multiple: the row count is padded to a multiple of it (mesh batch size times
      micro-batches) with rows whose masks are all zero.
    pad_id: id written at padded positions (never used to infer masks).
    invalid_penalty: subtracted from an invalid step's score (paper 0.1, search 0.01).
    ineffective_penalty: subtracted from the score of a valid step that changed nothing
      (`StepRecord.action_effective` False; paper 0).
    advantage_mode: "step" (public code) or "trajectory"; see advantages.py.
    norm_by_std: divide by the group std (False for WebShop, as in the public code).
    eps: added to the std (1e-6).
    skip_zero_advantage_groups: a group whose advantages are all zero (every sample scored
      alike) carries no outcome signal; its rows get `outcome_mask` 0, which takes them out
      of the policy-gradient, entropy and KL terms and their token counts (DAPO's dynamic
      sampling, without resampling). The OPD term keeps them.
    image_token_id, spatial_merge_size: a vision-language model's image placeholder id and
      merge size (`ModelConfig.image_token_id`, `cfg.vision.spatial_merge_size`): rows of
      steps that show an image get its patches and multimodal positions.
  """
  response_len: int = 512
  prompt_bucket: int = 128
  max_prompt_len: int = 2048
  rows_multiple: int = 1
  shared_prompt_len: bool = True
  pad_id: int = 0
  invalid_penalty: float = 0.1
  ineffective_penalty: float = 0.0
  advantage_mode: str = "step"
  norm_by_std: bool = True
  eps: float = 1e-6
  skip_zero_advantage_groups: bool = False
  image_token_id: int | None = None
  spatial_merge_size: int = 2

  def __post_init__(self):
    require(self, ("response_len", "prompt_bucket", "max_prompt_len", "rows_multiple"),
            positive_int, "a positive integer")
    require(self, ("invalid_penalty", "ineffective_penalty"), non_negative,
            "a non-negative number")
    require(self, "advantage_mode", one_of(ADVANTAGE_MODES), f"one of {ADVANTAGE_MODES}")


def place_row(tokens: np.ndarray, mask: np.ndarray, row: int, prompt: Sequence[int],
              response: Sequence[int], prompt_len: int) -> bool:
  """Writes `prompt` left-padded to `prompt_len` then `response` into row `row` of
  `tokens` / `mask` `[B, P + R]`; a longer prompt keeps its last tokens. Returns whether
  the prompt was truncated. The one row layout of RL and SFT batches."""
  truncated = len(prompt) > prompt_len
  prompt = list(prompt)[-prompt_len:]
  response = list(response)
  tokens[row, prompt_len - len(prompt):prompt_len] = prompt
  tokens[row, prompt_len:prompt_len + len(response)] = response
  mask[row, prompt_len - len(prompt):prompt_len + len(response)] = True
  return truncated


def _round_up(value: int, multiple: int) -> int:
  return -(-max(value, 1) // multiple) * multiple


def build_batch(
    trajectories: Sequence[Trajectory], cfg: BatchConfig, *, with_teacher: bool = True,
) -> tuple[dict[str, np.ndarray], dict[str, float]]:
  """Pads every step of every trajectory into rows.

  Args:
    trajectories: finished episodes; all groups of the iteration together (advantages are
      normalised per group).
    with_teacher: also build teacher rows (False for plain GRPO).
  Returns:
    (batch, stats). batch holds, with B rows, Ts = P + R and Tt = P_teacher + R (equal
    when `cfg.shared_prompt_len`):
      student_tokens int32 `[B, Ts]`, student_mask bool `[B, Ts]`,
      response_mask float32 `[B, R]`, old_logprobs float32 `[B, R]`,
      advantages float32 `[B]`, opd_mask float32 `[B]` (1 where the row has a skill),
      outcome_mask float32 `[B]` (1 where the row's outcome terms count; see
      `BatchConfig.skip_zero_advantage_groups`), and with_teacher: teacher_tokens int32
      `[B, Tt]`, teacher_mask bool `[B, Tt]`.
      Steps that show an image (`StepRecord.image`; then every step does, with one grid
      `(1, h, w)`) add `image_patches` float32 `[B, h, w, D]` (each row's image, zeros in
      padding rows; the student and teacher rows of a step read the same one) and
      multimodal positions int32 `student_positions [B, 3, Ts]` (and
      `teacher_positions [B, 3, Tt]`).
    stats: row, padding, truncation and OPD counts.
  """
  penalties = adv_lib.step_penalties(
      [[s.action_valid for s in t.steps] for t in trajectories], cfg.invalid_penalty,
      [[s.action_effective for s in t.steps] for t in trajectories], cfg.ineffective_penalty)
  step_adv = adv_lib.step_advantages(
      [t.episode_reward for t in trajectories], penalties, [t.group_id for t in trajectories],
      mode=cfg.advantage_mode, norm_by_std=cfg.norm_by_std, eps=cfg.eps)
  silent = (zero_advantage_groups([t.group_id for t in trajectories], step_adv)
            if cfg.skip_zero_advantage_groups else set())
  steps = [(s, a, float(str(t.group_id) not in silent))
           for t, adv in zip(trajectories, step_adv) for s, a in zip(t.steps, adv)]
  num_rows = _round_up(len(steps), cfg.rows_multiple)

  def padded_len(prompts):
    return min(_round_up(max([len(p) for p in prompts] + [1]), cfg.prompt_bucket),
               cfg.max_prompt_len)

  prompt_len = padded_len([s.prompt_ids for s, _, _ in steps])
  # A teacher row without a skill holds the student prompt (see below).
  teacher_len = padded_len([s.prompt_ids if s.teacher_prompt_ids is None
                            else s.teacher_prompt_ids for s, _, _ in steps])
  if cfg.shared_prompt_len:
    prompt_len = teacher_len = max(prompt_len, teacher_len)
  resp_len = cfg.response_len

  def rows(length, fill, dtype=np.int32):
    return np.full((num_rows, length + resp_len), fill, dtype)

  out = {
      "student_tokens": rows(prompt_len, cfg.pad_id),
      "student_mask": rows(prompt_len, False, bool),
      "response_mask": np.zeros((num_rows, resp_len), np.float32),
      "old_logprobs": np.zeros((num_rows, resp_len), np.float32),
      "advantages": np.zeros((num_rows,), np.float32),
      "opd_mask": np.zeros((num_rows,), np.float32),
      "outcome_mask": np.zeros((num_rows,), np.float32),
  }
  if with_teacher:
    out["teacher_tokens"] = rows(teacher_len, cfg.pad_id)
    out["teacher_mask"] = rows(teacher_len, False, bool)
  stats = {"rows": len(steps), "padding_rows": num_rows - len(steps), "prompt_len": prompt_len,
           "teacher_prompt_len": teacher_len,
           "truncated_prompts": 0, "truncated_responses": 0, "opd_rows": 0,
           "zero_advantage_groups": len(silent),
           "zero_advantage_rows": sum(1 for _, _, counts in steps if not counts)}

  def place(tokens, mask, row, prompt, response):
    stats["truncated_prompts"] += place_row(tokens, mask, row, prompt, response,
                                            tokens.shape[1] - resp_len)

  for row, (step, advantage, counts) in enumerate(steps):
    if len(step.response_ids) != len(step.sampler_logprobs):
      raise ValueError(f"row {row}: {len(step.response_ids)} response ids but "
                       f"{len(step.sampler_logprobs)} sampler log-probs")
    response = list(step.response_ids)[:resp_len]
    stats["truncated_responses"] += len(step.response_ids) > resp_len
    place(out["student_tokens"], out["student_mask"], row, step.prompt_ids, response)
    out["response_mask"][row, :len(response)] = 1.0
    out["old_logprobs"][row, :len(response)] = list(step.sampler_logprobs)[:resp_len]
    out["advantages"][row] = advantage
    out["outcome_mask"][row] = counts
    if with_teacher:
      # Without a skill the teacher row repeats the student row; opd_mask keeps it out.
      has_skill = step.teacher_prompt_ids is not None
      teacher_prompt = step.teacher_prompt_ids if has_skill else step.prompt_ids
      place(out["teacher_tokens"], out["teacher_mask"], row, teacher_prompt, response)
      out["opd_mask"][row] = float(has_skill)
      stats["opd_rows"] += int(has_skill)
  # Padding rows see one pad token so no attention row is empty; all their loss masks are 0.
  out["student_mask"][len(steps):, -1] = True
  if with_teacher:
    out["teacher_mask"][len(steps):, -1] = True
  images = [step.image for step, _, _ in steps]
  if any(image is not None for image in images):
    out.update(_image_rows(out, images, cfg))
  return out, stats


def _image_rows(out: dict[str, np.ndarray], images: Sequence, cfg: BatchConfig
                ) -> dict[str, np.ndarray]:
  """Each row's image patches `[B, h, w, D]` and the rows' multimodal positions
  `[B, 3, T]` (`build_batch`). Raises ValueError naming the step when the images are not
  one per step with one grid, a row lost image tokens to `max_prompt_len`, or a response
  holds one."""
  if cfg.image_token_id is None:
    raise ValueError("the steps show images but BatchConfig.image_token_id is not set "
                     "(the model's ModelConfig.image_token_id)")
  grids = {tuple(image.grids) if image is not None else None for image in images}
  if len(grids) != 1 or None in grids or len(next(iter(grids))) != 1:
    raise ValueError(f"every step must show exactly one image of one size; the steps' image "
                     f"grids are {sorted(map(str, grids))}")
  (grid,) = next(iter(grids))
  frames, h, w = grid
  if frames != 1:
    raise ValueError(f"image grid {grid}: one frame per image expected")
  num_rows = out["advantages"].shape[0]
  patches = np.zeros((num_rows, h, w, images[0].pixel_values.shape[-1]), np.float32)
  for row, image in enumerate(images):
    patches[row] = np.asarray(image.pixel_values, np.float32).reshape(h, w, -1)
  rows = {"image_patches": patches}
  for side in ("student", "teacher"):
    if f"{side}_tokens" not in out:
      continue
    tokens, mask = out[f"{side}_tokens"], out[f"{side}_mask"]
    is_image = tokens[:len(images)] == cfg.image_token_id
    prompt_len = tokens.shape[1] - out["response_mask"].shape[1]
    in_response = np.flatnonzero(is_image[:, prompt_len:].any(axis=1))
    if len(in_response):
      raise ValueError(f"{side} row {in_response[0]}'s response holds the image token (id "
                       f"{cfg.image_token_id}), which the sampler never draws")
    per_row = is_image.sum(axis=1)
    expected = h * w // cfg.spatial_merge_size ** 2
    short = np.flatnonzero(per_row != expected)
    if len(short):
      raise ValueError(f"{side} row {short[0]} holds {per_row[short[0]]} image tokens of "
                       f"{expected}: batch.max_prompt_len cut its prompt; raise it")
    positions, _ = mrope_position_ids(tokens, mask, [grid] * len(images),
                                      image_token_id=cfg.image_token_id,
                                      spatial_merge_size=cfg.spatial_merge_size)
    rows[f"{side}_positions"] = positions.transpose(1, 0, 2).astype(np.int32)
  return rows


def zero_advantage_groups(group_ids: Sequence, step_advantages: Sequence[Sequence[float]],
                          atol: float = 1e-6) -> set[str]:
  """The groups (as `str(group_id)`) whose every step advantage is zero, to `atol` (a
  group mean of equal scores can be off by rounding)."""
  loud = {str(g) for g, adv in zip(group_ids, step_advantages)
          if np.any(np.abs(np.asarray(adv, np.float64)) > atol)}
  return {str(g) for g in group_ids} - loud


def spread_row_order(outcome_mask: np.ndarray, mini_batch_size: int) -> np.ndarray:
  """A row order `[B]` whose consecutive slices of `mini_batch_size` rows give every
  mini-batch its share of the rows with an outcome signal (`outcome_mask` > 0).

  `build_batch` lays a group's rows side by side, so slicing in batch order puts a run of
  groups that all scored alike (`skip_zero_advantage_groups`) into whole mini-batches with
  no outcome signal: GRPO skips them and SEED steps on its OPD term alone, so the arms take
  different numbers of optimizer steps. Here the signal rows are dealt round-robin over the
  `ceil(B / mini_batch_size)` mini-batches (a full one is passed over) and the other rows
  fill the places left, in batch order; each mini-batch keeps its rows in batch order.
  Every mini-batch then has a signal row whenever there are at least as many as there are
  mini-batches, and where B is a multiple of `mini_batch_size` (as `build_batch` pads it)
  two mini-batches' counts differ by at most one.
  """
  rows = outcome_mask.shape[0]
  minis = -(-rows // mini_batch_size)
  capacity = [min(mini_batch_size, rows - k * mini_batch_size) for k in range(minis)]
  slots: list[list[int]] = [[] for _ in range(minis)]
  k = 0
  for row in np.flatnonzero(outcome_mask > 0):
    while len(slots[k]) == capacity[k]:
      k = (k + 1) % minis
    slots[k].append(int(row))
    k = (k + 1) % minis
  rest = iter(np.flatnonzero(outcome_mask <= 0).tolist())
  for slot, room in zip(slots, capacity):
    slot.extend(next(rest) for _ in range(room - len(slot)))
  return np.concatenate([np.sort(np.asarray(slot, np.int64)) for slot in slots])


def trajectory_gate_stats(trajectories: Sequence[Trajectory], batch: dict[str, np.ndarray],
                          teacher_logprobs: np.ndarray, beta: float
                          ) -> list[dict[str, float] | None]:
  """Per trajectory, the OPD shift and gate of its action tokens at theta_old.

  `delta = teacher_logprobs - old_logprobs` (the skill-conditioned and the plain score of
  the sampled tokens, both under the parameters that acted), `gate = sigmoid(beta * delta)`,
  averaged over the trajectory's OPD-active tokens; None for a trajectory without a skill.
  Rows follow `build_batch`'s order: every step of every trajectory, in turn.

  Args:
    batch: `build_batch`'s output (`old_logprobs`, `response_mask [B, R]`, `opd_mask [B]`).
    teacher_logprobs: `[B, R]` under the skill-augmented prompts.
  """
  active = batch["response_mask"] * batch["opd_mask"][:, None]
  delta = (teacher_logprobs - batch["old_logprobs"]).astype(np.float64)
  gate = 1.0 / (1.0 + np.exp(-beta * delta))
  out, row = [], 0
  for traj in trajectories:
    rows = slice(row, row + len(traj.steps))
    row += len(traj.steps)
    tokens = active[rows].sum()
    out.append(None if tokens == 0 else {
        "delta_mean": float((delta[rows] * active[rows]).sum() / tokens),
        "gate_mean": float((gate[rows] * active[rows]).sum() / tokens),
        "opd_tokens": int(tokens)})
  return out
