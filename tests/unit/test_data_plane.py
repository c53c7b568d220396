"""The bulk data plane over real loopback sockets: kept connections, error replies, restarts."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from pathways_core.wire.arrays import Assembly
from pathways_executor.data_plane import DataPlaneServer, Puller


class Buffers:
    """A lookup for the server that counts the connections it was asked on."""

    def __init__(self, values: dict[str, np.ndarray]) -> None:
        self.values = values
        self.threads: set[threading.Thread] = set()

    def __call__(self, buffer_id: str, timeout: float) -> np.ndarray:
        self.threads.add(threading.current_thread())  # one serving thread per connection
        if buffer_id not in self.values:
            raise LookupError(f"unknown buffer {buffer_id!r}")
        return self.values[buffer_id]


def fetch(puller: Puller, endpoint: str, buffer_id: str) -> np.ndarray:
    assembly = Assembly()
    puller.pull(endpoint, buffer_id, 10.0, assembly)
    assert assembly.complete and assembly.array is not None
    return assembly.array


def test_pulls_reuse_one_kept_connection_and_survive_error_replies() -> None:
    buffers = Buffers({"c/a": np.arange(6, dtype=np.float32).reshape(2, 3)})
    server = DataPlaneServer(buffers)
    puller = Puller()
    try:
        for _ in range(5):
            np.testing.assert_array_equal(
                fetch(puller, server.endpoint, "c/a"), buffers.values["c/a"]
            )
        with pytest.raises(LookupError, match="unknown buffer 'c/missing'"):
            fetch(puller, server.endpoint, "c/missing")
        buffers.values["c/b"] = np.ones(4, np.int32)
        np.testing.assert_array_equal(fetch(puller, server.endpoint, "c/b"), np.ones(4))
        assert len(buffers.threads) == 1  # every request went over the same connection
    finally:
        puller.close()
        server.close()


def test_a_kept_connection_that_broke_is_replaced_by_a_fresh_one() -> None:
    buffers = Buffers({"c/a": np.full(3, 7.0, np.float32)})
    server = DataPlaneServer(buffers)
    puller = Puller()
    try:
        fetch(puller, server.endpoint, "c/a")
        for idle in puller._idle.values():  # the kept connection breaks
            for connection in idle:
                connection.shutdown(2)
        np.testing.assert_array_equal(fetch(puller, server.endpoint, "c/a"), np.full(3, 7.0))
        assert len(buffers.threads) == 2
    finally:
        puller.close()
        server.close()
