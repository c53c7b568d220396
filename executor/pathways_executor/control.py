"""The executor's end of the island scheduler's command stream (framed protobuf over raw TCP):
``CommandBatch`` frames in, in island order; ``EventBatch`` frames out.

Events are written straight from the thread that produced them (no hand-off to a sender
thread); a lock keeps frames whole.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Sequence

from pathways_core.wire import pb
from pathways_core.wire.streams import FrameError, frame, messages
from pathways_executor.data_plane import accept_forever


class ControlServer:
    """Accepts the scheduler's command stream; a new connection replaces the previous one."""

    def __init__(self, submit: Callable[[pb.ExecutorCommand], None], host: str) -> None:
        self._submit = submit
        self._listener = socket.create_server((host, 0), backlog=8)
        self.endpoint = f"{host}:{self._listener.getsockname()[1]}"
        self._connection: socket.socket | None = None
        self._send_lock = threading.Lock()
        threading.Thread(
            target=accept_forever, args=(self._listener, self._open), name="control", daemon=True
        ).start()

    def emit(self, events: Sequence[pb.ExecutorEvent]) -> None:
        """Send events to the scheduler (dropped when none is connected: it learns of lost
        work from the stream's end)."""
        connection = self._connection
        if connection is None or not events:
            return
        data = frame(pb.EventBatch(events=events))
        # A failed write means the scheduler went away; its next connection starts afresh.
        with self._send_lock, contextlib.suppress(OSError):
            connection.sendall(data)

    def _open(self, connection: socket.socket) -> None:
        """A scheduler's stream, read on this thread; it replaces the previous one."""
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        previous, self._connection = self._connection, connection
        if previous is not None:
            with contextlib.suppress(OSError):  # ends its reader's recv
                previous.shutdown(socket.SHUT_RDWR)
        try:
            for batch in messages(connection.recv, pb.CommandBatch.FromString):
                for command in batch.commands:
                    self._submit(command)
        except (OSError, FrameError):
            pass
        if self._connection is connection:
            self._connection = None
        connection.close()

    def close(self) -> None:
        self._listener.close()
