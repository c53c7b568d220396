"""The scheduler's shell around its dispatcher: the order in which one stimulus's messages
leave for their peers."""

from __future__ import annotations

import threading

import pytest

from pathways_core.scheduling import ToClient, ToExecutor
from pathways_core.scheduling.island import TraceRecord
from pathways_core.wire import pb
from pathways_scheduler.server import MAX_HOLD_SECONDS, HeldCompletions, SchedulerService


class RecordingPeer:
    def __init__(self, name: str, flushed: list[str]) -> None:
        self.name, self.flushed, self.queued = name, flushed, []

    def queue(self, message: object) -> None:
        self.queued.append(message)

    def flush(self) -> None:
        self.flushed.append(self.name)


def test_executors_sent_only_deletions_hear_after_those_sent_work() -> None:
    """A client's batch often frees its last call's results before its next call: the
    executor running the call's first node is written to first, whatever came before."""
    flushed: list[str] = []
    service = SchedulerService.__new__(SchedulerService)  # the shell alone, no executors
    service._lock, service.dispatcher = threading.Lock(), None
    service._executors = {i: RecordingPeer(f"executor {i}", flushed) for i in range(3)}
    service._clients = {"a": RecordingPeer("client a", flushed)}
    delete = pb.ExecutorCommand(seq=1, delete=pb.DeleteBuffers(ids=["a/r1"]))
    call = pb.ExecutorCommand(seq=2, call=pb.ProgramCall(id="a/p2"))
    service._handle(
        lambda dispatcher: [
            ToExecutor(1, delete),
            ToExecutor(2, delete),
            ToExecutor(0, call),
            ToExecutor(1, call),
            ToClient("a", pb.ClientEvent(kind=pb.ClientEvent.COMPLETED)),
        ]
    )
    assert flushed == ["executor 0", "executor 1", "client a", "executor 2"]
    assert [c.WhichOneof("kind") for c in service._executors[1].queued] == ["delete", "call"]


def test_a_deferrable_event_waits_for_the_clients_next_and_leaves_with_it_in_order() -> None:
    """A completion the dispatcher lets wait is queued for its client without waking it; the
    client's next event that may not wait takes it along, in order."""
    flushed: list[str] = []
    service = SchedulerService.__new__(SchedulerService)
    service._lock, service.dispatcher = threading.Lock(), None
    service._executors = {}
    service._clients = {name: RecordingPeer(f"client {name}", flushed) for name in "ab"}
    held: list[RecordingPeer] = []
    service._held = type("Held", (), {"hold": staticmethod(held.append)})()

    def completed(client: str, name: str, deferrable: bool) -> ToClient:
        event = pb.ClientEvent(kind=pb.ClientEvent.COMPLETED, computation_id=name)
        return ToClient(client, event, deferrable)

    service._handle(lambda dispatcher: [completed("a", "a/1", True), completed("b", "b/1", False)])
    service._handle(lambda dispatcher: [completed("a", "a/2", True)])
    assert flushed == ["client b"]
    service._handle(lambda dispatcher: [completed("a", "a/3", False)])
    assert flushed == ["client b", "client a"]
    assert [e.computation_id for e in service._clients["a"].queued] == ["a/1", "a/2", "a/3"]
    assert held == [service._clients["a"]] * 2  # flushed MAX_HOLD_SECONDS later at the latest


def test_a_held_completion_goes_out_after_max_hold_seconds_at_the_latest() -> None:
    """With no next event it waited for the client's other computations, seconds long."""
    flushed: list[str] = []
    peer = RecordingPeer("client a", flushed)
    held = HeldCompletions()
    held.hold(peer)
    held.hold(peer)  # one flush for a run of holds
    deadline = threading.Event()
    deadline.wait(MAX_HOLD_SECONDS + 0.5)
    assert flushed == ["client a"]


def test_get_trace_makes_its_records_without_holding_up_dispatch() -> None:
    """Made under the dispatch lock, a call-heavy trace's records (seconds for a few hundred
    thousand) stalled every client and executor of the island meanwhile."""
    service = SchedulerService.__new__(SchedulerService)
    service._lock = threading.Lock()
    record = TraceRecord(1, "a/1", "a", "f", (0,), 0, 10, 20, True)
    making, made = threading.Event(), threading.Event()

    class Dispatcher:
        def trace_entries(self, clients: object = ()) -> tuple[TraceRecord, ...]:
            return (record,)

        def trace_dropped_until_ns(self) -> dict[str, int]:
            return {"a": 5}

        def records_of(self, entries: tuple[TraceRecord, ...]) -> list[TraceRecord]:
            making.set()
            made.wait(10)
            return list(entries)

    service.dispatcher = Dispatcher()
    answers: list[pb.Trace] = []
    reader = threading.Thread(target=lambda: answers.append(service.GetTrace(None, None)))
    reader.start()
    assert making.wait(10)
    free = service._lock.acquire(timeout=5)  # as dispatch would, meanwhile
    made.set()
    reader.join(10)
    assert free
    assert [r.computation_id for r in answers[0].records] == ["a/1"]
    assert dict(answers[0].dropped_until_ns) == {"a": 5}


def test_get_trace_answers_the_clients_asked_for_and_at_most_what_one_message_holds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every client's whole trace in one answer: long names made it larger than a gRPC
    message, and no one's trace could be read."""
    from pathways_core.scheduling import ExecutorSpec, IslandDispatcher
    from pathways_scheduler import server

    service = SchedulerService.__new__(SchedulerService)
    service._lock = threading.Lock()
    service.dispatcher = IslandDispatcher([ExecutorSpec(0, "h:0", (0,))], trace_limit=1000)
    for n in range(100):
        for client in ("mine", "other"):
            record = TraceRecord(n, f"{client}/{n}", client, "x" * 200, (0,), 0, n, n + 1, True)
            service.dispatcher._keep(record, 1)
    mine = service.GetTrace(pb.TraceRequest(clients=["mine"], since_ns=10), None)
    assert [r.seq for r in mine.records] == list(range(10, 100))
    assert {r.client for r in mine.records} == {"mine"}
    monkeypatch.setattr(server, "MAX_TRACE_ANSWER_BYTES", 30 * 300)
    capped = service.GetTrace(pb.TraceRequest(clients=["mine"]), None)
    size = sum(record.ByteSize() + 8 for record in capped.records)
    assert size <= 30 * 300 < size + 300 and len(capped.records) < 100
    assert capped.records[-1].seq == 99  # the newest
    assert dict(capped.dropped_until_ns) == {"mine": capped.records[0].seq}
