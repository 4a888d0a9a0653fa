"""Runs every benchmark, one after another, and writes the benchmarks page.

  .venv/bin/python bench/run_all.py [--quick] [--only=forward,train_step,sampler,envs,iteration]
      [--out=docs/benchmarks.md] [--plans=DIR] [--device_check=docs/device_check.json]
      [--extra=NAME:ARGS ...] [--timeout=SECONDS]

Each bench (bench/forward.py, train_step.py, sampler.py, envs.py) runs as its own process,
one at a time, so no two heavy jobs share the cores and no bench inherits another's JAX
thread pool or compiled programs; each prints one JSON line. `iteration` runs two SEED
iterations of `configs/alfworld.py:cpu` in a temporary workdir and reads each one's
rollout / analysis / update seconds from the run's metrics. The page puts every figure
beside its comparison from the same run (the machine's measured matmul peak,
transformers' `generate`, the naive full-logits log-prob), renders the TPU plans found in
`--plans` (JSON files written by `python -m seed_jax.plan ... --json=PATH`, each headed by
its model, slice and file name) and the H200 device check
(`bench/device_check.sh`'s JSON), and keeps the raw JSON lines at the end. A bench that
fails or times out is reported on the page with its last error line; the page is written
all the same.

`--quick` runs tiny sizes: a smoke test of the whole pipeline, not figures to quote.
`--extra=NAME:ARGS` appends ARGS to bench NAME's command (e.g. `--extra=sampler:--no-torch`).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import glob
import importlib.metadata
import json
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from bench import device_check  # noqa: E402  (after the repository joins the path)
from seed_jax import metrics, provenance  # noqa: E402

GiB = 1 << 30

# Full sizes are each bench's own defaults (the Quickstart's shapes); quick ones only check
# that every bench and every section of the page still work.
BENCH_ARGS = {
    "forward": ([], ["--shapes=1x16", "--matmul_n=256"]),
    "train_step": (["--modes=precomputed,separate"],
                   ["--rows=2", "--prompt_len=32", "--response_len=16", "--repeats=1",
                    "--lp_rows=2", "--lp_len=32", "--lp_chunks=16", "--matmul_n=256"]),
    "sampler": ([], ["--batches=1", "--prompt-len=16", "--new-tokens=4", "--stream-gib=0.05",
                     "--matmul-n=256"]),
    "envs": ([], ["--sizes=2", "--steps=2", "--set=num_games.train=4"]),
}

ITERATION_CONFIG = "configs/alfworld.py:cpu"
# The :cpu preset as it is (warm start and stage 1 included, so the iterations' analysis
# runs with a stage-1-tuned analyzer), two iterations: the first compiles the update's
# programs, the second shows an iteration without compiling. No HF export or plots: they
# are not part of an iteration.
ITERATION_ARGS = ["--config.checkpoint.export_hf=False", "--config.log.plots=False",
                  "--config.rl.iterations=2"]
# The quick run has one iteration and skips stage 1 (`no_sft` runs the same iteration: the
# policy analyzes its batch, the skills condition the OPD teacher) and shrinks every length.
ITERATION_QUICK_ARGS = ["--config.checkpoint.export_hf=False", "--config.log.plots=False",
                        "--config.rl.iterations=1", "--config.algorithm=no_sft",
                        "--config.bc.enabled=False", "--config.rollout.tasks_per_batch=1",
                        "--config.rollout.max_new_tokens=8",
                        "--config.rollout.max_prompt_tokens=256",
                        "--config.analyzer.max_prompt_tokens=256",
                        "--config.analyzer.max_new_tokens=16", "--config.analyzer.max_retries=0",
                        "--config.env.max_steps=2", "--config.eval.max_episodes=1"]

ALL = ("forward", "train_step", "sampler", "envs", "iteration")


# ------------------------------------------------------------------ running commands


@dataclasses.dataclass
class Finished:
  returncode: int | None  # None: killed at the timeout
  stdout: list[tuple[float, str]]  # (seconds since the start, line)
  stderr_tail: str
  seconds: float


def run_command(cmd: list[str], timeout_s: float) -> Finished:
  """Runs `cmd` in the repo root, timestamping each stdout line as it arrives.

  The command gets its own process group, killed whole at the timeout and after it exits:
  env pools and transformers' child process must not outlive their bench and load the
  next one's cores.
  """
  start = time.monotonic()
  lines: list[tuple[float, str]] = []
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  with tempfile.TemporaryFile("w+b") as err:
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=err, text=True,
                            env=env, start_new_session=True)

    def read():
      for line in proc.stdout:
        lines.append((time.monotonic() - start, line.rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
      returncode = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
      returncode = None
    _kill_group(proc.pid)
    proc.wait()
    reader.join(timeout=10)
    err.seek(max(0, err.seek(0, os.SEEK_END) - 8000))
    stderr_tail = err.read().decode(errors="replace")
  return Finished(returncode, lines, stderr_tail, time.monotonic() - start)


def _kill_group(pgid: int) -> None:
  try:
    os.killpg(pgid, signal.SIGKILL)
  except ProcessLookupError:
    pass


def last_error_line(finished: Finished, timeout_s: float) -> str:
  """The line that says why a command failed: the last stderr line naming an error (absl
  ends a flag error with a generic hint line), else the last line of output."""
  if finished.returncode is None:
    return f"timed out after {timeout_s:.0f} s"
  text = finished.stderr_tail or "\n".join(line for _, line in finished.stdout)
  lines = [l.strip() for l in re.split(r"[\r\n]+", text) if l.strip()]
  errors = [l for l in lines if re.search(r"error|exception|fatal", l, re.IGNORECASE)]
  return (errors or lines or [f"exit status {finished.returncode}, no output"])[-1][:300]


def last_json_line(finished: Finished) -> dict[str, Any] | None:
  for _, line in reversed(finished.stdout):
    if line.startswith("{"):
      try:
        return json.loads(line)
      except json.JSONDecodeError:
        continue
  return None


def failure(name: str, finished: Finished, timeout_s: float) -> dict[str, Any]:
  return {"bench": name, "failed": True, "error": last_error_line(finished, timeout_s),
          "returncode": finished.returncode, "wall_s": round(finished.seconds, 1)}


def run_bench(name: str, args: list[str], timeout_s: float) -> dict[str, Any]:
  """One bench's JSON line (plus its wall seconds), or a failure record."""
  finished = run_command([sys.executable, "-m", f"bench.{name}", *args], timeout_s)
  record = last_json_line(finished) if finished.returncode == 0 else None
  if record is None:
    return failure(name, finished, timeout_s)
  return dict(record, bench=name, args=args, wall_s=round(finished.seconds, 1))


