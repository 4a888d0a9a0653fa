"""The accelerator check of issue 13: a Qwen2.5-1.5B shape, random weights, bfloat16 compute.

  python bench/device_check.py [--tiny]                    # every part here; one JSON line
  python bench/device_check.py --part=train --out=FILE     # one part (bench/device_check.sh)
  python bench/device_check.py --merge=DIR --out=FILE      # the parts' files -> one line
  python bench/device_check.py --missing                   # Python modules it lacks

Parts, each its own process under `bench/device_check.sh` so a timeout or crash costs only
that part:
* `matmul`: a bf16 x bf16 -> float32 `n^3` matmul on random operands: this chip's peak,
  measured in the same run; and the memory's streaming bandwidth (a jitted sum over a
  4-GiB array, `bench.common.stream_bandwidth_bytes`);
* `train`: the RL train step (`seed_jax.seed.train_step`, teacher log-probs precomputed,
  AdamW) at the paper's micro-batch (16 rows x (2048 prompt + 512 response) tokens):
  tokens/s and MFU, the model FLOPs of `seed_jax.models.flops.training_flops` per second
  against the H200's bf16 peak measured here before (`REFERENCE_PEAK_TFLOPS`) and against
  the matmul part's. `train` rematerialises every layer (`remat` "full", the default);
  `train_projections` keeps the projections' outputs (`remat` "projections": no weight
  matmul twice, at the memory it reports);
* `sampler`: greedy `Sampler.generate` of 128 tokens after a 512-token prompt, end of
  sequence ignored, at batch 64 and 256: tokens/s of the whole call and of decoding alone,
  and (at the merge) decoding beside its roofline: the bytes a step reads (weights + the
  filled KV cache) at the matmul part's bandwidth, its FLOPs at its peak
  (`bench.common.decode_roofline`, the fields `bench/sampler.py` reports on a CPU).
Each reports the device's peak memory in use (`device.memory_stats()`; None on a CPU).
The merged line carries the figures of the last check (`--previous`, the committed
`docs/device_check.json`) under `previous`, so a change reads beside what it replaced.
Parameters are stored as the trainer stores them (`--param_dtype`, float32) and computed
in bfloat16. `--tiny` shrinks the model and every size so the whole check runs on a CPU in
seconds (the test does); its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.util
import json
import os
import sys
import time
import traceback
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MODEL = "qwen2.5-1.5b-instruct"
# An 8192^3 bf16 matmul on an H200 of this workplace ran at 769-798 TFLOP/s on random data
# (device README, KINDS.md); the vendor's dense figure, 989, is not reached by a matmul.
REFERENCE_PEAK_TFLOPS = 790.0
# Imported by the parts (directly or through seed_jax); pip names where they differ.
REQUIRED_MODULES = {"jax": "jax", "flax": "flax", "optax": "optax", "numpy": "numpy",
                    "absl": "absl-py", "tqdm": "tqdm", "yaml": "pyyaml", "rich": "rich",
                    "msgpack": "msgpack", "treescope": "treescope"}
SEED_JAX_MODULES = ("seed_jax.models.shapes", "seed_jax.models.weights",
                    "seed_jax.models.flops", "seed_jax.sampling", "seed_jax.seed.train_step",
                    "seed_jax.seed.optim", "seed_jax.seed.losses", "bench.common")
TINY_SHAPE = dict(num_layers=2, hidden_size=64, intermediate_size=128, num_heads=4,
                  num_kv_heads=2, head_dim=16, vocab_size=512, bos_token_id=0,
                  eos_token_id=1, pad_token_id=0)
GiB = 1 << 30
PARTS = ("matmul", "train", "train_projections", "sampler")
TRAIN_PARTS = tuple(p for p in PARTS if p.startswith("train"))  # "train_<remat policy>"


def remat_policy(train_part: str) -> str:
  """The remat policy a train part measures: "train" -> "full", "train_<policy>" -> policy."""
  return train_part.partition("_")[2] or "full"


def missing_packages() -> list[str]:
  """pip names of what the parts cannot import (the device image lacks some of the
  project's requirements; the check needs only these)."""
  missing = [pip for module, pip in REQUIRED_MODULES.items()
             if importlib.util.find_spec(module) is None]
  if missing:
    return missing
  for module in SEED_JAX_MODULES:  # anything else seed_jax imports on the way
    try:
      importlib.import_module(module)
    except ModuleNotFoundError as e:
      return [e.name or str(e)]
  return []


# ------------------------------------------------------------------ measurements


def peak_memory_gib() -> float | None:
  import jax  # pylint: disable=import-outside-toplevel
  stats = jax.local_devices()[0].memory_stats()
  if not stats or "peak_bytes_in_use" not in stats:
    return None
  return round(stats["peak_bytes_in_use"] / GiB, 2)


def mean_seconds(run: Callable[[], Any], repeats: int, warmups: int = 1) -> float:
  """Mean wall seconds of `run()` (which blocks until its result is ready) after warm-ups;
  back-to-back calls so launch gaps overlap as they would in a loop."""
  for _ in range(warmups):
    run()
  start = time.perf_counter()
  for _ in range(repeats):
    run()
  return (time.perf_counter() - start) / repeats


def part_matmul(tiny: bool) -> dict[str, Any]:
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  n = 256 if tiny else 8192
  key_a, key_b = jax.random.split(jax.random.key(0))
  a = jax.random.normal(key_a, (n, n), jnp.bfloat16)
  b = jax.random.normal(key_b, (n, n), jnp.bfloat16)
  matmul = jax.jit(lambda x, y: jnp.matmul(x, y, preferred_element_type=jnp.float32))
  # Ten products per timing: one 8192^3 product is ~1.4 ms on an H200, near launch noise.
  seconds = mean_seconds(lambda: jax.block_until_ready([matmul(a, b) for _ in range(10)]),
                         repeats=3, warmups=2) / 10
  from bench.common import stream_bandwidth_bytes  # pylint: disable=import-outside-toplevel
  bandwidth = stream_bandwidth_bytes(0.01 if tiny else 4.0)
  return {"n": n, "dtype": "bfloat16", "seconds": round(seconds, 6),
          "tflops": round(2 * n**3 / seconds / 1e12, 2 if not tiny else 4),
          "stream_gbps": round(bandwidth / 1e9, 2 if not tiny else 4)}


def model_config(tiny: bool, param_dtype: str, remat: str = "full"):
  from seed_jax.models.shapes import shape_config  # pylint: disable=import-outside-toplevel
  return shape_config(MODEL, dtype="bfloat16", param_dtype=param_dtype, remat=remat,
                      **(TINY_SHAPE if tiny else {}))


def part_train(tiny: bool, param_dtype: str, remat: str, rows: int, prompt_len: int,
               response_len: int, steps: int) -> dict[str, Any]:
  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx
  from bench.common import synthetic_rl_batch
  from seed_jax.models.flops import training_flops
  from seed_jax.models.weights import random_model
  from seed_jax.seed import losses
  from seed_jax.seed import train_step as ts
  from seed_jax.seed.optim import OptimConfig
  cfg = model_config(tiny, param_dtype, remat)
  graphdef, params = nnx.split(random_model(cfg), nnx.Param)
  optim_cfg = OptimConfig()
  step = ts.make_train_step(graphdef, optim_cfg, ts.TrainStepConfig(
      teacher_mode="precomputed", logprob_chunk=min(512, response_len),
      loss=losses.LossConfig(kl_coef=0.0)))
  state = ts.init_train_state(params, optim_cfg)
  del params  # the state holds them; the step donates it
  batch = {k: jnp.asarray(v) for k, v in
           synthetic_rl_batch(rows, prompt_len, response_len, cfg.vocab_size).items()}
  start = time.perf_counter()
  compiled = step.lower(state, batch).compile()
  compile_s = time.perf_counter() - start
  holder = {"state": state, "loss": None}

  def run():
    holder["state"], metrics = compiled(holder["state"], batch)
    holder["loss"] = float(metrics["loss"])  # a host read: waits for the step

  seconds = mean_seconds(run, repeats=steps)
  length = prompt_len + response_len
  model_flops, hardware_flops = training_flops(cfg, rows, length, unembedded=response_len)
  return {"rows": rows, "prompt_len": prompt_len, "response_len": response_len,
          "length": length, "param_dtype": param_dtype, "remat": remat,
          "compile_s": round(compile_s, 1),
          "step_s": round(seconds, 4), "tokens_per_s": round(rows * length / seconds, 1),
          "model_tflops_per_s": model_flops / seconds / 1e12,
          "hardware_tflops_per_s": hardware_flops / seconds / 1e12,
          "loss_finite": bool(np.isfinite(holder["loss"])),
          "peak_memory_gib": peak_memory_gib()}


def part_sampler(tiny: bool, param_dtype: str, batches: list[int], prompt_len: int,
                 new_tokens: int) -> dict[str, Any]:
  # pylint: disable=import-outside-toplevel
  import numpy as np
  import jax
  from bench.common import decode_step_cost
  from seed_jax.models.weights import random_model
  from seed_jax.sampling import Sampler, SamplingParams
  cfg = model_config(tiny, param_dtype)
  sampler = Sampler.from_model(random_model(cfg), max_cache_len=prompt_len + new_tokens)
  weight_bytes = sum(x.nbytes for x in jax.tree.leaves(sampler.params))
  # The KV cache is in the sampler's cache dtype, by default the compute dtype.
  cache_itemsize = jax.numpy.dtype(sampler.cache_dtype or cfg.dtype).itemsize
  full = SamplingParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True)
  first = SamplingParams(max_new_tokens=1, temperature=0.0, ignore_eos=True)
  rng = np.random.default_rng(0)
  results = {}
  for batch in batches:
    prompts = rng.integers(3, cfg.vocab_size, size=(batch, prompt_len)).tolist()
    start = time.perf_counter()
    sampler.generate(prompts, full)  # compiles prefill and decode
    sampler.generate(prompts, first)
    compile_s = time.perf_counter() - start
    total = mean_seconds(lambda: sampler.generate(prompts, full), repeats=2, warmups=0)
    prefill = mean_seconds(lambda: sampler.generate(prompts, first), repeats=2, warmups=0)
    results[str(batch)] = {
        "tok_s": round(batch * new_tokens / total, 1),
        "decode_tok_s": round(batch * (new_tokens - 1) / max(total - prefill, 1e-9), 1),
        "call_s": round(total, 4), "prefill_s": round(prefill, 4),
        "compile_s": round(compile_s, 1),
        "cost": decode_step_cost(cfg, weight_bytes, batch, prompt_len, new_tokens,
                                 cache_itemsize=cache_itemsize)}
  return {"prompt_len": prompt_len, "new_tokens": new_tokens, "param_dtype": param_dtype,
          "batches": results, "peak_memory_gib": peak_memory_gib()}


