"""Registered programs on an island of real processes (a scheduler and 2 executors x 4 fake
devices): a call's results, chains within one executor and across both, an SPMD node spanning
both hosts, failures naming the node, nothing left behind, and the island serving on."""

from __future__ import annotations

import re
import time

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import (
    chain_nodes,
    executor_infos,
    export,
    f32,
    huge,
    increment,
    rows,
    settled_executor_infos,
    slow_square,
)

from pathways_client.island_client import IslandClient, IslandError
from pathways_client.launcher import LocalIsland
from pathways_core.wire import pb

INCREMENT = increment()
DOUBLE = export(lambda x: x * 2, f32(4))


def test_a_computation_does_not_take_over_a_buffer_a_later_call_reads(
    island: LocalIsland,
) -> None:
    with IslandClient(island.scheduler_endpoint, "donor") as client:
        increment = client.register(INCREMENT, "increment")
        double = client.register(DOUBLE, "double")
        node = pb.Computation(
            id="n0", function_id=increment, devices=[0], inputs=["a"], outputs=["r"]
        )
        program = client.register_program([node], ["a"], ["r"], name="inc")
        for _ in range(3):  # the first takes nothing over: it compiles the taking variant
            zeros = client.put(np.zeros(4, np.float32), 0)
            x = client.submit(increment, [0], [zeros], 1)
            x.wait(60)
            with client.batch():
                # (Dispatched first, it has the next three reach the executor as one batch.)
                client.submit(increment, [1], [zeros], 1)
                doubled = client.submit(double, [0], [x.outputs[0]], 1)
                call = client.call(program, [x.outputs[0]])
                client.delete([x.outputs[0]])
            np.testing.assert_array_equal(client.get(doubled.outputs[0]), 2)
            call.wait(60)
            np.testing.assert_array_equal(client.get(call.outputs[0]), 2)


def test_a_call_failing_on_the_devices_names_the_node_that_failed(island: LocalIsland) -> None:
    with IslandClient(island.scheduler_endpoint, "failing-node") as client:
        failing = client.register(huge(), "huge")
        double = client.register(DOUBLE, "double")
        nodes = [
            pb.Computation(id="n0", function_id=double, devices=[1], inputs=["x"], outputs=["a"]),
            pb.Computation(
                id="n1", name="huge", function_id=failing, devices=[1], inputs=["a"], outputs=["b"]
            ),
            pb.Computation(id="n2", function_id=double, devices=[1], inputs=["b"], outputs=["c"]),
        ]
        program = client.register_program(nodes, ["x"], ["c"], name="failing")
        x = client.put(np.ones(4, np.float32), device=1)
        for _ in range(2):  # the second call runs its nodes as planned then
            call = client.call(program, [x])
            named = rf"computation 'huge' of call '{call.id}' failed on executor 0: .*memory"
            with pytest.raises(IslandError, match=named):
                call.wait(60)
            # A read of its result names the node too, not only what the devices said.
            with pytest.raises(IslandError, match=rf"get '{call.outputs[0]}': .*{named}"):
                client.get(call.outputs[0])
            # The node before the failing one ran: its record is ok, the others' are not.
            records = {
                r.name: r.ok for r in client.trace() if r.computation_id.startswith(call.id + "/")
            }
            assert records == {"n0": True, "huge": False, "n2": False}


