"""Sokoban 6x6 with one box (the paper's visual setting, here with text observations).

  python -m seed_jax.main --config=configs/sokoban.py          # paper settings
  python -m seed_jax.main --config=configs/sokoban.py:cpu      # minutes on 2 cores
  python -m seed_jax.experiment --config=configs/sokoban.py:learn --out=results/sokoban_learn
                                  # the small-scale comparison (issue 26), skill-reading
  python -m seed_jax.experiment --config=configs/sokoban.py:learn_distill ...
                                  # the same with an OPD term that can act in 10 iterations
  python -m seed_jax.experiment --config=configs/sokoban.py:learn_fast ...
                                  # `:learn_distill` with cheap episodes and 4x as many
  python -m seed_jax.experiment --config=configs/sokoban.py:learn_unstuck ...
                                  # `:learn_fast` charging a move that changes nothing
  python -m seed_jax.experiment --config=configs/sokoban.py:learn_notice ...
                                  # `:learn_unstuck` whose prompt says so, too
  python -m seed_jax.experiment --config=configs/sokoban.py:learn_listed ...
                                  # `:learn_unstuck` listing only the moves that do something
  python -m seed_jax.experiment --config=configs/sokoban.py:learn_placed ...
                                  # `:learn_listed` giving the pieces' (row, column), too
  python -m seed_jax.experiment --config=configs/sokoban.py:learn_long ...
                                  # `:learn_listed` cloning 512 puzzles of 2-3 moves, RL and
                                  # held-out games on puzzles of 4-5
"""

from configs import base
from seed_jax.envs import sokoban


def get_config(preset: str = ""):
  c = base.get_base_config()
  c.env = sokoban.default_config()
  c.env.name = "sokoban"
  c.rollout.max_new_tokens = 512
  c.sft.tasks_per_type = 180  # Sokoban has one task type
  return base.apply_preset(c, preset, cpu=_cpu, learn=_learn, learn_distill=_learn_distill,
                           learn_fast=_learn_fast, learn_unstuck=_learn_unstuck,
                           learn_notice=_learn_notice, learn_listed=_learn_listed,
                           learn_placed=_learn_placed, learn_long=_learn_long)


def _cpu(c):
  base.cpu_preset(c)
  c.env.max_steps = 6
  c.env.num_tasks = {"train": 50, "valid_seen": 8, "valid_unseen": 8}
  c.sft.tasks_per_type = 2


def _learn(c):
  """The setting for the small-scale comparison (issue 26): the `:cpu` model on puzzles of
  2 or 3 moves, a warm start that clones 256 training puzzles once with their oracle plan
  read at the end of the message (each step shown plain and with its plan), RL on the
  other 64 puzzles, and groups without a GRPO signal left out of its terms. Small-model
  aids, every one of them off in the paper presets; every arm of a comparison gets them
  alike.

  Why these puzzles and this warm start (pilots: results/sokoban_pilots/README.md): after
  one epoch of cloning on puzzles of up to 12 moves the plain policy chose its move almost
  uniformly (entropy 1.28 nats of 1.39, p(expert) 0.31) and won 0-25% of an iteration's
  games, as random play does; GRPO had a signal in about one group of four and did not
  learn. Random play wins 19% of the 2-3-move puzzles within 6 turns, so most groups of 4
  carry a signal. Cloning 128 puzzles twice left the plain policy at p(expert) 0.385 and
  GRPO lowered its training success at every learning rate tried (1e-5 to 3e-4, pools of 8
  to 64 puzzles, 16 or 64 episodes an iteration); cloning 256 puzzles once (the same 154
  steps) reads the board better (p(expert) 0.549, 9/16 held out), keeps the oracle
  teacher's gap (16/16, +43.8 points) and GRPO learned from it on seed 0 (training success
  0.42 -> 0.75, first three iterations against the last three; held-out 7/16 -> 9/16).

  Stage 1 (the arms with it: seed, seed_oracle, no_opd) labels 32 of the BC policy's
  trajectories with the oracle analyzer and trains on them at lr 1e-4 with two
  behaviour-cloning examples rehearsed per analyzer example (results/sokoban_pilots/
  stage1/, seed 0's warm start, 16 held-out puzzles): the `:cpu` stage 1 (2 labels, lr
  5e-6) left the policy analyzer writing no parseable skill (0%); 32 labels at lr 2e-5
  6%; at lr 1e-4 without rehearsal 100%, but the oracle-reading teacher fell from 16/16 to
  2/16; with rehearsal the analyzer parses 100% (its skills: 8/16 against 6/16 plain) and
  the oracle teacher keeps 16/16.
  """
  _cpu(c)
  c.env.max_solution_steps = 3
  # The board is the whole state: the two previous boards only lengthened the prompt (and
  # made the 135M model find the current one among three).
  c.env.history_length = 0
  c.skill_placement = "end"
  c.bc.episodes = 256
  c.bc.epochs = 1
  c.bc.skill_fraction = 1.0
  c.bc.disjoint = True
  c.rl.skip_zero_advantage_groups = True
  c.sft.tasks_per_type = 32  # one task type: 32 puzzles' trajectories, oracle-labelled
  c.sft.learning_rate = 1e-4
  c.sft.rehearsal = 2.0
  c.rollout.tasks_per_batch = 4  # 4 puzzles x 4 episodes = 16 episodes an iteration
  c.rollout.group_size = 4
  c.rollout.temperature = 1.0  # the policy's own distribution: exploration for GRPO
  c.rl.learning_rate = 2e-5
  c.rl.iterations = 10
  c.eval.splits = ("valid_unseen",)
  c.eval.every = 5  # held-out curve: the warm start, iteration 5 and the end
  # 256 cloned, 64 more for RL (10 iterations x 4 puzzles = 40 drawn from them).
  c.env.num_tasks = {"train": 320, "valid_seen": 8, "valid_unseen": 16}
  c.eval.max_episodes = 0  # all 16 held-out puzzles


