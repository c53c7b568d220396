"""How the island backend reads values for its client, with the island replaced by a counter:
a sharded array's shards read at once fetch its value once (kept until each is read), each
session copies on threads of its own, and a read asked for before a delete reads what was
asked for."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import numpy as np
import pytest

from pathways_client.proxy.errors import ProxyError
from pathways_client.proxy.island import IslandBackend, IslandSession, _Array, _Buffer

VALUE = np.arange(8, dtype=np.float32)


class CountingIsland:
    """An island whose every fetch of a buffer is counted; each takes a while, as a large
    value's does, so that reads asked for together overlap."""

    def __init__(self) -> None:
        self.gets: list[str] = []
        self.lock = threading.Lock()

    def get(self, buffer_id: str, timeout: float) -> np.ndarray:
        with self.lock:
            self.gets.append(buffer_id)
        threading.Event().wait(0.2)
        return VALUE.copy()


def session(island: CountingIsland) -> IslandSession:
    backend = IslandBackend(lambda client: None, devices=8)
    opened = IslandSession(backend, SimpleNamespace(protocol=None, number=1))
    opened._island = island  # as Init sets it
    return opened


def test_the_shards_of_a_value_read_at_once_fetch_it_once() -> None:
    """Each shard's read fetched the whole value, all at once: 8 shards, 8 times its bytes
    from the island and in the proxy's memory (3.4 GiB for a 256 MiB array)."""
    island = CountingIsland()
    reader = session(island)
    buffer = _Buffer("b", VALUE.shape, viewers=8)  # (as the session's stores count them)
    shards = [_Array(buffer=buffer, index=(slice(i, i + 1),)) for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        parts = list(pool.map(lambda shard: reader._reader(shard)(), shards))
    assert island.gets == ["b"]
    assert [part.tolist() for part in parts] == [[float(i)] for i in range(8)]
    # Each view read, the value is let go: it pinned a host copy of the whole array in the
    # proxy for as long as the client held the array (JAX keeps its shards with it).
    assert buffer.host is None
    assert reader._reader(shards[3])().tolist() == [3.0]
    assert island.gets == ["b", "b"]


def test_each_session_copies_on_threads_of_its_own() -> None:
    """Every session's copies ran on one pool of 8 threads for the whole proxy: one session's
    16 large reads held another's 16-byte reads up to a second."""
    island = CountingIsland()
    first, second = session(island), session(island)
    assert first.copies is not second.copies
    first.close()
    with pytest.raises(RuntimeError):  # a closed session copies nothing more
        first.copies.submit(lambda: None)
    assert second.copies.submit(lambda: 1).result() == 1
    second.close()


def test_a_read_asked_for_before_a_delete_reads_what_it_asked_for() -> None:
    """The read looked at the array only when its copy ran: deleted meanwhile, it failed on
    an assertion inside the proxy."""
    island = CountingIsland()
    reader = session(island)
    array = _Array(buffer=_Buffer("b", VALUE.shape))
    read = reader._reader(array)
    array.buffer = None  # deleted
    np.testing.assert_array_equal(read(), VALUE)
    with pytest.raises(ProxyError, match="deleted"):
        reader._reader(array)