def _seconds_between(lines: list[tuple[float, str]], first: str, second: str
                     ) -> float | None:
  """Seconds from the first stdout line starting with `first` to the next containing
  `second`."""
  start = next((t for t, l in lines if l.startswith(first)), None)
  if start is None:
    return None
  end = next((t for t, l in lines if t >= start and second in l), None)
  return None if end is None else end - start


def run_iteration(extra: list[str], timeout_s: float) -> dict[str, Any]:
  """RL iterations of the :cpu preset, each one's phases' seconds from its metrics.jsonl.

  The trainer writes rollout, analysis and update seconds (`time_*_s`) with each
  iteration's metrics, but not the evaluation's: that is read off the console, from the
  last iteration's line to the evaluation table (the checkpoint save in between is
  asynchronous).
  """
  with tempfile.TemporaryDirectory(prefix="bench_iteration_") as tmp:
    workdir = os.path.join(tmp, "run")
    cmd = [sys.executable, "-m", "seed_jax.main", f"--config={ITERATION_CONFIG}",
           f"--workdir={workdir}", *extra]
    finished = run_command(cmd, timeout_s)
    records = metrics.read_metrics(os.path.join(workdir, "metrics.jsonl"))
    config = _read_json(os.path.join(workdir, "config.json")) or {}
  train = [r for r in records if r.get("phase") == "train"]
  if finished.returncode != 0 or not train:
    return failure("iteration", finished, timeout_s)
  last = train[-1]
  evaluation = next((r for r in records if r.get("phase") == "eval"), {})
  eval_s = _seconds_between(finished.stdout, f"[iter {last['step']}/",
                            "evaluation at iteration")
  return {"bench": "iteration", "config": ITERATION_CONFIG, "args": extra,
          "algorithm": config.get("algorithm"),
          # A fresh workdir each time: an existing one would resume instead.
          "command": shlex.join(["python", *cmd[1:4]]) + " --workdir=$(mktemp -d)/run "
                     + shlex.join(extra),
          "iterations_s": [{phase: _round(r.get(f"time_{phase}_s"))
                            for phase in ("rollout", "analysis", "update")} for r in train],
          "evaluation_s": _round(eval_s),
          "episodes": last.get("episodes"), "steps": last.get("steps"),
          "train_success": [r.get("success") for r in train],
          "eval_splits": (config.get("eval") or {}).get("splits"),
          "eval_max_episodes": (config.get("eval") or {}).get("max_episodes"),
          "eval_success": {k: v for k, v in evaluation.items() if k.endswith("/success")},
          "wall_s": round(finished.seconds, 1)}