def _learn_distill(c):
  """`:learn` with an OPD term large enough to act within its 10 iterations, and every arm
  stepping on the same mini-batches.

  At the paper's `lambda_opd` 0.01 the OPD term was about 1% of the first update's
  gradient where GRPO had a signal (`seed_jax.teacher_gap --parts=update` on seed 0's
  stage-1 warm start: |G_outcome| 0.434, |G_opd| 0.40 at `lambda_opd` 1;
  results/sokoban_learn/opd_share/), so no teacher could move the policy in 10
  iterations. At 1 the two are of one size there. And in `:learn` a third of the
  mini-batches held only groups that all scored alike: GRPO skipped them, SEED stepped on
  OPD alone, so the SEED arms took 51-54 optimizer steps a run against GRPO's 28-37;
  `rl.spread_outcome_rows` deals the signal rows over every mini-batch (by the same
  records every arm would have taken 46-54). Both are off in the paper presets.
  """
  _learn(c)
  c.rl.lambda_opd = 1.0
  c.rl.spread_outcome_rows = True


def _learn_fast(c):
  """`:learn_distill` with episodes 2.4x cheaper and four times as many of them.

  In `:learn_distill` no arm learned, GRPO included (docs/results.md): 160 episodes a run,
  5-9 an iteration with a GRPO signal, and the training success moved with the 4 puzzles
  each iteration drew. Where its seconds went (grpo seed 0, 10 iterations): rollout ~55 s
  and update ~120 s an iteration for ~80 turn rows of 384 + 40 tokens, behaviour cloning 22
  min, every row mostly the 296-token prompt. Here the prompt is the compact one (159
  tokens: the same legend, rule and goal sentence) and turn rows are padded to a multiple
  of 32 instead of 128 (384 -> 160 prompt positions a row); an iteration draws 8 puzzles
  x 4 episodes and a run takes 20 of them (640 episodes, 4x). The RL pool stays the 64
  puzzles `:learn` keeps out of cloning, so each recurs about 2.5 times a run. Measured
  (grpo seed 1, results/sokoban_fast/): 3.74 s of RL an episode against 9.1 s for the same
  seed in `:learn_distill`; behaviour cloning 19 min.
  """
  _learn_distill(c)
  c.env.prompt_style = "compact"
  c.rl.prompt_bucket = 32
  c.rollout.tasks_per_batch = 8  # 8 puzzles x 4 episodes = 32 episodes an iteration
  c.rl.iterations = 20
  c.eval.every = 10  # held-out curve: the warm start, iteration 10 and the end


def _learn_unstuck(c):
  """`:learn_fast` charging a move that changes nothing (into a wall, or against a box that
  cannot move) as the paper charges a malformed one: `rl.invalid_penalty`'s 0.1, to that
  step only.

  In `:learn_fast` GRPO sharpened the plain decision (p(expert) 0.553 -> 0.719, seed 1) but
  not the success: the prompt shows the board alone (`env.history_length` 0), a blocked
  move leaves it as it was, and a policy sure of that move repeats it to the turn limit
  (46% of a failed held-out episode's later moves at the warm start, 71% after RL;
  results/sokoban_pilots/fast_loops/). Every such episode scores alike, so the outcome
  terms never say which move wasted the turns; the step-local charge does, at the very
  board where it was made. Not the paper's.
  """
  _learn_fast(c)
  c.rl.ineffective_penalty = c.rl.invalid_penalty


