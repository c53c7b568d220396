"""The executor's bulk data plane: serves buffers over raw TCP and pulls them from peers."""

from __future__ import annotations

import contextlib
import functools
import math
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from pathways_core.wire import bulk
from pathways_core.wire.arrays import Assembly
from pathways_core.wire.streams import HANDSHAKE_TIMEOUT_SECONDS
from pathways_executor.arrays import held_whole, local_regions
from pathways_executor.buffers import not_ready
from pathways_executor.tls import Tls

# Replies up to this size are sent in one write, header and bytes together.
SMALL_REPLY_BYTES = 64 << 10
# A connection's first request must come this soon; a kept connection may idle this long
# between requests (a peer whose kept connection was closed reconnects); a request's rest must
# follow its length prefix this soon; a reply stalled this long without progress is dropped.
IDLE_TIMEOUT_SECONDS = 300.0
REQUEST_TIMEOUT_SECONDS = 10.0
SEND_TIMEOUT_SECONDS = 60
# A request may ask to wait at most this long for a buffer.
MAX_LOOKUP_SECONDS = 600.0
MAX_BUFFER_ID = 4096
# How long a pull whose connection failed waits to be told its peer's executor was lost: the
# scheduler tells at once, but after the death cut the connection, and the failure should name
# the loss (clients tell it apart: IslandUnavailable), not only the connection's end.
PEER_LOSS_WAIT_SECONDS = 5.0


class DataPlaneServer:
    """Answers one request per connection with the regions of a buffer this host holds."""

    def __init__(
        self,
        lookup: Callable[[str, float, float | None], Any],
        host: str = "127.0.0.1",
        tls: Tls | None = None,
        sent: Callable[[int], None] = lambda size: None,
    ) -> None:
        """``sent`` is told the size of every array sent."""
        self._lookup = lookup
        self._tls = tls
        self._sent = sent
        self._listener = socket.create_server((host, 0), backlog=64)
        self.endpoint = f"{host}:{self._listener.getsockname()[1]}"
        threading.Thread(
            target=accept_forever,
            args=(self._listener, self._serve),
            name="data-plane",
            daemon=True,
        ).start()

    def _serve(self, connection: socket.socket) -> None:
        """Answer requests on a connection, one after the other, until the peer closes it: a
        peer keeps its connections, so a transfer on the critical path of a pipeline pays
        neither a connection nor a thread of its own."""
        if self._tls is not None:
            try:  # a peer without our CA's certificate gets nothing
                connection = self._tls.accept(connection)
            except OSError:
                connection.close()
                return
        with connection:
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            connection.setsockopt(
                socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", SEND_TIMEOUT_SECONDS, 0)
            )
            # A peer asks at once after connecting, and a kept connection idles a while: a
            # connection that sends nothing (or half a request) holds its thread briefly.
            wait = HANDSHAKE_TIMEOUT_SECONDS
            try:
                while True:
                    connection.settimeout(wait)
                    prefix = _receive_prefix(connection)
                    if not prefix:
                        return
                    connection.settimeout(REQUEST_TIMEOUT_SECONDS)
                    try:
                        length = bulk.header_length(prefix)
                        buffer_id, timeout, appear = _parse_request(
                            _receive_exactly(connection, length)
                        )
                    except (ValueError, KeyError, TypeError) as error:
                        # Not our peer's request: say why, then hang up (out of step).
                        connection.sendall(bulk.error(f"bad data-plane request: {error}"))
                        return
                    connection.settimeout(None)  # replies: SO_SNDTIMEO bounds a stalled peer
                    self._reply(connection, buffer_id, timeout, appear)
                    wait = IDLE_TIMEOUT_SECONDS
            except OSError:
                return

    def _reply(
        self, connection: socket.socket, buffer_id: str, timeout: float, appear: float | None
    ) -> None:
        try:
            value = self._lookup(buffer_id, timeout, appear)
            whole = held_whole(value)
            regions = local_regions(value) if whole is None else []
        except Exception as error:  # unknown, failed or late buffer: tell the peer
            connection.sendall(bulk.error(str(error)))
            return
        if whole is not None:  # the common case: one region, its header made once per layout
            header = _whole_header(whole.dtype, whole.shape)
            if whole.nbytes <= SMALL_REPLY_BYTES:
                # A small array leaves in one write with its header: one wake-up of the peer.
                connection.sendall(header + whole.tobytes())
                self._sent(whole.nbytes)
                return
            payloads = [np.ascontiguousarray(whole).reshape(-1).view(np.uint8)]
        else:
            headers = [
                bulk.RegionHeader(
                    tuple(s.start for s in region),
                    tuple(s.stop for s in region),
                    np.asarray(values).nbytes,
                )
                for region, values in regions
            ]
            header = bulk.reply(_dtype_name(value.dtype), value.shape, headers)
            payloads = [np.ascontiguousarray(v).reshape(-1).view(np.uint8) for _, v in regions]
        connection.sendall(header)
        for payload in payloads:
            if payload.nbytes:
                connection.sendall(memoryview(payload))
        self._sent(sum(payload.nbytes for payload in payloads))

    def close(self) -> None:
        self._listener.close()