def _round(seconds: float | None) -> float | None:
  return None if seconds is None else round(seconds, 2)


def _read_json(path: str) -> Any:
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


# ------------------------------------------------------------------ the page


def md_table(header: list[str], rows: list[list[Any]]) -> list[str]:
  cells = lambda row: "| " + " | ".join("-" if v is None else str(v) for v in row) + " |"
  return [cells(header), "| " + " | ".join("---" for _ in header) + " |",
          *map(cells, rows), ""]


def fmt(value: Any, digits: int = 3) -> str:
  """Numbers with `digits` significant figures, thousands separated; '-' for missing."""
  if value is None:
    return "-"
  if isinstance(value, (int, float)):
    text = f"{float(value):,.{digits}g}" if abs(value) < 10**digits else f"{value:,.0f}"
    return text
  return str(value)


def pct(fraction: float | None) -> str:
  return "-" if fraction is None else f"{100 * fraction:.1f}%"


def render_forward(r: dict[str, Any]) -> list[str]:
  out = [f"{r['model']}, {r['dtype']} compute, causal forward with the LM head at every "
         f"position. This machine's {r['dtype']} matmul peak, measured in the same run: "
         f"**{fmt(r['matmul_peak_gflops'])} GFLOP/s**.", ""]
  rows = [[f"{x['batch']} x {x['length']}", fmt(x["seconds"]), fmt(x["tokens_per_s"]),
           fmt(x["flops_per_s"]), pct(x["fraction_of_matmul_peak"])] for x in r["results"]]
  return out + md_table(["batch x length", "seconds", "tokens/s", "GFLOP/s",
                         "of matmul peak"], rows)


