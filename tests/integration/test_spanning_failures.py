"""A computation spanning both executors of a two-host island that fails on one of them before
its launch: that executor launches it all the same, on zeros, so the collectives of every
later computation spanning the hosts stay paired. Before, the other executor waited in the
collective alone: the computation hung, and the collectives of other tenants after it were
paired with the wrong ones (wrong values, then hangs)."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from conftest import export, f32

from pathways_client.island_client import IslandClient, IslandError
from pathways_client.launcher import LocalIsland
from pathways_client.rpc import stub
from pathways_core.wire import EXECUTOR
from pathways_core.wire.arrays import to_chunks


def add_sum() -> bytes:
    """``x + sum(x)`` over 8 devices (a cross-host all-reduce), its input split over them."""
    return export(lambda x: x + x.sum(), f32(8), devices=8, sharded=True)


def test_a_failure_on_one_host_before_launch_leaves_other_collectives_right(
    island: LocalIsland,
) -> None:
    with (
        IslandClient(island.scheduler_endpoint, "spoiler", tls=None) as spoiler,
        IslandClient(island.scheduler_endpoint, "bystander", tls=None) as bystander,
    ):
        function = spoiler.register(add_sum(), "add-sum")
        x = spoiler.put(np.arange(8, dtype=np.float32), device=0)
        warm = spoiler.submit(function, list(range(8)), [x], 1)
        warm.wait(120)  # both hosts' collectives set up and paired once
        # The spoiler uploads, to executor 1 alone, a value under the output id its next
        # computation will have: executor 1 refuses to run it (the id is taken), executor 0
        # runs it.
        taken = f"spoiler/b-taken-{np.random.default_rng().integers(1 << 60)}"
        ids = iter([taken])
        real_new_id = spoiler._new_id
        spoiler._new_id = lambda kind: next(ids) if kind == "b" else real_new_id(kind)  # type: ignore[method-assign]
        with grpc.insecure_channel(island.executors[1].endpoint) as channel:
            stub(channel, EXECUTOR, "PutArray")(
                to_chunks(taken, np.zeros(8, np.float32)), timeout=30
            )
        spoiled = spoiler.submit(function, list(range(8)), [x], 1, name="spoiled")
        with pytest.raises(IslandError, match="holds a value on executor 1 already"):
            spoiled.wait(60)
        # Another tenant's cross-host collectives after it: right, and not hung.
        bystander_function = bystander.register(add_sum(), "add-sum")
        for value in (100.0, 1000.0, 10000.0):
            y = bystander.put(np.full(8, value, np.float32), device=0)
            done = bystander.submit(bystander_function, list(range(8)), [y], 1)
            done.wait(60)
            np.testing.assert_array_equal(
                bystander.get(done.outputs[0], timeout=60), np.full(8, 9 * value)
            )
