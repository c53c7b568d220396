"""The island dispatcher's own cost per computation, with no network and no devices.

Four clients of weights 1 to 4 submit one-device computations round-robin to a
proportional-share dispatcher of 2 executors x 4 devices; each completion is reported once 8
are outstanding, so the dispatcher's queue, its policy and its bookkeeping all run as they do
in a scheduler. Prints the best of three runs, in computations submitted and completed per
second. ``--grants``: the sessions hold session credentials' grants (all 8 devices, one
tenant), so each submission also checks its devices and its tenant's bound.

    PYTHONPATH=core python benchmarks/dispatcher_loop.py [--grants]
"""

from __future__ import annotations

import argparse
import hashlib
import time

from pathways_core.scheduling import ExecutorSpec, IslandDispatcher, ToExecutor
from pathways_core.wire import pb

ARTIFACT = b"an artifact the dispatcher only hashes"
FUNCTION = hashlib.sha256(ARTIFACT).hexdigest()


def run(computations: int, grants: bool, clients: int = 4) -> float:
    """Computations per second through one dispatcher."""
    dispatcher = IslandDispatcher(
        [ExecutorSpec(0, "h:1", (0, 1, 2, 3)), ExecutorSpec(1, "h:2", (4, 5, 6, 7))],
        policy="proportional-share",
        max_queued=1 << 20,
        max_queued_per_client=1 << 18,
    )
    names = [f"c{i}" for i in range(clients)]
    for weight, name in enumerate(names, 1):
        held = {"tenant": "t", "devices": frozenset(range(8))} if grants else {}
        dispatcher.connect(name, weight=weight, **held)
        dispatcher.register(name, pb.FunctionRegistration(function_id=FUNCTION, artifact=ARTIFACT))
    outstanding: list[tuple[int, int]] = []

    def note(instructions: list) -> None:
        for instruction in instructions:
            if isinstance(instruction, ToExecutor) and instruction.command.HasField("run"):
                outstanding.append((instruction.executor, instruction.command.seq))

    start = time.perf_counter()
    for i in range(computations):
        name = names[i % clients]
        computation = pb.Computation(
            id=f"{name}/k{i}", function_id=FUNCTION, devices=[i % 8], outputs=[f"{name}/o{i}"]
        )
        note(dispatcher.submit(name, computation))
        while len(outstanding) > 8:
            executor, seq = outstanding.pop(0)
            event = pb.ExecutorEvent(seq=seq, executor=executor, ok=True, start_ns=1, end_ns=2)
            note(dispatcher.executor_event(event))
    return computations / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--computations", type=int, default=20_000)
    parser.add_argument("--grants", action="store_true")
    args = parser.parse_args()
    print(f"{max(run(args.computations, args.grants) for _ in range(3)):.0f}")


if __name__ == "__main__":
    main()
