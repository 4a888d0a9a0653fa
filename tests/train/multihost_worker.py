"""One host of the two-process test (test_multihost.py): 4 CPU devices per process, gloo
collectives, the tiny end-to-end config on a (2, 2, 2) mesh spanning both processes.

  python -m tests.train.multihost_worker PROCESS_ID PORT MODEL WORKDIR OUT_JSON
"""

import json
import os
import sys

os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"

import jax  # pylint: disable=wrong-import-position
import numpy as np  # pylint: disable=wrong-import-position


def main(process_id: int, port: int, model: str, workdir: str, out_json: str) -> None:
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=process_id)
  from seed_jax.envs.pool import EnvPool
  from seed_jax.parallel import hosts
  from seed_jax.train.trainer import Trainer
  from tests.train.conftest import tiny_spec

  stepped = []  # rows this host's env workers stepped
  original_step = EnvPool.step

  def counting_step(self, actions):
    stepped.append(sum(a is not None for a in actions))
    return original_step(self, actions)

  EnvPool.step = counting_step
  trainer = Trainer(tiny_spec(model, "seed"), workdir)
  summary = trainer.run()
  params = hosts.fetch(trainer.state.params)
  checksum = float(sum(np.abs(x.astype(np.float64)).sum() for x in jax.tree.leaves(params)))
  with open(out_json, "w") as f:
    json.dump({"summary": summary, "checksum": checksum, "stepped": sum(stepped),
               "devices": jax.device_count(), "local_devices": jax.local_device_count()}, f)
  jax.distributed.shutdown()


if __name__ == "__main__":
  main(int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:6])
