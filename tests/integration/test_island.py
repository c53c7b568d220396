"""An island of real processes: computations, chains across executors, concurrent clients."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import grpc
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import executor_infos, export, f32, rows, settled_executor_infos, slow_square
from conftest import huge as huge_artifact
from conftest import increment as increment_of
from processes import assert_all_stop

import pathways_client.island_client as island_client_module
from pathways_client.embedded import _alive
from pathways_client.island_client import IslandClient, IslandError, Submitted
from pathways_client.launcher import LocalIsland
from pathways_client.rpc import stub
from pathways_core.wire import EXECUTOR, pb
from pathways_core.wire.streams import frame, messages
from pathways_executor.functions import TOKEN_FROM_BYTES

INCREMENT = increment_of()  # conftest's, exported once for the whole session
DOUBLE = export(lambda x: x * 2, f32(4))


def all_reduce_artifact(devices: int) -> bytes:
    """Every row becomes the sum of all rows: one row of 3 floats per device."""
    return export(
        lambda x: jnp.sum(x, axis=0, keepdims=True) * jnp.ones_like(x),
        f32(devices, 3),
        devices=devices,
        sharded=True,
    )


def test_island_reports_its_executors_and_devices(island: LocalIsland) -> None:
    with IslandClient(island.scheduler_endpoint, "info") as client:
        assert [list(e.devices) for e in client.info.executors] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_island_processes_share_the_launchers_session_not_its_process_group(
    island: LocalIsland,
) -> None:
    # Own process group: a terminal's Ctrl-C reaches only the launcher. Same session: Linux
    # shares CPU equally between sessions, which would starve the executors' device threads.
    for process in [island.scheduler, *island.executors]:
        assert os.getpgid(process.popen.pid) == process.popen.pid
        assert os.getsid(process.popen.pid) == os.getsid(0)


# A launcher that starts an island, says its processes' ids, and waits to be killed.
ORPHANING_LAUNCHER = """
import json, sys, time
from pathways_client.launcher import LocalIsland
island = LocalIsland(hosts=2, devices_per_host=1, compilation_cache=sys.argv[1]).start()
print(json.dumps([p.popen.pid for p in [*island.executors, island.scheduler]]), flush=True)
time.sleep(600)
"""


def test_an_island_stops_when_its_launcher_dies_without_stopping_it(compilation_cache) -> None:
    launcher = subprocess.Popen(
        [sys.executable, "-c", ORPHANING_LAUNCHER, str(compilation_cache)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert launcher.stdout is not None
        pids = json.loads(launcher.stdout.readline())
        assert len(pids) == 3 and all(_alive(pid) for pid in pids)
    finally:
        launcher.kill()  # no atexit, no stop(): only the closed pipes tell the island
        launcher.wait()
    assert_all_stop(pids)


def test_three_node_chain_across_executors(island: LocalIsland) -> None:
    with IslandClient(island.scheduler_endpoint, "chain") as client:
        increment = client.register(INCREMENT, "increment")
        double = client.register(DOUBLE, "double")
        x = client.put(np.arange(4, dtype=np.float32), device=0)
        a = client.submit(increment, [1], [x], 1, name="a")  # executor 0
        b = client.submit(double, [6], [a.outputs[0]], 1, name="b")  # executor 1
        c = client.submit(increment, [2], [b.outputs[0]], 1, name="c")  # back to executor 0
        # All three were dispatched before the first finished; only the last is awaited.
        c.wait()
        np.testing.assert_array_equal(client.get(c.outputs[0]), (np.arange(4) + 1) * 2 + 1)
        # An island reads a buffer to whoever names it: ids carry 64 random bits.
        for buffer_id in (x, *a.outputs, *c.outputs):
            assert re.fullmatch(r"chain/(put|b)\d+-[0-9a-f]{16}", buffer_id), buffer_id


def test_sharded_all_reduce_on_a_four_device_slice(island: LocalIsland) -> None:
    all_reduce = all_reduce_artifact(devices=4)
    with IslandClient(island.scheduler_endpoint, "allreduce") as client:
        function = client.register(all_reduce, "all-reduce")
        value = np.arange(12, dtype=np.float32).reshape(4, 3)
        x = client.put(value, device=4)
        result = client.submit(function, [4, 5, 6, 7], [x], 1, name="sum")
        result.wait()
        np.testing.assert_array_equal(client.get(result.outputs[0]), np.tile(value.sum(0), (4, 1)))


def test_concurrent_clients_on_overlapping_devices_share_one_order(island: LocalIsland) -> None:
    rounds = 30
    errors: list[BaseException] = []

    def work(name: str, devices: list[int]) -> None:
        try:
            with IslandClient(island.scheduler_endpoint, name) as client:
                function = client.register(INCREMENT, "increment")
                current = client.put(np.zeros(4, np.float32), device=devices[0])
                last = None
                for _ in range(rounds):
                    for device in devices:
                        last = client.submit(function, [device], [current], 1)
                        current = last.outputs[0]
                last.wait(60)
                np.testing.assert_array_equal(client.get(current), rounds * len(devices))
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    threads = [
        threading.Thread(target=work, args=("left", [0, 4, 1])),
        threading.Thread(target=work, args=("right", [4, 0, 5])),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    with IslandClient(island.scheduler_endpoint, "observer") as client:
        records = [r for r in client.trace() if r.client in ("left", "right")]
    assert len(records) == 2 * rounds * 3
    # Each device ran its computations in island order (increasing sequence numbers), with no
    # overlap in time between consecutive ones (on other devices they may overlap).
    for device in (0, 1, 4, 5):
        ran = sorted((r for r in records if device in r.devices), key=lambda r: r.start_ns)
        assert [r.seq for r in ran] == sorted(r.seq for r in ran)
        assert all(a.end_ns <= b.start_ns for a, b in itertools.pairwise(ran))


def _long(x):
    # A second or more on these machines: what a tenant's training step may take.
    return jax.lax.fori_loop(0, 2000, lambda _, v: jnp.tanh(v @ v), x)


LONG = export(_long, f32(256, 256))


def test_a_computation_is_reported_once_done_not_after_others_on_other_devices_of_its_host(
    island: LocalIsland,
) -> None:
    with (
        IslandClient(island.scheduler_endpoint, "long") as long,
        IslandClient(island.scheduler_endpoint, "short") as short,
    ):
        x = long.put(np.eye(256, dtype=np.float32) * 0.5, device=2)
        slow = long.submit(long.register(LONG, "long"), [2], [x], 1, name="slow")
        increment = short.register(INCREMENT, "increment")
        current = short.put(np.zeros(4, np.float32), device=3)
        for _ in range(3):  # one at a time, each awaited, as a loop fetching its loss does
            step = short.submit(increment, [3], [current], 1)
            step.wait(60)
            current = step.outputs[0]
        assert not slow.done.done(), "the short steps were reported only once the slow one ended"
        np.testing.assert_array_equal(short.get(current), 3)
        slow.wait(120)
        records = {r.computation_id: r for r in short.trace() if r.client in ("long", "short")}
    # The trace shows the two running at once on their devices.
    assert records[step.id].start_ns < records[slow.id].end_ns


@pytest.mark.parametrize("weights", [(1, 2, 4, 8)])
def test_proportional_share_within_five_percent(compilation_cache, weights) -> None:
    per_client = 1000
    with LocalIsland(
        hosts=1,
        devices_per_host=1,
        policy="proportional-share",
        max_in_flight=2,
        compilation_cache=compilation_cache,
    ) as island:
        clients = [IslandClient(island.scheduler_endpoint, f"w{w}", weight=w) for w in weights]
        try:
            functions = [client.register(INCREMENT, "increment") for client in clients]
            inputs = [client.put(np.zeros(4, np.float32), device=0) for client in clients]

            def submit_all(client: IslandClient, function: str, x: str) -> Submitted:
                # Each client from its own thread, as separate programs would: a client
                # waits for room in its window, and must not hold up the others meanwhile.
                for _ in range(per_client):
                    submitted = client.submit(function, [0], [x], 1)
                return submitted

            with ThreadPoolExecutor(len(clients)) as pool:
                last = list(pool.map(submit_all, clients, functions, inputs))
            for submitted in last:
                submitted.wait(300)
            records = sorted(clients[0].trace(), key=lambda r: r.seq)
        finally:
            for client in clients:
                client.close()
    # While every client still has work queued, device time is split by weight: start once
    # the last client's first computation ran (they join one after the other) and stop before
    # the heaviest client could run out.
    start = max(next(i for i, r in enumerate(records) if r.client == f"w{w}") for w in weights)
    window = records[start : start + 600]
    assert len(window) == 600
    for weight in weights:
        share = sum(1 for r in window if r.client == f"w{weight}") / len(window)
        assert share == pytest.approx(weight / sum(weights), rel=0.05), (weight, share)


def test_shares_are_of_device_time_when_tenants_functions_take_unlike(compilation_cache) -> None:
    """Two tenants of equal weight, one's computation ~10x longer than the other's: charged by
    devices alone, the slow one's took ~90% of the device time."""
    heavy = export(lambda x: jax.lax.fori_loop(0, 40, lambda _, v: jnp.tanh(v @ v), x), f32(96, 96))
    light = export(lambda x: jax.lax.fori_loop(0, 4, lambda _, v: jnp.tanh(v @ v), x), f32(96, 96))
    with LocalIsland(
        hosts=1,
        devices_per_host=1,
        policy="proportional-share",
        max_in_flight=2,
        compilation_cache=compilation_cache,
    ) as island:
        clients = [IslandClient(island.scheduler_endpoint, name) for name in ("heavy", "light")]
        try:
            x = np.eye(96, dtype=np.float32) * 0.5
            functions = [
                c.register(f, n) for c, f, n in zip(clients, (heavy, light), "hl", strict=False)
            ]
            inputs = [client.put(x, device=0) for client in clients]
            for client, function, value in zip(clients, functions, inputs, strict=True):
                client.submit(function, [0], [value], 1).wait(60)  # measured once, warm

            def submit_all(client: IslandClient, function: str, value: str, count: int):
                for _ in range(count):
                    submitted = client.submit(function, [0], [value], 1)
                return submitted

            with ThreadPoolExecutor(2) as pool:
                last = list(pool.map(submit_all, clients, functions, inputs, (150, 1500)))
            for submitted in last:
                submitted.wait(300)
            records = sorted(clients[0].trace(), key=lambda r: r.seq)
        finally:
            for client in clients:
                client.close()
    # While both had work queued: from the third record on, until either ran out.
    ends = [
        max(i for i, r in enumerate(records) if r.client == name) for name in ("heavy", "light")
    ]
    window = records[2 : min(ends)]
    time_of = {
        name: sum(r.end_ns - r.start_ns for r in window if r.client == name)
        for name in ("heavy", "light")
    }
    share = time_of["heavy"] / sum(time_of.values())
    assert 0.35 < share < 0.65, (share, len(window))