def test_a_node_spanning_executors_reads_an_output_made_on_one_of_them(
    island: LocalIsland,
) -> None:
    with IslandClient(island.scheduler_endpoint, "spanning") as client:
        double = client.register(rows("double"), "double")
        increment = client.register(rows("increment", devices=2), "increment")
        nodes = [  # made on executor 0 alone, read on both: executor 1 pulls it
            pb.Computation(id="a", function_id=double, devices=[1], inputs=["x"], outputs=["h"]),
            pb.Computation(
                id="b", function_id=increment, devices=[3, 4], inputs=["h"], outputs=["r"]
            ),
        ]
        program = client.register_program(nodes, ["x"], ["r"], name="spanning")
        before = [info.buffers for info in executor_infos(island)]
        x = client.put(np.arange(12, dtype=np.float32).reshape(4, 3), device=1)
        call = client.call(program, [x])
        call.wait(60)
        np.testing.assert_array_equal(
            client.get(call.outputs[0]), np.arange(12).reshape(4, 3) * 2 + 1
        )
        # And back: read on one host, and on the other, each assembles the whole.
        back = [
            nodes[1],
            pb.Computation(id="c", function_id=double, devices=[2], inputs=["r"], outputs=["s"]),
            pb.Computation(id="d", function_id=double, devices=[5], inputs=["r"], outputs=["t"]),
        ]
        nodes[1].inputs[:] = ["x"]
        program = client.register_program(back, ["x"], ["s", "t"], name="back")
        second = client.call(program, [x])
        second.wait(60)
        for result in second.outputs:
            np.testing.assert_array_equal(client.get(result), (np.arange(12).reshape(4, 3) + 1) * 2)
        # An argument held in part (made on both hosts) read on one of them.
        y = client.submit(increment, [3, 4], [x], 1).outputs[0]
        node = pb.Computation(id="e", function_id=double, devices=[2], inputs=["y"], outputs=["u"])
        third = client.call(client.register_program([node], ["y"], ["u"], name="arg"), [y])
        third.wait(60)
        np.testing.assert_array_equal(
            client.get(third.outputs[0]), (np.arange(12).reshape(4, 3) + 1) * 2
        )
        client.delete([x, y, *call.outputs, *second.outputs, *third.outputs])  # wholes too
        settled = settled_executor_infos(island, before, 30)
        assert [info.buffers for info in settled] == before


@pytest.mark.parametrize(
    "devices",
    [[0, 1, 2, 3, 0, 1], [0, 5, 2, 7, 3, 4]],
    ids=["one executor", "across executors"],
)
def test_a_program_called_in_a_chain_gives_the_right_results(
    island: LocalIsland, devices: list[int]
) -> None:
    with IslandClient(island.scheduler_endpoint, "programs") as client:
        increment = client.register(INCREMENT, "increment")
        double = client.register(DOUBLE, "double")
        nodes = chain_nodes(increment, devices)
        nodes[2].function_id = double  # x -> +1 -> +1 -> *2 -> +1 ...
        last = nodes[-1].outputs[0]
        program = client.register_program(nodes, ["x"], [last, "y2"], name="mixed")
        before = executor_infos(island)
        start = client.put(np.arange(4, dtype=np.float32), device=devices[0])
        current, expected, calls = start, np.arange(4, dtype=np.float32), []
        for _ in range(5):  # each call takes the one before's result, not yet computed
            call = client.call(program, [current])
            calls.append(call)
            current = call.outputs[0]
        for call in calls:
            middle = (expected + 2) * 2
            expected = middle + len(devices) - 3
            call.wait(60)
            np.testing.assert_array_equal(client.get(call.outputs[1]), middle)
            np.testing.assert_array_equal(client.get(call.outputs[0]), expected)
        # Every result is a buffer of the client's; intermediates were freed with their call.
        client.delete([start, *(b for call in calls for b in call.outputs)])
        settled = settled_executor_infos(island, [i.buffers for i in before], 30)
        assert [i.buffers for i in settled] == [i.buffers for i in before]
        # The trace has each node of each call under the call's id, on its device.
        records = [r for r in client.trace() if r.computation_id.startswith(calls[0].id + "/")]
        assert sorted((r.name, list(r.devices)) for r in records) == sorted(
            (node.name, list(node.devices)) for node in nodes
        )
        assert all(r.start_ns <= r.end_ns for r in records)


def test_a_program_node_spanning_both_executors(island: LocalIsland) -> None:
    all_reduce = export(
        lambda x: jnp.sum(x, axis=0, keepdims=True) * jnp.ones_like(x),
        f32(8, 3),
        devices=8,
        sharded=True,
    )
    with IslandClient(island.scheduler_endpoint, "wide-program") as client:
        function = client.register(all_reduce, "all-reduce-8")
        nodes = chain_nodes(function, [range(8)] * 3)
        program = client.register_program(nodes, ["x"], ["y2"], name="reduce-3")
        value = np.arange(24, dtype=np.float32).reshape(8, 3)
        call = client.call(program, [client.put(value, device=0)])
        call.wait(60)
        np.testing.assert_array_equal(
            client.get(call.outputs[0]), np.tile(value.sum(0), (8, 1)) * 64
        )


