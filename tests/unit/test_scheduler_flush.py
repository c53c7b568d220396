"""The scheduler's shell around its dispatcher: the order in which one stimulus's messages
leave for their peers."""

from __future__ import annotations

import threading

from pathways_core.scheduling import ToClient, ToExecutor
from pathways_core.wire import pb
from pathways_scheduler.server import SchedulerService


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
