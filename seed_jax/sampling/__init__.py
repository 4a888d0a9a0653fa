"""KV-cache sampler for acting and for the analyzer (prefill + while_loop decode, jitted).

    sampler = Sampler(graphdef, params, cfg, tokenizer=tok)   # or sampler_for("smollm2-...")
    out = sampler.generate(prompt_ids, SamplingParams(max_new_tokens=128,
                                                      stop_strings=("</action>",)), seed=0)
    out = sampler.generate_text(["text", [{"role": "user", "content": "hi"}]], sampling)
    sampler.update_params(new_params)  # each RL iteration; no recompile
"""

from seed_jax.sampling.sampler import SampleOutput, Sampler, SamplingParams, sampler_for
from seed_jax.sampling.stops import build_stop_table, truncate_at_stop

__all__ = ["Sampler", "SamplingParams", "SampleOutput", "sampler_for", "build_stop_table",
           "truncate_at_stop"]