def test_each_node_of_a_long_call_is_traced_with_its_own_times(island: LocalIsland) -> None:
    """A call of many collective nodes: each node is stamped as it ends. (The runner handed a
    call over once it had dispatched it, so every node that ended before was stamped then: the
    first node took the whole call, the rest a few microseconds each.)"""
    width, stages = 262_144, 24
    step = export(lambda x: x * 0.5 + jnp.mean(x), f32(4, width), devices=4, sharded=True)
    with IslandClient(island.scheduler_endpoint, "traced-call") as client:
        function = client.register(step, "mean-step")
        nodes = chain_nodes(function, [range(4)] * stages)
        program = client.register_program(nodes, ["x"], [f"y{stages - 1}"], name="long-call")
        x = client.put(np.ones((4, width), np.float32), device=0)
        for _ in range(2):  # the first compiles
            call = client.call(program, [x])
            call.wait(60)
        records = sorted(
            (r for r in client.trace() if r.computation_id.startswith(call.id + "/")),
            key=lambda r: r.start_ns,
        )
        assert len(records) == stages
        spans = [r.end_ns - r.start_ns for r in records]
        assert max(spans) < (records[-1].end_ns - records[0].start_ns) / 2, spans
        assert [r.end_ns for r in records] == sorted(r.end_ns for r in records)


def test_a_node_before_a_wait_for_the_other_executor_is_stamped_as_it_ends(
    island: LocalIsland,
) -> None:
    """A call of nodes on executor 0, then executor 1 (slow), then executor 0 again: the first
    node is stamped as it ended, not when the runner's wait for the slow node's output did (it
    took ~50 ms, the span of the wait, instead of ~1)."""
    with IslandClient(island.scheduler_endpoint, "crossing-call") as client:
        add_one = client.register(export(lambda x: x + 1, f32(512, 512)), "increment")
        slow = client.register(slow_square(60), "slow")
        nodes = [
            pb.Computation(id=name, function_id=f, devices=[d], inputs=[i], outputs=[o], name=name)
            for name, f, d, i, o in [
                ("first", add_one, 0, "x", "y0"),
                ("slow", slow, 4, "y0", "y1"),
                ("last", add_one, 0, "y1", "y2"),
            ]
        ]
        program = client.register_program(nodes, ["x"], ["y2"], name="crossing")
        x = client.put(np.full((512, 512), 0.01, np.float32), device=0)
        for _ in range(3):  # the first compiles
            call = client.call(program, [x])
            call.wait(60)
            client.delete(list(call.outputs))
        records = {r.name: r for r in client.trace() if r.computation_id.startswith(call.id + "/")}
        first, slowest = records["first"], records["slow"]
        assert first.end_ns <= slowest.start_ns, (first, slowest)
        assert first.end_ns - first.start_ns < (slowest.end_ns - slowest.start_ns) / 2


def test_a_failing_node_fails_its_call_naming_it_and_the_island_keeps_serving(
    island: LocalIsland,
) -> None:
    with IslandClient(island.scheduler_endpoint, "failing-program") as client:
        increment = client.register(INCREMENT, "increment")
        program = client.register_program(
            chain_nodes(increment, [0, 4, 1], name="step"), ["x"], ["y2"], name="three"
        )
        wrong_shape = client.put(np.zeros((2, 2), np.float32), device=0)
        bad = client.call(program, [wrong_shape])
        with pytest.raises(
            IslandError,
            match=r"'step-0' of call '.*' failed on executor 0: input 0 of function "
            r"'increment' is float32\[2, 2\], expected float32\[4\]",
        ):
            bad.wait(30)
        # Its result fails with that cause; a later call reading it fails the same way.
        with pytest.raises(IslandError, match="step-0"):
            client.get(bad.outputs[0], timeout=10)
        downstream = client.call(program, [bad.outputs[0]])
        with pytest.raises(IslandError, match="step-0"):
            downstream.wait(30)
        # Still serving, the same program too.
        good = client.call(program, [client.put(np.ones(4, np.float32), device=0)])
        good.wait(30)
        np.testing.assert_array_equal(client.get(good.outputs[0]), np.full(4, 4.0))


