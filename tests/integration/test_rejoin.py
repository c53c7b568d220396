"""A lost executor restarted at its endpoint (as a kubelet restarts a container) is taken back
by its scheduler: work runs on it again, for sessions open through the loss and new ones,
while what the lost process held stays gone, saying so."""

from __future__ import annotations

import socket
import time
import urllib.request
from pathlib import Path

import grpc
import httpx
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import (
    assert_chain_runs,
    executor_infos,
    export,
    f32,
    increment,
    settled_executor_infos,
)

import pathways_client as pw
from pathways_client.island_client import IslandClient, IslandError
from pathways_client.launcher import LocalIsland
from pathways_client.rpc import stub
from pathways_core.wire import EXECUTOR, pb
from pathways_core.wire.streams import frame, messages

UNREACHABLE = r"executor 1 \(127\.0\.0\.1:\d+\) is unreachable"


def _metrics(island: LocalIsland) -> str:
    assert island.scheduler is not None
    url = f"http://127.0.0.1:{island.scheduler.health_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as answer:
        return answer.read().decode()


def test_a_restarted_executor_is_taken_back_and_what_it_held_stays_gone(
    compilation_cache: Path,
) -> None:
    # Not one JAX group: the other executor serves on while this one is down.
    island = LocalIsland(
        hosts=2, devices_per_host=2, distributed=False, compilation_cache=compilation_cache
    )
    with island:
        with IslandClient(island.scheduler_endpoint, "through") as client:
            add_one = client.register(increment(), "increment")
            held = client.put(np.arange(4, dtype=np.float32), device=2)
            island.kill_executor(1)
            with pytest.raises(IslandError, match=UNREACHABLE):
                client.submit(add_one, [2], [held], 1).wait(30)
            assert list(client.lost_executors) == [1]

            island.restart_executors(1)
            assert client.wait_for_executors(timeout=60), client.lost_executors
            # What the lost process held is gone, for the client and for work reading it.
            with pytest.raises(IslandError, match=rf"get '{held}': it was lost: {UNREACHABLE}"):
                client.get(held, timeout=5)
            reads_lost = client.submit(add_one, [0], [held], 1)
            with pytest.raises(IslandError, match=rf"reads buffer '{held}', which was lost"):
                reads_lost.wait(30)
            # Its output will never be: a read says why at once (it waited 30 s, then said
            # the buffer was never announced).
            with pytest.raises(IslandError, match=r"its computation failed: .* which was lost"):
                client.get(reads_lost.outputs[0], timeout=30)
            # The function registered before the loss is sent to the new process before its use;
            # uploads go to it, and a chain crosses from the other executor to it and back.
            x = client.put(np.arange(4, dtype=np.float32), device=2)
            first = client.submit(add_one, [2], [x], 1)
            second = client.submit(add_one, [0], [first.outputs[0]], 1)
            third = client.submit(add_one, [3], [second.outputs[0]], 1)
            np.testing.assert_array_equal(
                client.get(third.outputs[0], timeout=60), np.arange(4) + 3
            )
            client.delete([held])  # a lost buffer may still be deleted
        assert_chain_runs(island, "after")  # a session opened later sees it healthy
        metrics = _metrics(island)
        assert 'pathways_island_executors_rejoined_total{island="local"} 1.0' in metrics
        assert 'pathways_island_executors_lost{island="local"} 0.0' in metrics


def test_an_island_group_restarted_whole_is_taken_back(compilation_cache: Path) -> None:
    """One JAX group: a restarted member ends the group (its coordinator aborts when it
    rejoins), so the executors restart together, as a StatefulSet's pods do; the scheduler
    takes each back and a collective over both hosts runs again."""
    mesh_devices = 4
    total = export(
        lambda x: jnp.sum(x) * jnp.ones_like(x), f32(8), devices=mesh_devices, sharded=True
    )
    with (
        LocalIsland(hosts=2, devices_per_host=2, compilation_cache=compilation_cache) as island,
        IslandClient(island.scheduler_endpoint, "group") as client,
    ):
        function = client.register(total, "total")
        devices = list(range(mesh_devices))

        def all_reduce() -> np.ndarray:
            x = client.put(np.arange(8, dtype=np.float32), device=0)
            done = client.submit(function, devices, [x], 1)
            return client.get(done.outputs[0], timeout=60)

        np.testing.assert_array_equal(all_reduce(), np.full(8, 28.0))
        island.restart_executors(1, 0)
        assert client.wait_for_executors(timeout=60), client.lost_executors
        np.testing.assert_array_equal(all_reduce(), np.full(8, 28.0))


def test_a_slice_lost_with_its_executor_comes_back_once_it_is_restarted(
    compilation_cache: Path,
) -> None:
    island = LocalIsland(
        hosts=2, devices_per_host=2, distributed=False, compilation_cache=compilation_cache
    )
    with island, pw.connect(island) as cluster:
        slices = [cluster.slice(devices=2, name=name) for name in ("a", "b")]
        doubles = {s.name: pw.function(lambda v: v * 2, slice=s) for s in slices}
        manager = pw.elastic.Manager(cluster, slices)
        x = np.arange(4, dtype=np.float32)
        np.testing.assert_array_equal(doubles["b"](x).result(timeout=60), x * 2)
        island.kill_executor(1)
        with pytest.raises(pw.NodeFailed, match=UNREACHABLE):
            doubles["b"](x).result(timeout=60)
        assert [s.name for s in manager.find_lost()] == ["b"]
        with pytest.raises(TimeoutError, match=r"still lost: \['b'\]"):
            manager.wait_for_slices(timeout=0)

        island.restart_executors(1)
        assert [s.name for s in manager.wait_for_slices(timeout=60)] == ["a", "b"]
        np.testing.assert_array_equal(doubles["b"](x).result(timeout=60), x * 2)
        # Its devices may be bound again too.
        cluster.release(slices[1])
        again = cluster.slice(devices=2, name="again")
        owners = cluster.session(island.name).device_owner
        assert {owners[d] for d in again.devices} == {1}