@functools.cache
def _dtype_name(dtype: Any) -> str:
    """``np.dtype(dtype).name``, which costs ~7 µs a time."""
    return np.dtype(dtype).name


@functools.lru_cache(maxsize=1024)
def _whole_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """The reply header of a whole array (as many layouts as a host's programs use, so the
    ~15 µs of building it are paid once each rather than on every transfer)."""
    region = bulk.RegionHeader((0,) * len(shape), shape, math.prod(shape) * dtype.itemsize)
    return bulk.reply(_dtype_name(dtype), shape, [region])


def _parse_request(data: bytes) -> tuple[str, float, float | None]:
    """A request's buffer id, timeout and time to wait for the buffer to be announced (None:
    the server's default); ``ValueError`` naming what is wrong."""
    try:
        buffer_id, timeout, appear = bulk.parse_request(data)
    except (KeyError, TypeError, AttributeError, RecursionError) as error:
        raise ValueError(f"expected {{'buffer': id, 'timeout': seconds}}: {error!r}") from None
    if not buffer_id or len(buffer_id) > MAX_BUFFER_ID:
        raise ValueError(f"buffer must hold 1 to {MAX_BUFFER_ID} characters")
    for name, seconds in (("timeout", timeout), ("appear", appear)):
        if seconds is not None and (not math.isfinite(seconds) or seconds < 0):
            raise ValueError(f"{name} must be a finite number >= 0, not {seconds}")
    limited = None if appear is None else min(appear, MAX_LOOKUP_SECONDS)
    return buffer_id, min(timeout, MAX_LOOKUP_SECONDS), limited


def accept_forever(listener: socket.socket, serve: Callable[[socket.socket], None]) -> None:
    """Serve each connection of ``listener`` on a thread of its own until it is closed."""
    while True:
        try:
            connection, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=serve, args=(connection,), daemon=True).start()