def render_train_step(r: dict[str, Any]) -> list[str]:
  tokens = r["rows"] * (r["prompt_len"] + r["response_len"])
  out = [f"{r['model']}, {r['param_dtype']} parameters, {r['dtype']} compute, "
         f"{r['rows']} rows x ({r['prompt_len']} prompt + {r['response_len']} response) = "
         f"{tokens:,} tokens a step. GFLOP/s count forward + backward (the LM head at the "
         "response positions only, rematerialisation not counted), beside this machine's "
         f"{r['dtype']} matmul peak measured in the same run: "
         f"**{fmt(r['matmul_peak_gflops'])} GFLOP/s**.", ""]
  names = {"grad": "value-and-grad of the log-probs (no optimizer)",
           "step_precomputed": "train step, teacher precomputed (default)",
           "step_separate": "train step, teacher scored in the step (separate)",
           "step_joint": "train step, teacher in the student's forward (joint)"}
  rows = [[names.get(k, k), fmt(x["seconds"]), fmt(x["tokens_per_s"]),
           fmt(x["achieved_gflops_per_s"]), pct(x["fraction_of_matmul_peak"]),
           fmt(x["temp_mib"]), fmt(x["compile_s"])] for k, x in r["results"].items()]
  out += md_table(["measurement", "seconds", "tokens/s", "GFLOP/s", "of matmul peak",
                   "temp MiB", "compile s"], rows)
  m = r["logprob_memory"]
  out += [f"**Log-prob memory.** Compiled temporary memory of value-and-grad of the "
          f"response log-probs and entropy over {m['rows']} rows x {m['length']} positions, "
          f"vocabulary {m['vocab']:,}, beside the naive variant that materialises the "
          f"full float32 logits (those alone are {fmt(m['full_logits_mib'])} MiB).", ""]
  naive = m["naive_temp_mib"]
  rows = [["naive: full `[B, R, V]` logits", fmt(naive), "1"]]
  for key, value in m.items():
    found = re.fullmatch(r"chunked(\d+)_temp_mib", key)
    if found:
      rows.append([f"chunked, {found.group(1)} positions at a time", fmt(value),
                   fmt(value / naive if naive else None)])
  return out + md_table(["log-prob + entropy", "temp MiB", "vs naive"], rows)


def render_sampler(r: dict[str, Any]) -> list[str]:
  torch = r.get("transformers")
  out = [f"{r['model']}, {r['dtype']}, greedy, a random {r['prompt_len']}-token prompt and "
         f"{r['new_tokens']} new tokens a row (end-of-sequence ignored). tokens/s count "
         "generated tokens over the whole call, prefill included; decode tokens/s exclude "
         "the prefill. " + ("transformers' `generate` (PyTorch, float32) ran on the same "
                            "prompts in a child process." if torch else
                            "transformers' `generate` was not run (`--no-torch`)."),
         "",
         f"The roofline: a decode step must read the weights and each row's filled KV cache "
         f"(prompt + tokens so far) and do its FLOPs; at this machine's streaming bandwidth "
         f"(**{fmt(r.get('stream_gbps'))} GB/s**) and matmul peak "
         f"(**{fmt(r.get('matmul_peak_gflops'))} GFLOP/s**), both measured in the same run, "
         f"the lower bound of the two is the roofline; the weight-streaming limit leaves the "
         f"cache and the FLOPs out. Targets: 60% of the weight limit at batch 1, 50% of the "
         f"roofline at batch 32.", ""]
  rows = []
  for batch, x in r["jax"].items():
    t = (torch or {}).get(batch) or (torch or {}).get(str(batch)) or {}
    ratio = (r.get("vs_transformers") or {}).get(batch) or (r.get("vs_transformers")
                                                            or {}).get(str(batch))
    rows.append([batch, fmt(x["tok_s"]), fmt(x["decode_tok_s"]), fmt(x["prefill_s"]),
                 fmt(x.get("roofline_tok_s")), pct(x.get("roofline_fraction")),
                 pct(x.get("weight_fraction")),
                 fmt(t.get("tok_s")), f"{fmt(ratio)}x" if ratio else "-",
                 fmt(t.get("first16_agreement"))])
  return out + md_table(["batch", "JAX tokens/s", "JAX decode tokens/s", "JAX prefill s",
                         "roofline decode tokens/s", "of roofline", "of weight limit",
                         "transformers tokens/s", "JAX / transformers",
                         "first 16 tokens agree"], rows)