def test_failures_name_the_node_and_keep_the_island_serving(island: LocalIsland) -> None:
    with IslandClient(island.scheduler_endpoint, "faults") as client:
        increment = client.register(INCREMENT, "increment")
        wrong_shape = client.put(np.zeros((2, 2), np.float32), device=0)
        bad = client.submit(increment, [0], [wrong_shape], 1, name="bad-node")
        with pytest.raises(
            IslandError,
            match=r"'bad-node' failed on executor 0: input 0 of "
            r"function 'increment' is float32\[2, 2\], expected float32\[4\]",
        ):
            bad.wait(30)
        # A consumer of a failed output fails with the cause, and the error reaches get().
        after = client.submit(increment, [5], [bad.outputs[0]], 1, name="downstream")
        with pytest.raises(IslandError, match="bad-node"):
            after.wait(30)
        with pytest.raises(IslandError, match="bad-node"):
            client.get(bad.outputs[0], timeout=10)
        unknown = client.submit(increment, [0], ["faults/never-made"], 1)
        with pytest.raises(IslandError, match="unknown buffer 'faults/never-made'"):
            unknown.wait(10)
        # An artifact corrupted in transit: its bytes no longer hash to its id.
        corrupted = Future()
        good_id = hashlib.sha256(DOUBLE).hexdigest()
        client._functions[good_id] = corrupted
        client._send(
            pb.ClientMessage(
                function=pb.FunctionRegistration(
                    function_id=good_id, artifact=DOUBLE[:-7], name="double"
                )
            )
        )
        with pytest.raises(IslandError, match=r"'double': the artifact's sha256 .* does not match"):
            corrupted.result(10)
        # Refused in the client before anything is sent: a device the island lacks, an
        # array of something other than numbers, a negative count of outputs.
        with pytest.raises(IslandError, match=r"put names devices \[9\] the island does not"):
            client.put(np.ones(4, np.float32), device=9)
        with pytest.raises(TypeError, match="put: dtype 'object' is not a numeric dtype"):
            client.put(np.array([object()] * 4), device=0)
        with pytest.raises(TypeError, match="put: dtype '\\|V8' is not a numeric dtype"):
            client.put(np.zeros(4, "V8"), device=0)
        # An array in the other byte order goes in this machine's, as jax.device_put takes it.
        swapped = np.arange(4, dtype=np.float32).astype(np.dtype(np.float32).newbyteorder())
        np.testing.assert_array_equal(client.get(client.put(swapped, device=1)), [0, 1, 2, 3])
        with pytest.raises(ValueError, match="outputs must be >= 0, not -1"):
            client.submit(increment, [0], [wrong_shape], -1)
        # Still serving.
        x = client.put(np.ones(4, np.float32), device=3)
        ok = client.submit(increment, [3], [x], 1)
        ok.wait(30)
        np.testing.assert_array_equal(client.get(ok.outputs[0]), 2 * np.ones(4))