class Puller:
    """Pulls over kept connections, one per pull in progress and peer, opened when none is
    idle: connecting (and the peer starting a thread) is then off the critical path."""

    def __init__(self, tls: Tls | None = None) -> None:
        self._tls = tls
        self._lock = threading.Lock()
        self._idle: dict[str, list[socket.socket]] = {}
        self._busy: dict[str, set[socket.socket]] = {}
        self._down: dict[str, str] = {}  # endpoint -> why its executor is lost
        self._loss_told = threading.Condition(self._lock)

    def down(self, endpoint: str, reason: str) -> None:
        """The executor at ``endpoint`` is lost: pulls from it in progress end now, and later
        ones fail at once, with ``reason``."""
        with self._lock:
            self._down[endpoint] = reason
            self._loss_told.notify_all()
            connections = [*self._idle.pop(endpoint, []), *self._busy.get(endpoint, ())]
        for connection in connections:
            with contextlib.suppress(OSError):  # wakes the pull waiting on it
                socket.socket.shutdown(connection, socket.SHUT_RDWR)

    def up(self, endpoint: str) -> None:
        """A restarted executor listens at ``endpoint`` (perhaps where the lost one did): pulls
        from it may go again."""
        with self._lock:
            self._down.pop(endpoint, None)

    def _check_up(self, endpoint: str) -> None:
        reason = self._down.get(endpoint)
        if reason is not None:
            raise ConnectionError(reason)

    def pull(
        self,
        endpoint: str,
        buffer_id: str,
        timeout: float,
        assembly: Assembly,
        appear_within: float | None = None,
        *,
        until_ready: bool = False,
    ) -> None:
        """Receive the regions of a buffer held at ``endpoint`` into ``assembly``, straight
        from the socket into the destination's memory (the holder waiting up to
        ``appear_within`` s for it to be announced, if given); an error reply
        (``LookupError``) leaves the connection usable. ``until_ready``: a buffer the holder
        has not computed within ``timeout`` is asked for again, for as long as the holder
        answers (its loss, told by ``down``, ends the wait): it waits for its producer, which
        may run long (another tenant's step on the holder's devices) and fails it if it
        fails."""
        while True:
            try:
                self._pull_once(endpoint, buffer_id, timeout, assembly, appear_within)
                return
            except LookupError as error:
                if not (until_ready and str(error).startswith(not_ready(buffer_id))):
                    raise

    def _pull_once(
        self,
        endpoint: str,
        buffer_id: str,
        timeout: float,
        assembly: Assembly,
        appear_within: float | None,
    ) -> None:
        exchange = functools.partial(
            _request,
            buffer_id=buffer_id,
            request=bulk.request(buffer_id, timeout, appear_within),
            timeout=timeout,
            assembly=assembly,
        )
        with self._lock:
            self._check_up(endpoint)
            idle = self._idle.get(endpoint)
            connection = idle.pop() if idle else None
        try:
            if connection is not None:
                try:
                    self._pull_on(endpoint, connection, exchange)
                    return
                except _Stale:
                    pass  # the peer closed the kept connection before replying: once more, fresh
            self._pull_on(endpoint, _connect(endpoint, timeout, self._tls), exchange)
        except OSError:
            self._await_loss(endpoint)
            raise

    def _await_loss(self, endpoint: str) -> None:
        """Raise why the executor at ``endpoint`` was lost if told so within
        PEER_LOSS_WAIT_SECONDS (a pull it failed by dying)."""
        with self._loss_told:
            self._loss_told.wait_for(lambda: endpoint in self._down, PEER_LOSS_WAIT_SECONDS)
        self._check_up(endpoint)

    def _pull_on(
        self, endpoint: str, connection: socket.socket, exchange: Callable[[socket.socket], None]
    ) -> None:
        with self._lock:
            try:
                self._check_up(endpoint)  # lost while this connection was being opened
            except ConnectionError:
                connection.close()
                raise
            self._busy.setdefault(endpoint, set()).add(connection)
        try:
            exchange(connection)
        except LookupError:  # the peer's error reply: the connection is still in step
            self._keep(endpoint, connection)
            raise
        except BaseException:
            self._forget(endpoint, connection)
            connection.close()
            self._check_up(endpoint)  # ended by down(): say why
            raise
        self._keep(endpoint, connection)

    def _forget(self, endpoint: str, connection: socket.socket) -> None:
        with self._lock:
            self._busy.get(endpoint, set()).discard(connection)

    def _keep(self, endpoint: str, connection: socket.socket) -> None:
        self._forget(endpoint, connection)
        with self._lock:
            if endpoint in self._down:
                connection.close()
            else:
                self._idle.setdefault(endpoint, []).append(connection)

    def close(self) -> None:
        with self._lock:
            connections = [c for idle in self._idle.values() for c in idle]
            self._idle.clear()
        for connection in connections:
            connection.close()


class _Stale(ConnectionError):
    """A kept connection failed before any byte of the reply arrived."""


def _connect(endpoint: str, timeout: float, tls: Tls | None = None) -> socket.socket:
    host, port = endpoint.rsplit(":", 1)
    connection = socket.create_connection((host, int(port)), timeout=timeout + 30)
    connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if tls is not None:
        try:
            return tls.connect(connection, host)
        except OSError:
            connection.close()
            raise
    return connection


def _request(
    connection: socket.socket, buffer_id: str, request: bytes, timeout: float, assembly: Assembly
) -> None:
    connection.settimeout(timeout + 30)
    try:
        connection.sendall(request)
        prefix = _receive_prefix(connection)
    except OSError as error:
        raise _Stale(str(error)) from error
    if not prefix:
        raise _Stale("the peer closed the data-plane connection")
    length = bulk.header_length(prefix)
    reply = bulk.parse_reply(_receive_exactly(connection, length))
    for region in reply.regions:
        assembly.receive(
            buffer_id,
            reply.dtype,
            reply.shape,
            (region.start, region.stop),
            region.nbytes,
            lambda view: _receive_into(connection, view),
        )


def _receive_prefix(connection: socket.socket) -> bytes:
    """A frame's length prefix, or b"" when the peer closed the connection before it."""
    first = connection.recv(bulk.LENGTH.size)
    if not first or len(first) == bulk.LENGTH.size:
        return first
    rest = bytearray(bulk.LENGTH.size - len(first))
    _receive_into(connection, memoryview(rest))
    return first + bytes(rest)


def _receive_exactly(connection: socket.socket, size: int) -> bytes:
    data = bytearray(size)
    _receive_into(connection, memoryview(data))
    return bytes(data)


def _receive_into(connection: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        count = connection.recv_into(view[got:])
        if count == 0:
            raise ConnectionError("the peer closed the data-plane connection early")
        got += count
