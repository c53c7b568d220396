"""Real islands: scheduler and executor processes with fake CPU devices on loopback.

The test process exports functions with JAX on 8 fake CPU devices of its own (exporting a
sharded function needs a mesh), so JAX is configured here before anything uses it.
"""

from __future__ import annotations

import jax

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_platforms", "cpu")

import functools  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterable, Iterator, Sequence  # noqa: E402
from pathlib import Path  # noqa: E402

import grpc  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

from pathways_client.island_client import IslandClient  # noqa: E402
from pathways_client.launcher import LocalIsland  # noqa: E402
from pathways_client.rpc import stub  # noqa: E402
from pathways_core.wire import EXECUTOR, pb  # noqa: E402


def export(function, *avals, devices: int = 1, sharded: bool = False) -> bytes:
    """A serialized jax.export artifact of ``function`` for ``devices`` devices, its inputs and
    outputs split along the first axis when ``sharded``."""
    if devices == 1:
        jitted = jax.jit(function)
    else:
        mesh = Mesh(np.array(jax.devices()[:devices]), ("x",))
        spec = NamedSharding(mesh, PartitionSpec("x") if sharded else PartitionSpec())
        jitted = jax.jit(function, in_shardings=spec, out_shardings=spec)
    return bytes(jax.export.export(jitted)(*avals).serialize())


def f32(*shape: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, jnp.float32)


def chain_nodes(
    function: str, slices: Sequence[int | Iterable[int]], name: str = "stage"
) -> list[pb.Computation]:
    """A program's nodes x -> y0 -> y1 -> ...: node k runs ``function`` on ``slices[k]`` (a
    device, or the devices of a slice)."""
    nodes, previous = [], "x"
    for k, devices in enumerate(slices):
        nodes.append(
            pb.Computation(
                id=f"s{k}",
                function_id=function,
                devices=[devices] if isinstance(devices, int) else list(devices),
                inputs=[previous],
                outputs=[f"y{k}"],
                name=f"{name}-{k}",
            )
        )
        previous = f"y{k}"
    return nodes


@functools.cache
def increment(floats: int = 4) -> bytes:
    """``x + 1`` on ``floats`` float32 values, exported (once per size: each export differs)."""
    return export(lambda x: x + 1, f32(floats))


@functools.cache
def slow_square(iterations: int = 400) -> bytes:
    """A computation of a 512 x 512 float32 array taking about a second (400 iterations)
    here: what other work waits behind."""

    def run(x: jax.Array) -> jax.Array:
        return jax.lax.fori_loop(0, iterations, lambda _, y: jnp.tanh(y @ y) * 0.5 + x, x)

    return export(run, f32(512, 512))


@functools.cache
def huge() -> bytes:
    """A function of 4 floats that asks the devices for 256 GiB when it runs: it fails
    there, not when dispatched."""
    return export(
        lambda v: jax.lax.dynamic_update_slice(jnp.zeros((1 << 36,)), v[:1], (0,)).sum() + v,
        f32(4),
    )


@functools.cache
def rows(operation: str, devices: int = 1) -> bytes:
    """``x * 2`` (``"double"``) or ``x + 1`` (``"increment"``) on a float32[4, 3], its rows
    split over ``devices``."""
    function = {"double": lambda x: x * 2, "increment": lambda x: x + 1}[operation]
    return export(function, f32(4, 3), devices=devices, sharded=devices > 1)


def assert_chain_runs(island: LocalIsland, client_name: str) -> None:
    """A chain across two executors gives the right result: the second (device 2) pulls the
    first's output (device 0) over the data plane, and the result comes back over gRPC."""
    with IslandClient(island.scheduler_endpoint, client_name) as client:
        function = client.register(increment(), "increment")
        x = client.put(np.arange(4, dtype=np.float32), device=0)
        first = client.submit(function, [0], [x], 1)
        second = client.submit(function, [2], [first.outputs[0]], 1)
        second.wait(60)
        np.testing.assert_array_equal(client.get(second.outputs[0], timeout=60), np.arange(4) + 2)
        client.delete([x, *first.outputs, *second.outputs])


@pytest.fixture(scope="session")
def compilation_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("xla-cache")


@pytest.fixture(scope="module")
def island(compilation_cache: Path) -> Iterator[LocalIsland]:
    """One island of 2 executors x 4 fake devices, shared by a module's tests."""
    with LocalIsland(hosts=2, devices_per_host=4, compilation_cache=compilation_cache) as running:
        yield running


def executor_infos(island: LocalIsland) -> list[pb.ExecutorInfo]:
    """Each executor's ``Info``: its buffers, their bytes, inputs taken over."""
    infos = []
    for process in island.executors:
        with grpc.insecure_channel(process.endpoint) as channel:
            infos.append(stub(channel, EXECUTOR, "Info")(pb.Empty(), timeout=30))
    return infos


def settled_executor_infos(
    island: LocalIsland, buffers: list[int], within: float, at_most: bool = False
) -> list[pb.ExecutorInfo]:
    """Executors' ``Info`` once their buffer counts are back to ``buffers`` (deletions travel
    behind the work queued before them; ``at_most``: or below, as other sessions' buffers
    may go meanwhile), or as they are after ``within`` seconds."""
    give_up = time.monotonic() + within
    while True:
        infos = executor_infos(island)
        counts = [i.buffers for i in infos]
        back = all(map(int.__le__, counts, buffers)) if at_most else counts == buffers
        if back or time.monotonic() > give_up:
            return infos
        time.sleep(0.1)
