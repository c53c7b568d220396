"""Single-process JAX on 4 fake CPU devices, the one-host baseline of the dispatch benchmark,
in a process of its own with exactly the devices an executor has: on these 2-core machines a
process configured with 8 fake devices runs the same 4-device step 25-30% slower (more XLA
threads), which flattered the island when the baseline ran in the benchmark's own process.

Reads commands on stdin, one per line, and answers each on stdout:
``SIZE N`` prepares the all-reduce step for N floats per device (answers ``ok``);
``RUN CHAIN`` runs it chained CHAIN times and answers the steps/s.

    python benchmarks/single_process.py
"""

from __future__ import annotations

import sys

import jax

jax.config.update("jax_num_cpu_devices", 4)
jax.config.update("jax_platforms", "cpu")

import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402
from jax_chain import all_reduce_step, chain_rate  # noqa: E402


def main() -> None:
    sharding = NamedSharding(Mesh(np.array(jax.devices()), ("x",)), PartitionSpec("x"))
    step = jax.jit(all_reduce_step, in_shardings=sharding, out_shardings=sharding)
    x = None
    for line in sys.stdin:
        command, value = line.split()
        if command == "SIZE":
            x = jax.device_put(np.ones((4, int(value)), np.float32), sharding)
            step(x).block_until_ready()
            answer = "ok"
        else:
            answer = repr(chain_rate(step, x, int(value), 1))
        print(answer, flush=True)


if __name__ == "__main__":
    main()
