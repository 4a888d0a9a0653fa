"""Sampler throughput vs transformers' PyTorch `generate`, on the embedded model.

Prints one JSON line. Greedy, random prompt of 512 tokens, 128 new tokens (end-of-sequence
ignored so every row decodes all 128), at batch 1, 8 and 32. `tok_s` counts generated
tokens per second of the whole `generate` call (prefill included) for both systems;
`decode_tok_s` (JAX) excludes the prefill, measured by a separate one-token run.
`vs_transformers` is the end-to-end ratio. transformers runs in a child process (no JAX
thread pool alive there), float32 as in REFERENCE.md's calibration; `first16_agreement` is
low where bf16 flips a near-tie of random-token prompts (float32 JAX matches exactly).
The roofline fields relate one JAX decode step to this machine's calibrated ceilings
(REFERENCE.md: ~1,450 GFLOP/s for bf16 matmuls with float32 accumulation, ~25 GB/s of
streaming bandwidth); FLOPs are `seed_jax.models.flops.forward_flops` of one token per row
attending over the whole cache; bytes = weights + the KV cache read once per step.

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

PEAK_GFLOPS = 1450.0
PEAK_GBPS = 25.0


def _time(fn, repeats: int = 1) -> float:
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - start)
  return best


def bench_jax(batches, prompt_len, new_tokens, dtype):
  import jax  # pylint: disable=import-outside-toplevel
  from seed_jax.models.flops import forward_flops  # pylint: disable=import-outside-toplevel
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
    rows = max(batch, 2)  # decode pads to two rows
    cache_len = prompt_len + new_tokens
    kv_bytes = (2 * cfg.num_layers * rows * cfg.num_kv_heads * cache_len * cfg.head_dim
                * np.dtype(dtype).itemsize)
    # One decode step: every row's one new token attends over the whole cache.
    flops = forward_flops(cfg, rows, 1, unembedded=1, context=cache_len)
    results[batch] = dict(
        tok_s=round(batch * new_tokens / total, 2),
        decode_tok_s=round(batch * (new_tokens - 1) / (total - prefill), 2),
        prefill_s=round(prefill, 3), step_ms=round(1e3 * step, 2),
        gflops=round(flops / step / 1e9, 1), gbps=round((weight_bytes + kv_bytes) / step / 1e9, 2),
        frac_peak_flops=round(flops / step / 1e9 / PEAK_GFLOPS, 3),
        frac_peak_bw=round((weight_bytes + kv_bytes) / step / 1e9 / PEAK_GBPS, 3))
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
  parser.add_argument("--torch-only", default=None, help=argparse.SUPPRESS)
  args = parser.parse_args()
  batches = [int(b) for b in args.batches.split(",")]
  if args.torch_only:
    print(json.dumps(bench_torch(batches, args.prompt_len, args.new_tokens, args.torch_only)))
    return
  jax_results, outputs = bench_jax(batches, args.prompt_len, args.new_tokens,
                                           args.dtype)
  line = dict(bench="sampler", model="smollm2-135m-instruct", dtype=args.dtype,
              prompt_len=args.prompt_len, new_tokens=args.new_tokens, greedy=True,
              cpus=os.cpu_count(), jax=jax_results)
  if not args.no_torch:
    torch_results = _run_torch_subprocess(batches, args.prompt_len, args.new_tokens, outputs)
    line["transformers"] = torch_results
    line["vs_transformers"] = {b: round(jax_results[b]["tok_s"] / torch_results[b]["tok_s"], 2)
                               for b in batches}
  print(json.dumps(line))


if __name__ == "__main__":
  main()