def run_part(name: str, args: argparse.Namespace) -> dict[str, Any]:
  """One part's record, or `{"error": ...}` with the exception's last line (the check
  goes on with the other parts)."""
  tiny = args.tiny
  try:
    if name == "matmul":
      return part_matmul(tiny)
    if name in TRAIN_PARTS:
      return part_train(tiny, args.param_dtype, remat_policy(name),
                        *((2, 24, 8, 2) if tiny else (args.rows, args.prompt_len,
                                                      args.response_len, args.steps)))
    if name == "sampler":
      return part_sampler(tiny, args.param_dtype, [2, 4] if tiny else args.batches,
                          *((8, 4) if tiny else (args.sampler_prompt_len, args.new_tokens)))
    raise ValueError(f"unknown part {name!r}")
  except Exception as e:  # pylint: disable=broad-except
    traceback.print_exc()
    return {"error": error_line(e)}


def error_line(e: Exception) -> str:
  """`Type: last line of the message` (XLA's errors run to many lines)."""
  lines = str(e).strip().splitlines()
  return f"{type(e).__name__}: {lines[-1] if lines else ''}"[:300]


# ------------------------------------------------------------------ the one JSON line


def merge(parts: dict[str, dict[str, Any]], tiny: bool,
          previous: dict[str, Any] | None = None) -> dict[str, Any]:
  """The parts as one record: each train step's MFU against the reference peak and this
  run's matmul, the sampler's decode beside its roofline, and `previous`'s headline
  figures (the last check's record) under `previous`."""
  import jax  # pylint: disable=import-outside-toplevel
  from bench.common import decode_roofline  # pylint: disable=import-outside-toplevel
  record = {"check": "device_check", "model": MODEL, "dtype": "bfloat16", "tiny": tiny,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "device": jax.local_devices()[0].device_kind, "backend": jax.default_backend(),
            "jax": jax.__version__, "reference_peak_tflops": REFERENCE_PEAK_TFLOPS}
  matmul = parts.get("matmul") or {"error": "did not run"}
  record["matmul"] = matmul
  for name in TRAIN_PARTS:
    train = dict(parts.get(name) or {"error": "did not run"})
    if "error" not in train:
      train["mfu"] = round(train["model_tflops_per_s"] / REFERENCE_PEAK_TFLOPS, 4)
      if matmul.get("tflops"):
        train["fraction_of_measured_matmul"] = round(
            train["model_tflops_per_s"] / matmul["tflops"], 4)
      for key in ("model_tflops_per_s", "hardware_tflops_per_s"):
        train[key] = round(train[key], 3)
    record[name] = train
  sampler = dict(parts.get("sampler") or {"error": "did not run"})
  if "batches" in sampler:
    batches = {}
    for batch, x in sampler["batches"].items():
      x = dict(x)
      cost = x.pop("cost")
      if matmul.get("tflops") and matmul.get("stream_gbps"):
        x.update(decode_roofline(int(batch), x["decode_tok_s"], cost,
                                 matmul["stream_gbps"] * 1e9, matmul["tflops"] * 1e12))
      batches[batch] = x
    sampler["batches"] = batches
  record["sampler"] = sampler
  peaks = [record[p].get("peak_memory_gib") for p in TRAIN_PARTS + ("sampler",)]
  record["peak_memory_gib"] = max((p for p in peaks if p is not None), default=None)
  if previous:
    record["previous"] = headline(previous)
  return record


