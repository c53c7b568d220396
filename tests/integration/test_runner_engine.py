"""The executor's engine in this process, on real JAX CPU devices: completions of a batch are
reported together, but never held back by a computation that waits for its input; bounding
the work in flight keeps no output alive past its deletion."""

from __future__ import annotations

import gc
import hashlib
import queue
import threading
import weakref

import jax
import numpy as np
from conftest import export, f32, increment

from pathways_core.wire import pb
from pathways_executor.runner import HAND_OVER_EVERY, MAX_OUTSTANDING, Runner


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
        function_id=hashlib.sha256(function or increment()).hexdigest(),
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
        return np.full(4, 10, np.float32)

    runner = Runner(0, {0: jax.devices()[0]}, fetch, lambda batch: [events.put(e) for e in batch])
    try:
        runner.put_array("x", np.zeros(4, np.float32))
        function_id = hashlib.sha256(increment()).hexdigest()
        register = pb.FunctionRegistration(function_id=function_id, artifact=increment())
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


def test_bounding_work_in_flight_keeps_no_deleted_output_alive() -> None:
    """A chain of 4-device computations, each input deleted once its consumer is queued (as
    clients do): once the chain is done, the outputs the runner still holds are the newest
    (what it waits for at the bound) and the chain's end. CPU devices' outputs are host memory:
    a runner holding the last eight (it did) worked on a larger set of it than JAX does."""
    events: queue.Queue[pb.ExecutorEvent] = queue.Queue()
    devices = {d.id: d for d in jax.devices()[:4]}
    runner = Runner(0, devices, lambda source: None, lambda batch: [events.put(e) for e in batch])
    alive: list[weakref.ref] = []
    store_set = runner.buffers.set

    def set_and_watch(buffer_id: str, value: object) -> None:
        if isinstance(value, jax.Array):
            alive.append(weakref.ref(value))
        store_set(buffer_id, value)

    runner.buffers.set = set_and_watch
    try:
        doubled = export(lambda x: x * 2, f32(8), devices=4, sharded=True)
        register = pb.FunctionRegistration(
            function_id=hashlib.sha256(doubled).hexdigest(), artifact=doubled
        )
        runner.put_array("x", np.ones(8, np.float32))
        commands, previous = [pb.ExecutorCommand(seq=1, register=register)], "x"
        steps = 3 * MAX_OUTSTANDING
        for step in range(steps):
            seq = 2 * step + 2
            computation = run(seq, f"s{step}", [previous], function=doubled, devices=(0, 1, 2, 3))
            commands.append(computation)
            if previous != "x":
                delete = pb.DeleteBuffers(ids=[previous])
                commands.append(pb.ExecutorCommand(seq=seq + 1, delete=delete))
            previous = f"s{step}-out"
        runner.submit(commands)
        assert all(events.get(timeout=60).ok for _ in range(steps))
        np.testing.assert_array_equal(np.asarray(runner.buffers.get(previous, 10)), 2.0**steps)
        gc.collect()
        assert sum(ref() is not None for ref in alive) <= 2
    finally:
        runner.stop()