def test_a_failure_down_a_chain_across_executors_names_its_first_cause_once(
    island: LocalIsland,
) -> None:
    """Every stage after a failed one fails, on either executor; each names the first failure
    once (not every stage before it), so a long chain's last message is as long as its
    second's."""
    with IslandClient(island.scheduler_endpoint, "failed-chain") as client:
        increment = client.register(INCREMENT, "increment")
        current = client.put(np.zeros((2, 2), np.float32), device=0)  # the wrong shape
        calls = []
        with client.batch():
            for step in range(40):
                name = "bad-node" if step == 0 else f"stage-{step:02d}"
                calls.append(client.submit(increment, [step % 8], [current], 1, name=name))
                current = calls[-1].outputs[0]
        messages = []
        for call in calls[1:]:
            with pytest.raises(IslandError) as failed:
                call.wait(60)
            messages.append(str(failed.value))
        first = "'bad-node' failed on executor 0: input 0 of function 'increment' is float32[2, 2]"
        for message in messages:
            assert first in message and message.count("failed on executor") == 2, message
        # Stages pulling their input from the other executor also say where from; none grows.
        lengths = [len(message) for message in messages]
        assert max(lengths[-10:]) <= max(lengths[:10]) + 2  # ids' digits


def test_a_computation_failing_on_the_devices_is_named_by_those_reading_its_output(
    island: LocalIsland,
) -> None:
    with IslandClient(island.scheduler_endpoint, "upstream") as client:
        huge = client.register(huge_artifact(), "huge")
        double = client.register(DOUBLE, "double")
        x = client.put(np.ones(4, np.float32), device=1)
        with client.batch():  # the readers are dispatched before the failure is known
            failing = client.submit(huge, [1], [x], 1, name="huge")
            reader = client.submit(double, [1], [failing.outputs[0]], 1, name="reader")
            last = client.submit(double, [1], [reader.outputs[0]], 1, name="last")
        with pytest.raises(IslandError, match=r"RESOURCE_EXHAUSTED|Out of memory") as own:
            failing.wait(60)
        assert "upstream" not in str(own.value)
        for name, read in (("reader", failing), ("last", reader)):
            with pytest.raises(IslandError) as passed_on:
                (reader if name == "reader" else last).wait(60)
            assert (
                f"buffer '{read.outputs[0]}' failed upstream: computation 'huge' failed on "
                "executor 0:" in str(passed_on.value)
            ), str(passed_on.value)


