"""A session whose client went away drops the requests it left queued instead of running
each (a killed training loop's 100,000 queued steps each failed and were logged, at 100% of
a core for 17 s, while other sessions ran)."""

from __future__ import annotations

import threading
import time
from typing import Any

from raw_client import P

from pathways_client.proxy.session import Session


class _Slow:
    """A session state whose every request takes 10 ms."""

    def __init__(self) -> None:
        self.handled = 0
        self.first = threading.Event()

    def handle_check_value_ready_request(self, request: Any) -> Any:
        self.first.set()
        time.sleep(0.01)
        self.handled += 1
        return P.CheckValueReadyResponse()

    def close(self) -> None:
        pass


class _Backend:
    def __init__(self) -> None:
        self.state = _Slow()

    def open_session(self, session: Session) -> _Slow:
        return self.state


def test_requests_left_queued_by_a_client_that_went_away_are_dropped() -> None:
    backend = _Backend()
    replies: list[Any] = []
    version = P.IfrtProxyVersion(protocol_version=25, ifrt_serdes_version_number=3)
    session = Session(1, P, version, backend, replies.append)  # type: ignore[arg-type]
    for op in range(500):  # 5 s of work, queued
        request = P.IfrtRequest()
        request.request_metadata.op_id = op
        request.check_value_ready_request.SetInParent()
        session.submit(request)
    assert backend.state.first.wait(10)
    session.abandon()
    began = time.monotonic()
    session.drain(timeout=30)
    assert time.monotonic() - began < 2
    assert backend.state.handled < 20 and len(replies) < 20
    session.close()
