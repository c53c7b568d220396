"""The island queue's policies: FIFO, proportional share and priorities (pure, no network)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pathways_core.scheduling import IslandQueue, Policy, QueueFull, UnknownClient


def drain(queue: IslandQueue, limit: int = 10_000) -> list[tuple[str, object]]:
    taken = []
    while (item := queue.next()) is not None and len(taken) < limit:
        taken.append(item)
    return taken


def test_fifo_keeps_arrival_order_across_clients() -> None:
    queue: IslandQueue[str] = IslandQueue(Policy.FIFO)
    for client in ("a", "b"):
        queue.add_client(client)
    for client, item in [("a", "a1"), ("b", "b1"), ("a", "a2"), ("b", "b2")]:
        queue.submit(client, item)
    assert [item for _, item in drain(queue)] == ["a1", "b1", "a2", "b2"]


@pytest.mark.parametrize("weights", [(1, 1, 1, 1), (1, 2, 4, 8)])
def test_proportional_share_matches_weights_within_one_percent(weights) -> None:
    queue: IslandQueue[int] = IslandQueue(Policy.PROPORTIONAL_SHARE, max_queued=100_000)
    clients = [f"c{w}-{i}" for i, w in enumerate(weights)]
    for client, weight in zip(clients, weights, strict=True):
        queue.add_client(client, weight)
        for n in range(2000):
            queue.submit(client, n)
    taken = [client for client, _ in (queue.next() for _ in range(1500))]
    for client, weight in zip(clients, weights, strict=True):
        share = taken.count(client) / len(taken)
        assert share == pytest.approx(weight / sum(weights), rel=0.01)


def test_costs_are_charged_by_device_time() -> None:
    queue: IslandQueue[int] = IslandQueue(Policy.PROPORTIONAL_SHARE)
    queue.add_client("big")
    queue.add_client("small")
    for n in range(100):
        queue.submit("big", n, cost=4.0)
        queue.submit("small", n, cost=1.0)
    taken = [client for client, _ in (queue.next() for _ in range(50))]
    # Equal weights share device time: four small computations per big one.
    assert taken.count("small") == pytest.approx(4 * taken.count("big"), abs=4)


def test_an_idle_client_cannot_claim_time_it_did_not_use() -> None:
    queue: IslandQueue[int] = IslandQueue(Policy.PROPORTIONAL_SHARE)
    queue.add_client("busy")
    queue.add_client("late")
    for n in range(100):
        queue.submit("busy", n)
    drain_first = [queue.next() for _ in range(50)]
    assert all(client == "busy" for client, _ in drain_first)
    for n in range(100):
        queue.submit("late", n)
    taken = [client for client, _ in (queue.next() for _ in range(20))]
    assert 8 <= taken.count("late") <= 12  # alternates, no burst of 50


def test_higher_priority_goes_first_under_both_policies() -> None:
    for policy in Policy:
        queue: IslandQueue[str] = IslandQueue(policy)
        queue.add_client("low", priority=0)
        queue.add_client("high", priority=5)
        queue.submit("low", "l1")
        queue.submit("high", "h1")
        queue.submit("high", "h2")
        assert [item for _, item in drain(queue)] == ["h1", "h2", "l1"]


def test_queue_is_bounded_and_clients_must_say_hello() -> None:
    queue: IslandQueue[int] = IslandQueue(max_queued=2)
    queue.add_client("a")
    queue.submit("a", 1)
    queue.submit("a", 2)
    with pytest.raises(QueueFull):
        queue.submit("a", 3)
    with pytest.raises(UnknownClient):
        queue.submit("nobody", 1)
    with pytest.raises(ValueError, match="weight"):
        queue.add_client("b", weight=0)
    assert queue.remove_client("a") == [1, 2]
    assert queue.queued == 0


@settings(max_examples=150, deadline=None)
@given(
    policy=st.sampled_from(list(Policy)),
    clients=st.lists(st.tuples(st.integers(1, 8), st.integers(0, 2)), min_size=1, max_size=4),
    submissions=st.lists(st.integers(0, 3), max_size=60),
)
def test_every_item_comes_out_once_and_each_client_keeps_its_order(
    policy, clients, submissions
) -> None:
    queue: IslandQueue[tuple[int, int]] = IslandQueue(policy, max_queued=1000)
    for index, (weight, priority) in enumerate(clients):
        queue.add_client(str(index), weight, priority)
    sent = []
    for number, pick in enumerate(submissions):
        client = pick % len(clients)
        queue.submit(str(client), (client, number))
        sent.append((client, number))
    taken = [item for _, item in drain(queue)]
    assert sorted(taken) == sorted(sent)
    for client in range(len(clients)):
        mine = [number for owner, number in taken if owner == client]
        assert mine == sorted(mine)
    # Priority is strict: no lower-priority item precedes a higher-priority one.
    priorities = [clients[owner][1] for owner, _ in taken]
    assert priorities == sorted(priorities, reverse=True)