def _learn_notice(c):
  """`:learn_unstuck` whose prompt also says when the last move changed nothing
  (`env.blocked_notice`), so that the turn after a blocked move is not the very prompt the
  policy just answered.

  With the charge alone (`:learn_unstuck`, grpo seed 1, results/sokoban_unstuck/) half of a
  training iteration's steps at the warm start were moves that changed nothing and 10
  iterations later still a third to 40%: a policy sure of its move (p near 1) learns
  little from a negative advantage on it, and it meets the same prompt again. The notice
  changes that prompt; the warm start is the same (behaviour cloning follows the expert,
  whose moves all change the board, so it never sees the notice).
  """
  _learn_unstuck(c)
  c.env.blocked_notice = True


def _learn_listed(c):
  """`:learn_unstuck` whose admissible actions are only the moves that change the board
  (`env.effective_moves_only`), as ALFWorld lists the commands that do something.

  The 135M policy reads a 6x6 board poorly (p(expert) 0.55 at the compact warm start):
  half of a training iteration's steps at the warm start were moves into a wall or an
  immovable box; the charge for them and a prompt saying so (`:learn_notice`, grpo seed 1,
  results/sokoban_notice/) brought that to about a third in 20 iterations, and the
  training success not up at all (first quarter 0.406, last 0.431). Here the prompt names
  the 2-3 moves that do something, and behaviour cloning (whose expert moves are always
  among them) can learn to choose from that list. A new warm start: the prompts differ
  from the first turn on.
  """
  _learn_unstuck(c)
  c.env.effective_moves_only = True


def _learn_placed(c):
  """`:learn_listed` whose prompt also gives the player's, the boxes' and the targets'
  (row, column) after the board (`env.board_positions`), with the rule that down adds 1 to
  the row and right 1 to the column.

  With only the moves that change the board listed (`:learn_listed`, grpo seed 1,
  results/sokoban_listed/) almost no step was wasted (ineffective share 0.00-0.03), yet
  GRPO did not raise the training success (first quarter 0.519, last 0.506) and the
  held-out success fell from the warm start's 11/16 to 6/16, while the plain policy's
  p(expert) on the expert's path rose only 0.680 -> 0.725, against chance among the 2-3
  listed moves of about 0.4: the 135M model barely reads where the box lies on the grid,
  and GRPO's few signals a batch do not teach it. Here comparing two numbers says it. A
  new warm start: the prompts differ from the first turn on.
  """
  _learn_listed(c)
  c.env.board_positions = True


def _learn_long(c):
  """`:learn_listed` whose RL and held-out puzzles are longer than the cloned ones: behaviour
  cloning on 512 puzzles of 2-3 moves (`bc.env_settings`), RL on 64 others of 4-5 moves
  (`env.min_solution_steps`, `env.max_solution_steps`) within 8 turns, 32 held out.

  On the 2-3-move puzzles of `:learn_listed` the RL had no room that it could use: cloning
  256 of them left held-out success at 9-11/16 and GRPO did not raise it; cloning 512
  (results/sokoban_listed/pilots/bc512/) raised it to 13/16, more than any RL lever tried.
  That same warm start on puzzles of up to 5 moves (seed 1, `seed_jax.teacher_gap`, 16
  held-out puzzles, 10 turns) won 6/16 plain and 16/16 reading the oracle plan (acting gap
  +0.625; p(expert) 0.576 against 1.000, content score +0.493); at T 1.0 it won 29 of 32
  training episodes of 2 moves and 2 of 16 of 5. The band of 4-5 moves keeps the groups
  that can carry a GRPO signal and the decisions where the teacher knows more. A new warm
  start (512 puzzles cloned).
  """
  _learn_listed(c)
  c.bc.episodes = 512
  c.bc.env_settings.max_solution_steps = 3
  c.bc.env_settings.min_solution_steps = 2
  c.env.max_solution_steps = 5
  c.env.min_solution_steps = 4
  c.env.max_steps = 8
  # 512 cloned, 64 for RL (20 iterations x 8 puzzles: each recurs about 2.5 times a run).
  c.env.num_tasks = {"train": 576, "valid_seen": 8, "valid_unseen": 32}