def render_envs(r: dict[str, Any]) -> list[str]:
  out = [f"{r['env']}, {r['num_tasks']} games, {r['steps_per_env']} random admissible "
         f"actions per env; the pool has {r['workers']} worker processes.", ""]
  rows = [["one env in this process, no pool", fmt(r["bare_steps_per_s"]), "-"],
          ["one env through the pool (1 worker)", fmt(r["pool_one_env_steps_per_s"]),
           f"+{fmt(r['pool_overhead_ms_per_step'])} ms a step (the pool's overhead)"]]
  rows += [[f"{n} envs through the pool", fmt(v),
            f"{fmt(v / r['bare_steps_per_s'])}x the bare env"]
           for n, v in r["pool_steps_per_s"].items()]
  return out + md_table(["measurement", "steps/s", "vs one bare env"], rows)


def render_iteration(r: dict[str, Any]) -> list[str]:
  iterations, evaluation = r["iterations_s"], r.get("evaluation_s")
  last = dict(iterations[-1], evaluation=evaluation)
  known = [v for v in last.values() if v is not None]
  total = sum(known) if known else None
  splits = ", ".join(r.get("eval_splits") or []) or "-"
  limit = r.get("eval_max_episodes")
  episodes = f"at most {limit} episode{'s' if limit != 1 else ''}" if limit else "every game"
  out = [f"RL iterations of `{r['config']}`, algorithm `{r.get('algorithm')}` "
         f"({r['episodes']} training episodes and {r['steps']} agent steps in the last; "
         f"the final evaluation on {episodes} of each of {splits}), in a temporary "
         "workdir; the warm start and stage 1 before them are not among the phases:", "",
         "```bash", r["command"], "```", ""]
  header = ["phase"] + [f"iteration {i + 1} s" for i in range(len(iterations))]
  header.append(f"share of iteration {len(iterations)} + evaluation")
  rows = []
  for phase in ("rollout", "analysis", "update", "evaluation"):
    values = [it.get(phase) for it in iterations]
    if phase == "evaluation":  # once, after the last iteration
      values = [None] * (len(iterations) - 1) + [evaluation]
    share = last[phase] / total if last[phase] is not None and total else None
    rows.append([phase, *map(fmt, values), pct(share)])
  rows.append(["whole command (start-up, games, warm start, stage 1, the above)",
               *["-"] * (len(iterations) - 1), fmt(r["wall_s"]), "-"])
  out += md_table(header, rows)
  notes = ["Rollout, analysis and update seconds are the trainer's own (`time_*_s` in the "
           "run's `metrics.jsonl`, `seed_jax.metrics.Timer`). The trainer does not write "
           "the evaluation's seconds: they are read off the console, from the last "
           "iteration's line to the evaluation table."]
  if len(iterations) > 1:
    notes.append("The first iteration includes compiling its programs (the update's train "
                 "step and scoring, new sampler shapes); later ones reuse them.")
  else:
    notes.append("A single iteration: its seconds include compiling its programs.")
  return out + [" ".join(notes), ""]


RENDERERS: dict[str, tuple[str, Callable[[dict], list[str]]]] = {
    "forward": ("Forward", render_forward),
    "train_step": ("Train step", render_train_step),
    "sampler": ("Sampler", render_sampler),
    "envs": ("Environments", render_envs),
    "iteration": ("One training iteration", render_iteration),
}


def render_bench(name: str, record: dict[str, Any] | None) -> list[str]:
  title, render = RENDERERS[name]
  lines = [f"## {title}", ""]
  if record is None:
    return lines + ["Not run in this regeneration (`--only`).", ""]
  if record.get("failed"):
    return lines + [f"**Failed** (exit status {record['returncode']}, after "
                    f"{record['wall_s']} s): `{record['error']}`", ""]
  try:
    return lines + render(record)
  except (KeyError, TypeError, ZeroDivisionError) as e:  # a bench's line changed shape
    return lines + [f"**Could not render** its JSON line ({type(e).__name__}: {e}); it is "
                    "in the raw lines below.", ""]


