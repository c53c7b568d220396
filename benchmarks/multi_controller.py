"""Multi-controller JAX, the baseline of the dispatch benchmark: one of two processes of 4 fake
CPU devices each, running the all-reduce step chained, as a user runs JAX on a 2-host slice
without Pathways. Started twice by ``dispatch.py``; prints the steps/s of its best run.

    python benchmarks/multi_controller.py INDEX COORDINATOR FLOATS_PER_DEVICE REPEATS CHAIN
"""

from __future__ import annotations

import json
import sys
import time

import jax

jax.config.update("jax_num_cpu_devices", 4)
jax.config.update("jax_cpu_collectives_implementation", "gloo")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

OUTSTANDING = 8


def main() -> None:
    index, coordinator = int(sys.argv[1]), sys.argv[2]
    size, repeats, chain = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    jax.distributed.initialize(coordinator, num_processes=2, process_id=index)
    sharding = NamedSharding(Mesh(np.array(jax.devices()), ("x",)), PartitionSpec("x"))
    step = jax.jit(
        lambda x: jnp.sum(x, axis=0, keepdims=True) * jnp.ones_like(x) * (1.0 / x.shape[0]),
        in_shardings=sharding,
        out_shardings=sharding,
    )
    host = np.ones((8, size), np.float32)
    x = jax.make_array_from_callback(host.shape, sharding, lambda where: host[where])
    step(x).block_until_ready()
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        y = x
        for count in range(1, chain + 1):
            y = step(y)
            # More than a few cross-process collectives queued at once deadlock gloo on these
            # 2-core machines; executors bound their outstanding work the same way.
            if count % OUTSTANDING == 0:
                y.block_until_ready()
        y.block_until_ready()
        best = max(best, chain / (time.perf_counter() - start))
    print(json.dumps({"rate": best}), flush=True)


if __name__ == "__main__":
    main()
