"""Multi-controller JAX, the two-host baseline of the dispatch benchmark: one of two processes
of 4 fake CPU devices each, running the all-reduce step chained, as a user runs JAX on a 2-host
slice without Pathways. Started twice by ``dispatch.py`` and kept running, so its rounds
interleave with the island's.

Reads the commands of ``single_process.py`` on stdin (both processes get each one) and answers
each on stdout: ``SIZE N`` prepares the step for N floats per device (answers ``ok``);
``RUN CHAIN`` runs it chained CHAIN times and answers the steps/s.

    python benchmarks/multi_controller.py INDEX COORDINATOR
"""

from __future__ import annotations

import os
import sys

import jax

jax.config.update("jax_num_cpu_devices", 4)
jax.config.update("jax_cpu_collectives_implementation", "gloo")

import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402
from jax_chain import all_reduce_step, chain_rate  # noqa: E402


def ones(sharding: NamedSharding, size: int) -> jax.Array:
    """The step's input: 8 rows of ``size`` floats, this process supplying its own shards."""
    host = np.ones((8, size), np.float32)
    return jax.make_array_from_callback(host.shape, sharding, lambda where: host[where])


def main() -> None:
    index, coordinator = int(sys.argv[1]), sys.argv[2]
    # Answers go to the real stdout; gloo's own lines (printed by its C++ code) go to stderr.
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    jax.distributed.initialize(coordinator, num_processes=2, process_id=index)
    sharding = NamedSharding(Mesh(np.array(jax.devices()), ("x",)), PartitionSpec("x"))
    step = jax.jit(all_reduce_step, in_shardings=sharding, out_shardings=sharding)
    x = None
    for line in sys.stdin:
        command, value = line.split()
        if command == "SIZE":
            x = ones(sharding, int(value))
            step(x).block_until_ready()
            answer = "ok"
        else:
            answer = repr(chain_rate(step, x, int(value), 1))
        print(answer, file=answers, flush=True)


if __name__ == "__main__":
    main()
