"""Proportional share charges work its function's measured device time: the running averages
(pure), and shares of device time in the dispatcher when tenants' functions take unlike."""

from __future__ import annotations

import hashlib

import pytest
from test_dispatcher import island, to_executors

from pathways_core.scheduling.costs import (
    MIN_NS_PER_DEVICE,
    RECENT,
    SETTLED,
    STEADY,
    DeviceTimeCosts,
)
from pathways_core.scheduling.queue import IslandQueue
from pathways_core.wire import pb


def test_a_functions_price_is_set_from_its_runs_a_few_times_then_stays() -> None:
    costs = DeviceTimeCosts(limit=2)
    assert costs.cost("f", 4) == 4 * MIN_NS_PER_DEVICE  # nothing measured yet: next to nothing
    costs.measured("f", 4, 150_000_000)  # its first run (compiling) is not counted
    for device_ns in (400_000, 420_000, 380_000, 30_000_000, 400_000, 400_000, 410_000):
        costs.measured("f", 4, device_ns)
        assert costs.cost("f", 4) == 4 * MIN_NS_PER_DEVICE  # fewer than SETTLED runs
    costs.measured("f", 4, 390_000)  # the SETTLED-th: the median of them, a held-up one aside
    assert costs.cost("f", 4) == pytest.approx(400_000)
    assert costs.cost("g", 2) == pytest.approx(2 * 400_000 / 4)  # the island's typical
    costs.measured("f", 4, 0)  # a report with no times measures nothing
    for _ in range(SETTLED):  # the mean moves within STEADY: the price stays
        costs.measured("f", 4, 460_000)
    assert costs.cost("f", 4) == pytest.approx(400_000)
    costs.measured("f", 4, 300_000_000)  # held up by the host: counts as OUTLIER x the mean
    for _ in range(8 * RECENT):  # the runs changed: the price follows at its next looks
        costs.measured("f", 4, 100_000)
    assert costs.cost("f", 4) <= 100_000 / (1 - STEADY)  # within a step of the new mean
    costs.measured("h", 1, 10)
    for _ in range(SETTLED):
        costs.measured("h", 1, 10)
    assert costs.cost("h", 1) == MIN_NS_PER_DEVICE  # never free
    for _ in range(SETTLED + 1):
        costs.measured("k", 1, 5_000)  # past the limit the least recently measured goes
    assert costs.cost("f", 4) != pytest.approx(100_000, rel=STEADY)
    costs.forget("k")
    assert costs.cost("k", 1) != 5_000


def test_queued_work_pays_what_its_function_costs_when_it_is_taken() -> None:
    """Charged when queued, a tenant keeping hundreds queued paid the warm-up's prices long
    after: the lightest of 1:2:4:8 got 5.3% of the island, not 6.7%."""
    queue = IslandQueue("proportional-share", price=lambda item: 1.0)
    for client in "ab":
        queue.add_client(client)
    for n in (1, 2):
        queue.submit("a", f"a{n}", cost=100.0)  # its price when queued: the warm-up's
        queue.submit("b", f"b{n}", cost=1.0)
    assert [queue.next()[1] for _ in range(4)] == ["a1", "b1", "a2", "b2"]  # a paid 1, not 100


def register(dispatcher, client: str, artifact: bytes) -> str:
    function_id = hashlib.sha256(artifact).hexdigest()
    dispatcher.register(client, pb.FunctionRegistration(function_id=function_id, artifact=artifact))
    return function_id


@pytest.mark.parametrize("weights", [(1, 1), (1, 3)])
def test_shares_of_device_time_follow_the_weights_when_functions_take_unlike(weights) -> None:
    """Charged by devices alone, a tenant whose computations took ten times longer got ten
    times the device time of one of equal weight."""
    dispatcher = island(max_in_flight=1, policy="proportional-share")
    durations = {"a": 10_000_000, "b": 1_000_000}  # ns: a's function takes 10x longer
    functions = {}
    for client, weight in zip("ab", weights, strict=True):
        dispatcher.connect(client, weight)
        functions[client] = register(dispatcher, client, f"{client}'s function".encode())
    clock, ran = 0, []
    pending = {client: 0 for client in "ab"}

    def keep_queued(client: str) -> list:
        """Each client keeps 8 computations queued, as a tenant running ahead does."""
        sent = []
        while pending[client] < 8:
            n = len(ran) * 10 + pending[client]
            pending[client] += 1
            work = pb.Computation(
                id=f"{client}/c{n}-{clock}",
                function_id=functions[client],
                devices=[0],
                outputs=[f"{client}/o{n}-{clock}"],
            )
            sent += to_executors(dispatcher.submit(client, work))
        return sent

    sent = keep_queued("a") + keep_queued("b")
    for _ in range(400):
        (run,) = [command for _, command in sent if command.WhichOneof("kind") == "run"]
        client = run.run.id[0]
        duration = durations[client]
        event = pb.ExecutorEvent(
            seq=run.seq, executor=0, ok=True, start_ns=clock, end_ns=clock + duration
        )
        clock += duration
        ran.append((client, duration))
        pending[client] -= 1
        sent = to_executors(dispatcher.executor_event(event))
        sent += keep_queued(client)
    window = ran[50:]  # past the first measurements
    time = {c: sum(d for who, d in window if who == c) for c in "ab"}
    share = time["a"] / (time["a"] + time["b"])
    assert share == pytest.approx(weights[0] / sum(weights), abs=0.03)
