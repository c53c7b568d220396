"""The elastic manager's decisions, against a stand-in cluster: which slices are lost (the
scheduler's word, a probe, a session that ended) and which came back, which failures are
retried, and its arguments checked."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

import pathways_client.elastic as elastic
from pathways_client.errors import ConnectError, NodeFailed, SliceError
from pathways_client.slices import Slice
from pathways_core.wire import pb


@dataclass
class Session:
    """What the manager reads of an island session."""

    executors: int = 2
    lost_executors: dict[int, str] = field(default_factory=dict)
    ended: str = ""

    @property
    def info(self) -> pb.IslandInfo:
        return pb.IslandInfo(
            executors=[
                pb.ExecutorInfo(index=i, endpoint=f"h:{i}", devices=[2 * i, 2 * i + 1])
                for i in range(self.executors)
            ]
        )

    @property
    def device_owner(self) -> dict[int, int]:
        return {d: i for i in range(self.executors) for d in (2 * i, 2 * i + 1)}


@dataclass
class Cluster:
    """Sessions of ``sessions`` are open; an island of ``down`` has none, and its scheduler
    does not answer: opening one is a ConnectError, as pathways_client.Cluster's."""

    sessions: dict[str, Session]
    overdue: dict[str, str] = field(default_factory=dict)  # slice -> why its lease may be out
    down: set[str] = field(default_factory=set)
    closed: bool = False
    opening: list[str] = field(default_factory=list)  # islands session() was asked to open

    @property
    def islands(self) -> dict[str, str]:
        return {name: f"{name}-scheduler:8470" for name in [*self.sessions, *self.down]}

    def session(self, island: str) -> Session:
        if self.closed:
            raise ConnectError("this connection was closed")
        if island not in self.sessions:
            self.opening.append(island)
        if island in self.down:
            raise ConnectError(f"island {island!r} at {self.islands[island]} did not answer")
        return self.sessions[island]

    def open_session(self, island: str) -> Session | None:
        return None if self.closed else self.sessions.get(island)

    def check_lease(self, item: Slice) -> None:
        if item.name in self.overdue:
            raise SliceError(f"slice {item.name!r} cannot be used: {self.overdue[item.name]}")


def slices() -> list[Slice]:
    return [Slice("a", "one", (0, 1), (2,)), Slice("b", "one", (2, 3), (2,))]


@pytest.fixture
def answering(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """Endpoints whose executors answer the manager's probe (all of them to start with)."""
    alive = {"h:0", "h:1"}
    monkeypatch.setattr(elastic, "_answers", lambda endpoint: endpoint in alive)
    # Schedulers answer the probe: whether a session opens is the stand-in cluster's to say.
    monkeypatch.setattr(elastic, "_scheduler_answers", lambda endpoint: True)
    return alive


def failure() -> NodeFailed:
    return NodeFailed("step", "one", "executor 1 is unreachable")


def test_an_executor_the_scheduler_lost_is_lost_even_if_it_answers(answering) -> None:
    # Something answers at its endpoint, but the scheduler has not taken it back (yet).
    session = Session(lost_executors={1: "executor 1 is unreachable"})
    manager = elastic.Manager(Cluster({"one": session}), slices())  # type: ignore[arg-type]
    assert [s.name for s in manager.find_lost()] == ["b"]
    assert [s.name for s in manager.available] == ["a"]


def test_a_session_that_ended_loses_every_slice_of_its_island(answering) -> None:
    cluster = Cluster({"one": Session(ended="the scheduler closed the session")})
    manager = elastic.Manager(cluster, slices())  # type: ignore[arg-type]
    assert [s.name for s in manager.find_lost()] == ["a", "b"]


def test_a_loss_found_by_another_function_of_the_manager_is_retried(answering) -> None:
    manager = elastic.Manager(Cluster({"one": Session()}), slices())  # type: ignore[arg-type]
    seen = []

    @manager.elastic_retry
    def evaluate() -> str:
        seen.append([s.name for s in manager.available])
        if len(seen) == 1:
            answering.discard("h:1")
            manager.find_lost()  # a training loop sharing the manager found it first
            raise failure()
        return "done"

    assert evaluate() == "done"
    assert seen == [["a", "b"], ["a"]]
    assert manager.events[0][2] == ["b"]


def test_a_failure_on_slices_still_alive_is_raised_at_once(answering) -> None:
    manager = elastic.Manager(Cluster({"one": Session()}), slices())  # type: ignore[arg-type]
    answering.discard("h:1")
    manager.find_lost()  # lost before the function began: its failure is not that loss

    @manager.elastic_retry(max_retries=3)
    def step() -> None:
        raise failure()

    with pytest.raises(NodeFailed):
        step()
    assert manager.events == []


def test_a_nested_retry_giving_up_is_a_loss_for_the_outer_one(answering) -> None:
    manager = elastic.Manager(Cluster({"one": Session()}), slices())  # type: ignore[arg-type]
    attempts = []

    @manager.elastic_retry(max_retries=5)
    def outer() -> int:
        @manager.elastic_retry(max_retries=0)
        def inner() -> int:
            attempts.append(len(manager.available))
            if len(attempts) == 1:
                answering.discard("h:1")
                raise failure()
            return len(manager.available)

        return inner()

    assert outer() == 1
    assert attempts == [2, 1]


def test_a_stopped_host_timing_out_is_a_loss(answering) -> None:
    manager = elastic.Manager(Cluster({"one": Session()}), slices())  # type: ignore[arg-type]

    @manager.elastic_retry(max_retries=1)
    def step() -> int:
        if "h:1" in answering:
            answering.discard("h:1")  # stopped: it answers no probe
            raise TimeoutError("'step' was not computed within 5 s")
        return len(manager.available)

    assert step() == 1


def test_retries_used_up_say_so_in_good_english(answering) -> None:
    cluster = Cluster({"one": Session(executors=3)})
    answering.add("h:2")
    three = [*slices(), Slice("c", "one", (4, 5), (2,))]
    manager = elastic.Manager(cluster, three)  # type: ignore[arg-type]

    @manager.elastic_retry(max_retries=1)
    def step() -> None:
        answering.discard(f"h:{3 - len(manager.available) + 1}")  # loses one host per attempt
        raise failure()

    with pytest.raises(elastic.SlicesLost, match=r"\(1 left\) after 1 retry: "):
        step()


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        ("2", TypeError, "max_retries: expected an int >= 0, got '2'"),
        (None, TypeError, "max_retries: expected an int >= 0, got None"),
        (1.5, TypeError, "got 1.5"),
        (True, TypeError, "got True"),
        (-1, ValueError, "max_retries: expected an int >= 0, got -1"),
    ],
)
def test_max_retries_is_checked_when_decorating(value, error, message) -> None:
    manager = elastic.Manager(Cluster({"one": Session()}), slices())  # type: ignore[arg-type]
    with pytest.raises(error, match=message):
        manager.elastic_retry(max_retries=value)