def test_nodes_independent_of_a_failed_one_still_run(island: LocalIsland) -> None:
    """A failed node fails only what depends on it (as computations do): a node of the same
    call reading other inputs runs (a collective across executors must run on all)."""
    with IslandClient(island.scheduler_endpoint, "partly-failing") as client:
        increment = client.register(INCREMENT, "increment")
        nodes = [
            pb.Computation(id="a", function_id=increment, devices=[0], inputs=["x"], outputs=["p"]),
            pb.Computation(id="b", function_id=increment, devices=[1], inputs=["p"], outputs=["q"]),
            pb.Computation(id="c", function_id=increment, devices=[2], inputs=["y"], outputs=["r"]),
        ]
        program = client.register_program(nodes, ["x", "y"], ["q", "r"], name="two-branches")
        bad = client.put(np.zeros((2, 2), np.float32), device=0)
        good = client.put(np.arange(4, dtype=np.float32), device=2)
        call = client.call(program, [bad, good])
        with pytest.raises(IslandError, match=r"computation 'a' of call .* input 0 of function"):
            call.wait(30)
        with pytest.raises(IslandError, match=r"failed upstream: computation 'a' of call"):
            client.get(call.outputs[0], timeout=10)
        np.testing.assert_array_equal(client.get(call.outputs[1]), np.arange(4) + 1)


def test_bad_programs_and_calls_are_refused_with_what_is_wrong(island: LocalIsland) -> None:
    with IslandClient(island.scheduler_endpoint, "refused-program") as client:
        increment = client.register(INCREMENT, "increment")
        nodes = chain_nodes(increment, [0, 1])
        nodes[1].inputs[0] = "nowhere"
        with pytest.raises(IslandError, match=r"node 1 .* reads 'nowhere'"):
            client.register_program(nodes, ["x"], ["y1"], name="broken")
        program = client.register_program(chain_nodes(increment, [0, 1]), ["x"], ["y1"])
        missing = client.call(program, ["refused-program/never-made"])
        with pytest.raises(IslandError, match="reads unknown buffer 'refused-program/never-made'"):
            missing.wait(10)
        with pytest.raises(IslandError, match="was not registered by this client"):
            client.call("0" * 64, [])
        ok = client.call(program, [client.put(np.zeros(4, np.float32), device=0)])
        ok.wait(30)
        np.testing.assert_array_equal(client.get(ok.outputs[0]), np.full(4, 2.0))


def test_a_program_killed_executor_fails_its_calls_within_seconds(compilation_cache) -> None:
    with (
        LocalIsland(hosts=2, devices_per_host=4, compilation_cache=compilation_cache) as island,
        IslandClient(island.scheduler_endpoint, "killed-program") as client,
    ):
        increment = client.register(INCREMENT, "increment")
        program = client.register_program(
            chain_nodes(increment, [0, 4]), ["x"], ["y1"], name="two-hosts"
        )
        x = client.put(np.zeros(4, np.float32), device=0)
        client.call(program, [x]).wait(60)
        island.executors[1].popen.kill()
        island.executors[1].popen.wait(10)
        with pytest.raises(IslandError, match="executor 1"):
            client.call(program, [x]).wait(30)
        # The other executor keeps serving single computations.
        alone = client.submit(increment, [1], [x], 1)
        alone.wait(30)
        np.testing.assert_array_equal(client.get(alone.outputs[0]), np.ones(4))


def test_a_deletion_with_nothing_outstanding_goes_on_its_own_soon(island: LocalIsland) -> None:
    """Deletions wait for a message to ride along with; with nothing outstanding and nothing
    sent after them, they still go (within DELETE_LINGER_SECONDS)."""
    with IslandClient(island.scheduler_endpoint, "lone-deletion") as client:
        before = [i.buffers for i in executor_infos(island)]
        x = client.put(np.zeros(4, np.float32), device=0)
        assert executor_infos(island)[0].buffers == before[0] + 1
        client.delete([x])  # then nothing else is sent
        settled = settled_executor_infos(island, before, 5)
        assert [i.buffers for i in settled] == before


TRIPLE = export(lambda x: x * 3, f32(4))


def held(island: LocalIsland) -> list[tuple[int, int, int]]:
    """Each executor's functions, executables and programs held; then the scheduler's
    functions and programs."""
    executors = [(i.functions, i.executables, i.programs) for i in executor_infos(island)]
    with IslandClient(island.scheduler_endpoint, "observer") as observer:
        return [*executors, (observer.info.functions, 0, observer.info.programs)]


def settled_held(island: LocalIsland, expected: list[tuple[int, int, int]], within: float):
    """``held`` once it is ``expected`` (a forget travels behind the work before it), or as
    it is after ``within`` seconds."""
    give_up = time.monotonic() + within
    while (now := held(island)) != expected and time.monotonic() < give_up:
        time.sleep(0.1)
    return now


