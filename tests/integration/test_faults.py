"""Fault injection with real processes: an executor killed mid-run, or stopped."""

from __future__ import annotations

import os
import re
import signal
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import export, f32, increment

from pathways_client.island_client import IslandClient, IslandError, IslandUnavailable
from pathways_client.launcher import LocalIsland
from pathways_executor.server import RETIRED_EXIT_CODE


def slow(x):
    # Seconds of matrix products on one CPU device.
    return jax.lax.fori_loop(0, 400, lambda _, y: jnp.tanh(y @ y), x)


def test_sigkill_of_an_executor_fails_its_work_fast_and_the_rest_keeps_serving(
    compilation_cache,
) -> None:
    island = LocalIsland(hosts=2, devices_per_host=2, compilation_cache=compilation_cache)
    with island, IslandClient(island.scheduler_endpoint, "victim") as client:
        heavy = client.register(export(slow, f32(512, 512)), "slow")
        add_one = client.register(increment(), "increment")
        x = client.put(np.full((512, 512), 0.001, np.float32), device=2)
        running = [client.submit(heavy, [2], [x], 1, name=f"slow-{n}") for n in range(5)]
        uploading: list[Exception] = []

        def upload_until_it_fails() -> None:
            big = np.ones((16, 1024, 1024), np.float32)
            try:
                while True:
                    client.delete(client.put(big, device=2))
            except Exception as error:  # asserted below
                uploading.append(error)

        uploader = threading.Thread(target=upload_until_it_fails)
        uploader.start()
        time.sleep(1.0)
        killed = time.monotonic()
        island.kill_executor(1)
        # An upload the death cut says so (not gRPC's "Stream removed").
        uploader.join(30)
        assert re.fullmatch(
            r"put: executor 1 \(127\.0\.0\.1:\d+\) is unreachable: .*", str(uploading[0])
        ), uploading
        # The island, not the request, failed it: IslandUnavailable (the proxy's UNAVAILABLE).
        lost = r"executor 1 \(127\.0\.0\.1:\d+\) is unreachable"
        with pytest.raises(IslandUnavailable, match=lost):
            running[-1].wait(30)
        assert time.monotonic() - killed < 10
        # Work touching the dead executor is refused with the same reason ...
        refused = client.submit(add_one, [3], [x], 1)
        with pytest.raises(IslandUnavailable, match="unreachable"):
            refused.wait(10)
        # ... and the scheduler and the other executor keep serving.
        y = client.put(np.zeros(4, np.float32), device=0)
        fine = client.submit(add_one, [1], [y], 1)
        fine.wait(30)
        np.testing.assert_array_equal(client.get(fine.outputs[0]), np.ones(4))
        # Uploads to the dead executor, and reads of what it held, fail naming it.
        unreachable = (
            r"executor 1 \(127\.0\.0\.1:\d+\)(:| is unreachable: its command stream ended)"
        )
        with pytest.raises(IslandError, match=rf"put: {unreachable}"):
            client.put(np.zeros(4, np.float32), device=2)
        with pytest.raises(IslandError, match=rf"get '{x}': it was lost: {unreachable}"):
            client.get(x, timeout=5)
    # A closed session says so (not "Cannot invoke RPC on closed channel").
    with pytest.raises(IslandError, match=r"put: the session with island .* is closed"):
        client.put(np.zeros(4, np.float32), device=0)
    with pytest.raises(IslandError, match=r"the session with island .* is closed"):
        client.get(y)


def test_a_stopped_executor_is_lost_after_the_executor_timeout_and_reads_from_it_end(
    compilation_cache,
) -> None:
    """A stopped (or hung) executor keeps its connections open: work reading its buffers
    waited 120 s (saying the buffer was not ready), holding up everything after it on the
    reader's devices, and its own work waited for good."""
    island = LocalIsland(
        hosts=2, devices_per_host=2, compilation_cache=compilation_cache, executor_timeout=3
    )
    with island, IslandClient(island.scheduler_endpoint, "tenant") as client:
        add_one = client.register(increment(), "increment")
        held = client.submit(add_one, [2], [client.put(np.zeros(4, np.float32), device=2)], 1)
        held.wait(30)  # its output stays on executor 1
        mine = client.put(np.zeros(4, np.float32), device=0)
        pid = island.executors[1].popen.pid
        os.kill(pid, signal.SIGSTOP)
        stopped = time.monotonic()
        # An upload to it in progress ends when the scheduler tells its loss (it waited 120 s).
        uploading: list[BaseException] = []

        def upload() -> None:
            try:
                client.put(np.zeros(1 << 24, np.float32), device=2)
            except BaseException as error:
                uploading.append(error)

        uploader = threading.Thread(target=upload)
        uploader.start()
        try:
            reading = client.submit(add_one, [0], [held.outputs[0]], 1)
            own = client.submit(add_one, [3], [held.outputs[0]], 1)
            silent = r"executor 1 \(127\.0\.0\.1:\d+\) is unreachable: it sent nothing for \d+ s"
            with pytest.raises(IslandError, match=silent):
                reading.wait(60)
            with pytest.raises(IslandError, match=silent):
                own.wait(10)
            assert time.monotonic() - stopped < 15
            uploader.join(15)
            assert not uploader.is_alive() and re.search(silent, str(uploading[0]))
            # Later uploads and reads fail at once, saying why.
            began = time.monotonic()
            with pytest.raises(IslandError, match=silent):
                client.put(np.zeros(4, np.float32), device=3)
            with pytest.raises(IslandError, match=silent):
                client.get(held.outputs[0])
            assert time.monotonic() - began < 1
            # The rest of the island keeps serving, the reader's devices too.
            after = client.submit(add_one, [0], [mine], 1)
            after.wait(30)
            np.testing.assert_array_equal(client.get(after.outputs[0]), np.ones(4))
        finally:
            os.kill(pid, signal.SIGCONT)
        # Resumed, it answers as the process the island gave up on: it is retired, to be
        # restarted (by a kubelet) and taken back as a new one.
        assert island.executors[1].popen.wait(timeout=30) == RETIRED_EXIT_CODE
        assert "retired by its scheduler: island 'local' lost it" in island.executors[1].tail()


