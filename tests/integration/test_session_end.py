"""A session that ends (its scheduler restarted), or work the island refuses, while the client
still uses it: uploads are refused and leave nothing behind, and reads waiting for a buffer
that will never be end at once, saying why (they waited out the executor's 30 s for it to be
announced, then said only that it was not)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from conftest import chain_nodes, executor_infos, increment, settled_executor_infos

import pathways_client as pw
from pathways_client.island_client import IslandClient, IslandError, IslandUnavailable
from pathways_client.launcher import LocalIsland

ENDED = r"the scheduler at \S+ (closed the session|is unreachable)"  # as SIGKILL left it
# Well inside the executor's 30 s wait for a buffer to be announced, which a read that is
# not woken sits out.
PROMPTLY = 15.0


class Reader(threading.Thread):
    """A ``get`` on another thread; its value or error, once it ends."""

    def __init__(self, read: Callable[[], np.ndarray]) -> None:
        super().__init__(daemon=True)
        self._read = read
        self.value: np.ndarray | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.value = self._read()
        except BaseException as error:  # asserted by the test
            self.error = error

    def outcome(self) -> BaseException | None:
        """The read's error, once it ended within ``PROMPTLY`` seconds."""
        self.join(PROMPTLY)
        assert not self.is_alive(), f"the read still waits after {PROMPTLY:g} s"
        return self.error


def started(read: Callable[[], np.ndarray]) -> Reader:
    """A read begun (its call to the executor waiting) before this returns."""
    reader = Reader(read)
    reader.start()
    time.sleep(0.5)
    assert reader.is_alive(), reader.error
    return reader


def ended(client: IslandClient) -> str:
    """Why the session ended, once it has (within 10 s)."""
    for _ in range(100):
        if client.ended:
            return client.ended
        time.sleep(0.1)
    raise AssertionError("the session did not end")


@pytest.fixture
def restarted(island: LocalIsland) -> Iterator[IslandClient]:
    """A session whose scheduler was restarted; the executors have dropped what it held."""
    with IslandClient(island.scheduler_endpoint, "survivor") as client:
        client.put(np.zeros(4, np.float32), device=0)
        island.restart_scheduler()
        ended(client)
        assert [i.buffers for i in settled_executor_infos(island, [0, 0], within=30)] == [0, 0]
        yield client


def test_an_upload_after_the_session_ended_is_refused_and_leaves_nothing(
    island: LocalIsland, restarted: IslandClient
) -> None:
    """It uploaded the array, said it was placed to a session that was gone (the word was
    lost) and returned its id: the executor kept the bytes for good."""
    with pytest.raises(IslandUnavailable, match=rf"^put: {ENDED}.*connect again"):
        restarted.put(np.ones((256, 256), np.float32), device=4)
    with pytest.raises(IslandUnavailable, match=rf"^put_shards: {ENDED}"):
        restarted.put_shards(np.ones(8, np.float32), {0: [(slice(0, 4),)], 1: [(slice(4, 8),)]})
    assert [(i.buffers, i.buffer_bytes) for i in executor_infos(island)] == [(0, 0), (0, 0)]


def test_an_sdk_upload_after_the_session_ended_fails_naming_why(island: LocalIsland) -> None:
    with pw.connect(island) as cluster:
        one = cluster.slice(devices=1)
        np.testing.assert_array_equal(pw.put(np.zeros(4, np.float32), one).result(), 0)
        island.restart_scheduler()
        session = cluster.open_session(one.island)
        assert session is not None
        ended(session)
        settled_executor_infos(island, [0, 0], within=30)
        with pytest.raises(pw.NodeFailed, match=rf"uploading an input failed: put: {ENDED}"):
            pw.put(np.ones(4, np.float32), one)
        assert [i.buffers for i in executor_infos(island)] == [0, 0]


def test_a_read_waiting_when_the_session_ends_fails_at_once_with_the_reason(
    island: LocalIsland,
) -> None:
    with IslandClient(island.scheduler_endpoint, "reader") as client:
        add_one = client.register(increment(), "increment")
        x = client.put(np.zeros(4, np.float32), device=0)
        # Held back until the block ends: the executor has not heard of the output when the
        # read asks for it, as when it is queued behind other work.
        with client.batch():
            output = client.submit(add_one, [0], [x], 1).outputs[0]
            reader = started(lambda: client.get(output, timeout=60))
            island.restart_scheduler()
        error = reader.outcome()
        assert isinstance(error, IslandUnavailable), repr(error)
        assert str(error).startswith(f"get {output!r}: {client.ended}")
        # Later reads fail at once with the same reason.
        with pytest.raises(IslandUnavailable, match=rf"^get '{x}': {ENDED}"):
            client.get(x)


def test_a_read_of_an_output_the_island_then_refuses_fails_at_once_with_the_reason(
    island: LocalIsland,
) -> None:
    with IslandClient(island.scheduler_endpoint, "refused") as client:
        add_one = client.register(increment(), "increment")
        program = client.register_program(chain_nodes(add_one, [0]), ["x"], ["y0"])
        missing = f"{client.client}/nowhere"
        with client.batch():  # refused only once the block ends, the reads waiting by then
            computation = client.submit(add_one, [0], [missing], 1)
            call = client.call(program, [missing])
            computed = started(lambda: client.get(computation.outputs[0], timeout=60))
            called = started(lambda: client.get(call.outputs[0], timeout=60))
        unknown = rf"reads unknown buffer '{missing}'"
        with pytest.raises(IslandError, match=unknown):
            computation.wait(30)
        error = computed.outcome()
        assert isinstance(error, IslandError), repr(error)
        assert str(error).startswith(
            f"get {computation.outputs[0]!r}: its computation failed: computation "
        ), error
        assert f"reads unknown buffer {missing!r}" in str(error)
        error = called.outcome()
        assert isinstance(error, IslandError), repr(error)
        assert str(error).startswith(f"get {call.outputs[0]!r}: its program call was refused: "), (
            error
        )
        assert missing in str(error)
        # The session serves on.
        x = client.put(np.zeros(4, np.float32), device=0)
        np.testing.assert_array_equal(client.get(client.call(program, [x]).outputs[0]), 1)