def render_plans(plans_dir: str | None) -> list[str]:
  lines = ["## TPU plans for the paper's models", ""]
  files = sorted(glob.glob(os.path.join(plans_dir, "*.json"))) if plans_dir else []
  if not files:
    return lines + ["No plans given. `python -m seed_jax.plan --config=... --topology=... "
                    "--json=DIR/NAME.json` writes one (many minutes each); "
                    "`bench/run_all.py --plans=DIR` renders every JSON file in DIR.", ""]
  lines += ["Estimated by `seed_jax.plan` (compiled for the slice with abstract weights; "
            "seconds at the chip's bf16 peak and HBM bandwidth, not measured). Bytes per "
            "device. The README's plans table says which files are the presets and which "
            "predate the prefill fixes (upper bounds).", ""]
  for path in files:
    name = os.path.basename(path)
    label = os.path.splitext(name)[0]
    try:
      with open(path) as f:
        plan = json.load(f)
      lines += render_plan(f"{plan.get('model', label)} @ {plan.get('target', '?')} (`{name}`)",
                           plan)
    except (OSError, ValueError, KeyError, TypeError) as e:
      lines += [f"### {label}", "", f"Unreadable plan file `{path}`: {e}", ""]
  return lines


def render_plan(label: str, plan: dict[str, Any]) -> list[str]:
  hbm = plan.get("hbm_per_device")
  fits = {True: "fits", False: "**does not fit**", None: "fit unknown"}[plan.get("fits")]
  # A plan stopped before its last program (`complete` false) has figures for some only.
  planned = len(plan["programs"])
  partial = (f" (partial: {planned} program{'s' if planned != 1 else ''} planned)"
             if plan.get("complete") is False else "")
  lines = [f"### {label}", "", f"{plan['target']}, {plan['devices']} devices, "
           f"{fmt(hbm / GiB if hbm else None)} GiB HBM per device: {fits}{partial}.", ""]
  rows = []
  for p in plan["programs"]:
    seconds = p.get("est_seconds")
    rows.append([p["name"], p.get("shapes"), f"{p['total_bytes'] / GiB:.2f}",
                 f"{100 * p['total_bytes'] / hbm:.0f}" if hbm else "-", fmt(seconds),
                 fmt(p["tokens"] / seconds) if seconds else "-"])
  return lines + md_table(["program", "rows x tokens", "per-device GiB", "HBM %", "est. s",
                           "tokens/s"], rows)


def render_device_check(path: str) -> list[str]:
  lines = ["## Device check: NVIDIA H200", ""]
  if not os.path.exists(path):
    return lines + ["Not measured: no accelerator was lent. `bash bench/device_check.sh` "
                    "on an H200 (its header says how) writes `device_check.json`; copied to "
                    f"`{os.path.relpath(path, REPO)}`, it appears here at the next "
                    "regeneration.", ""]
  with open(path) as f:
    r = json.load(f)
  train, sampler = r.get("train") or {}, r.get("sampler") or {}
  lines += [f"Measured {r.get('date')} on {r.get('device')} (jax {r.get('jax')}): the "
            f"`{r.get('model')}` shape with random weights, {train.get('param_dtype', '-')} "
            "parameters, bfloat16 compute." + (" **A `--tiny` dry run: its figures mean "
                                               "nothing.**" if r.get("tiny") else ""), ""]
  return lines + md_table(["measurement", "value", "beside"], device_check_rows(r))