def test_an_output_of_a_slice_spanning_hosts_is_read_on_one_of_them(island: LocalIsland) -> None:
    """Each host holds its rows only: a reader on one host assembles the whole (JAX cannot
    reshard an array its process does not hold whole), and frees it with the buffer."""
    with IslandClient(island.scheduler_endpoint, "partial") as client:
        span = client.register(rows("increment", devices=2), "span")
        double = client.register(rows("double"), "double")
        before = [info.buffers for info in executor_infos(island)]
        x = client.put(np.arange(12, dtype=np.float32).reshape(4, 3), device=3)
        spanning = client.submit(span, [3, 4], [x], 1)
        readers = [client.submit(double, [d], [spanning.outputs[0]], 1) for d in (3, 4, 0)]
        for reader in readers:
            reader.wait(60)
            np.testing.assert_array_equal(
                client.get(reader.outputs[0]), (np.arange(12).reshape(4, 3) + 1) * 2
            )
        client.delete([x, spanning.outputs[0], *(r.outputs[0] for r in readers)])
        settled = settled_executor_infos(island, before, 30)
        assert [info.buffers for info in settled] == before


def test_an_output_spanning_hosts_is_read_over_its_devices_in_another_order(
    island: LocalIsland,
) -> None:
    """Two meshes of one slice's devices (as a JAX program's device_put between them): the
    reshard was refused, 'Received incompatible devices for jitted computation'."""
    increment = export(lambda x: x + 1, f32(4, 3), devices=4, sharded=True)
    double = export(lambda x: x * 2, f32(4, 3), devices=4, sharded=True)
    with IslandClient(island.scheduler_endpoint, "orders") as client:
        x = client.put(np.arange(12, dtype=np.float32).reshape(4, 3), device=0)
        first = client.submit(client.register(increment, "increment"), [0, 4, 1, 5], [x], 1)
        second = client.submit(client.register(double, "double"), [0, 1, 4, 5], first.outputs, 1)
        second.wait(60)
        np.testing.assert_array_equal(
            client.get(second.outputs[0]), (np.arange(12).reshape(4, 3) + 1) * 2
        )