def headline(record: dict[str, Any]) -> dict[str, Any]:
  """A check's figures that the next one is read beside."""
  train, sampler = record.get("train") or {}, record.get("sampler") or {}
  return {"date": record.get("date"), "matmul_tflops": (record.get("matmul") or {}).get("tflops"),
          "train_tokens_per_s": train.get("tokens_per_s"), "train_mfu": train.get("mfu"),
          "sampler_tok_s": {b: x.get("tok_s") for b, x in (sampler.get("batches") or {}).items()},
          "sampler_decode_tok_s": {b: x.get("decode_tok_s")
                                   for b, x in (sampler.get("batches") or {}).items()}}


def read_previous(path: str | None) -> dict[str, Any] | None:
  """The last check's record at `path`, if there is one and it measured a device."""
  if not path or not os.path.exists(path):
    return None
  with open(path) as f:
    record = json.load(f)
  return None if record.get("tiny") else record


def read_parts(folder: str) -> dict[str, dict[str, Any]]:
  """The parts' files; a part killed by its timeout left none and says so."""
  parts = {}
  for name in PARTS:
    path = os.path.join(folder, f"{name}.json")
    if os.path.exists(path):
      with open(path) as f:
        parts[name] = json.load(f)
    else:
      parts[name] = {"error": "no result: killed by its timeout or crashed (see the log)"}
  return parts


