"""Sampler throughput vs transformers' PyTorch `generate`, on the embedded model.

Prints one JSON line. Greedy, random prompt of 512 tokens, 128 new tokens (end-of-sequence
ignored so every row decodes all 128), at batch 1, 8 and 32. `tok_s` counts generated
tokens per second of the whole `generate` call (prefill included) for both systems;
`decode_tok_s` (JAX) excludes the prefill, measured by a separate one-token run.
`vs_transformers` is the end-to-end ratio. transformers runs in a child process (no JAX
thread pool alive there), float32 as in REFERENCE.md's calibration; `first16_agreement` is
low where bf16 flips a near-tie of random-token prompts (float32 JAX matches exactly).
The roofline fields relate a decode step to this machine's ceilings, measured in the same
run: the streaming bandwidth (`bench.common.stream_bandwidth_bytes`) and the matmul peak
in the compute dtype. A decode step must read the weights once and, per row, the filled
part of the KV cache (the prompt plus the tokens so far: on average over the decode,
`prompt_len + (new_tokens - 1) / 2` slots): `step_bytes`, which bounds decode at
`bandwidth_limit_tok_s = batch * bandwidth / step_bytes`; its FLOPs
(`seed_jax.models.flops.forward_flops` of one token a row over the filled cache) bound it
at `compute_limit_tok_s = batch * peak / step_flops`. The roofline is the lower of the
two (`roofline_tok_s`): on a CPU without bf16 matrix units a batch-32 step is already
compute-bound. `weight_limit_tok_s = batch * bandwidth / weight_bytes` is what a step could
reach if the cache were free. `roofline_fraction` and `weight_fraction` are the achieved
`decode_tok_s` over each.

  .venv/bin/python -m bench.sampler [--batches 1,8,32] [--dtype bfloat16] [--no-torch]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np


def _time(fn, repeats: int = 1) -> float:
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - start)
  return best


def bench_jax(batches, prompt_len, new_tokens, dtype, bandwidth, peak_flops):
  import jax  # pylint: disable=import-outside-toplevel
  from bench.common import decode_roofline, decode_step_cost  # pylint: disable=import-outside-toplevel
  from seed_jax.models.loader import load_model  # pylint: disable=import-outside-toplevel
  from seed_jax.sampling import Sampler, SamplingParams  # pylint: disable=import-outside-toplevel
  model, tokenizer = load_model("smollm2-135m-instruct", dtype=dtype)
  cfg = model.cfg
  sampler = Sampler.from_model(model, tokenizer=tokenizer, max_cache_len=2048)
  rng = np.random.default_rng(0)
  full = SamplingParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True)
  first = SamplingParams(max_new_tokens=1, temperature=0.0, ignore_eos=True)
  weight_bytes = sum(x.nbytes for x in jax.tree.leaves(sampler.params))
  results, outputs = {}, {}
  for batch in batches:
    prompts = rng.integers(100, cfg.vocab_size, size=(batch, prompt_len)).tolist()
    sampler.generate(prompts, full)  # compile
    sampler.generate(prompts, first)
    out = None

    def run():
      nonlocal out
      out = sampler.generate(prompts, full)

    total = _time(run)
    prefill = _time(lambda: sampler.generate(prompts, first))
    assert all(n == new_tokens for n in out.lengths)
    step = (total - prefill) / (new_tokens - 1)
    decode_tok_s = batch / step
    cost = decode_step_cost(cfg, weight_bytes, batch, prompt_len, new_tokens,
                            cache_itemsize=np.dtype(dtype).itemsize)
    results[batch] = dict(
        tok_s=round(batch * new_tokens / total, 2),
        decode_tok_s=round(decode_tok_s, 2),
        prefill_s=round(prefill, 3), step_ms=round(1e3 * step, 2),
        **decode_roofline(batch, decode_tok_s, cost, bandwidth, peak_flops))
    outputs[batch] = (prompts, out.tokens)
  return results, outputs


def bench_torch(batches, prompt_len, new_tokens, prompts_file):
  """transformers' greedy `generate` (float32, as REFERENCE.md's calibration), on the
  prompts the JAX run used; runs in its own process so no JAX thread pool competes."""
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  from seed_jax.models.embedded import embedded_model_dir  # pylint: disable=import-outside-toplevel
  model = transformers.AutoModelForCausalLM.from_pretrained(embedded_model_dir(),
                                                            dtype=torch.float32).eval()
  saved = np.load(prompts_file)
  results = {}
  for batch in batches:
    ids = torch.tensor(saved[f"prompts{batch}"])
    kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                  min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    with torch.no_grad():
      model.generate(ids[:, :16], **dict(kwargs, max_new_tokens=4, min_new_tokens=4))
      start = time.perf_counter()
      out = model.generate(ids, **kwargs)
      total = time.perf_counter() - start
    torch_tokens = out[:, prompt_len:].numpy()
    # Greedy paths split once logits nearly tie (JAX runs bfloat16): compare the start.
    same = float(np.mean(torch_tokens[:, :16] == saved[f"tokens{batch}"][:, :16]))
    results[batch] = dict(tok_s=round(batch * new_tokens / total, 2),
                          first16_agreement=round(same, 3))
  return results


def _run_torch_subprocess(batches, prompt_len, new_tokens, outputs):
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "prompts.npz")
    np.savez(path, **{f"prompts{b}": np.asarray(p, np.int64) for b, (p, _) in outputs.items()},
             **{f"tokens{b}": np.asarray(t, np.int64) for b, (_, t) in outputs.items()})
    cmd = [sys.executable, "-m", "bench.sampler", "--torch-only", path,
           "--batches", ",".join(map(str, batches)), "--prompt-len", str(prompt_len),
           "--new-tokens", str(new_tokens)]
    # OpenMP's default busy-waiting collapses torch (~10x) when other processes share the
    # cores, as on this machine; passive waiting gives its best time here.
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    done = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
  return {int(k): v for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--batches", default="1,8,32")
  parser.add_argument("--prompt-len", type=int, default=512)
  parser.add_argument("--new-tokens", type=int, default=128)
  parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
  parser.add_argument("--no-torch", action="store_true")
  parser.add_argument("--stream-gib", type=float, default=1.0,
                      help="size of the array whose read measures the bandwidth")
  parser.add_argument("--matmul-n", type=int, default=2048,
                      help="side of the square matmul that measures the peak")
  parser.add_argument("--torch-only", default=None, help=argparse.SUPPRESS)
  args = parser.parse_args()
  batches = [int(b) for b in args.batches.split(",")]
  if args.torch_only:
    print(json.dumps(bench_torch(batches, args.prompt_len, args.new_tokens, args.torch_only)))
    return
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from bench.common import matmul_peak_flops, stream_bandwidth_bytes  # pylint: disable=import-outside-toplevel
  bandwidth = stream_bandwidth_bytes(args.stream_gib)
  peak = matmul_peak_flops(jnp.dtype(args.dtype), args.matmul_n)
  jax_results, outputs = bench_jax(batches, args.prompt_len, args.new_tokens, args.dtype,
                                   bandwidth, peak)
  line = dict(bench="sampler", model="smollm2-135m-instruct", dtype=args.dtype,
              prompt_len=args.prompt_len, new_tokens=args.new_tokens, greedy=True,
              cpus=os.cpu_count(), stream_gbps=round(bandwidth / 1e9, 2),
              matmul_peak_gflops=round(peak / 1e9, 1), jax=jax_results)
  if not args.no_torch:
    torch_results = _run_torch_subprocess(batches, args.prompt_len, args.new_tokens, outputs)
    line["transformers"] = torch_results
    line["vs_transformers"] = {b: round(jax_results[b]["tok_s"] / torch_results[b]["tok_s"], 2)
                               for b in batches}
  print(json.dumps(line))


if __name__ == "__main__":
  main()
