"""Four clients with weights 1:2:4:8 share one island's devices.

Each client has its own session and its own view of the devices; the island's gang scheduler
orders everyone's work into one sequence and, under proportional share, gives each client
device time in proportion to its weight while all of them have work queued.

    python examples/multi_tenant.py              # starts a local island
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any

import jax.numpy as jnp
import numpy as np

import pathways_client as pw
from pathways_client.launcher import LocalIsland

WEIGHTS = (1, 2, 4, 8)


def work(x):
    """A small computation: a few matrix products, so device time is what is shared."""
    for _ in range(4):
        x = jnp.tanh(x @ x.T) + 1.0
    return x


def run_client(
    islands: dict[str, str], weight: int, computations: int, size: int, results: dict[int, Any]
) -> None:
    """One tenant: a chain of ``computations`` calls, all dispatched before any finishes."""
    with pw.connect(islands=islands, client=f"tenant-w{weight}", weight=weight) as cluster:
        devices = cluster.slice(devices=1)
        step = pw.function(work, slice=devices, name=f"work-w{weight}")
        x = np.full((size, size), 0.01 * weight, np.float32)
        value = x
        for _ in range(computations):
            value = step(value)
        results[weight] = value.result()


def run(
    islands: dict[str, str], computations: int = 200, size: int = 64
) -> tuple[dict[int, float], dict[int, np.ndarray], list[Any]]:
    """Run the four tenants at once; returns each one's share of device time while all were
    busy, each one's final value, and the island's trace."""
    results: dict[int, Any] = {}
    threads = [
        threading.Thread(target=run_client, args=(islands, w, computations, size, results))
        for w in WEIGHTS
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with pw.connect(islands=islands, client="observer") as cluster:
        trace = cluster.trace()
    return shares(trace), results, trace


def shares(trace: list[Any], by_time: bool = True) -> dict[int, float]:
    """Each tenant's share of device time (or of computations: all are the same size) over
    the stretch where all of them had work queued: from the last tenant's first computation
    to the first tenant's last; a computation counts as at most ten times the median one."""
    by_client: dict[str, list[Any]] = defaultdict(list)
    for record in trace:
        if record.client.startswith("tenant-w"):
            by_client[record.client].append(record)
    start = max(records[0].seq for records in by_client.values())
    stop = min(records[-1].seq for records in by_client.values())
    stretch = {
        client: [r for r in records if start <= r.seq <= stop]
        for client, records in by_client.items()
    }
    # A computation the host held up (another process's burst) counts as ten typical ones at
    # most (beside other tests, a tenant of weight 2 in 15 read 0.215 of the device time).
    durations = sorted(r.end_ns - r.start_ns for records in stretch.values() for r in records)
    ceiling = 10 * durations[len(durations) // 2] if durations else 0
    time: dict[int, float] = defaultdict(float)
    for client, records in stretch.items():
        weight = int(client.removeprefix("tenant-w"))
        time[weight] += sum(min(r.end_ns - r.start_ns, ceiling) if by_time else 1 for r in records)
    total = sum(time.values()) or 1.0
    return {weight: time[weight] / total for weight in sorted(time)}


def reference(computations: int = 200, size: int = 64) -> dict[int, np.ndarray]:
    """Each tenant's chain in plain JAX."""
    import jax

    step = jax.jit(work)
    expected = {}
    for weight in WEIGHTS:
        value = jnp.full((size, size), 0.01 * weight, jnp.float32)
        for _ in range(computations):
            value = step(value)
        expected[weight] = np.asarray(value)
    return expected


def main() -> None:
    with LocalIsland(
        hosts=1, devices_per_host=1, policy="proportional-share", max_in_flight=2
    ) as island:
        measured, results, _ = run({island.name: island.scheduler_endpoint})
    expected = reference()
    total = sum(WEIGHTS)
    for weight, share in measured.items():
        same = np.allclose(results[weight], expected[weight], rtol=1e-5)
        target = weight / total
        print(f"weight {weight}: share {share:.3f} (target {target:.3f}); equal to JAX: {same}")


if __name__ == "__main__":
    main()