def write_and_print(record: dict[str, Any], out: str | None) -> None:
  line = json.dumps(record)
  if out:
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
      f.write(line + "\n")
  print(line, flush=True)


def main(argv: list[str]) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
  parser.add_argument("--tiny", action="store_true", help="tiny model and sizes (CPU test)")
  parser.add_argument("--part", choices=PARTS, default=None)
  parser.add_argument("--merge", default=None, metavar="DIR", help="merge DIR/PART.json")
  parser.add_argument("--missing", action="store_true", help="print missing pip packages")
  parser.add_argument("--out", default=None, help="also write the JSON here")
  parser.add_argument("--previous", default="docs/device_check.json",
                      help="the last check's record, whose figures the new line carries")
  parser.add_argument("--param_dtype", default="float32", choices=("float32", "bfloat16"))
  parser.add_argument("--rows", type=int, default=16)
  parser.add_argument("--prompt_len", type=int, default=2048)
  parser.add_argument("--response_len", type=int, default=512)
  parser.add_argument("--steps", type=int, default=3, help="timed train steps")
  parser.add_argument("--batches", type=lambda s: [int(b) for b in s.split(",")],
                      default=[64, 256])
  parser.add_argument("--sampler_prompt_len", type=int, default=512)
  parser.add_argument("--new_tokens", type=int, default=128)
  args = parser.parse_args(argv)
  if args.missing:
    print(" ".join(missing_packages()))
    return
  if args.part:
    record = run_part(args.part, args)
    if args.out:
      with open(args.out, "w") as f:
        json.dump(record, f)
    print(json.dumps({args.part: record}), flush=True)
    return
  parts = (read_parts(args.merge) if args.merge else
           {name: run_part(name, args) for name in PARTS})
  write_and_print(merge(parts, args.tiny, read_previous(args.previous)), args.out)


if __name__ == "__main__":
  main(sys.argv[1:])
