"""Turn rows -> packed sequences, so that padding costs no FLOPs in the update (host side).

`build_batch` lays every turn out as `prompt left-padded to P ++ response right-padded to
R`: a batch of ALFWorld turns is a third padding or more (P is the longest prompt rounded
up to a bucket, R the response budget, most responses far shorter). Packing lays the same
turns end to end in `N` sequences of length `L`, each turn its own segment (attention
stays inside a segment, positions restart at 0), and puts the response tokens of each
sequence in one list `[N, Rp]`: every per-token quantity of the loss (`response_mask`,
`old_logprobs`, teacher and reference log-probs) and every per-row one broadcast to its
tokens (`advantages`, `opd_mask`, `outcome_mask`) follow that list. The loss is a sum over
tokens (`seed_jax.seed.losses`), so it is the same number in either layout.

Packed batch (N sequences; Ls, Lt the student and teacher widths; Rp response slots):
  student_tokens int32 `[N, Ls]`, student_segments int32 `[N, Ls]` (0 at padding, k for
  the k-th turn of the sequence), student_positions int32 `[N, Ls]`, student_predict int32
  `[N, Rp]` (the position whose hidden state predicts each response token); the same four
  `teacher_*` arrays for the skill-augmented prompts, their response slots in the same
  order; response_mask, old_logprobs, advantages, opd_mask, outcome_mask and, where the row
  batch has them, teacher_logprobs / ref_logprobs / opd_span: float32 `[N, Rp]`.

Turns go to sequences longest first, each to the one with the least tokens so far (the
LPT rule), so the N sequences come out nearly equal in length; within a sequence they
keep the row order.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from seed_jax.seed.losses import OPD_SPAN_KEY

# Per-token arrays `[B, R]` of the row layout that follow the response slots.
TOKEN_KEYS = ("response_mask", "old_logprobs", "teacher_logprobs", "ref_logprobs",
              OPD_SPAN_KEY)
# Per-row arrays `[B]` broadcast to the row's response slots.
ROW_KEYS = ("advantages", "opd_mask", "outcome_mask")
# Response slots are rounded up to a multiple of this, so that few step shapes compile.
RESPONSE_SLOT_BUCKET = 64


def _round_up(value: int, multiple: int) -> int:
  return -(-max(value, 1) // multiple) * multiple


@dataclasses.dataclass(frozen=True)
class PackPlan:
  """Which sequence each turn goes to, and the widths the sequences need.

  Attributes:
    sequence: `[B]` the sequence of each row, -1 for a row with no response token (the
      row layout's padding rows), which is left out.
    num_sequences: N.
    widths: the smallest (student, teacher, response-slot) widths that hold every
      sequence, before rounding to buckets.
  """
  sequence: np.ndarray
  num_sequences: int
  widths: tuple[int, int, int]


def _segments(tokens: np.ndarray, mask: np.ndarray, response_len: int,
              lengths: np.ndarray) -> list[tuple[np.ndarray, int]]:
  """Per row: (its real tokens, prompt then response; the prompt's length)."""
  prompt_len = tokens.shape[1] - response_len
  out = []
  for row in range(tokens.shape[0]):
    prompt = tokens[row, :prompt_len][mask[row, :prompt_len]]
    response = tokens[row, prompt_len:prompt_len + lengths[row]]
    out.append((np.concatenate([prompt, response]), len(prompt)))
  return out


def _response_lengths(batch: dict[str, np.ndarray]) -> np.ndarray:
  """`[B]` response tokens per row (the response mask is a prefix of R)."""
  return batch["response_mask"].astype(bool).sum(axis=1)


def plan_packing(batch: dict[str, np.ndarray], num_sequences: int) -> PackPlan:
  """Assigns the turns of a row-layout batch (`build_batch`'s, or a slice of it) to
  `num_sequences` sequences by the LPT rule on each turn's longer row (student or teacher).
  """
  lengths = _response_lengths(batch)
  response_len = batch["response_mask"].shape[1]
  student = batch["student_mask"].sum(axis=1) - batch["student_mask"][:, -response_len:].sum(1)
  need = student + lengths
  teacher_need = need
  if "teacher_mask" in batch:
    teacher = (batch["teacher_mask"].sum(axis=1)
               - batch["teacher_mask"][:, -response_len:].sum(1))
    teacher_need = teacher + lengths
  sequence = np.full(len(lengths), -1, np.int64)
  loads = np.zeros((num_sequences, 3), np.int64)  # student, teacher, response tokens
  for row in sorted(np.flatnonzero(lengths > 0), key=lambda r: -max(need[r], teacher_need[r])):
    target = int(np.argmin(loads[:, 0] + loads[:, 1]))
    sequence[row] = target
    loads[target] += (need[row], teacher_need[row], lengths[row])
  return PackPlan(sequence=sequence, num_sequences=num_sequences,
                  widths=tuple(int(w) for w in loads.max(axis=0)))


def max_segment_len(batch: dict[str, np.ndarray]) -> int:
  """The longest a packed turn can be: the row layout's widest row (a turn is its prompt's
  real tokens and its response, at most `P + R` of its side). The packed step's attention
  reads keys only this far back (`causal_attention`'s `window`); one bound an iteration,
  like the widths, so that the step compiles once."""
  return max(batch[f"{side}_tokens"].shape[1] for side in ("student", "teacher")
             if f"{side}_tokens" in batch)


def packed_widths(plans: list[PackPlan], bucket: int, shared: bool,
                  response_bucket: int = RESPONSE_SLOT_BUCKET) -> tuple[int, int, int]:
  """One (Ls, Lt, Rp) for a list of plans (the mini-batches of an iteration, so that they
  compile once): the largest need, rounded up to `bucket` (tokens) and `response_bucket`
  (response slots); Ls = Lt when `shared` (the "joint" teacher mode concatenates them)."""
  student, teacher, response = (max(p.widths[i] for p in plans) for i in range(3))
  student, teacher = _round_up(student, bucket), _round_up(teacher, bucket)
  if shared:
    student = teacher = max(student, teacher)
  return student, teacher, _round_up(response, response_bucket)


def pack_batch(batch: dict[str, np.ndarray], plan: PackPlan, widths: tuple[int, int, int],
               pad_id: int = 0) -> dict[str, np.ndarray]:
  """Lays the rows of `batch` out as `plan` says, at `widths` (`packed_widths`).

  Args:
    batch: a row-layout batch (module docstring of `seed_jax.seed.batch`).
  Returns:
    the packed batch (module docstring).
  """
  student_width, teacher_width, slots = widths
  n = plan.num_sequences
  lengths = _response_lengths(batch)
  response_len = batch["response_mask"].shape[1]
  out: dict[str, np.ndarray] = {}
  sides = [("student", student_width)]
  if "teacher_tokens" in batch:
    sides.append(("teacher", teacher_width))
  for side, width in sides:
    out[f"{side}_tokens"] = np.full((n, width), pad_id, np.int32)
    out[f"{side}_segments"] = np.zeros((n, width), np.int32)
    out[f"{side}_positions"] = np.zeros((n, width), np.int32)
    out[f"{side}_predict"] = np.zeros((n, slots), np.int32)
  for key in TOKEN_KEYS + ROW_KEYS:
    if key in batch:
      out[key] = np.zeros((n, slots), np.float32)

  segments = {side: _segments(batch[f"{side}_tokens"], batch[f"{side}_mask"], response_len,
                              lengths) for side, _ in sides}
  fill = {side: np.zeros(n, np.int64) for side, _ in sides}
  slot_fill = np.zeros(n, np.int64)
  count = np.zeros(n, np.int32)
  for row in range(len(lengths)):
    seq = plan.sequence[row]
    if seq < 0:
      continue
    count[seq] += 1
    r, s = lengths[row], slot_fill[seq]
    for side, width in sides:
      tokens, prompt_len = segments[side][row]
      start = fill[side][seq]
      if start + len(tokens) > width:
        raise ValueError(f"pack_batch: sequence {seq} needs more than its {side} width "
                         f"{width}; take the widths from packed_widths of this plan")
      out[f"{side}_tokens"][seq, start:start + len(tokens)] = tokens
      out[f"{side}_segments"][seq, start:start + len(tokens)] = count[seq]
      out[f"{side}_positions"][seq, start:start + len(tokens)] = np.arange(len(tokens))
      # Response token j sits at start + prompt_len + j, predicted by the position before.
      out[f"{side}_predict"][seq, s:s + r] = start + prompt_len - 1 + np.arange(r)
      fill[side][seq] += len(tokens)
    for key in TOKEN_KEYS:
      if key in batch:
        out[key][seq, s:s + r] = batch[key][row, :r]
    for key in ROW_KEYS:
      if key in batch:
        out[key][seq, s:s + r] = batch[key][row]
    slot_fill[seq] += r
  return out


def token_fill(batch: dict[str, np.ndarray]) -> dict[str, float]:
  """Real tokens over computed tokens of each side of a batch in either layout: what the
  forward passes spend on padding (packing's saving is the rise of this number)."""
  out = {}
  for side in ("student", "teacher"):
    real = batch.get(f"{side}_segments", batch.get(f"{side}_mask"))
    if real is not None:
      out[f"{side}_fill"] = float((real > 0).sum() / real.size)
  return out