def test_64_bit_arrays_keep_their_dtype_on_one_host_and_across_two(island: LocalIsland) -> None:
    """They were narrowed to 32 bits when placed: the computation failed, and across hosts
    the runtime crashed, taking the island down."""
    with jax.enable_x64(True):
        one = export(lambda x: x * 2, jax.ShapeDtypeStruct((4,), jnp.float64))
        across = export(
            lambda x: x + x, jax.ShapeDtypeStruct((8,), jnp.int64), devices=8, sharded=True
        )
    with IslandClient(island.scheduler_endpoint, "wide") as client:
        doubled = client.submit(
            client.register(one, "one"), [2], [client.put(np.full(4, 1e300), device=2)], 1
        )
        doubled.wait(60)
        value = client.get(doubled.outputs[0])
        assert value.dtype == np.float64 and (value == 2e300).all()
        big = np.arange(8, dtype=np.int64) + (1 << 40)
        summed = client.submit(
            client.register(across, "across"), list(range(8)), [client.put(big, device=0)], 1
        )
        summed.wait(60)
        np.testing.assert_array_equal(client.get(summed.outputs[0]), big * 2)


def test_an_artifact_that_is_not_jax_export_fails_its_computations(island: LocalIsland) -> None:
    with IslandClient(island.scheduler_endpoint, "incompatible") as client:
        junk = client.register(b"\x00 not a flatbuffer at all", "junk")
        x = client.put(np.ones(4, np.float32), device=1)
        run = client.submit(junk, [1], [x], 1, name="junk-node")
        with pytest.raises(IslandError, match=r"'junk' is not a jax\.export artifact"):
            run.wait(30)


def test_a_function_of_symbolic_shapes_is_refused_naming_the_dimension(
    island: LocalIsland,
) -> None:
    """It was taken, then failed when called with JAX's InconclusiveDimensionOperation."""
    (batch,) = jax.export.symbolic_shape("b")
    symbolic = bytes(
        jax.export.export(jax.jit(lambda x: x + 1))(
            jax.ShapeDtypeStruct((batch, 2), jnp.float32)
        ).serialize()
    )
    with IslandClient(island.scheduler_endpoint, "symbolic") as client:
        x = client.put(np.ones((4, 2), np.float32), device=1)
        run = client.submit(client.register(symbolic, "batched"), [1], [x], 1)
        with pytest.raises(
            IslandError,
            match=r"'batched' has a symbolic dimension \(input 0 is float32\[b,2\]\): .* "
            r"export it with concrete ones",
        ):
            run.wait(30)
        fixed = client.submit(client.register(export(lambda x: x + 1, f32(4, 2))), [1], [x], 1)
        np.testing.assert_array_equal(client.get(fixed.outputs[0]), np.full((4, 2), 2))


def test_function_exported_for_other_device_counts_is_refused(island: LocalIsland) -> None:
    four = export(lambda x: x * 3, f32(4, 2), devices=4, sharded=True)
    with IslandClient(island.scheduler_endpoint, "mismatch") as client:
        function = client.register(four, "four-device")
        x = client.put(np.ones((4, 2), np.float32), device=0)
        run = client.submit(function, [0, 1], [x], 1, name="too-small")
        with pytest.raises(IslandError, match=r"exported for 4 device.* the slice has 2"):
            run.wait(30)


def test_all_reduce_over_all_eight_devices_of_two_executors(island: LocalIsland) -> None:
    # One SPMD function spanning both hosts: the executors run it together (gloo collectives).
    all_reduce = all_reduce_artifact(devices=8)
    with IslandClient(island.scheduler_endpoint, "wide") as client:
        function = client.register(all_reduce, "all-reduce-8")
        value = np.arange(24, dtype=np.float32).reshape(8, 3)
        x = client.put(value, device=0)
        first = client.submit(function, list(range(8)), [x], 1, name="sum-8")
        # Its output feeds the next step on the same slice without leaving the devices.
        second = client.submit(function, list(range(8)), [first.outputs[0]], 1, name="again")
        second.wait(60)
        expected = np.tile(value.sum(0), (8, 1))
        np.testing.assert_array_equal(client.get(first.outputs[0]), expected)
        np.testing.assert_array_equal(client.get(second.outputs[0]), expected * 8)


