"""Work on one island reading an array of another that will never be: it fails within seconds,
naming the other island and why, and the island reading it keeps serving. Before, it waited
out the pull (30 s a holder, up to 120 s), holding up its executor's other work meanwhile."""

from __future__ import annotations

import gc
import os
import signal
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import increment, settled_executor_infos

import pathways_client as pw
from pathways_client.island_client import IslandClient, IslandError, Submitted
from pathways_client.launcher import LocalIsland


@pytest.fixture
def islands(compilation_cache: Path):
    with (
        LocalIsland(
            name="near", hosts=1, devices_per_host=2, compilation_cache=compilation_cache
        ) as near,
        LocalIsland(
            name="far", hosts=1, devices_per_host=2, compilation_cache=compilation_cache
        ) as far,
    ):
        yield near, far


def test_reading_an_array_whose_islands_scheduler_died_fails_at_once(islands) -> None:
    near, far = islands
    here = IslandClient(near.scheduler_endpoint, "tenant")
    there = IslandClient(far.scheduler_endpoint, "tenant")
    try:
        add_here, reader, remote, _ = read_while_unsent(here, there, far)
        time.sleep(0.5)
        far.scheduler.popen.kill()
        began = time.monotonic()
        with pytest.raises(IslandError, match=r"never be here: on island 'far', the session ended"):
            reader.wait(60)
        assert time.monotonic() - began < 10
        # The island that read it serves on, and holds nothing of it.
        y = here.put(np.ones(4, np.float32), device=1)
        z = here.submit(add_here, [1], [y], 1)
        np.testing.assert_array_equal(here.get(z.outputs[0], timeout=30), np.full(4, 2.0))
        here.delete([remote, y, *reader.outputs, *z.outputs])
        assert [i.buffers for i in settled_executor_infos(near, [0], within=30)] == [0]
    finally:
        here.close()
        there.close()


def read_while_unsent(
    here: IslandClient, there: IslandClient, far: LocalIsland
) -> tuple[str, Submitted, str, str]:
    """A computation of ``here`` (device 1) reading what one of ``there`` makes, with
    ``far``'s scheduler stopped so that producer is never sent: the function it calls, the
    reader, the id its input is placed under here, and the producer's output there."""
    add_here, add_there = here.register(increment()), there.register(increment())
    x = there.put(np.zeros(4, np.float32), device=0)
    there.submit(add_there, [0], [x], 1).wait(60)  # compiled: the producer would be quick
    assert far.scheduler is not None
    os.kill(far.scheduler.popen.pid, signal.SIGSTOP)
    wait_until_stopped(far.scheduler.popen.pid)
    produced = there.submit(add_there, [0], [x], 1).outputs[0]
    remote = here.place_remote(there.holders(produced))
    there.export(produced, here)
    return add_here, here.submit(add_here, [1], [remote], 1), remote, produced


def wait_until_stopped(pid: int) -> None:
    """Until the process is stopped (SIGSTOP lands a moment later: a message written at once
    was still read and acted on)."""
    give_up = time.monotonic() + 10
    while "\tT (stopped)" not in Path(f"/proc/{pid}/status").read_text():
        assert time.monotonic() < give_up, f"process {pid} did not stop"
        time.sleep(0.01)


def test_a_node_reading_a_failed_islands_output_fails_naming_it(islands) -> None:
    """Through the SDK: a function on one island given the future of another's."""
    near, far = islands
    with pw.connect(islands={"near": near.scheduler_endpoint, "far": far.scheduler_endpoint}) as c:
        produce = pw.function(lambda x: x * 2, slice=c.slice(devices=1, island="far"))
        consume = pw.function(lambda x: x + 1, slice=c.slice(devices=1, island="near"))
        ones = np.ones(4, np.float32)
        np.testing.assert_array_equal(consume(produce(ones)).result(), np.full(4, 3.0))
        assert far.scheduler is not None
        os.kill(far.scheduler.popen.pid, signal.SIGSTOP)
        wait_until_stopped(far.scheduler.popen.pid)
        result = consume(produce(ones))
        time.sleep(0.5)
        far.scheduler.popen.kill()
        began = time.monotonic()
        with pytest.raises(
            pw.NodeFailed, match=r"never be here: on island 'far', the session ended"
        ):
            result.result(timeout=60)
        assert time.monotonic() - began < 10
        np.testing.assert_array_equal(
            pw.function(lambda x: x + 1, slice=c.slice(devices=1, island="near"))(ones).result(),
            np.full(4, 2.0),
        )


