"""The experiment runner's parts (seed_jax/experiment.py): arms, runs, aggregation."""
