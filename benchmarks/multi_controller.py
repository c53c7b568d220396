"""Multi-controller JAX, the baseline of the dispatch benchmark: one of two processes of 4 fake
CPU devices each, running the all-reduce step chained, as a user runs JAX on a 2-host slice
without Pathways. Started twice by ``dispatch.py``; prints the steps/s of its best run.

    python benchmarks/multi_controller.py INDEX COORDINATOR FLOATS_PER_DEVICE REPEATS CHAIN
"""

from __future__ import annotations

import json
import sys

import jax

jax.config.update("jax_num_cpu_devices", 4)
jax.config.update("jax_cpu_collectives_implementation", "gloo")

import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402
from jax_chain import all_reduce_step, chain_rate  # noqa: E402


def main() -> None:
    index, coordinator = int(sys.argv[1]), sys.argv[2]
    size, repeats, chain = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    jax.distributed.initialize(coordinator, num_processes=2, process_id=index)
    sharding = NamedSharding(Mesh(np.array(jax.devices()), ("x",)), PartitionSpec("x"))
    step = jax.jit(all_reduce_step, in_shardings=sharding, out_shardings=sharding)
    host = np.ones((8, size), np.float32)
    x = jax.make_array_from_callback(host.shape, sharding, lambda where: host[where])
    step(x).block_until_ready()
    best = chain_rate(step, x, chain, repeats)
    print(json.dumps({"rate": best}), flush=True)


if __name__ == "__main__":
    main()