def test_reading_an_array_whose_holder_was_lost_fails_once_its_island_says_so(
    compilation_cache: Path,
) -> None:
    """Its holder frozen, the pull from it hung for the reader's 120 s, though the holder's
    island had declared it lost within seconds."""
    with (
        LocalIsland(
            name="near", hosts=1, devices_per_host=2, compilation_cache=compilation_cache
        ) as near,
        LocalIsland(
            name="far",
            hosts=1,
            devices_per_host=2,
            executor_timeout=2,
            compilation_cache=compilation_cache,
        ) as far,
        IslandClient(near.scheduler_endpoint, "tenant") as here,
        IslandClient(far.scheduler_endpoint, "tenant") as there,
    ):
        add_here, add_there = here.register(increment()), there.register(increment())
        produced = there.submit(add_there, [0], [there.put(np.zeros(4, np.float32), 0)], 1)
        produced.wait(30)
        remote = here.place_remote(there.holders(produced.outputs[0]))
        there.export(produced.outputs[0], here)
        holder = far.executors[0].popen.pid
        os.kill(holder, signal.SIGSTOP)
        wait_until_stopped(holder)
        try:
            began = time.monotonic()
            reader = here.submit(add_here, [1], [remote], 1)
            with pytest.raises(
                IslandError, match=r"never be here: on island 'far', it was lost: executor 0"
            ):
                reader.wait(60)
            assert time.monotonic() - began < 15
        finally:
            os.kill(holder, signal.SIGCONT)


def test_an_array_deleted_once_another_islands_work_reads_it_is_kept_for_that_work(
    islands,
) -> None:
    """``x.delete()`` right after a call on another island was given ``x`` (as a jax.Array's
    delete, after the work already queued): its island freed it before the reader pulled it,
    which then failed ("unknown buffer"), or, ``x`` not made yet, waited for good, holding up
    its island's later work."""
    near, far = islands
    with pw.connect(islands={"near": near.scheduler_endpoint, "far": far.scheduler_endpoint}) as c:
        far_one, near_one = c.slice(devices=1, island="far"), c.slice(devices=1, island="near")

        def slow(v):
            m = jnp.full((128, 128), 1e-3, jnp.float32)
            w = jax.lax.fori_loop(0, 1500, lambda i, u: jnp.tanh(u @ m), jnp.ones((128, 128)))
            return v * 2 + w[0, 0] * 0

        produce = pw.function(slow, slice=far_one, name="produce")
        consume = pw.function(lambda v: v + 1, slice=near_one, name="consume")
        twice = pw.program(lambda v: consume(consume(v)))
        ones = np.ones(4, np.float32)
        np.testing.assert_array_equal(consume(produce(ones)).result(), np.full(4, 3.0))
        for made in (False, True):
            x = produce(ones)
            if made:
                x.wait()
            y, z = consume(x), twice(x)
            x.delete()
            np.testing.assert_array_equal(y.result(timeout=60), np.full(4, 3.0))
            np.testing.assert_array_equal(z.result(timeout=60), np.full(4, 4.0))
            del y, z
        gc.collect()
        for island in (near, far):
            assert [i.buffers for i in settled_executor_infos(island, [0], within=30)] == [0]


def test_a_buffer_deleted_before_it_was_made_fails_another_islands_reader_at_once(
    islands,
) -> None:
    """Through the island clients, which hold nothing for the reader: it waited for good."""
    near, far = islands
    here = IslandClient(near.scheduler_endpoint, "tenant")
    there = IslandClient(far.scheduler_endpoint, "tenant")
    try:
        _, reader, _, produced = read_while_unsent(here, there, far)
        there.delete([produced])
        with pytest.raises(IslandError, match=r"island 'far', it was deleted before it was made"):
            reader.wait(30)
        os.kill(far.scheduler.popen.pid, signal.SIGCONT)
    finally:
        here.close()
        there.close()