def test_slices_must_be_given_each_once() -> None:
    cluster = Cluster({"one": Session()})
    with pytest.raises(ValueError, match="at least one slice"):
        elastic.Manager(cluster, [])  # type: ignore[arg-type]
    a, b = slices()
    with pytest.raises(ValueError, match=r"\['a'\] appear twice"):
        elastic.Manager(cluster, [a, a, b])  # type: ignore[arg-type]


def test_a_lost_slice_comes_back_once_its_executor_is_taken_back(answering) -> None:
    session = Session(lost_executors={1: "executor 1 is unreachable"})
    manager = elastic.Manager(Cluster({"one": session}), slices())  # type: ignore[arg-type]
    manager.find_lost()
    assert manager.find_returned() == []  # answering, but not taken back by the scheduler
    with pytest.raises(
        TimeoutError, match=r"1 of 2 slices available after 0 s; still lost: \['b'\]"
    ):
        manager.wait_for_slices(timeout=0)
    assert manager.wait_for_slices(count=1, timeout=0) == manager.slices[:1]
    session.lost_executors = {}  # restarted and taken back
    assert [s.name for s in manager.wait_for_slices(timeout=0)] == ["a", "b"]
    assert manager.lost == []


def test_waiting_for_slices_whose_session_ended_fails_at_once(answering) -> None:
    """They never come back on this connection: without a timeout it waited for ever."""
    two = {"one": Session(), "two": Session()}
    items = [Slice("a", "one", (0, 1), (2,)), Slice("b", "two", (0, 1), (2,))]
    manager = elastic.Manager(Cluster(two), items)  # type: ignore[arg-type]
    two["two"].ended = "the scheduler restarted"
    # Not looked for first (it returned both, the dead one as available).
    assert manager.wait_for_slices(count=1) == items[:1]  # one can come back: enough
    with pytest.raises(
        elastic.SlicesLost, match=r"1 of the 2 slices asked for can come back"
    ) as lost:
        manager.wait_for_slices(timeout=5, poll_interval=0.1)  # (5 s: it waited them out)
    assert "['b'] are gone for good (b: the scheduler restarted); connect again" in str(lost.value)
    assert [item.name for item in lost.value.lost] == ["b"]


def test_a_taken_back_executor_that_does_not_answer_stays_lost(answering) -> None:
    manager = elastic.Manager(Cluster({"one": Session()}), slices())  # type: ignore[arg-type]
    answering.discard("h:1")
    manager.find_lost()
    assert manager.find_returned() == []
    answering.add("h:1")
    assert [s.name for s in manager.find_returned()] == ["b"]


def test_a_retry_takes_back_the_slices_that_came_back(answering) -> None:
    session = Session()
    manager = elastic.Manager(Cluster({"one": session}), slices())  # type: ignore[arg-type]
    seen = []

    def restarted(attempt, error, lost) -> None:
        session.lost_executors = {}  # the kubelet restarted it before the retry

    @manager.elastic_retry(max_retries=1, on_elastic_event=restarted)
    def step() -> None:
        seen.append([s.name for s in manager.available])
        if len(seen) == 1:
            session.lost_executors = {1: "executor 1 is unreachable"}
            raise failure()

    step()
    assert seen == [["a", "b"], ["a", "b"]]