def test_compiled_functions_land_in_the_persistent_cache(
    island: LocalIsland, compilation_cache
) -> None:
    # Executors compile once per device set and keep the result on disk for their next start.
    assert any(compilation_cache.iterdir()), "the executors wrote nothing to their XLA cache"


def test_a_chain_submitted_in_one_batch_runs_in_order(island: LocalIsland) -> None:
    with IslandClient(island.scheduler_endpoint, "batched") as client:
        increment = client.register(INCREMENT, "increment")
        current = client.put(np.zeros(4, np.float32), device=0)
        calls = []
        with client.batch():  # one message to the scheduler for the whole chain
            for step in range(12):
                calls.append(client.submit(increment, [step % 8], [current], 1))
                current = calls[-1].outputs[0]
            assert not any(call.done.done() for call in calls)
        calls[-1].wait(60)
        np.testing.assert_array_equal(client.get(current), np.full(4, 12.0))
        np.testing.assert_array_equal(client.get(calls[4].outputs[0]), np.full(4, 5.0))


def test_a_chain_freeing_each_intermediate_writes_into_its_inputs(island: LocalIsland) -> None:
    """A chain that frees each intermediate once its consumer is queued (as the dispatch
    benchmark's -C does): the consumers take their inputs' buffers over, the result is right,
    and nothing is left behind. (Outputs large enough for a token: smaller ones are taken over
    only once reported.)"""
    floats = TOKEN_FROM_BYTES // 4
    with IslandClient(island.scheduler_endpoint, "takes-over") as client:
        increment = client.register(increment_of(floats), "increment")
        start = client.put(np.zeros(floats, np.float32), device=3)
        before = executor_infos(island)[0]
        current, steps = start, 40
        with client.batch():
            for _ in range(steps):
                call = client.submit(increment, [3], [current], 1)
                if current != start:
                    client.delete([current])
                current = call.outputs[0]
        call.wait(60)
        np.testing.assert_array_equal(client.get(current), np.full(floats, float(steps)))
        client.delete([start, current])
        # The first chance compiles the variant; a consumer whose input's producer the
        # completion thread already waits for makes a new buffer: most, not all, take over.
        after = executor_infos(island)[0]
        assert after.inputs_taken_over - before.inputs_taken_over >= steps // 2, after
        expected = [before.buffers - 1, *(i.buffers for i in executor_infos(island)[1:])]
        settled = settled_executor_infos(island, expected, 30)  # "start" is gone too
        assert settled[0].buffers == before.buffers - 1, settled[0]


def test_interleaved_tenants_chains_write_into_their_inputs(compilation_cache) -> None:
    """Two tenants' chains freeing each intermediate, interleaved by proportional share on an
    island running one computation at a time: each deletion still travels with the
    computation reading its buffer last (it takes no device time, so it goes right behind it,
    at the bound on work in flight too), and that computation takes the buffer over."""
    steps = 20
    with LocalIsland(
        hosts=1,
        devices_per_host=4,
        policy="proportional-share",
        max_in_flight=1,
        compilation_cache=compilation_cache,
    ) as busy:

        def chain(name: str, device: int) -> np.ndarray:
            with IslandClient(busy.scheduler_endpoint, name) as client:
                increment = client.register(INCREMENT, "increment")
                start = client.put(np.zeros(4, np.float32), device=device)
                current = start
                with client.batch():
                    for _ in range(steps):
                        call = client.submit(increment, [device], [current], 1)
                        if current != start:
                            client.delete([current])
                        current = call.outputs[0]
                call.wait(60)
                return client.get(current)

        with ThreadPoolExecutor(2) as pool:
            results = list(pool.map(chain, ["tenant-a", "tenant-b"], [0, 1]))
        for result in results:
            np.testing.assert_array_equal(result, np.full(4, float(steps)))
        # Each chain's first chance compiles the donating variant; the rest take over. (With
        # the deletion a turn behind, none did.)
        taken = executor_infos(busy)[0].inputs_taken_over
        assert taken >= 2 * (steps - 4), taken


def test_a_second_session_with_the_same_name_is_refused(island: LocalIsland) -> None:
    with IslandClient(island.scheduler_endpoint, "twice") as first:
        first.register(INCREMENT, "increment")
        with (
            IslandClient(island.scheduler_endpoint, "twice") as second,
            pytest.raises(IslandError, match="client 'twice' already has a session"),
        ):
            second.register(DOUBLE, "double", timeout=10)
        # The first session is untouched.
        x = first.put(np.ones(4, np.float32), device=2)
        first.submit(first.register(INCREMENT), [2], [x], 1).wait(30)


