"""Soak: eight clients of different weights load one island for about a minute, putting arrays,
calling functions (one executor pulling from the other), fetching results and deleting buffers.

Afterwards nothing is lost (every computation submitted completed with the right result or
failed with a clear error) and nothing leaks: each executor holds as many buffers and buffer
bytes as before the load, and its resident memory is back near the level measured after a
warm-up phase (a leak check with a tolerance, not a timing). Select it with ``-m soak``; it
runs in ``make test`` like every test.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from conftest import executor_infos, export, f32, increment, settled_executor_infos

from pathways_client.island_client import IslandClient, IslandError
from pathways_client.launcher import LocalIsland
from pathways_core.wire import pb

pytestmark = pytest.mark.soak

CLIENTS = 8
WARM_UP_SECONDS = 10.0
LOAD_SECONDS = 50.0
# Resident memory may end this much above the warm baseline (allocator slack, thread stacks
# touched, caches of the runtime): a leak of buffers or of per-computation state goes past it.
RSS_SLACK_BYTES = 64 << 20
SETTLE_SECONDS = 60.0  # deletions are asynchronous: how long the buffer count may take to settle

INCREMENT = increment()
ADD = export(lambda x, y: x + y, f32(4), f32(4))


@dataclass
class Tally:
    """What one client submitted and how each computation ended."""

    submitted: int = 0
    completed: int = 0  # with the right result
    failed_clearly: Counter[str] = field(default_factory=Counter)  # expected, clear errors
    problems: list[str] = field(default_factory=list)  # anything else: the test fails


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")


@dataclass
class Rendezvous:
    """Clients stop at ``done`` with their sessions open (what they deleted must be gone
    before any session closes: closing would delete the rest), and close after ``release``."""

    done: threading.Barrier
    release: threading.Barrier

    def wait(self, timeout: float) -> None:
        for barrier in (self.done, self.release):
            try:
                barrier.wait(timeout)
            except threading.BrokenBarrierError:
                return


def _client_loop(
    endpoint: str,
    name: str,
    weight: int,
    seconds: float,
    tally: Tally,
    seed: int,
    rendezvous: Rendezvous,
) -> None:
    """One client: rounds of put, increment, add (on the other executor half the time), get,
    delete; every fifth round also a computation refused by the executor for a wrong input."""
    rng = np.random.default_rng(seed)
    with IslandClient(endpoint, name, weight=weight) as client:
        try:
            _rounds(client, name, seconds, tally, rng)
        finally:
            rendezvous.wait(seconds + 300)


def _rounds(
    client: IslandClient, name: str, seconds: float, tally: Tally, rng: np.random.Generator
) -> None:
    """The rounds of one client until ``seconds`` have passed."""
    increment = client.register(INCREMENT, "increment")
    add = client.register(ADD, "add")
    wrong = client.put(np.zeros(3, np.int32), device=int(rng.integers(4)))
    stop = time.monotonic() + seconds
    round_ = 0
    while time.monotonic() < stop:
        round_ += 1
        first, second = int(rng.integers(4)), int(rng.integers(4))
        value = rng.standard_normal(4).astype(np.float32)
        try:
            x = client.put(value, device=first)
            with client.batch():  # the pair crosses to the scheduler as one message
                a = client.submit(increment, [first], [x], 1, name="increment")
                b = client.submit(add, [second], [a.outputs[0], x], 1, name="add")
            tally.submitted += 2
            if round_ % 2:
                b.wait(120)
            result = client.get(b.outputs[0], timeout=120)  # waits for it when need be
            a.wait(120)
            if np.allclose(result, 2 * value + 1, rtol=1e-5, atol=1e-6):  # float32 rounding
                tally.completed += 2
            else:
                tally.problems.append(f"{name}: {value} gave {result}")
            client.delete([x, *a.outputs, *b.outputs])
            if round_ % 5 == 0:
                bad = client.submit(increment, [second], [wrong], 1, name="wrong-input")
                tally.submitted += 1
                try:
                    bad.wait(120)
                    tally.problems.append(f"{name}: a wrong input was accepted")
                except IslandError as error:
                    if "input 0 of function 'increment' is int32[3]" in str(error):
                        tally.failed_clearly["wrong input"] += 1
                    else:
                        tally.problems.append(f"{name}: unclear error {error}")
                client.delete(list(bad.outputs))
        except (IslandError, TimeoutError) as error:
            tally.problems.append(f"{name}: round {round_}: {type(error).__name__}: {error}")
            return
    client.delete([wrong])


def _load(
    island: LocalIsland, seconds: float, phase: str
) -> tuple[list[Tally], list[pb.ExecutorInfo]]:
    """Run the clients for ``seconds``; returns their tallies and the executors' information
    once the buffer counts settled, taken while every session was still open."""
    tallies = [Tally() for _ in range(CLIENTS)]
    rendezvous = Rendezvous(threading.Barrier(CLIENTS + 1), threading.Barrier(CLIENTS + 1))
    threads = [
        threading.Thread(
            target=_client_loop,
            args=(
                island.scheduler_endpoint,
                f"{phase}-{n}",
                n + 1,
                seconds,
                tallies[n],
                n,
                rendezvous,
            ),
            name=f"{phase}-{n}",
            daemon=True,
        )
        for n in range(CLIENTS)
    ]
    for thread in threads:
        thread.start()
    rendezvous.done.wait(seconds + 300)
    open_sessions = settled_executor_infos(island, [0] * len(island.executors), SETTLE_SECONDS)
    rendezvous.release.wait(60)
    for thread in threads:
        thread.join(seconds + 300)  # bounded: a hung client fails the test below
        assert not thread.is_alive(), f"{thread.name} did not finish"
    return tallies, open_sessions


def test_an_island_under_a_minute_of_load_loses_nothing_and_leaks_nothing(
    compilation_cache: Path,
) -> None:
    island = LocalIsland(
        hosts=2,
        devices_per_host=2,
        policy="proportional-share",
        compilation_cache=compilation_cache,
    )
    with island:
        start = executor_infos(island)
        empty = [info.buffers for info in start]
        assert empty == [0] * len(island.executors)
        # Warm-up: every function compiled for every device, the runtime's pools grown.
        tallies, _ = _load(island, WARM_UP_SECONDS, "warm")
        for tally in tallies:
            assert not tally.problems, tally.problems
        warm = settled_executor_infos(island, empty, SETTLE_SECONDS)
        assert [i.buffers for i in warm] == empty, warm
        baseline = [_rss(process.popen.pid) for process in island.executors]

        began = time.monotonic()
        tallies, open_sessions = _load(island, LOAD_SECONDS, "soak")
        elapsed = time.monotonic() - began

        submitted = sum(t.submitted for t in tallies)
        completed = sum(t.completed for t in tallies)
        failed = sum(sum(t.failed_clearly.values()) for t in tallies)
        problems = [p for t in tallies for p in t.problems]
        print(
            f"soak: {submitted} computations in {elapsed:.0f} s by {CLIENTS} clients "
            f"({submitted / elapsed:.0f}/s): {completed} right, {failed} refused as expected"
        )
        assert not problems, problems[:10]
        assert all(t.completed > 0 for t in tallies), [t.completed for t in tallies]
        assert completed + failed == submitted  # none lost
        # What the clients deleted is gone while their sessions are open (pulled copies too) ...
        assert [i.buffers for i in open_sessions] == empty, open_sessions
        # ... and after they closed.
        after = settled_executor_infos(island, empty, SETTLE_SECONDS)
        assert [i.buffers for i in after] == [i.buffers for i in start], after
        assert [i.buffer_bytes for i in after] == [i.buffer_bytes for i in start], after
        for process, before in zip(island.executors, baseline, strict=True):
            now = _rss(process.popen.pid)
            print(f"{process.name}: resident {before >> 20} MiB warm, {now >> 20} MiB after")
            assert now <= before + RSS_SLACK_BYTES, (process.name, before, now)