def test_a_scheduler_stopped_longer_than_the_executor_timeout_keeps_its_executors(
    compilation_cache,
) -> None:
    """Resumed, it took what it had not heard while stopped for its executors' silence and
    cut a healthy one off for good."""
    island = LocalIsland(
        hosts=2, devices_per_host=2, compilation_cache=compilation_cache, executor_timeout=3
    )
    with island, IslandClient(island.scheduler_endpoint, "tenant") as client:
        add_one = client.register(increment(), "increment")
        pid = island.scheduler.popen.pid  # type: ignore[union-attr]
        os.kill(pid, signal.SIGSTOP)
        time.sleep(5)
        os.kill(pid, signal.SIGCONT)
        time.sleep(1.0)  # a watch of its executors or two
        for device in (0, 2):
            x = client.put(np.zeros(4, np.float32), device=device)
            done = client.submit(add_one, [device], [x], 1)
            done.wait(30)
            np.testing.assert_array_equal(client.get(done.outputs[0]), np.ones(4))


def test_a_finished_computation_is_reported_while_the_clients_others_run(
    compilation_cache,
) -> None:
    """Held for the client's next event while it had two others outstanding, a 1 ms
    computation was reported only when a 4 s one beside it ended."""
    island = LocalIsland(hosts=2, devices_per_host=2, compilation_cache=compilation_cache)
    with island, IslandClient(island.scheduler_endpoint, "pipeline") as client:
        heavy = client.register(export(slow, f32(512, 512)), "slow")
        add_one = client.register(increment(), "increment")
        inputs = [client.put(np.full((512, 512), 0.001, np.float32), device=d) for d in (2, 3)]
        client.submit(heavy, [2], [inputs[0]], 1).wait(120)  # compiled
        y = client.put(np.zeros(4, np.float32), device=0)
        client.submit(add_one, [0], [y], 1).wait(60)  # compiled
        long = [client.submit(heavy, [d], [x], 1) for d, x in zip((2, 3), inputs, strict=True)]
        began = time.monotonic()
        quick = client.submit(add_one, [0], [y], 1)
        quick.wait(60)
        waited = time.monotonic() - began
        assert not long[-1].done.done(), "the long ones ended first: the test proves nothing"
        assert waited < 1.0, waited
        for item in long:
            item.wait(120)


def test_a_read_cut_by_the_death_of_the_executor_serving_it_names_the_loss(
    compilation_cache,
) -> None:
    """A computation whose input's holder died while serving it failed, 2 runs in 3, naming
    the connection's end only ("Connection reset by peer"): an IslandError, not the
    IslandUnavailable that says the island, not the request, failed it."""
    island = LocalIsland(hosts=2, devices_per_host=1, compilation_cache=compilation_cache)
    with island, IslandClient(island.scheduler_endpoint, "reader") as client:
        add_one = client.register(increment(), "increment")
        held = client.submit(add_one, [1], [client.put(np.zeros(4, np.float32), device=1)], 1)
        held.wait(30)  # its output stays on executor 1
        holder = island.executors[1].popen
        holder.send_signal(signal.SIGSTOP)  # the reader's request waits, unanswered
        try:
            reading = client.submit(add_one, [0], [held.outputs[0]], 1)
            time.sleep(1.0)
        finally:
            holder.kill()  # dies with the request in hand
        lost = r"executor 1 \(127\.0\.0\.1:\d+\) is unreachable"
        with pytest.raises(IslandUnavailable, match=lost):
            reading.wait(30)
