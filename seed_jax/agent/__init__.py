"""The acting layer: one loop that plays episodes in an env pool (`loop`) and the
scripted policies that act in it (`policies`); the model policy is in `seed_jax.train.rollout`."""
