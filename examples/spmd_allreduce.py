"""The paper's micro-benchmark computation: a trivial all-reduce gang-scheduled over 8 devices.

Run it three ways, as in the paper's Figure 5: op by op (-O: one call per step, each result a
future fed to the next call), chained (-C: steps traced into one program, dispatched at once)
and fused (-F: the steps inside one compiled function).

    python examples/spmd_allreduce.py            # starts a local island of 2 x 4 fake devices
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import pathways_client as pw
from pathways_client.launcher import LocalIsland

ROWS_PER_DEVICE = 1


def all_reduce_step(x: jax.Array) -> jax.Array:
    """Every row becomes the mean of all rows, plus one: an all-reduce over the devices."""
    return jnp.broadcast_to(jnp.mean(x, axis=0), x.shape) + 1.0


def run(cluster: pw.Cluster, steps: int = 8, width: int = 16) -> dict[str, np.ndarray]:
    """The three modes on one 8-device slice; returns each mode's final value."""
    with cluster.slice(devices=8, name="allreduce") as devices:
        step = pw.function(
            all_reduce_step, slice=devices, in_shardings=P("x"), out_shardings=P("x")
        )

        @pw.function(slice=devices, in_shardings=P("x"), out_shardings=P("x"), name="fused")
        def fused(x: jax.Array) -> jax.Array:
            return jax.lax.fori_loop(0, steps, lambda _, v: all_reduce_step(v), x)

        @pw.program(name="chained")
        def chained(x):
            for _ in range(steps):
                x = step(x)
            return x

        x = initial(devices.size, width)
        value = x
        for _ in range(steps):  # -O: every call returns a future that feeds the next call
            value = step(value)
        return {
            "op-by-op": value.result(),
            "chained": chained(x).result(),
            "fused": fused(x).result(),
        }


def initial(devices: int, width: int) -> np.ndarray:
    return np.arange(devices * ROWS_PER_DEVICE * width, dtype=np.float32).reshape(-1, width)


def reference(steps: int = 8, width: int = 16, devices: int = 8) -> np.ndarray:
    """The same steps in plain single-process JAX."""
    x = jnp.asarray(initial(devices, width))
    for _ in range(steps):
        x = jax.jit(all_reduce_step)(x)
    return np.asarray(x)


def main() -> None:
    with LocalIsland(hosts=2, devices_per_host=4) as island, pw.connect(island) as cluster:
        results = run(cluster)
    expected = reference()
    for mode, value in results.items():
        print(
            f"{mode:>9}: first row {value[0, :4]} ... equal to JAX: {np.allclose(value, expected)}"
        )


if __name__ == "__main__":
    main()
