"""One IFRT proxy session: a client's requests, handled in order, and its host buffers.

Requests arrive on the session's stream and are handled strictly in arrival order on one thread
(the client relies on it: it names the arrays it creates, then uses those names in its next
requests without waiting). A handler answers at once, or with a future for requests whose answer
waits on the devices (``CheckFuture``, ``CheckValueReady``, ``CopyToHostBuffer``, ...); those
replies are sent when ready, possibly out of order, matched by ``op_id``.

A request that fails is answered with its ``op_id`` and a status naming what was wrong; the
session and the server go on serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np

from pathways_client.proxy.backend import Backend
from pathways_client.proxy.errors import ProxyError, code_number

log = logging.getLogger(__name__)
_STOP = object()
DELETED_KEPT = 65_536
"""Deleted host buffer handles a session remembers, so a lookup of one fails at once."""


class HostBuffers:
    """A session's host buffer store: bytes (1-D ``uint8`` arrays) by client-chosen handle;
    lookups wait for stores (a thread's, or a coroutine's without holding a thread)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._data: dict[int, np.ndarray] = {}
        # Handles deleted: a lookup of one fails at once instead of waiting for a store.
        # (The latest DELETED_KEPT: the stock client never reuses a handle, and a set of all of
        # them grew by two entries a step of a training loop, for the session's life.)
        self._deleted: dict[int, None] = {}
        self._closed = ""
        # Coroutines waiting for a handle: each a future of its event loop, set when it changes.
        self._waiters: dict[int, list[tuple[asyncio.AbstractEventLoop, asyncio.Future]]] = {}

    def store(self, handle: int, data: np.ndarray) -> str:
        """Keep ``data`` under ``handle``; returns an error message, or "" when stored."""
        with self._cond:
            if self._closed:
                return self._closed
            if handle in self._data or handle in self._deleted:
                return f"host buffer handle {handle} already exists"
            self._data[handle] = data
            self._changed(handle)
        return ""

    def _answer(self, handle: int) -> np.ndarray | str | None:
        """The bytes or why there are none; ``None`` while a store may still come (locked)."""
        if handle in self._data:
            return self._data[handle]
        if self._closed:
            return self._closed
        if handle in self._deleted:
            return f"host buffer handle {handle} was deleted"
        return None

    def lookup(self, handle: int, timeout: float) -> np.ndarray | str:
        """The bytes under ``handle``, waiting up to ``timeout`` for a store still in flight."""
        with self._cond:
            self._cond.wait_for(lambda: self._answer(handle) is not None, timeout)
            answer = self._answer(handle)
        return _not_found(handle, timeout) if answer is None else answer

    async def lookup_async(self, handle: int, timeout: float) -> np.ndarray | str:
        """:meth:`lookup` for a coroutine: it waits holding no thread."""
        loop = asyncio.get_running_loop()
        with self._cond:
            answer = self._answer(handle)
            if answer is not None:
                return answer
            waiter = loop.create_future()
            self._waiters.setdefault(handle, []).append((loop, waiter))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(waiter, timeout)
        with self._cond:
            waiting = self._waiters.get(handle, [])
            if (loop, waiter) in waiting:
                waiting.remove((loop, waiter))
                if not waiting:
                    del self._waiters[handle]
            answer = self._answer(handle)
        return _not_found(handle, timeout) if answer is None else answer

    def take(self, handle: int, timeout: float) -> np.ndarray:
        """Look up and delete ``handle`` (a buffer consumed by an array); raise if missing."""
        data = self.lookup(handle, timeout)
        if isinstance(data, str):
            raise ProxyError("NOT_FOUND", data)
        self.delete(handle)
        return data

    def delete(self, handle: int) -> str:
        """Forget ``handle``; returns an error message, or "" when deleted."""
        with self._cond:
            if self._data.pop(handle, None) is None:
                return f"host buffer handle {handle} not found"
            self._deleted[handle] = None
            if len(self._deleted) > DELETED_KEPT:
                del self._deleted[next(iter(self._deleted))]  # the oldest
            self._changed(handle)
        return ""

    def close(self, reason: str) -> None:
        """Drop every buffer; pending and later lookups fail with ``reason``."""
        with self._cond:
            self._closed = reason
            self._data.clear()
            for handle in list(self._waiters):
                self._changed(handle)
            # Threads waiting in lookup or take too (they waited out their 120 s).
            self._cond.notify_all()

    def _changed(self, handle: int) -> None:
        """Wake the threads and coroutines waiting (locked)."""
        self._cond.notify_all()
        for loop, waiter in self._waiters.pop(handle, ()):
            loop.call_soon_threadsafe(_wake, waiter)

    def __len__(self) -> int:
        with self._cond:
            return len(self._data)


