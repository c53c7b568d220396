"""The executor's engine in this process, on real JAX CPU devices: completions of a batch are
reported together, but never held back by a computation that waits for its input."""

from __future__ import annotations

import hashlib
import queue
import threading

import jax
import numpy as np
from conftest import increment

from pathways_core.wire import pb
from pathways_executor.runner import HAND_OVER_EVERY, Runner


def run(seq: int, name: str, inputs: list[str], sources: list[pb.InputSource] = ()):
    computation = pb.Computation(
        id=name,
        client="c",
        function_id=hashlib.sha256(increment()).hexdigest(),
        devices=[0],
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