def test_functions_and_programs_are_forgotten_once_no_open_session_uses_them(
    island: LocalIsland,
) -> None:
    baseline = settled_held(island, held(island), 0)
    first = IslandClient(island.scheduler_endpoint, "forget-first")
    second = IslandClient(island.scheduler_endpoint, "forget-second")
    triple = first.register(TRIPLE, "triple")
    assert second.register(TRIPLE, "triple") == triple
    program = first.register_program(chain_nodes(triple, [0, 5]), ["x"], ["y1"], name="x9")
    x = first.put(np.ones(4, np.float32), device=0)
    call = first.call(program, [x])
    call.wait(60)
    np.testing.assert_array_equal(first.get(call.outputs[0]), np.full(4, 9.0))
    # Loaded and compiled on both executors, the program planned on both.
    using = [(f + 1, e + 1, p + 1) for f, e, p in baseline[:2]] + [
        (baseline[2][0] + 1, 0, baseline[2][2] + 1)
    ]
    assert held(island) == using

    # The first session ends: its program goes everywhere; the function stays, as the
    # second session registered it, and serves it.
    first.close()
    kept = [(f, e, p - 1) for f, e, p in using]
    assert settled_held(island, kept, 30) == kept
    y = second.put(np.ones(4, np.float32), device=1)
    alone = second.submit(triple, [1], [y], 1)
    alone.wait(30)
    np.testing.assert_array_equal(second.get(alone.outputs[0]), np.full(4, 3.0))

    # The last session using it ends: nothing of it is left.
    second.close()
    assert settled_held(island, baseline, 30) == baseline

    # A later session registers it again and it runs (loaded and compiled anew).
    with IslandClient(island.scheduler_endpoint, "forget-third") as third:
        with pytest.raises(IslandError, match="is not registered: register it in this session"):
            third.submit(triple, [0], [third.put(np.ones(4, np.float32), device=0)], 1).wait(10)
        assert third.register(TRIPLE, "triple") == triple
        again = third.submit(triple, [0], [third.put(np.ones(4, np.float32), device=0)], 1)
        again.wait(60)
        np.testing.assert_array_equal(third.get(again.outputs[0]), np.full(4, 3.0))


def test_an_interleaved_schedule_crossing_executors_both_ways_runs(island: LocalIsland) -> None:
    """A 1F1B-like order: stage A (executor 0) and stage B (executor 1) forward, and B's then
    A's "backward" of microbatch m - 2 after each forward. Each executor pulled the other's
    intermediates in the order of their names, on 8 transfer threads: all 8 waited for ones
    made late (``grad-b-10`` ...), made only after work waiting on a pull queued behind them
    (``grad-b-2``), and the island deadlocked until the 120 s input timeout."""
    microbatches, lag = 32, 2
    with IslandClient(island.scheduler_endpoint, "one-f-one-b") as client:
        increment = client.register(INCREMENT, "increment")
        double = client.register(DOUBLE, "double")
        nodes = []

        def node(name: str, function: str, device: int, source: str) -> str:
            nodes.append(
                pb.Computation(
                    id=name, function_id=function, devices=[device], inputs=[source], outputs=[name]
                )
            )
            return name

        def backward(m: int) -> str:
            return node(f"grad-a-{m}", double, 0, node(f"grad-b-{m}", increment, 4, f"fwd-b-{m}"))

        results = []
        for m in range(microbatches):
            node(f"fwd-b-{m}", double, 4, node(f"fwd-a-{m}", increment, 0, f"x{m}"))
            if m >= lag:
                results.append(backward(m - lag))
        results += [backward(m) for m in range(microbatches - lag, microbatches)]
        arguments = [f"x{m}" for m in range(microbatches)]
        program = client.register_program(nodes, arguments, results, name="one-f-one-b")
        inputs = [client.put(np.full(4, m, np.float32), 0) for m in range(microbatches)]
        done = client.call(program, inputs)
        done.wait(60)
        # x -> +1 (A) -> x2 (B) -> +1 (B) -> x2 (A), every microbatch's in its order
        for m, result in enumerate(done.outputs):
            np.testing.assert_array_equal(client.get(result), ((m + 1) * 2 + 1) * 2)