def _wake(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _not_found(handle: int, timeout: float) -> str:
    return f"host buffer handle {handle} not found (waited {timeout:.0f} s)"


class Session:
    """The server side of one ``IfrtSession`` stream."""

    def __init__(
        self,
        session_id: int,
        protocol: Any,
        version: Any,
        backend: Backend,
        reply: Callable[[Any], None],
        peer: str = "",
        lookup_timeout: float = 120.0,
        number: int = 0,
    ) -> None:
        self.session_id = session_id
        # The id is the session's only credential on the host buffer calls (the stock client
        # presents nothing else): logs, thread and client names show this ordinal instead.
        self.number = number or session_id
        self.protocol = protocol
        self.protocol_version = version.protocol_version
        self.serdes_version = version.ifrt_serdes_version_number
        self.peer = peer
        self.host_buffers = HostBuffers()
        self.lookup_timeout = lookup_timeout
        self._reply = reply
        self._queue: queue.Queue[Any] = queue.Queue()
        self._pending = 0
        self._pending_cond = threading.Condition()
        # The client went away: the requests it left queued are dropped, not run (a killed
        # training loop's 100,000 queued steps each failed, logged, at 100% CPU for 17 s).
        self._abandoned = False
        self.state = backend.open_session(self)
        self._worker = threading.Thread(
            target=self._loop, name=f"proxy-session-{self.number}-worker", daemon=True
        )
        self._worker.start()

    # -- the stream side -----------------------------------------------------------------------

    def submit(self, request: Any) -> None:
        """Queue a request read from the stream."""
        with self._pending_cond:
            self._pending += 1
        self._queue.put(request)

    def abandon(self) -> None:
        """The stream broke (the client is gone): drop what it left queued."""
        if not self._abandoned:
            self._abandoned = True
            with self._pending_cond:
                left = self._pending
            if left:
                log.info(
                    "session %d: dropping %d requests its client left queued", self.number, left
                )

    def drain(self, timeout: float = 60.0) -> None:
        """Wait until every queued request was answered (the stream's end)."""
        with self._pending_cond:
            self._pending_cond.wait_for(lambda: self._pending == 0, timeout)

    def close(self) -> None:
        """End the session: stop the worker, free the backend's arrays and the host buffers."""
        self._queue.put(_STOP)
        self.host_buffers.close(f"session {self.number} has ended")
        try:
            self.state.close()
        except Exception:
            log.exception("session %d: backend close failed", self.number)

    # -- processing ----------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            request = self._queue.get()
            if request is _STOP:
                return
            if self._abandoned:
                self._done_one()
                continue
            self._handle(request)

    def _handle(self, request: Any) -> None:
        op_id = request.request_metadata.op_id
        kind = request.WhichOneof("request")
        try:
            if kind is None:
                raise ProxyError("INVALID_ARGUMENT", "IfrtRequest has no request set")
            handler = getattr(self.state, f"handle_{kind}", None)
            if handler is None:
                raise ProxyError(
                    "UNIMPLEMENTED", f"{kind} is not supported by the Pathways proxy yet"
                )
            result = handler(getattr(request, kind))
        except ProxyError as exc:
            self._fail_results(request, kind, exc)
            self._send_error(op_id, kind, exc.code, exc.message)
            return
        except Exception as exc:
            log.exception("session %d: %s failed", self.number, kind)
            self._send_error(op_id, kind, "INTERNAL", f"{type(exc).__name__}: {exc}")
            return
        if isinstance(result, Future):
            result.add_done_callback(lambda f: self._finish_future(op_id, kind, f))
        else:
            self._send(op_id, kind, result)

    def _fail_results(self, request: Any, kind: str | None, error: ProxyError) -> None:
        """The arrays a failed request named for its results (``result_handles``) carry its
        error, so the client's next use of them says why (not "unknown handle")."""
        handles = list(getattr(getattr(request, kind, None), "result_handles", ()) if kind else ())
        put_error = getattr(self.state, "put_error", None)
        if handles and put_error is not None:
            put_error(handles, error)

    def _finish_future(self, op_id: int, kind: str | None, future: Future) -> None:
        try:
            result = future.result()
        except ProxyError as exc:
            self._send_error(op_id, kind, exc.code, exc.message)
            return
        except Exception as exc:
            self._send_error(op_id, kind, "INTERNAL", f"{type(exc).__name__}: {exc}")
            return
        self._send(op_id, kind, result)

    def _send(self, op_id: int, kind: str | None, message: Any) -> None:
        response = self.protocol.IfrtResponse()
        response.response_metadata.op_id = op_id
        assert kind is not None
        getattr(response, kind.removesuffix("_request") + "_response").CopyFrom(message)
        self._emit(response)

    def _send_error(self, op_id: int, kind: str | None, code: str, message: str) -> None:
        if kind:
            log.info("session %d: %s (op %d) failed: %s", self.number, kind, op_id, message)
        response = self.protocol.IfrtResponse()
        response.response_metadata.op_id = op_id
        response.response_metadata.status.code = code_number(code)
        response.response_metadata.status.message = message
        self._emit(response)

    def _emit(self, response: Any) -> None:
        self._reply(response)
        self._done_one()

    def _done_one(self) -> None:
        """A queued request is answered (or dropped)."""
        with self._pending_cond:
            self._pending -= 1
            self._pending_cond.notify_all()