@pytest.mark.parametrize(
    ("count", "message"),
    [
        (3, "3 slices asked for; the manager has 2"),
        (-1, "expected an int >= 0, got -1"),
        (True, "expected an int >= 0, got True"),
    ],
)
def test_wait_for_slices_checks_its_count(count, message) -> None:
    manager = elastic.Manager(Cluster({"one": Session()}), slices())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=message):
        manager.wait_for_slices(count=count, timeout=0)


def test_a_slice_the_cluster_released_is_lost_for_good_and_retried(answering) -> None:
    """A slice whose lease ran out, or that was deleted, failed the function with SliceError,
    raised at once: it was not taken for a loss, and waits counted it as available."""
    cluster = Cluster({"one": Session()})
    manager = elastic.Manager(cluster, slices())  # type: ignore[arg-type]
    calls = []

    @manager.elastic_retry(max_retries=1)
    def train() -> list[str]:
        calls.append([item.name for item in manager.available])
        if len(calls) == 1:
            manager.slices[0].lost = "no virtual slice named 'a'"
            manager.slices[0].released = True
            raise SliceError("slice 'a' was released by the cluster: no virtual slice named 'a'")
        return calls[-1]

    assert train() == ["b"] and calls == [["a", "b"], ["b"]]
    assert manager.find_returned() == []  # never comes back, whatever its executors do
    with pytest.raises(elastic.SlicesLost, match=r"\['a'\] are gone for good \(a: released by"):
        manager.wait_for_slices(timeout=5, poll_interval=0.1)


def test_a_slice_whose_lease_is_overdue_is_lost_until_it_is_renewed(answering) -> None:
    cluster = Cluster({"one": Session()}, overdue={"b": "its lease was last renewed 20 s ago"})
    manager = elastic.Manager(cluster, slices())  # type: ignore[arg-type]
    assert [item.name for item in manager.find_lost()] == ["b"]
    assert manager.find_returned() == []
    cluster.overdue.clear()  # a renewal went through: its devices were never given away
    assert [item.name for item in manager.find_returned()] == ["b"]


def two_islands(down: str) -> tuple[Cluster, list[Slice]]:
    """Slice a on island one (open), b on island two, whose session was never opened: its
    scheduler is down (``down="two"``), or not."""
    cluster = Cluster({"one": Session()}, down={down} if down else set())
    return cluster, [Slice("a", "one", (0, 1), (2,)), Slice("b", "two", (0, 1), (2,))]


def test_an_island_whose_session_cannot_be_opened_loses_its_slices(answering) -> None:
    """Cluster.session()'s ConnectError escaped find_lost() and elastic_retry: the step was
    never retried on the healthy island's slice."""
    cluster, items = two_islands(down="two")
    manager = elastic.Manager(cluster, items)  # type: ignore[arg-type]
    calls = []

    @manager.elastic_retry(max_retries=2)
    def train() -> list[str]:
        calls.append([item.name for item in manager.available])
        for item in manager.available:
            cluster.session(item.island)  # the step's work on each slice
        return calls[-1]

    assert train() == ["a"]
    assert calls == [["a", "b"], ["a"]]
    assert [item.name for item in manager.lost] == ["b"]
    assert "did not answer" in manager.events[0][1]


def test_a_slice_whose_scheduler_was_down_comes_back_when_it_answers(answering) -> None:
    cluster, items = two_islands(down="two")
    manager = elastic.Manager(cluster, items)  # type: ignore[arg-type]
    assert [item.name for item in manager.find_lost()] == ["b"]
    assert manager.find_returned() == []
    # Not gone for good (nothing was held there): a timeout, not SlicesLost at once.
    with pytest.raises(TimeoutError, match=r"still lost: \['b'\]"):
        manager.wait_for_slices(timeout=0)
    assert manager.wait_for_slices(count=1, timeout=0) == items[:1]
    cluster.down.clear()  # the scheduler is back: a session opens
    cluster.sessions["two"] = Session()
    assert manager.wait_for_slices(timeout=0) == items


def test_a_scheduler_that_does_not_answer_the_probe_is_not_waited_for(
    answering, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opening a session waits up to a minute for a scheduler that is down; a probe of a
    few seconds tells first."""
    cluster, items = two_islands(down="two")
    manager = elastic.Manager(cluster, items)  # type: ignore[arg-type]
    probed: list[str] = []
    monkeypatch.setattr(
        elastic, "_scheduler_answers", lambda endpoint: probed.append(endpoint) or False
    )
    assert [item.name for item in manager.find_lost()] == ["b"]
    assert manager.find_returned() == []
    assert probed == ["two-scheduler:8470"] * 2 and cluster.opening == []


def test_a_closed_connection_is_a_connect_error_not_a_loss(answering) -> None:
    cluster, items = two_islands(down="")
    manager = elastic.Manager(cluster, items)  # type: ignore[arg-type]
    cluster.closed = True
    with pytest.raises(ConnectError, match="connection was closed"):
        manager.find_lost()
    assert manager.lost == []