def test_a_client_reopening_its_session_at_once_gets_a_whole_new_one(island: LocalIsland) -> None:
    """A client whose session ends and that says hello again under its name as soon as the
    scheduler lets it (a restarted process, a dropped connection) gets a session of its own:
    the old one's end takes none of the new one's functions, buffers or place in the queue."""
    for cycle in range(12):
        deadline = time.monotonic() + 30
        while True:  # the old session's end may not have been noticed yet
            client = IslandClient(island.scheduler_endpoint, "again")
            try:
                increment = client.register(INCREMENT, "increment", timeout=10)
                break
            except IslandError as error:
                client.close()
                assert "already has a session" in str(error)
                assert time.monotonic() < deadline, "the name was never freed"
        with client:
            x = client.put(np.full(4, float(cycle), np.float32), device=cycle % 4)
            y = client.submit(increment, [cycle % 4], [x], 1)
            y.wait(30)
            np.testing.assert_array_equal(client.get(y.outputs[0]), np.full(4, cycle + 1.0))


def test_a_session_that_is_not_ours_is_refused_and_the_island_keeps_serving(
    island: LocalIsland,
) -> None:
    with IslandClient(island.scheduler_endpoint, "witness") as client:
        host, port = client.info.session_endpoint.rsplit(":", 1)
        for garbage, reason in [
            (b"\xff\xff\xff\xff", "exceeds"),  # a frame longer than any message may be
            (frame(pb.ClientBatch()), "a session starts with hello naming the client"),
        ]:
            with socket.create_connection((host, int(port)), timeout=10) as raw:
                raw.sendall(garbage)
                events = list(messages(raw.recv, pb.ClientEventBatch.FromString))
            assert [e.kind for b in events for e in b.events] == [pb.ClientEvent.REJECTED]
            assert reason in events[0].events[0].message
        x = client.put(np.ones(4, np.float32), device=1)
        done = client.submit(client.register(INCREMENT, "increment"), [1], [x], 1)
        done.wait(30)
        np.testing.assert_array_equal(client.get(done.outputs[0]), np.full(4, 2.0))


def test_a_client_with_work_outstanding_hears_its_completions_in_batches(
    island: LocalIsland, monkeypatch
) -> None:
    """A client's completions wait for its next event while it has two or more other
    computations outstanding (``MAX_HELD_COMPLETIONS`` at most): 40 computations of ~2 ms
    submitted together reach the client in a few messages, not one each, and every one
    completes."""
    received: list[int] = []

    def counted(read, parse):
        for batch in messages(read, parse):
            received.append(len(batch.events))
            yield batch

    monkeypatch.setattr(island_client_module, "messages", counted)
    with IslandClient(island.scheduler_endpoint, "batched-completions") as client:
        square = client.register(export(lambda x: jnp.tanh(x @ x) * 0.5, f32(256, 256)), "sq")
        x = client.put(np.full((256, 256), 0.01, np.float32), device=0)
        client.submit(square, [0], [x], 1).wait(60)  # compiled before the count
        received.clear()
        with client.batch():
            calls = [client.submit(square, [0], [x], 1) for _ in range(40)]
        calls[-1].wait(60)
        assert all(call.done.done() and call.done.exception() is None for call in calls)
        np.testing.assert_allclose(
            client.get(calls[7].outputs[0]), np.tanh(np.full((256, 256), 0.0256)) * 0.5, rtol=1e-5
        )
    assert sum(received) == 40 and len(received) <= 8, received


def test_a_scheduler_that_never_answers_is_given_up_on_within_twice_the_connect_timeout() -> None:
    """A stopped scheduler (its kernel accepts, it answers nothing) held a client connect_timeout
    and 10 s more."""
    silent = socket.create_server(("127.0.0.1", 0))
    try:
        began = time.monotonic()
        with pytest.raises(IslandError):
            IslandClient(f"127.0.0.1:{silent.getsockname()[1]}", "c", tls=None, connect_timeout=1)
        assert time.monotonic() - began < 5
    finally:
        silent.close()


