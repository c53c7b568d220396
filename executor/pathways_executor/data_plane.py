"""The executor's bulk data plane: serves buffers over raw TCP and pulls them from peers."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from pathways_core.wire import bulk
from pathways_core.wire.arrays import Assembly
from pathways_executor.arrays import local_regions


class DataPlaneServer:
    """Answers one request per connection with the regions of a buffer this host holds."""

    def __init__(self, lookup: Callable[[str, float], Any], host: str = "127.0.0.1") -> None:
        self._lookup = lookup
        self._listener = socket.create_server((host, 0), backlog=64)
        self.endpoint = f"{host}:{self._listener.getsockname()[1]}"
        threading.Thread(
            target=accept_forever,
            args=(self._listener, self._serve),
            name="data-plane",
            daemon=True,
        ).start()

    def _serve(self, connection: socket.socket) -> None:
        with connection:
            try:
                length = bulk.header_length(_receive_exactly(connection, bulk.LENGTH.size))
                buffer_id, timeout = bulk.parse_request(_receive_exactly(connection, length))
                try:
                    value = self._lookup(buffer_id, timeout)
                    regions = local_regions(value)
                except Exception as error:  # unknown, failed or late buffer: tell the peer
                    connection.sendall(bulk.error(str(error)))
                    return
                headers = [
                    bulk.RegionHeader(
                        tuple(s.start for s in region),
                        tuple(s.stop for s in region),
                        np.asarray(values).nbytes,
                    )
                    for region, values in regions
                ]
                connection.sendall(bulk.reply(np.dtype(value.dtype).name, value.shape, headers))
                for _, values in regions:
                    contiguous = np.ascontiguousarray(values)
                    if contiguous.nbytes:
                        connection.sendall(memoryview(contiguous.reshape(-1).view(np.uint8)))
            except (OSError, ValueError):
                return

    def close(self) -> None:
        self._listener.close()


def accept_forever(listener: socket.socket, serve: Callable[[socket.socket], None]) -> None:
    """Serve each connection of ``listener`` on a thread of its own until it is closed."""
    while True:
        try:
            connection, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=serve, args=(connection,), daemon=True).start()


def pull(endpoint: str, buffer_id: str, timeout: float, assembly: Assembly) -> None:
    """Receive the regions of a buffer held at ``endpoint`` into ``assembly``, straight from
    the socket into the destination's memory."""
    host, port = endpoint.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout + 30) as connection:
        connection.sendall(bulk.request(buffer_id, timeout))
        length = bulk.header_length(_receive_exactly(connection, bulk.LENGTH.size))
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
