"""KV-cache sampler for acting and for the analyzer (prefill + while_loop decode, jitted).

    sampler = Sampler(graphdef, params, cfg, tokenizer=tok)
    out = sampler.generate(prompt_ids, SamplingParams(max_new_tokens=128,
                                                      stop_strings=("</action>",)), seed=0)
"""

from seed_jax.sampling.sampler import SampleOutput, Sampler, SamplingParams
from seed_jax.sampling.stops import build_stop_table, truncate_at_stop

__all__ = ["Sampler", "SamplingParams", "SampleOutput", "build_stop_table", "truncate_at_stop"]
