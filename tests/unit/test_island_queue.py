"""The island queue's policies: FIFO, proportional share and priorities (pure, no network)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pathways_core.scheduling import (
    DEFAULT_RUN_LENGTH,
    IslandQueue,
    Policy,
    QueueFull,
    UnknownClient,
)


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


@pytest.mark.parametrize("run_length", [DEFAULT_RUN_LENGTH, 16])
@pytest.mark.parametrize("weights", [(1, 1, 1, 1), (1, 2, 4, 8)])
def test_proportional_share_matches_weights_within_one_percent(weights, run_length) -> None:
    queue: IslandQueue[int] = IslandQueue(
        Policy.PROPORTIONAL_SHARE, max_queued=200_000, run_length=run_length
    )
    clients = [f"c{w}-{i}" for i, w in enumerate(weights)]
    for client, weight in zip(clients, weights, strict=True):
        queue.add_client(client, weight)
        for n in range(40_000):
            queue.submit(client, n)
    # Runs make a share off by at most one run at any moment: 1% of 2,000 items (the smallest
    # share of 30,000) is 20.
    taken = [client for client, _ in (queue.next() for _ in range(30_000))]
    for client, weight in zip(clients, weights, strict=True):
        share = taken.count(client) / len(taken)
        assert share == pytest.approx(weight / sum(weights), rel=0.01)


def test_costs_are_charged_by_device_time() -> None:
    queue: IslandQueue[int] = IslandQueue(Policy.PROPORTIONAL_SHARE, run_length=1)
    queue.add_client("big")
    queue.add_client("small")
    for n in range(100):
        queue.submit("big", n, cost=4.0)
        queue.submit("small", n, cost=1.0)
    taken = [client for client, _ in (queue.next() for _ in range(50))]
    # Equal weights share device time: four small computations per big one.
    assert taken.count("small") == pytest.approx(4 * taken.count("big"), abs=4)


def test_an_idle_client_cannot_claim_time_it_did_not_use() -> None:
    queue: IslandQueue[int] = IslandQueue(Policy.PROPORTIONAL_SHARE, run_length=1)
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


def test_a_client_held_cannot_claim_the_time_others_ran_meanwhile() -> None:
    """Work held (reading another island's buffer not made yet) is idle time, as a client's
    empty queue is: released, its client alternated with the others, where it used to take
    the devices for as long as it had been held."""
    queue: IslandQueue[str] = IslandQueue(Policy.PROPORTIONAL_SHARE, run_length=1)
    queue.add_client("busy")
    queue.add_client("held")
    for n in range(100):
        queue.submit("busy", f"busy{n}")
        queue.submit("held", f"held{n}")
    waiting = {"held0"}
    first = [queue.next(lambda item: item in waiting) for _ in range(50)]
    assert all(client == "busy" for client, _ in first)
    waiting.clear()  # made over there
    taken = [client for client, _ in (queue.next(lambda item: item in waiting) for _ in range(20))]
    assert 8 <= taken.count("held") <= 12  # alternates, no burst of 50


@pytest.mark.parametrize("with_deletions", [False, True])
def test_a_client_keeps_the_devices_for_a_run_then_yields(with_deletions) -> None:
    # A chain frees each intermediate once its consumer is queued: a deletion (cost 0) follows
    # every computation, and the run still holds run_length computations.
    queue: IslandQueue[str] = IslandQueue(Policy.PROPORTIONAL_SHARE, run_length=3)
    for client in ("a", "b"):
        queue.add_client(client)
        for n in range(6):
            queue.submit(client, f"{client}{n}")
            if with_deletions:
                queue.submit(client, f"{client}-delete{n}", cost=0.0, bounded=False)
    computations = [client for client, item in drain(queue) if "delete" not in item]
    assert "".join(computations) == "aaabbbaaabbb"


@pytest.mark.parametrize("policy", list(Policy))
def test_a_free_item_goes_right_behind_its_clients_item_before_it(policy) -> None:
    """Chains of three clients, each computation followed by the deletion of its input: every
    deletion comes out right after the computation before it (at once, though other clients'
    computations wait and the policy interleaves clients), and only then the next client's
    work. ``next_free`` takes only such an item."""
    queue: IslandQueue[str] = IslandQueue(policy)
    for client in "abc":
        queue.add_client(client, priority=2 if client == "c" else 0)
    for n in range(4):
        for client in "abc":
            queue.submit(client, f"{client}{n}")
            queue.submit(client, f"{client}-delete{n}", cost=0.0, bounded=False)
    assert queue.next_free() is None  # nothing taken yet
    taken = [item for _, item in drain(queue)]
    for position, item in enumerate(taken):
        if "delete" in item:
            assert taken[position - 1] == item.replace("-delete", "")
    assert taken[:8] == ["c0", "c-delete0", "c1", "c-delete1", "c2", "c-delete2", "c3", "c-delete3"]
    assert sorted(taken[8:]) == sorted(
        f"{x}{y}{n}" for x in "ab" for y in ("", "-delete") for n in range(4)
    )
    queue.submit("a", "a4")
    assert queue.next_free() is None  # a computation is not free
    assert queue.next() == ("a", "a4")


def test_a_client_arriving_waits_for_at_most_one_run() -> None:
    queue: IslandQueue[int] = IslandQueue(Policy.PROPORTIONAL_SHARE, run_length=16)
    queue.add_client("busy")
    queue.add_client("late")
    for n in range(200):
        queue.submit("busy", n)
    for _ in range(5):
        queue.next()  # a run of "busy" has begun
    for n in range(100):
        queue.submit("late", n)
    taken = [client for client, _ in (queue.next() for _ in range(64))]
    assert taken.index("late") == 11  # the rest of the run
    assert taken[11:27] == ["late"] * 16 and taken[27:43] == ["busy"] * 16


def test_a_higher_prioritys_burst_gives_a_newcomer_no_wait_behind_a_waiting_client() -> None:
    # The burst raised the one virtual time; the waiting client's pass did not move, so a
    # client arriving after the burst waited behind all of it (598 items of 600 measured).
    queue: IslandQueue[int] = IslandQueue(Policy.PROPORTIONAL_SHARE)
    for name, priority in (("waiting", 0), ("newcomer", 0), ("burst", 10)):
        queue.add_client(name, priority=priority)
    for n in range(1000):
        queue.submit("waiting", n)
    for n in range(600):
        queue.submit("burst", n)
    assert {client for client, _ in (queue.next() for _ in range(600))} == {"burst"}
    queue.submit("newcomer", 0)
    taken = [client for client, _ in (queue.next() for _ in range(3))]
    assert "newcomer" in taken


def test_a_client_arriving_beside_heavier_ones_waits_about_a_run_not_their_catch_up() -> None:
    # The run's holder raised the virtual time past the lighter client still waiting: one
    # joining then waited until that one caught up (75 items of a median, runs of 16).
    queue: IslandQueue[int] = IslandQueue(
        Policy.PROPORTIONAL_SHARE, max_queued=20_000, run_length=16
    )
    queue.add_client("w1", weight=1)
    queue.add_client("w8", weight=8)
    queue.add_client("interactive", weight=8)
    for n in range(5000):
        queue.submit("w1", n)
        queue.submit("w8", n)
    waits = []
    for n in range(20):
        for _ in range(37):  # the others run a while
            queue.next()
        queue.submit("interactive", n)
        waited = 0
        while queue.next()[0] != "interactive":  # type: ignore[index]
            waited += 1
        waits.append(waited)
    assert max(waits) <= 32, waits


def test_a_higher_priority_ends_a_run() -> None:
    queue: IslandQueue[str] = IslandQueue(Policy.PROPORTIONAL_SHARE, run_length=16)
    queue.add_client("low", priority=0)
    queue.add_client("high", priority=5)
    for n in range(4):
        queue.submit("low", f"l{n}")
    assert queue.next() == ("low", "l0")
    queue.submit("high", "h0")
    assert [item for _, item in drain(queue)] == ["h0", "l1", "l2", "l3"]


def test_runs_must_be_at_least_one_item() -> None:
    with pytest.raises(ValueError, match="run_length must be >= 1"):
        IslandQueue(run_length=0)


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


@pytest.mark.parametrize(
    ("max_queued", "per_client", "submissions", "refused"),
    [
        # one client floods: it stops at its own bound, well before the island's
        (8, 2, ["a", "a", "a", "a"], [(2, True), (3, True)]),
        # others still get in while one client is at its bound
        (8, 2, ["a", "a", "a", "b", "b", "c"], [(2, True)]),
        # the island's bound holds over all clients together
        (3, 2, ["a", "a", "b", "b", "c"], [(3, False), (4, False)]),
        # no per-client bound given: the island's bound only
        (3, None, ["a", "a", "a", "a"], [(3, False)]),
    ],
    ids=["one-floods", "others-get-in", "island-full", "island-bound-only"],
)
def test_per_client_and_island_bounds(max_queued, per_client, submissions, refused) -> None:
    queue: IslandQueue[int] = IslandQueue(Policy.FIFO, max_queued, per_client)
    for client in "abc":
        queue.add_client(client)
    seen = []
    for index, client in enumerate(submissions):
        try:
            queue.submit(client, index)
        except QueueFull as full:
            seen.append((index, full.per_client))
            assert full.client == client
            assert full.limit == (queue.max_queued_per_client if full.per_client else max_queued)
    assert seen == refused
    assert queue.queued == len(submissions) - len(refused)


def test_unbounded_items_are_never_refused_and_do_not_count() -> None:
    queue: IslandQueue[str] = IslandQueue(Policy.FIFO, max_queued=2, max_queued_per_client=1)
    queue.add_client("a")
    queue.submit("a", "c1")
    for n in range(5):
        queue.submit("a", f"delete{n}", cost=0.0, bounded=False)
    assert queue.queued == 6 and queue.queued_by("a") == 1
    assert queue.last("a") == "delete4"
    with pytest.raises(QueueFull):
        queue.submit("a", "c2")
    assert [item for _, item in drain(queue)][:2] == ["c1", "delete0"]
    queue.submit("a", "c2")  # room again once taken


@pytest.mark.parametrize(("max_queued", "per_client"), [(0, None), (4, 0)])
def test_bounds_must_be_positive(max_queued, per_client) -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        IslandQueue(Policy.FIFO, max_queued, per_client)


@settings(max_examples=150, deadline=None)
@given(
    max_queued=st.integers(1, 12),
    per_client=st.integers(1, 12),
    steps=st.lists(st.tuples(st.sampled_from("abc"), st.booleans()), max_size=80),
)
def test_bounds_hold_and_refusals_change_nothing(max_queued, per_client, steps) -> None:
    """Random submissions (True) and takes (False): neither bound is ever exceeded, a refusal
    leaves the queue as it was, and a client is refused only when it or the island is full."""
    queue: IslandQueue[int] = IslandQueue(Policy.PROPORTIONAL_SHARE, max_queued, per_client)
    for client in "abc":
        queue.add_client(client)
    bound = min(per_client, max_queued)
    held = {client: 0 for client in "abc"}
    for number, (client, submit) in enumerate(steps):
        if submit:
            before = queue.queued
            try:
                queue.submit(client, number)
                held[client] += 1
            except QueueFull as full:
                assert queue.queued == before
                assert (
                    held[client] >= bound if full.per_client else sum(held.values()) >= max_queued
                )
        elif (taken := queue.next()) is not None:
            held[taken[0]] -= 1
        assert all(queue.queued_by(c) == held[c] <= bound for c in "abc")
        assert queue.queued == sum(held.values()) <= max_queued


def _raised_after_its_priority_waited(queue: IslandQueue[int]) -> None:
    # "other" runs alone at priority 1 (its pass reaches 2,000) while "mover" waits at 0.
    queue.add_client("other", priority=1)
    queue.add_client("mover", priority=0)
    for n in range(5000):
        queue.submit("other", n)
        queue.submit("mover", n)
    for _ in range(2000):
        queue.next()
    queue.add_client("mover", priority=1)


def _raised_after_a_long_run_of_its_own(queue: IslandQueue[int]) -> None:
    # "mover" ran alone at priority 0 (its pass 2,000); priority 1 has barely begun.
    queue.add_client("mover", priority=0)
    queue.add_client("other", priority=1)
    for n in range(5000):
        queue.submit("mover", n)
    for _ in range(2000):
        queue.next()
    for n in range(5000):
        queue.submit("other", n)
    queue.add_client("mover", priority=1)


def _lowered_after_a_long_run(queue: IslandQueue[int]) -> None:
    # "mover" ran alone at priority 1 (its pass 2,000), then moves down beside "other".
    queue.add_client("mover", priority=1)
    queue.add_client("other", priority=0)
    for n in range(2000):
        queue.submit("mover", n)
    for n in range(5000):
        queue.submit("other", n)
    for _ in range(2000):
        queue.next()
    for n in range(5000):
        queue.submit("mover", n)
    queue.add_client("mover", priority=0)


@pytest.mark.parametrize(
    "setup",
    [
        _raised_after_its_priority_waited,
        _raised_after_a_long_run_of_its_own,
        _lowered_after_a_long_run,
    ],
)
def test_a_client_changing_priority_shares_equally_with_its_new_priority(
    setup: Callable[[IslandQueue[int]], None],
) -> None:
    """A pass means something against its own priority's virtual time: kept across a move,
    the mover took 400 items in a row (or none of 400)."""
    queue: IslandQueue[int] = IslandQueue(Policy.PROPORTIONAL_SHARE, max_queued=100_000)
    setup(queue)
    taken = [client for client, _ in (queue.next() for _ in range(400))]
    assert 199 <= taken.count("mover") <= 201
    streaks = "".join("m" if client == "mover" else "o" for client in taken)
    assert "mmm" not in streaks and "ooo" not in streaks  # turns from the start


def test_a_client_lowering_its_weight_pays_for_what_it_ran_at_the_old_one() -> None:
    """Its lead was kept in the old weight's units: an item that cost it 1 at weight 100 was
    then as cheap at weight 1, and it ran the next as soon (100 device-seconds to 1)."""
    queue: IslandQueue[int] = IslandQueue(Policy.PROPORTIONAL_SHARE)
    queue.add_client("mover", weight=100)
    queue.add_client("other", weight=1)
    for n in range(200):
        queue.submit("mover", n, cost=100.0)
        queue.submit("other", n, cost=1.0)
    assert queue.next() == ("mover", 0)
    queue.add_client("mover", weight=1)  # equal weights from now on
    taken = [client for client, _ in (queue.next() for _ in range(101))]
    assert taken[:100] == ["other"] * 100  # the 100 s the mover ran ahead, then turns
    assert taken[100] == "mover"


def test_a_prioritys_virtual_time_goes_with_its_last_client() -> None:
    queue: IslandQueue[int] = IslandQueue(Policy.PROPORTIONAL_SHARE)
    for priority in range(100):
        queue.add_client(f"c{priority}", priority=priority)
        queue.submit(f"c{priority}", 0)
        queue.next()
        if priority % 2:
            queue.remove_client(f"c{priority}")
        else:
            queue.add_client(f"c{priority}", priority=-1)  # moves away
    assert set(queue._virtual_time) <= {-1}
    queue.add_client("late", priority=5)
    queue.submit("late", 0)
    assert queue.next() == ("late", 0)