def test_a_result_read_by_the_other_executor_in_its_call_outlives_its_deletion(
    island: LocalIsland,
) -> None:
    """A result a node on the other executor also reads in the call, deleted at once by its
    client (``_, s = step(x)``): its maker freed it while the reader had yet to pull it. The
    reader failed with 'unknown buffer', or its executor waited 30 s for the buffer to appear,
    holding every client's work there."""
    with IslandClient(island.scheduler_endpoint, "dropped-result") as client:
        increment = client.register(INCREMENT, "increment")
        double = client.register(DOUBLE, "double")
        nodes = [
            pb.Computation(id="f", function_id=increment, devices=[0], inputs=["x"], outputs=["a"]),
            pb.Computation(id="g", function_id=double, devices=[4], inputs=["a"], outputs=["b"]),
        ]
        program = client.register_program(nodes, ["x"], ["a", "b"], name="dropped")
        x = client.put(np.arange(4, dtype=np.float32), 0)
        calls = []
        for _ in range(20):
            with client.batch():  # the deletion leaves with the call, before the pull
                call = client.call(program, [x])
                client.delete([call.outputs[0]])
            calls.append(call)
        for call in calls:
            call.wait(60)
            np.testing.assert_array_equal(client.get(call.outputs[1]), (np.arange(4) + 1) * 2)


# Made by a node on one set of devices spanning both executors, read by one on another set:
# its shards are on other devices than the reader's (or on only some of them).
SPANNING_READS = {
    "to other devices": ([1, 6], [3, 4]),
    "to the same devices in another order": ([3, 4], [4, 3]),
    "to fewer devices": (list(range(8)), [0, 5]),
    "to more devices": ([0, 5], list(range(8))),
}


@pytest.mark.parametrize("maker, reader", SPANNING_READS.values(), ids=SPANNING_READS)
def test_an_array_spanning_executors_is_read_on_other_devices_spanning_them(
    island: LocalIsland, maker: list[int], reader: list[int]
) -> None:
    """Each executor relabelled its copies of the array onto the reader's devices, as if they
    were the same devices: JAX refused ('Expected 4 per-device arrays ... but got 1')."""
    functions = {n: export(lambda v: v + 1, f32(8, 3), devices=n, sharded=True) for n in (2, 8)}
    x = np.arange(24, dtype=np.float32).reshape(8, 3)
    with IslandClient(island.scheduler_endpoint, "spanning-reads") as client:
        ids = {n: client.register(artifact, f"inc{n}") for n, artifact in functions.items()}
        first, second = ids[len(maker)], ids[len(reader)]
        put = client.put(x, 0)
        made = client.submit(first, maker, [put], 1)
        plain = client.submit(second, reader, [made.outputs[0]], 1)
        nodes = [
            pb.Computation(id="a", function_id=first, devices=maker, inputs=["x"], outputs=["a"]),
            pb.Computation(id="b", function_id=second, devices=reader, inputs=["a"], outputs=["b"]),
        ]
        program = client.register_program(nodes, ["x"], ["b"], name="spanning-read")
        call = client.call(program, [put])
        for done in (plain, call):
            done.wait(60)
            np.testing.assert_array_equal(client.get(done.outputs[0]), x + 2)


def test_a_node_failing_on_its_devices_is_named_when_a_node_spanning_executors_reads_it(
    island: LocalIsland,
) -> None:
    """The reader copied the failed output to the host to spread it over both executors,
    which raised its maker's error there: the call named the reader as the node that failed,
    and the node that failed nowhere."""
    spread = export(lambda v: v * 2, f32(4), devices=5)
    with IslandClient(island.scheduler_endpoint, "failing-maker") as client:
        failing = client.register(huge(), "huge")
        reader = client.register(spread, "spread")
        nodes = [
            pb.Computation(
                id="h", name="huge", function_id=failing, devices=[5], inputs=["x"], outputs=["a"]
            ),
            pb.Computation(
                id="s",
                name="spread",
                function_id=reader,
                devices=[0, 1, 2, 3, 4],
                inputs=["a"],
                outputs=["b"],
            ),
        ]
        program = client.register_program(nodes, ["x"], ["b"], name="failing-maker")
        call = client.call(program, [client.put(np.ones(4, np.float32), device=5)])
        with pytest.raises(IslandError) as failed:
            call.wait(60)
        # Executor 1 names it; executor 0's reader, which pulled its output, may report first.
        named = re.search(
            r"computation 'huge' of call '[^']*' failed on executor 1: (.*)", str(failed.value)
        )
        assert named and "JaxRuntimeError: RESOURCE_EXHAUSTED" in named[1], failed.value