def test_a_client_says_why_it_is_still_waiting_for_an_unreachable_scheduler(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wrong endpoint was a minute of silence, then an error."""
    monkeypatch.setattr(island_client_module, "QUIET_CONNECT_SECONDS", 0.5)
    unused = socket.create_server(("127.0.0.1", 0))
    port = unused.getsockname()[1]
    unused.close()  # refused from now on
    began = time.monotonic()
    with pytest.raises(IslandError, match=f"127.0.0.1:{port} did not answer"):
        IslandClient(f"127.0.0.1:{port}", "c", tls=None, connect_timeout=2)
    assert time.monotonic() - began < 6
    (warning,) = [r for r in caplog.records if r.name == island_client_module.__name__]
    assert warning.levelname == "WARNING" and f"127.0.0.1:{port} did not answer" in warning.message
    assert "waiting up to 2 s more for it" in warning.message


# A client that uploads a sharded array over two executors and says when it started.
DYING_UPLOADER = """
import sys
import numpy as np
from pathways_client.island_client import IslandClient
client = IslandClient(sys.argv[1], "dying")
print("uploading", flush=True)
array = np.ones((4, 1 << 20), np.float32)  # 16 MiB: 8 to each executor
rows = lambda a, b: [(slice(a, b), slice(0, 1 << 20))]
client.put_shards(array, {0: rows(0, 2), 1: rows(2, 4)})
print("uploaded", flush=True)
"""


def test_a_client_killed_mid_upload_leaves_no_shard_behind(compilation_cache) -> None:
    with LocalIsland(hosts=2, devices_per_host=2, compilation_cache=compilation_cache) as island:
        slow = island.executors[1].popen
        slow.send_signal(signal.SIGSTOP)  # its shard's upload waits; executor 0's completes
        uploader = subprocess.Popen(
            [sys.executable, "-c", DYING_UPLOADER, island.scheduler_endpoint],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert uploader.stdout is not None and uploader.stdout.readline() == "uploading\n"
            deadline = time.monotonic() + 30
            while first_executor_buffers(island) == 0:  # executor 0 holds its shard
                assert time.monotonic() < deadline, "executor 0 never received its shard"
                time.sleep(0.05)
            uploader.kill()
            uploader.wait()
        finally:
            slow.send_signal(signal.SIGCONT)
        # The session's end deletes the buffer where it is: nothing stays on either executor.
        deadline = time.monotonic() + 20
        while any(info.buffers for info in executor_infos(island)):
            assert time.monotonic() < deadline, [i.buffers for i in executor_infos(island)]
            time.sleep(0.1)


def first_executor_buffers(island: LocalIsland) -> int:
    """Executor 0's buffers (asked alone: a stopped executor answers nothing)."""
    with grpc.insecure_channel(island.executors[0].endpoint) as channel:
        return stub(channel, EXECUTOR, "Info")(pb.Empty(), timeout=10).buffers


def test_collectives_on_one_device_of_a_host_and_on_several_keep_one_order(
    compilation_cache,
) -> None:
    """Collectives over both hosts' devices and over one device of each, between slow
    single-device work: the runtime launches each kind apart, so one overtook the other on one
    host and not on the other, and both hung (3 runs of 3 out of 3 before the fix). Each
    collective's value is right too."""
    everywhere = export(lambda x: x + x.sum(), f32(8), devices=4, sharded=True)
    pairwise = export(lambda x: x * 0.5 + x.sum(), f32(8), devices=2, sharded=True)
    # The devices of each step: slow work on one, a collective on more.
    pattern = [(0,), (0, 1, 2, 3), (1,), (1, 2), (2,), (0, 3), (3,), (2, 3, 0, 1)]
    pattern += [(0,), (3, 0), (1,), (0, 1, 2, 3), (2,), (1, 2)]
    value = np.arange(8, dtype=np.float32)
    with (
        LocalIsland(hosts=2, devices_per_host=2, compilation_cache=compilation_cache) as island,
        IslandClient(island.scheduler_endpoint, "kinds") as client,
    ):
        functions = {4: client.register(everywhere, "all"), 2: client.register(pairwise, "pair")}
        slow = client.register(slow_square(30), "slow")
        square = client.put(np.full((512, 512), 0.01, np.float32), device=0)
        collectives: list[tuple[Submitted, int]] = []
        singles: list[Submitted] = []
        for step, devices in enumerate(pattern * 3):
            if len(devices) == 1:
                singles.append(client.submit(slow, list(devices), [square], 1, name=f"{step}"))
                continue
            x = client.put(value, device=devices[0])
            run = client.submit(functions[len(devices)], list(devices), [x], 1, name=f"{step}")
            collectives.append((run, len(devices)))
        for run in [run for run, _ in collectives] + singles:
            run.wait(60)
        for run, devices in collectives:
            expected = value + value.sum() if devices == 4 else value * 0.5 + value.sum()
            np.testing.assert_allclose(client.get(run.outputs[0]), expected)