def device_check_rows(r: dict[str, Any]) -> list[list[Any]]:
  """The device check's figures, each beside its comparison (this run's peaks, the last
  check's figures under `previous`); a failed part says why."""
  matmul, sampler = r.get("matmul") or {}, r.get("sampler") or {}
  before = r.get("previous") or {}
  was = f"; {before.get('date', '')[:10]}: " if before else None
  rows = [["bf16 matmul peak, measured", f"{fmt(matmul.get('tflops'))} TFLOP/s",
           matmul.get("error") or f"{matmul.get('n')}^3, random operands; "
           f"{fmt(r.get('reference_peak_tflops'))} TFLOP/s measured on an H200 before"],
          ["memory streaming bandwidth, measured", f"{fmt(matmul.get('stream_gbps'))} GB/s",
           "a jitted sum over 4 GiB (the sampler's roofline below uses it)"]]
  for name in device_check.TRAIN_PARTS:
    train = r.get(name)
    if train is None:
      continue
    label = f"train step, remat {train.get('remat', device_check.remat_policy(name))}"
    if "error" in train:
      rows.append([label, "failed", train["error"]])
      continue
    same_as_before = name == "train" and before
    rows += [[f"{label}: tokens/s", fmt(train.get("tokens_per_s")),
              f"{train.get('rows')} rows x {train.get('length')} tokens, "
              f"{fmt(train.get('step_s'))} s a step, peak "
              f"{fmt(train.get('peak_memory_gib'))} GiB"
              + (f"{was}{fmt(before.get('train_tokens_per_s'))}" if same_as_before else "")],
             [f"{label}: MFU", pct(train.get("mfu")),
              f"of {fmt(r.get('reference_peak_tflops'))} TFLOP/s; "
              f"{pct(train.get('fraction_of_measured_matmul'))} of this run's matmul peak"
              + (f"{was}{pct(before.get('train_mfu'))}" if same_as_before else "")]]
  if "error" in sampler:
    rows.append(["sampler", "failed", sampler["error"]])
  for batch, x in (sampler.get("batches") or {}).items():
    rows.append([f"sampler tokens/s, batch {batch}", fmt(x.get("tok_s")),
                 f"{sampler.get('prompt_len')}-token prompts, {sampler.get('new_tokens')} "
                 f"new tokens, prefill {fmt(x.get('prefill_s'))} s"
                 + (f"{was}{fmt((before.get('sampler_tok_s') or {}).get(batch))}"
                    if before else "")])
    rows.append([f"sampler decoding alone, batch {batch}", fmt(x.get("decode_tok_s")),
                 (f"{pct(x.get('roofline_fraction'))} of its roofline "
                  f"{fmt(x.get('roofline_tok_s'))} (a step reads "
                  f"{fmt(x.get('step_bytes_mb'))} MB: weights {fmt(x.get('weight_mb'))}, "
                  f"KV cache {fmt(x.get('kv_mb'))}); {pct(x.get('weight_fraction'))} of the "
                  "weight-streaming limit" if "roofline_tok_s" in x else "no roofline")
                 + (f"{was}{fmt((before.get('sampler_decode_tok_s') or {}).get(batch))}"
                    if before else "")])
  parts = [(n, (r.get(n) or {}).get("peak_memory_gib"))
           for n in device_check.TRAIN_PARTS + ("sampler",) if n in r]
  rows.append(["peak device memory in use", f"{fmt(r.get('peak_memory_gib'))} GiB",
               ", ".join(f"{n} {fmt(v)}" for n, v in parts) + " GiB"])
  return rows


def machine_header() -> str:
  memory = None
  try:
    with open("/proc/meminfo") as f:
      memory = int(next(l.split()[1] for l in f if l.startswith("MemTotal"))) * 1024
  except (OSError, StopIteration):
    pass
  load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
  return (f"{os.cpu_count()} cores, {provenance.cpu_model()}"
          + (f", {memory / GiB:.0f} GiB memory" if memory else "")
          + f", {platform.system()} {platform.machine()}, Python {platform.python_version()}, "
          f"jax {importlib.metadata.version('jax')}"
          + (f"; load average {load:.1f} when the run began (other work slows every "
             "figure)" if load is not None else ""))


def regenerate_command(argv: list[str]) -> str:
  python = os.path.relpath(sys.executable, REPO) if sys.executable.startswith(REPO) else \
      sys.executable
  return shlex.join([python, "bench/run_all.py", *argv])


