"""The executor's engine in this process, on real JAX CPU devices: completions of a batch are
reported together, but never held back by a computation that waits for its input; bounding
the work in flight keeps no output alive past its deletion, and waits for the oldest work
only; a computation takes over the
buffers of inputs it is the last use of."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import hashlib
import itertools
import queue
import threading
import time
import types
import weakref
from collections.abc import Iterator

import jax
import numpy as np
import pytest
from conftest import chain_nodes, export, f32, increment

from pathways_core.wire import pb
from pathways_executor import runner as runner_module
from pathways_executor.buffers import BufferError
from pathways_executor.functions import TOKEN_FROM_BYTES, FunctionCache
from pathways_executor.runner import (
    HAND_OVER_EVERY,
    MAX_OUTSTANDING,
    RESUME_AT,
    Runner,
    last_uses,
)

# Floats per device of this file's functions: outputs this large end in a token, so they may
# be taken over while their producer still runs (smaller ones are awaited through themselves).
FLOATS = TOKEN_FROM_BYTES // 4


def run(
    seq: int,
    name: str,
    inputs: list[str],
    sources: list[pb.InputSource] = (),
    function: bytes | None = None,
    devices: tuple[int, ...] = (0,),
):
    computation = pb.Computation(
        id=name,
        client="c",
        function_id=hashlib.sha256(function or increment(FLOATS)).hexdigest(),
        devices=devices,
        inputs=inputs,
        outputs=[f"{name}-out"],
    )
    return pb.ExecutorCommand(seq=seq, run=computation, sources=sources)


def test_completions_go_out_while_the_runner_waits_for_an_input() -> None:
    arrived = threading.Event()
    events: queue.Queue[pb.ExecutorEvent] = queue.Queue()

    def fetch(source: pb.InputSource) -> np.ndarray:  # another executor, slow to deliver
        assert arrived.wait(60)
        return np.full(FLOATS, 10, np.float32)

    runner = Runner(0, {0: jax.devices()[0]}, fetch, lambda batch: [events.put(e) for e in batch])
    try:
        runner.put_array("x", np.zeros(FLOATS, np.float32))
        function_id = hashlib.sha256(increment(FLOATS)).hexdigest()
        register = pb.FunctionRegistration(function_id=function_id, artifact=increment(FLOATS))
        remote = pb.InputSource(buffer_id="far", executors=["127.0.0.1:1"])
        # One batch, as the scheduler sends it: many quick computations, then one whose input
        # is still travelling.
        quick = [run(2 + i, f"quick-{i}", ["x"]) for i in range(HAND_OVER_EVERY + 3)]
        runner.submit(
            [
                pb.ExecutorCommand(seq=1, register=register),
                *quick,
                run(99, "waits", ["far"], [remote]),
            ]
        )
        reported = [events.get(timeout=60) for _ in quick]
        assert [e.computation_id for e in reported] == [c.run.id for c in quick]
        assert all(e.ok for e in reported)
        assert not arrived.is_set() and events.empty()

        arrived.set()
        last = events.get(timeout=60)
        assert (last.computation_id, last.ok) == ("waits", True)
        np.testing.assert_array_equal(np.asarray(runner.buffers.get("waits-out", 10)), 11.0)
        assert list(runner.executed) == [c.run.id for c in quick] + ["waits"]
    finally:
        arrived.set()
        runner.stop()


def four_device_runner() -> tuple[Runner, queue.Queue[pb.ExecutorEvent]]:
    events: queue.Queue[pb.ExecutorEvent] = queue.Queue()
    devices = {d.id: d for d in jax.devices()[:4]}
    runner = Runner(0, devices, lambda source: None, lambda batch: [events.put(e) for e in batch])
    return runner, events


def run_doubling_chain(runner: Runner, events: queue.Queue[pb.ExecutorEvent]) -> None:
    """A chain of ``3 * MAX_OUTSTANDING`` 4-device computations doubling ones, each input
    deleted once its consumer is queued (as clients do), run to its right result."""
    doubled = export(lambda x: x * 2, f32(4 * FLOATS), devices=4, sharded=True)
    register = pb.FunctionRegistration(
        function_id=hashlib.sha256(doubled).hexdigest(), artifact=doubled
    )
    runner.put_array("x", np.ones(4 * FLOATS, np.float32))
    commands, previous = [pb.ExecutorCommand(seq=1, register=register)], "x"
    steps = 3 * MAX_OUTSTANDING
    for step in range(steps):
        seq = 2 * step + 2
        commands.append(run(seq, f"s{step}", [previous], function=doubled, devices=(0, 1, 2, 3)))
        if previous != "x":
            commands.append(delete(seq + 1, previous))
        previous = f"s{step}-out"
    runner.submit(commands)
    assert all(events.get(timeout=60).ok for _ in range(steps))
    np.testing.assert_array_equal(np.asarray(runner.buffers.get(previous, 10)), 2.0**steps)


def test_bounding_work_in_flight_keeps_no_deleted_output_alive() -> None:
    """Once a chain of 4-device computations is done, the outputs the runner still holds are
    at most the newest and the chain's end. CPU devices' outputs are host memory: a runner
    holding the last eight (it did) worked on a larger set of it than JAX does."""
    runner, events = four_device_runner()
    alive: list[weakref.ref] = []
    store_set = runner.buffers.set

    def set_and_watch(buffer_id: str, value: object) -> None:
        if isinstance(value, jax.Array):
            alive.append(weakref.ref(value))
        store_set(buffer_id, value)

    runner.buffers.set = set_and_watch
    try:
        run_doubling_chain(runner, events)
        gc.collect()
        assert sum(ref() is not None for ref in alive) <= 2
    finally:
        runner.stop()


def test_at_the_bound_the_runner_waits_for_its_oldest_work_only() -> None:
    """At ``MAX_OUTSTANDING`` multi-device computations in flight the runner waits until
    ``RESUME_AT`` are left, never for all: the devices do not run dry at each wait (waiting for
    all cost -C on two hosts ~15% of its steps per second)."""
    runner, events = four_device_runner()
    waits: list[tuple[int, int, bool]] = []  # in flight before and after, the waited-for done
    bound = runner._bound_outstanding

    def watched(path: str) -> None:
        before = list(runner._in_flight)
        bound(path)
        after = len(runner._in_flight)
        done = all(
            value.is_ready() for awaited in before[: len(before) - after] for value in awaited
        )
        waits.append((len(before), after, done))

    runner._bound_outstanding = watched
    try:
        run_doubling_chain(runner, events)
        full = [(after, done) for before, after, done in waits if before >= MAX_OUTSTANDING]
        assert len(full) >= 2
        assert full == [(RESUME_AT, True)] * len(full) and RESUME_AT > 0
        assert max(before for before, _, _ in waits) == MAX_OUTSTANDING
    finally:
        runner.stop()


def test_a_call_of_collectives_is_stamped_a_group_of_nodes_at_a_time(monkeypatch) -> None:
    """The completion thread gets a call's nodes in groups: those dispatched before each wait
    of the runner for the devices, and the rest at the end (one wake-up a group: waking it
    twice a node took twice the thread's CPU). Each node still gets times of its own, in
    order, none taking the span of the ones around it."""
    runner, events = four_device_runner()
    groups: list[list[int]] = []
    send = runner_module._Dispatched.send_nodes

    def watched_send(record) -> None:
        if record.unsent:
            groups.append([index for index, _, _ in record.unsent])
        send(record)

    monkeypatch.setattr(runner_module._Dispatched, "send_nodes", watched_send)
    waits = 0
    bound = runner._bound_outstanding

    def counted_bound(path: str) -> None:
        nonlocal waits
        waits += len(runner._in_flight) >= MAX_OUTSTANDING
        bound(path)

    runner._bound_outstanding = counted_bound
    try:
        doubled = export(lambda x: x * 2, f32(4 * FLOATS), devices=4, sharded=True)
        function_id = hashlib.sha256(doubled).hexdigest()
        stages = 3 * MAX_OUTSTANDING
        program = pb.ProgramRegistration(
            program_id="chain",
            nodes=chain_nodes(function_id, [range(4)] * stages),
            arguments=["x"],
            results=[f"y{stages - 1}"],
        )
        runner.put_array("x", np.ones(4 * FLOATS, np.float32))
        register = pb.FunctionRegistration(function_id=function_id, artifact=doubled)
        runner.submit(
            [
                pb.ExecutorCommand(seq=1, register=register),
                pb.ExecutorCommand(seq=2, program=program),
            ]
        )
        for n in range(2):  # the first call compiles the variant taking inputs over
            groups.clear()
            waits = 0
            call = pb.ProgramCall(id=f"p{n}", program_id="chain", arguments=["x"], results=["r"])
            runner.submit([pb.ExecutorCommand(seq=3 + 2 * n, call=call), delete(4 + 2 * n, "r")])
            report = events.get(timeout=60)
            assert report.ok, report.message
        assert [index for group in groups for index in group] == list(range(stages))
        # The first node (the call is handed over with it), one group a wait, the rest.
        assert waits >= 2 and len(groups) <= waits + 2 < stages
        assert list(report.node_indices) == list(range(stages))
        times = list(zip(report.node_starts_ns, report.node_ends_ns, strict=True))
        assert all(start < end for start, end in times)
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(times))
        # The first node is a group of one, stamped as it ended: its span is its own, however
        # long the host kept it (4.1 ms of 9.4 in one CI run). A grouped node taking its
        # group's span would take ~1/3 of the call.
        spans = [end - start for start, end in times[1:]]
        assert max(spans) < (times[-1][1] - times[0][0]) / 4, spans
    finally:
        runner.stop()


def delete(seq: int, *ids: str) -> pb.ExecutorCommand:
    return pb.ExecutorCommand(seq=seq, delete=pb.DeleteBuffers(ids=ids))


@contextlib.contextmanager
def incrementing_runner(first: str) -> Iterator[tuple[Runner, queue.Queue[pb.ExecutorEvent]]]:
    """A one-device runner with ``increment`` registered and computation ``first`` reported
    (its output ``{first}-out`` holds ones)."""
    events: queue.Queue[pb.ExecutorEvent] = queue.Queue()
    runner = Runner(
        0, {0: jax.devices()[0]}, lambda source: None, lambda batch: [events.put(e) for e in batch]
    )
    try:
        function_id = hashlib.sha256(increment(FLOATS)).hexdigest()
        register = pb.FunctionRegistration(function_id=function_id, artifact=increment(FLOATS))
        runner.put_array("host", np.zeros(FLOATS, np.float32))
        runner.submit([pb.ExecutorCommand(seq=1, register=register), run(2, first, ["host"])])
        assert events.get(timeout=60).ok
        yield runner, events
    finally:
        runner.stop()


def test_last_uses_are_the_last_reads_before_a_deletion_in_the_batch() -> None:
    batch = [
        run(1, "a", ["x", "y"]),
        run(2, "b", ["x"]),
        delete(3, "x", "gone"),  # "gone" was read in an earlier batch: not this one's to give
        run(4, "c", ["y", "a-out"]),
        delete(5, "a-out"),
        run(6, "d", ["y"]),  # "y" is never deleted here
        run(7, "e", ["z"]),
        pb.ExecutorCommand(seq=8, call=pb.ProgramCall(id="k", program_id="p", arguments=["z"])),
        delete(9, "z"),  # the call reads it last: the run before may not take it over
    ]
    assert last_uses(batch) == {1: {"x"}, 3: {"a-out"}, 7: {"z"}}


def test_a_chain_hands_each_freed_input_to_its_consumer() -> None:
    """A client's chain frees each intermediate once its consumer is queued: the consumer takes
    the buffer over (no new one), every computation is still reported, in order, and inputs
    that are kept, or read again later, stay intact."""
    with incrementing_runner("x") as (runner, events):
        steps, commands, previous = 20, [], "x-out"
        for step in range(steps):
            commands.append(run(10 + 2 * step, f"s{step}", [previous]))
            if previous != "x-out":  # the chain's start is kept
                commands.append(delete(11 + 2 * step, previous))
            previous = f"s{step}-out"
        # "x-out" read twice more, then freed: only its last reader may take it over.
        commands += [run(100, "again", ["x-out"]), run(101, "last", ["x-out"])]
        commands.append(delete(102, "x-out"))
        runner.submit(commands)
        reported = [events.get(timeout=60) for _ in range(steps + 2)]
        assert all(event.ok for event in reported), [e.message for e in reported]
        assert [e.computation_id for e in reported] == [
            *(f"s{step}" for step in range(steps)),
            "again",
            "last",
        ]
        assert all(event.start_ns <= event.end_ns for event in reported)
        # Each freed intermediate but the first (its consumer compiles the variant that takes an
        # input over, and runs as it did), and "x-out" once.
        assert runner.inputs_taken_over == steps - 2 + 1
        np.testing.assert_array_equal(np.asarray(runner.buffers.get(previous, 10)), steps + 1.0)
        for name in ("again", "last"):
            np.testing.assert_array_equal(np.asarray(runner.buffers.get(f"{name}-out", 10)), 2.0)
        assert "s0-out" not in runner.buffers and "x-out" not in runner.buffers


def test_interleaved_chains_take_over_inputs_whose_producers_still_run() -> None:
    """Two chains in turn, as two tenants' work reaches an executor: each step's input comes
    from the step before last, usually still running when it is dispatched. It is taken over
    all the same (the producer's token, not its output, tells when it is done), and every
    computation is reported with times of its own, in order."""
    with incrementing_runner("x") as (runner, events):
        steps, commands, previous = 24, [], {"a": "x-out", "b": "x-out"}
        seq = 10
        for step in range(steps):
            for chain in ("a", "b"):
                name = f"{chain}{step}"
                commands.append(run(seq, name, [previous[chain]]))
                if previous[chain] != "x-out":
                    commands.append(delete(seq + 1, previous[chain]))
                previous[chain], seq = f"{name}-out", seq + 2
        runner.submit(commands)
        reported = [events.get(timeout=60) for _ in range(2 * steps)]
        assert all(event.ok for event in reported), [e.message for e in reported]
        assert [e.computation_id for e in reported] == [c.run.id for c in commands if c.run.id]
        assert all(e.start_ns <= e.end_ns for e in reported)
        assert all(a.end_ns <= b.start_ns for a, b in itertools.pairwise(reported))
        # Every freed intermediate but the first (its consumer compiles the variant that
        # takes an input over, and runs as it did).
        assert runner.inputs_taken_over == 2 * (steps - 1) - 1
        for chain in ("a", "b"):
            value = np.asarray(runner.buffers.get(previous[chain], 10))
            np.testing.assert_array_equal(value, steps + 1.0)


def test_an_output_awaited_through_itself_is_taken_over_only_once_reported() -> None:
    """A computation without a token (a function with small outputs, a STABLEHLO one)
    is known done through its outputs: none of them is handed to a consumer before it is
    reported, or the completion thread's wait would fail."""
    with incrementing_runner("p") as (runner, events):  # "p-out" is free to take over
        runner._watched.add("p-out")  # as if "p" had no token and were still running
        runner.submit([run(3, "q", ["p-out"]), delete(4, "p-out")])
        assert events.get(timeout=60).ok and runner.inputs_taken_over == 0
        runner._watched.discard("q-out")
        # "r" compiles the variant that takes an input over, "s" uses it.
        runner.submit([run(5, "r", ["q-out"]), delete(6, "q-out")])
        assert events.get(timeout=60).ok and runner.inputs_taken_over == 0
        runner.submit([run(7, "s", ["r-out"]), delete(8, "r-out")])
        assert events.get(timeout=60).ok and runner.inputs_taken_over == 1
        np.testing.assert_array_equal(np.asarray(runner.buffers.get("s-out", 10)), 4.0)


@pytest.mark.parametrize("on_one_device", [False, True], ids=["4-device", "1-device"])
def test_a_program_call_frees_each_intermediate_at_its_last_read(on_one_device: bool) -> None:
    """A chain of 4-device nodes called as a program, or of 1-device nodes on each device in
    turn: when a node is launched, the runner holds its input and nothing older, as a JAX loop
    does (it held every intermediate until the call was reported: at 1,048,576 floats per
    device, 2 GiB per 128-step call)."""
    events: queue.Queue[pb.ExecutorEvent] = queue.Queue()
    devices = {d.id: d for d in jax.devices()[:4]}
    runner = Runner(0, devices, lambda source: None, lambda batch: [events.put(e) for e in batch])
    made: list[weakref.ref] = []
    held_at_launch: list[int] = []
    launch = runner._launch

    def watched_launch(function, arguments, donations):
        gc.collect()
        held_at_launch.append(sum(ref() is not None for ref in made))
        awaited, outputs, unprepared, through = launch(function, arguments, donations)
        made.extend(weakref.ref(output) for output in outputs)
        return awaited, outputs, unprepared, through

    runner._launch = watched_launch
    try:
        doubled = export(
            lambda x: x * 2, f32(4 * FLOATS), devices=1 if on_one_device else 4, sharded=True
        )
        function_id = hashlib.sha256(doubled).hexdigest()
        register = pb.FunctionRegistration(function_id=function_id, artifact=doubled)
        stages = 12
        slices = [k % 4 for k in range(stages)] if on_one_device else [range(4)] * stages
        program = pb.ProgramRegistration(
            program_id="chain",
            nodes=chain_nodes(function_id, slices),
            arguments=["x"],
            results=[f"y{stages - 1}"],
        )
        runner.put_array("x", np.ones(4 * FLOATS, np.float32))
        commands = [
            pb.ExecutorCommand(seq=1, register=register),
            pb.ExecutorCommand(seq=2, program=program),
        ]
        # The first call also compiles the variant taking inputs over (on one node's inputs,
        # held until then); the second runs with it.
        for n in range(2):
            held_at_launch.clear()
            made.clear()
            call = pb.ProgramCall(
                id=f"p{n}", program_id="chain", arguments=["x"], results=[f"r{n}"]
            )
            runner.submit([*commands, pb.ExecutorCommand(seq=3 + n, call=call)])
            commands = []
            assert events.get(timeout=60).ok
            result = np.asarray(runner.buffers.get(f"r{n}", 10))
            np.testing.assert_array_equal(result, 2.0**stages)
        # Each launch: its input (the previous node's output) alone, of the call's outputs.
        assert max(held_at_launch) <= 1, held_at_launch
    finally:
        runner.stop()


def count_moves(monkeypatch) -> list[int]:
    """Inputs per call of ``_moved`` (a node's local inputs moved straight), from now on."""
    moved: list[int] = []
    moved_straight = runner_module._moved

    def counted(moves, *rest):
        moved.append(len(moves))
        return moved_straight(moves, *rest)

    monkeypatch.setattr(runner_module, "_moved", counted)
    return moved


def test_later_calls_move_local_inputs_straight_and_compute_what_the_first_call_did(
    monkeypatch,
) -> None:
    """From a program's second call on, a node on one device reading only outputs of nodes
    before it takes them straight (``_moved``: no check, the runtime's copy between devices).
    Every call computes the same: across devices, on one device (taking its last read over),
    reading an output twice, and reading a multi-device node's output."""
    events: queue.Queue[pb.ExecutorEvent] = queue.Queue()
    devices = {d.id: d for d in jax.devices()[:4]}
    runner = Runner(0, devices, lambda source: None, lambda batch: [events.put(e) for e in batch])
    moved = count_moves(monkeypatch)
    try:
        artifacts = {
            "one": increment(FLOATS),
            "add": export(lambda x, y: x + y, f32(FLOATS), f32(FLOATS)),
            "all": export(lambda x: x + 1, f32(FLOATS), devices=4),  # replicated on 0-3
        }
        ids = {name: hashlib.sha256(a).hexdigest() for name, a in artifacts.items()}
        commands = [
            pb.ExecutorCommand(seq=seq, register=pb.FunctionRegistration(function_id=i, artifact=a))
            for seq, (i, a) in enumerate(zip(ids.values(), artifacts.values(), strict=True))
        ]

        def node(name: str, function: str, on: list[int], *inputs: str) -> pb.Computation:
            return pb.Computation(
                id=name, function_id=ids[function], devices=on, inputs=inputs, outputs=[name]
            )

        nodes = [
            node("a", "one", [0], "x"),  # an argument: through the checks always
            node("b", "one", [1], "a"),  # copied from device 0
            node("c", "one", [1], "b"),  # "b" is read again below: not taken over
            node("d", "add", [1], "b", "c"),  # both last reads, on its device
            node("e", "all", [0, 1, 2, 3], "d"),  # multi-device: through the checks always
            node("f", "one", [2], "e"),  # from a multi-device array
        ]
        program = pb.ProgramRegistration(
            program_id="p", nodes=nodes, arguments=["x"], results=["f"]
        )
        runner.put_array("x", np.ones(FLOATS, np.float32))
        commands.append(pb.ExecutorCommand(seq=10, program=program))
        taken_over = []
        for n in range(3):
            call = pb.ProgramCall(id=f"c{n}", program_id="p", arguments=["x"], results=[f"r{n}"])
            runner.submit([*commands, pb.ExecutorCommand(seq=11 + n, call=call)])
            commands = []
            event = events.get(timeout=60)
            assert event.ok, event.message
            assert list(event.node_indices) == list(range(len(nodes)))
            result = runner.buffers.get(f"r{n}", 10)
            assert result.sharding == jax.sharding.SingleDeviceSharding(devices[2])
            np.testing.assert_array_equal(np.asarray(result), 9.0)  # b + c = 3 + 4, then + 2
            taken_over.append(runner.inputs_taken_over)
            if n == 0:
                assert moved == []  # the first call checks every input
        # The single-device nodes reading local outputs only: b, c, d and f, in each later call.
        assert moved == [1, 1, 2, 1] * 2
        # "d" takes one of its inputs over in each later call (the first compiles the variant).
        assert taken_over[2] - taken_over[1] == taken_over[1] - taken_over[0] >= 1
    finally:
        runner.stop()


def small_chain_runner() -> tuple[Runner, queue.Queue[pb.ExecutorEvent], list[pb.ExecutorCommand]]:
    """A runner of 4 devices, ``x`` put on device 0 (a host array), and the commands
    registering program ``p`` of small (token-less) nodes: a -> b -> c -> d -> e -> f, each
    adding 1. a, b, c and d are a run from a head (a reads the argument, b copies its input
    from device 0, c reads it on its device, d's output is a result), also found from b on;
    e reads d as a buffer, so it is no link; f alone is a run."""
    events: queue.Queue[pb.ExecutorEvent] = queue.Queue()
    devices = {d.id: d for d in jax.devices()[:4]}
    runner = Runner(0, devices, lambda source: None, lambda batch: [events.put(e) for e in batch])
    function_id = hashlib.sha256(increment()).hexdigest()
    register = pb.FunctionRegistration(function_id=function_id, artifact=increment())
    placement = {"a": 0, "b": 1, "c": 1, "d": 2, "e": 3, "f": 0}
    nodes, previous = [], "x"
    for name, device in placement.items():
        nodes.append(
            pb.Computation(
                id=name,
                function_id=function_id,
                devices=[device],
                inputs=[previous],
                outputs=[name],
            )
        )
        previous = name
    program = pb.ProgramRegistration(
        program_id="p", nodes=nodes, arguments=["x"], results=["d", "f"]
    )
    runner.put_array("x", np.ones(4, np.float32))
    return (
        runner,
        events,
        [
            pb.ExecutorCommand(seq=1, register=register),
            pb.ExecutorCommand(seq=2, program=program),
        ],
    )


def call_p(
    runner: Runner, n: int, commands: list[pb.ExecutorCommand] = (), argument: str = "x"
) -> None:
    call = pb.ProgramCall(
        id=f"c{n}", program_id="p", arguments=[argument], results=[f"d{n}", f"f{n}"]
    )
    runner.submit([*commands, pb.ExecutorCommand(seq=10 + n, call=call)])


def test_later_calls_dispatch_runs_of_links_in_one_loop_and_compute_what_the_first_did(
    monkeypatch,
) -> None:
    """From a program's second call on, consecutive single-device nodes each reading the one
    output of the node before them (a chain's links) go out in one tight loop, not through
    ``_moved`` and the general loop body, from the node reading the call's argument where the
    argument is a device array of the shape it takes; every call computes the same, reports
    each node's times, and makes its results as buffers on their nodes' devices. An argument
    of another shape still gets the general loop's clear error, and a call missing its
    argument fails alone."""
    runner, events, commands = small_chain_runner()
    moved = count_moves(monkeypatch)
    through_general_loop: list[str] = []
    node_inputs = runner._node_inputs

    def counted_inputs(call, step, *rest):
        through_general_loop.append(step.node.id)
        return node_inputs(call, step, *rest)

    runner._node_inputs = counted_inputs
    try:
        # Calls 0-2 read x (a host array: a takes the general loop), call 3 reads d2 (a device
        # array on device 2: a heads the run).
        for n, argument, first in ((0, "x", 1.0), (1, "x", 1.0), (2, "x", 1.0), (3, "d2", 5.0)):
            through_general_loop.clear()
            call_p(runner, n, commands if n == 0 else (), argument)
            event = events.get(timeout=60)
            assert event.ok, event.message
            assert list(event.node_indices) == list(range(6))
            times = zip(event.node_starts_ns, event.node_ends_ns, strict=True)
            assert all(start <= end for start, end in times)
            for result, value, device in ((f"d{n}", first + 4, 2), (f"f{n}", first + 6, 0)):
                array = runner.buffers.get(result, 10)
                assert array.sharding == jax.sharding.SingleDeviceSharding(runner.devices[device])
                np.testing.assert_array_equal(np.asarray(array), value)
            if n == 0:  # the first call checks every input; then the plan has its links
                plan = runner._plans["p"]
                assert {
                    start: (run.end, len(run.links), run.stored, run.head is not None)
                    for start, run in plan.links.items()
                } == {0: (4, 4, True, True), 1: (4, 3, True, False), 5: (6, 1, True, False)}
                # Each link's function moves its input from the device before itself: no copy.
                assert [copy for _, _, copy in plan.links[1].links] == [None, None, None]
            else:
                assert through_general_loop == (["a", "e"] if argument == "x" else ["e"])
        assert moved == []  # b, c, d and f went out as links in the later calls

        # Functions that do not move their inputs (STABLEHLO programs) get a copy where the
        # device changes: b from device 0, none for c (its input on device 1 too), d to 2.
        kept = {
            i: bound._replace(function=dataclasses.replace(bound.function, moves_inputs=False))
            for i, bound in plan.bound.items()
        }
        copying = runner_module._link_runs(dataclasses.replace(plan, bound=kept))
        assert [copy is None for _, _, copy in copying[1].links] == [False, True, False]
        saved, plan.links = plan.links, copying
        call_p(runner, 7, (), "d2")
        assert events.get(timeout=60).ok
        np.testing.assert_array_equal(np.asarray(runner.buffers.get("f7", 10)), 11.0)
        plan.links = saved

        runner.buffers.set("wide", jax.device_put(np.ones(8, np.float32), runner.devices[0]))
        call_p(runner, 4, (), "wide")
        event = events.get(timeout=60)
        assert not event.ok
        assert "input 0 of function" in event.message and "float32[8], expected float32[4]" in (
            event.message
        )
        # A call missing its argument (the scheduler refuses one): the general loop fails it,
        # and the runner goes on.
        short = pb.ProgramCall(id="c5", program_id="p", arguments=[], results=["d5", "f5"])
        runner.submit([pb.ExecutorCommand(seq=15, call=short)])
        assert not events.get(timeout=60).ok
        call_p(runner, 6)
        assert events.get(timeout=60).ok
    finally:
        runner.stop()


def test_a_link_refused_at_dispatch_fails_its_call_naming_it_and_the_runner_goes_on() -> None:
    """A link whose launch raises fails its node, the links after it and the nodes reading
    them, and the call names it; the program's next call runs as before."""
    runner, events, commands = small_chain_runner()
    try:
        call_p(runner, 0, commands)
        assert events.get(timeout=60).ok
        plan = runner._plans["p"]
        links = plan.links[1]

        def refused(value):
            raise RuntimeError("the devices are gone")

        index, _, copy = links.links[1]  # c
        plan.links[1] = dataclasses.replace(
            links, links=(links.links[0], (index, refused, copy), links.links[2])
        )
        call_p(runner, 1)
        event = events.get(timeout=60)
        assert not event.ok
        assert "computation 'c' of call 'c1'" in event.message
        assert "RuntimeError: the devices are gone" in event.message
        for result in ("d1", "f1"):  # d is after c in its run; f reads d through e
            with pytest.raises(BufferError, match="the devices are gone"):
                runner.buffers.get(result, 10)

        plan.links[1] = links
        call_p(runner, 2)
        assert events.get(timeout=60).ok
        np.testing.assert_array_equal(np.asarray(runner.buffers.get("f2", 10)), 7.0)
    finally:
        runner.stop()


def test_a_forget_drops_what_came_before_it_and_not_what_is_registered_after() -> None:
    """Forgetting runs in the island order: calls before it run, a program registered again
    after it (read by the command reader before the forget ran) keeps its new plan."""
    with incrementing_runner("first") as (runner, events):
        function_id = hashlib.sha256(increment(FLOATS)).hexdigest()
        node = pb.Computation(
            id="s", function_id=function_id, devices=[0], inputs=["x"], outputs=["y"]
        )
        program = pb.ProgramRegistration(
            program_id="p", nodes=[node], arguments=["x"], results=["y"]
        )
        register = pb.FunctionRegistration(function_id=function_id, artifact=increment(FLOATS))

        def call(seq: int, n: int) -> pb.ExecutorCommand:
            made = pb.ProgramCall(id=f"c{n}", program_id="p", arguments=["host"], results=[f"r{n}"])
            return pb.ExecutorCommand(seq=seq, call=made)

        forget = pb.Forget(function_ids=[function_id], program_ids=["p"])
        runner.submit(
            [
                pb.ExecutorCommand(seq=3, program=program),
                call(4, 1),
                pb.ExecutorCommand(seq=5, forget=forget),
                pb.ExecutorCommand(seq=6, register=register),
                pb.ExecutorCommand(seq=7, program=program),
                call(8, 2),
            ]
        )
        assert [events.get(timeout=60).ok for _ in range(2)] == [True, True]
        for n in (1, 2):
            np.testing.assert_array_equal(np.asarray(runner.buffers.get(f"r{n}", 10)), 1.0)
        assert (runner.functions.loaded, runner.programs) == (1, 1)

        runner.submit([pb.ExecutorCommand(seq=9, forget=forget)])
        runner.submit([run(10, "after", ["host"])])
        failed = events.get(timeout=60)
        assert not failed.ok and "was never registered" in failed.message
        assert (runner.functions.loaded, runner.executables, runner.programs) == (0, 0, 0)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8", "bool", "float64"])
def test_host_arrays_are_placed_on_the_devices_a_function_expects(monkeypatch, dtype) -> None:
    """An input pulled from another executor arrives as a host array: it is put on the
    consumer's devices by the runtime call itself, or by ``jax.device_put`` where that call is
    missing, with the same result as ``jax.device_put`` (a dtype JAX converts, as float64
    without x64, converted alike)."""
    from jax.sharding import Mesh, NamedSharding, SingleDeviceSharding
    from jax.sharding import PartitionSpec as P

    from pathways_executor import runner as engine

    one = SingleDeviceSharding(jax.devices()[2])
    four = NamedSharding(Mesh(np.array(jax.devices()[4:8]), ("x",)), P("x"))
    host = np.arange(32).reshape(4, 8).astype(jax.numpy.dtype(dtype))

    def placed_everywhere() -> None:
        for sharding in (one, four):
            for _ in range(2):  # the second time through what the first remembered
                value = engine.place(host, sharding)
                expected = jax.device_put(host, sharding)
                assert isinstance(value, jax.Array) and value.committed
                assert value.sharding == sharding
                assert value.dtype == expected.dtype and value.shape == expected.shape
                np.testing.assert_array_equal(np.asarray(value), np.asarray(expected))
            if sharding is four:  # each device holds its own row
                for shard in value.addressable_shards:
                    np.testing.assert_array_equal(
                        np.asarray(shard.data), np.asarray(expected)[shard.index]
                    )

    placed_everywhere()

    # A jax without the runtime calls.
    monkeypatch.setattr(engine, "pxla", types.SimpleNamespace())
    monkeypatch.setattr(engine, "xc", types.SimpleNamespace())
    placed_everywhere()


def test_a_function_returns_its_outputs_flat_in_leaf_order_then_its_token() -> None:
    """Outputs of any pytree come back as one flat tuple, in the pytree's leaf order, the
    token last (the runner then walks no pytree per launch), and so does the variant that
    takes an input over."""
    cache = FunctionCache()
    artifact = export(lambda x: {"b": x + 1, "a": (x * 2, x * 3)}, f32(FLOATS))
    function_id = hashlib.sha256(artifact).hexdigest()
    cache.register(function_id, artifact, "tree")
    function = cache.callable(function_id, [jax.devices()[0]])
    x = jax.device_put(np.ones(FLOATS, np.float32), jax.devices()[0])

    def values(results) -> list[float]:
        assert isinstance(results, tuple) and len(results) == 4
        assert results[-1].dtype == np.bool_ and results[-1].shape == ()
        return [float(np.asarray(r)[0]) for r in results[:-1]]

    assert values(function.run(x)) == [2.0, 3.0, 2.0]  # a's two leaves, then b
    assert function.donatable
    position = min(function.donatable)
    function.prepare_donating((position,), [x])
    assert values(function.donating((position,))(x.copy())) == [2.0, 3.0, 2.0]


def test_a_function_with_small_outputs_has_no_token_and_is_awaited_through_them() -> None:
    """Outputs under ``TOKEN_FROM_BYTES`` per device come back alone (a token would be one more
    buffer per launch, ~15% of a small computation's dispatch): the runner waits for them, and
    a chain of such computations never takes an output over before it is reported."""
    cache = FunctionCache()
    four = jax.devices()[:4]
    for floats, devices, tokened in [
        (FLOATS - 1, 1, False),
        (FLOATS, 1, True),
        (4 * (FLOATS - 1), 4, False),  # per device, not in all
    ]:
        artifact = export(lambda x: x + 1, f32(floats), devices=devices, sharded=devices > 1)
        function_id = hashlib.sha256(artifact).hexdigest()
        cache.register(function_id, artifact, "add")
        function = cache.callable(function_id, four[:devices])
        assert (function.token_sharding is not None) is tokened
        x = jax.device_put(np.ones(floats, np.float32), function.in_shardings[0])
        results = function.run(x)
        assert isinstance(results, tuple) and len(results) == 1 + tokened
        np.testing.assert_array_equal(np.asarray(results[0]), 2.0)

    with incrementing_runner("x") as (runner, events):
        small = increment(FLOATS - 1)
        function_id = hashlib.sha256(small).hexdigest()
        register = pb.FunctionRegistration(function_id=function_id, artifact=small)
        runner.put_array("small", np.zeros(FLOATS - 1, np.float32))
        commands, previous = [pb.ExecutorCommand(seq=2, register=register)], "small"
        steps = 20
        for step in range(steps):
            commands.append(run(10 + 2 * step, f"s{step}", [previous], function=small))
            if previous != "small":
                commands.append(delete(11 + 2 * step, previous))
            previous = f"s{step}-out"
        runner.submit(commands)
        reported = [events.get(timeout=60) for _ in range(steps)]
        assert all(event.ok for event in reported), [e.message for e in reported]
        assert [e.computation_id for e in reported] == [f"s{step}" for step in range(steps)]
        np.testing.assert_array_equal(np.asarray(runner.buffers.get(previous, 10)), steps)
        assert not runner._watched  # each output awaited through itself, until reported


def test_executables_held_are_bounded_dropping_the_least_recently_run(monkeypatch) -> None:
    """A sweep over many functions (a static argument's values) keeps at most
    ``max_executables`` compiled; the one run longest ago goes first and is compiled again,
    with the same result, at its next run; one run lately stays."""
    events: queue.Queue[pb.ExecutorEvent] = queue.Queue()
    runner = Runner(
        0,
        {0: jax.devices()[0]},
        lambda source: None,
        lambda batch: [events.put(e) for e in batch],
        max_executables=2,
    )
    compiled: list[str] = []
    build = runner.functions.callable
    monkeypatch.setattr(
        runner.functions,
        "callable",
        lambda function_id, devices: compiled.append(function_id) or build(function_id, devices),
    )
    artifacts = [export(lambda x, n=n: x * n, f32(4)) for n in range(3)]
    ids = [hashlib.sha256(artifact).hexdigest() for artifact in artifacts]
    try:
        runner.put_array("host", np.ones(4, np.float32))
        runner.submit(
            [
                pb.ExecutorCommand(
                    seq=seq,
                    register=pb.FunctionRegistration(function_id=function_id, artifact=artifact),
                )
                for seq, (function_id, artifact) in enumerate(zip(ids, artifacts, strict=True), 1)
            ]
        )
        seq = itertools.count(10)

        def run_each(*positions: int) -> None:
            for position in positions:
                name = f"r{next(seq)}"
                runner.submit([run(next(seq), name, ["host"], function=artifacts[position])])
                assert events.get(timeout=60).ok
                np.testing.assert_array_equal(
                    np.asarray(runner.buffers.get(f"{name}-out", 10)), float(position)
                )

        run_each(0, 1, 0, 2)  # 0 was run after 1: 1 goes when 2 comes
        assert runner.executables == 2
        assert compiled == [ids[0], ids[1], ids[2]]
        run_each(0, 2, 1)  # held: no compile; then 1 again, in place of 0
        assert compiled == [ids[0], ids[1], ids[2], ids[1]]
        assert runner.executables == 2
    finally:
        runner.stop()


def test_a_prefetch_of_a_buffer_not_announced_yet_leaves_nothing_for_its_work() -> None:
    """A prefetch (of work held in its island's queue until another island makes its input)
    that gave up on the holder's 30 s left the buffer failed: the work, sent once the input
    was made, found that failure instead of pulling it."""
    attempts: list[str] = []
    arrived = threading.Event()

    def fetch(source: pb.InputSource) -> np.ndarray:
        attempts.append(source.buffer_id)
        if len(attempts) == 1:  # the prefetch: its producer is still queued over there
            raise BufferError(f"cannot fetch buffer: far:2: unknown buffer {source.buffer_id!r}")
        arrived.set()
        return np.full(4, 3.0, np.float32)

    runner = Runner(0, {0: jax.devices()[0]}, fetch, lambda batch: None)
    source = pb.InputSource(buffer_id="c/far", executors=["far:1"], data_endpoints=["far:2"])
    runner.prefetch([source])
    for _ in range(200):
        if "c/far" not in runner.buffers:
            break
        time.sleep(0.01)
    assert "c/far" not in runner.buffers  # forgotten, not failed
    runner.prefetch([source])  # pulled again (as the work's own pull does), and kept
    assert arrived.wait(5) and runner.buffers.get("c/far", 5).tolist() == [3.0] * 4
    # Any other failure stays, for the work to meet.
    other = pb.InputSource(buffer_id="c/lost", executors=["far:1"], data_endpoints=["far:2"])
    attempts.clear()

    def refuse(source: pb.InputSource) -> np.ndarray:
        raise BufferError("cannot fetch buffer 'c/lost': far:2: connection refused")

    runner._fetch = refuse
    runner.prefetch([other])
    with pytest.raises(BufferError, match="connection refused"):
        runner.buffers.get("c/lost", 5)
    runner.stop()