def test_an_executor_is_ready_once_a_scheduler_holds_its_stream(tmp_path: Path) -> None:
    """Its pod's readiness probe asks this: a restarted executor counts as a ready host
    only once its scheduler took it back, not as soon as it listens."""
    launcher = LocalIsland(workdir=tmp_path)
    launcher._control_token = "t0ken"
    process = launcher._spawn(
        "executor",
        ["-m", "pathways_executor", "--fake-devices", "1", "--health-port", "0"],
    )
    try:
        launcher._await_ready(process)
        ready = f"http://127.0.0.1:{process.health_port}/readyz"
        answer = httpx.get(ready, timeout=10)
        assert (answer.status_code, answer.text) == (
            503,
            "no island scheduler holds its command stream",
        )
        with grpc.insecure_channel(process.endpoint) as channel:
            info = stub(channel, EXECUTOR, "Info")(pb.Empty(), timeout=30)
        host, port = info.control_endpoint.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=30) as connection:
            hello = pb.ExecutorCommand(hello=pb.ControlHello(token="t0ken"))
            # Its failure is reported on the stream: the executor has taken it by then.
            unknown = pb.ExecutorCommand(
                seq=1, run=pb.Computation(id="c/1", function_id="f" * 64, devices=[0])
            )
            connection.sendall(frame(pb.CommandBatch(commands=[hello])))  # alone, first
            connection.sendall(frame(pb.CommandBatch(commands=[unknown])))
            reports = messages(connection.recv, pb.EventBatch.FromString)
            assert next(batch for batch in reports if batch.events).events[0].computation_id
            assert httpx.get(ready, timeout=10).text == "ready"
    finally:
        process.popen.kill()
        process.popen.wait()


def test_a_restarted_executor_that_refuses_the_hello_is_not_taken_back(
    compilation_cache: Path,
) -> None:
    """Restarted with another control token, it refused the scheduler's hello: it was
    announced to clients as taken back, then lost again, and 'retired' every second."""
    island = LocalIsland(
        hosts=2, devices_per_host=2, distributed=False, compilation_cache=compilation_cache
    )
    with island, IslandClient(island.scheduler_endpoint, "tokens") as client:
        island.kill_executor(1)
        token = island._control_token
        island._control_token = "not-the-islands"  # as a misconfigured pod would start
        island.restart_executors(1)
        assert island.scheduler is not None
        scheduler_log = island.scheduler.log
        # Never announced as back: not while its hello is tried and refused, nor in the
        # scheduler's next attempts (one a second) after that.
        deadline = time.monotonic() + 60
        while "is not taken back: it refused the" not in scheduler_log.read_text():
            assert time.monotonic() < deadline, "the scheduler never tried its hello"
            assert not client.wait_for_executors(timeout=0.1)
        assert not client.wait_for_executors(timeout=2.5)
        log = scheduler_log.read_text()
        assert "executor 1 (127.0.0.1:" in log and "is not taken back: it refused the" in log
        assert "PATHWAYS_CONTROL_TOKEN the island's?" in log and "taken back\n" not in log
        island._control_token = token
        island.restart_executors(1)
        assert client.wait_for_executors(timeout=60)
        assert 'pathways_island_executors_rejoined_total{island="local"} 1.0' in _metrics(island)


def test_a_scheduler_restarted_alone_leaves_its_executors_nothing_of_the_old_sessions(
    compilation_cache: Path,
) -> None:
    """Its executors kept what the old scheduler's sessions held (buffers, 16 MiB here,
    functions, executables) for good, with no session left to free them."""
    with LocalIsland(hosts=1, devices_per_host=2, compilation_cache=compilation_cache) as island:
        client = IslandClient(island.scheduler_endpoint, "before")
        add_one = client.register(increment(), "increment")
        client.put(np.zeros(4 << 20, np.float32), device=0)
        kept = client.put(np.arange(4, dtype=np.float32), device=1)
        client.submit(add_one, [1], [kept], 1).wait(30)
        (before,) = executor_infos(island)
        assert before.buffers >= 3 and before.functions == 1 and before.buffer_bytes > 16 << 20

        island.restart_scheduler()
        client.close()
        (after,) = settled_executor_infos(island, [0], within=30)
        assert (after.buffers, after.buffer_bytes, after.functions, after.executables) == (
            0,
            0,
            0,
            0,
        )
        with IslandClient(island.scheduler_endpoint, "after") as again:  # serves on
            function = again.register(increment(), "increment")
            x = again.put(np.arange(4, dtype=np.float32), device=0)
            y = again.submit(function, [0], [x], 1)
            np.testing.assert_array_equal(again.get(y.outputs[0], timeout=60), np.arange(4) + 1)