def render_page(records: dict[str, dict], argv: list[str], header: str, started: str,
                quick: bool, plans_dir: str | None, device_check: str) -> str:
  lines = ["# Benchmarks", "",
           f"Written by `bench/run_all.py` on {started}.", "",
           f"**Machine:** {header}.", "",
           "**Regenerate** (in the repository root; every bench runs alone, one after "
           "another):", "", "```bash", regenerate_command(argv), "```", ""]
  if quick:
    lines += ["> **Quick mode** (`--quick`): tiny sizes that check the benches run. These "
              "figures are not the project's performance.", ""]
  rows = [[name, "not run" if r is None else ("**failed**" if r.get("failed") else "ok"),
           "-" if r is None else r.get("wall_s")] for name, r in records.items()]
  lines += md_table(["bench", "status", "wall s"], rows)
  for name in ALL:
    lines += render_bench(name, records.get(name))
  lines += render_plans(plans_dir)
  lines += render_device_check(device_check)
  raw = [json.dumps(r) for r in records.values() if r is not None]
  lines += ["## Raw results", "", "<details><summary>One JSON line per bench, as it "
            "printed it</summary>", "", "```json", *raw, "```", "", "</details>", ""]
  return "\n".join(lines)


# ------------------------------------------------------------------ main


def parse_extra(values: list[str]) -> dict[str, list[str]]:
  extra: dict[str, list[str]] = {}
  for value in values:
    name, _, args = value.partition(":")
    if name not in ALL:
      raise SystemExit(f"--extra={value}: unknown bench {name!r}; known: {', '.join(ALL)}")
    extra.setdefault(name, []).extend(shlex.split(args))
  return extra


def main(argv: list[str]) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
  parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
  parser.add_argument("--only", default=",".join(ALL), help="comma-separated benches")
  parser.add_argument("--out", default="docs/benchmarks.md")
  parser.add_argument("--plans", default=None, help="folder of seed_jax.plan --json files")
  parser.add_argument("--device_check", default="docs/device_check.json",
                      help="device_check.json from bench/device_check.sh, if any")
  parser.add_argument("--extra", action="append", default=[], metavar="NAME:ARGS",
                      help="extra arguments for one bench (repeatable)")
  parser.add_argument("--timeout", type=float, default=None,
                      help="seconds per bench (default 3600; 900 with --quick)")
  args = parser.parse_args(argv)
  only = [n.strip() for n in args.only.split(",") if n.strip()]
  unknown = sorted(set(only) - set(ALL))
  if unknown:
    raise SystemExit(f"--only: unknown bench(es) {', '.join(unknown)}; known: {', '.join(ALL)}")
  extra = parse_extra(args.extra)
  timeout_s = args.timeout or (900.0 if args.quick else 3600.0)
  started = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
  header = machine_header()  # before the benches: the load average they start under
  records: dict[str, dict | None] = {name: None for name in ALL}
  for name in ALL:
    if name not in only:
      continue
    print(f"[run_all] {name} ...", file=sys.stderr, flush=True)
    if name == "iteration":
      iteration_args = ITERATION_QUICK_ARGS if args.quick else ITERATION_ARGS
      records[name] = run_iteration(iteration_args + extra.get(name, []), timeout_s)
    else:
      full, quick = BENCH_ARGS[name]
      records[name] = run_bench(name, (quick if args.quick else full) + extra.get(name, []),
                                timeout_s)
    status = records[name].get("error") or "ok"
    print(f"[run_all] {name}: {status} ({records[name]['wall_s']} s)", file=sys.stderr,
          flush=True)
  page = render_page(records, argv, header, started, args.quick, args.plans,
                     os.path.join(REPO, args.device_check))
  out = os.path.join(REPO, args.out)
  os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
  with open(out, "w") as f:
    f.write(page)
  print(f"[run_all] wrote {out}", file=sys.stderr)


if __name__ == "__main__":
  main(sys.argv[1:])
