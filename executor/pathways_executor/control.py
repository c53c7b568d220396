"""The executor's end of the island scheduler's command stream (framed protobuf over raw TCP):
``CommandBatch`` frames in, in island order; ``EventBatch`` frames out.

Events are written straight from the thread that produced them (no hand-off to a sender
thread); a lock keeps frames whole. An empty ``EventBatch`` goes out every
``HEARTBEAT_SECONDS``: the scheduler takes an executor that sends nothing for its
``--executor-timeout`` as lost (stopped, hung or cut off), as it takes one whose stream ends.
"""

from __future__ import annotations

import contextlib
import hmac
import socket
import threading
from collections.abc import Callable, Iterator, Sequence

from pathways_core.wire import pb
from pathways_core.wire.streams import (
    HANDSHAKE_TIMEOUT_SECONDS,
    FrameError,
    frame,
    frames,
    messages,
)
from pathways_executor.data_plane import accept_forever
from pathways_executor.tls import Tls

# An event whose message would make it larger than this is cut (its frame must stay under the
# scheduler's cap, or the whole stream would end).
MAX_EVENT_BYTES = 1 << 20
HEARTBEAT_SECONDS = 1.0
HEARTBEAT = frame(pb.EventBatch())


class ControlServer:
    """Accepts the scheduler's command stream. A connection becomes the stream only once its
    first frame, within ``HANDSHAKE_TIMEOUT_SECONDS``, is a ``ControlHello`` with this
    executor's control token; it then replaces the previous stream (a restarted scheduler
    reconnects). Anything else is dropped without touching the current stream. A hello from
    another scheduler process than the last one's calls ``replaced`` first: what that one's
    sessions left is no longer anyone's."""

    def __init__(
        self,
        submit: Callable[[Sequence[pb.ExecutorCommand]], None],
        host: str,
        tls: Tls | None = None,
        token: str = "",
        replaced: Callable[[], None] | None = None,
    ) -> None:
        self._submit = submit
        self._replaced = replaced
        self._scheduler: str | None = None  # the id in the last hello taken
        self._tls = tls
        self._token = token.encode()
        self._listener = socket.create_server((host, 0), backlog=8)
        self.endpoint = f"{host}:{self._listener.getsockname()[1]}"
        self._connection: socket.socket | None = None
        self._send_lock = threading.Lock()
        self._closed = threading.Event()
        threading.Thread(
            target=accept_forever, args=(self._listener, self._open), name="control", daemon=True
        ).start()
        threading.Thread(target=self._beat, name="heartbeat", daemon=True).start()

    @property
    def connected(self) -> bool:
        """Whether a scheduler's stream is open (its hello was taken)."""
        return self._connection is not None

    def _beat(self) -> None:
        while not self._closed.wait(HEARTBEAT_SECONDS):
            connection = self._connection
            if connection is not None:
                with self._send_lock, contextlib.suppress(OSError):
                    connection.sendall(HEARTBEAT)

    def emit(self, events: Sequence[pb.ExecutorEvent]) -> None:
        """Send events to the scheduler (dropped when none is connected: it learns of lost
        work from the stream's end)."""
        connection = self._connection
        if connection is None or not events:
            return
        for event in events:
            if event.ByteSize() > MAX_EVENT_BYTES:
                event.message = event.message[: MAX_EVENT_BYTES // 8] + " ... (cut)"
        try:
            data = frames(list(events), lambda batch: pb.EventBatch(events=batch))
        except FrameError:  # an id too long for any frame: drop it rather than end the stream
            return
        # A failed write means the scheduler went away; its next connection starts afresh.
        with self._send_lock, contextlib.suppress(OSError):
            connection.sendall(data)

    def _open(self, connection: socket.socket) -> None:
        """A scheduler's stream, read on this thread; it replaces the previous one."""
        if self._tls is not None:
            try:  # before it may replace anything: a peer without our CA's certificate
                connection = self._tls.accept_stream(connection)
            except OSError:
                connection.close()
                return
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        incoming = messages(connection.recv, pb.CommandBatch.FromString)
        hello = self._hello(connection, incoming)
        if hello is None:
            connection.close()
            return
        replaced = self._scheduler is not None and hello.scheduler != self._scheduler
        if replaced and self._replaced is not None:
            self._replaced()
        self._scheduler = hello.scheduler
        previous, self._connection = self._connection, connection
        if previous is not None:
            with contextlib.suppress(OSError):  # ends its reader's recv
                previous.shutdown(socket.SHUT_RDWR)
        try:
            for batch in incoming:
                self._submit([c for c in batch.commands if c.WhichOneof("kind") != "hello"])
        except (OSError, FrameError):
            pass
        if self._connection is connection:
            self._connection = None
        connection.close()

    def _hello(
        self, connection: socket.socket, incoming: Iterator[pb.CommandBatch]
    ) -> pb.ControlHello | None:
        """The connection's first frame if it is, within the handshake timeout, a hello with
        this executor's token (compared in constant time). A stranger learns nothing."""
        connection.settimeout(HANDSHAKE_TIMEOUT_SECONDS)
        try:
            first = next(incoming, None)
        except (OSError, FrameError):  # silent, garbled or oversized: not our scheduler
            return None
        connection.settimeout(None)
        if first is None or len(first.commands) != 1:
            return None
        command = first.commands[0]
        if command.WhichOneof("kind") != "hello":
            return None
        if not hmac.compare_digest(command.hello.token.encode(), self._token):
            return None
        return command.hello

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
