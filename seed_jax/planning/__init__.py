"""Planning a run before spending pod hours on it, split by job: `targets` (the chips, the
topologies and the devices to plan for), `programs` (abstract parameters and batches, and
every program a run compiles, lowered and compiled for a target with its memory and FLOPs)
and `report` (the table, the verdict and the JSON). `seed_jax.plan` is the command that
puts them together.
"""
