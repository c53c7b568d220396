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


def test_a_stream_closed_while_a_reply_is_written_drops_what_its_client_left() -> None:
    """gRPC closes a session's reply generator at its ``yield`` when the client dies while a
    reply is written (GeneratorExit, not a cancellation): the session was closed, its state
    freed, and its worker ran every request left queued against it (43,000 failures logged)."""
    import asyncio

    from pathways_client.proxy.server import SESSION_METADATA_KEY, ProxyConfig, ProxyServer

    backend = _Backend()
    server = ProxyServer(ProxyConfig(backend))  # type: ignore[arg-type]
    metadata = P.GrpcIfrtSessionMetadata()
    metadata.version.protocol_version = 25

    class _Context:
        def invocation_metadata(self) -> list[tuple[str, bytes]]:
            return [(SESSION_METADATA_KEY, metadata.SerializeToString())]

        def peer(self) -> str:
            return "ipv4:127.0.0.1:1"

        async def abort(self, code: Any, message: str) -> None:
            raise AssertionError(message)

    async def requests() -> Any:
        for op in range(300):  # 3 s of work, queued
            request = P.IfrtRequest()
            request.request_metadata.op_id = op + 1
            request.check_value_ready_request.SetInParent()
            yield request
        await asyncio.sleep(3600)  # the client is gone: its stream never ends

    async def session() -> None:
        replies = server.ifrt_session(requests(), _Context())  # type: ignore[arg-type]
        await replies.__anext__()  # one reply written; the generator waits at its yield
        await replies.aclose()  # the next write failed
        await asyncio.sleep(1)

    asyncio.run(session())
    handled = backend.state.handled
    time.sleep(1)
    assert handled < 50 and backend.state.handled - handled < 5
