"""Work reading another island's array not made yet waits in its island's queue, holding no
executor, until that array is made. Executors used to wait for it in island order: two
islands whose tenants' priorities ordered their cross-island reads oppositely each waited,
in order, for work the other held behind its own waiting reader, for good, and every tenant
of both islands waited with them."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from conftest import increment, slow_square

from pathways_client.island_client import IslandClient, Submitted
from pathways_client.launcher import LocalIsland


def placed_from(producer: IslandClient, buffer_id: str, reader: IslandClient) -> str:
    """``buffer_id`` of ``producer``'s island placed on ``reader``'s, as the SDK places a
    future's array there (pending until made)."""
    source = producer.holders(buffer_id)
    source.pending = True
    placed = reader.place_remote(source)
    producer.export(buffer_id, reader)
    return placed


def test_islands_ordering_cross_island_reads_oppositely_do_not_wait_on_each_other(
    compilation_cache: Path,
) -> None:
    def small(name: str) -> LocalIsland:
        """One host of 2 devices, 2 computations in flight: long work soon fills it."""
        return LocalIsland(
            name=name,
            hosts=1,
            devices_per_host=2,
            max_in_flight=2,
            compilation_cache=compilation_cache,
        )

    with small("east") as east, small("west") as west:
        sessions = {
            # c1 comes first on east, c2 on west: each reads, there, what the other island
            # makes for it, and its reader is queued before the other tenant's producer.
            ("c1", "east"): IslandClient(east.scheduler_endpoint, "c1", priority=10),
            ("c1", "west"): IslandClient(west.scheduler_endpoint, "c1", priority=0),
            ("c2", "east"): IslandClient(east.scheduler_endpoint, "c2", priority=0),
            ("c2", "west"): IslandClient(west.scheduler_endpoint, "c2", priority=10),
            ("hog", "east"): IslandClient(east.scheduler_endpoint, "hog"),
            ("hog", "west"): IslandClient(west.scheduler_endpoint, "hog"),
        }
        try:
            add = {key: client.register(increment()) for key, client in sessions.items()}
            slow = {}
            for island in ("east", "west"):
                hog = sessions["hog", island]
                square = hog.put(np.full((512, 512), 0.01, np.float32), device=1)
                slow[island] = (hog.register(slow_square()), square)
                hog.submit(slow[island][0], [1], [square], 1).wait(120)  # compiled
            # Both islands busy with long work (their in-flight bound), so what follows queues.
            hogs = [
                sessions["hog", island].submit(slow[island][0], [1], [slow[island][1]], 1)
                for island in ("east", "west")
                for _ in range(2)
            ]
            c1_west, c2_east = sessions["c1", "west"], sessions["c2", "east"]
            made_west = c1_west.submit(
                add["c1", "west"], [0], [c1_west.put(np.zeros(4, np.float32), 0)], 1
            )
            made_east = c2_east.submit(
                add["c2", "east"], [0], [c2_east.put(np.full(4, 10, np.float32), 0)], 1
            )
            read: dict[str, Submitted] = {}
            for tenant, producer, reader, made in (
                ("c1", "west", "east", made_west),
                ("c2", "east", "west", made_east),
            ):
                there = sessions[tenant, reader]
                placed = placed_from(sessions[tenant, producer], made.outputs[0], there)
                read[tenant] = there.submit(add[tenant, reader], [0], [placed], 1)
            began = time.monotonic()
            for submitted in (*hogs, made_west, made_east, *read.values()):
                submitted.wait(90)
            assert time.monotonic() - began < 60
            assert sessions["c1", "east"].get(read["c1"].outputs[0], timeout=30).tolist() == [2] * 4
            assert (
                sessions["c2", "west"].get(read["c2"].outputs[0], timeout=30).tolist() == [12] * 4
            )
        finally:
            for client in sessions.values():
                client.close()
