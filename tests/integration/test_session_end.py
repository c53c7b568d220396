"""A session that ends (its scheduler restarted), or work the island refuses, while the client
still uses it: uploads are refused and leave nothing behind, and reads waiting for a buffer
that will never be end at once, saying why (they waited out the executor's 30 s for it to be
announced, then said only that it was not)."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import chain_nodes, executor_infos, increment, settled_executor_infos, slow_square

import pathways_client as pw
from pathways_client.island_client import IslandClient, IslandError, IslandUnavailable
from pathways_client.launcher import LocalIsland
from pathways_core.wire import pb

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


def test_a_program_calls_results_fail_at_once_when_the_call_failed_at_dispatch(
    compilation_cache: Path,
) -> None:
    """A call failing before any executor heard of it (its input would never be) makes none
    of its results, but a get of one waited out the executor's 30 s, then said it was never
    announced (a computation's outputs failed at once)."""
    with (
        LocalIsland(
            hosts=1, devices_per_host=2, max_in_flight=1, compilation_cache=compilation_cache
        ) as alone,
        IslandClient(alone.scheduler_endpoint, "caller") as client,
    ):
        add = client.register(increment())
        program = client.register_program(chain_nodes(add, [0, 1]), ["x"], ["y1"])
        remote = client.place_remote(
            pb.InputSource(
                buffer_id="caller/from-afar",
                executors=["127.0.0.1:9"],
                data_endpoints=["127.0.0.1:9"],
            )
        )
        slow = client.register(slow_square())
        square = client.put(np.full((512, 512), 0.01, np.float32), device=0)
        client.submit(slow, [0], [square], 1).wait(120)  # compiled: the next one only runs
        blocker = client.submit(slow, [0], [square], 1)  # the one in flight: the call waits
        call = client.call(program, [remote])
        time.sleep(0.2)
        assert not blocker.done.done(), "the blocker ended before the call was queued"
        client.remote_failed([remote], "the other island lost it")  # it fails at dispatch
        with pytest.raises(IslandError, match="the other island lost it"):
            call.wait(60)
        began = time.monotonic()
        with pytest.raises(IslandError, match=r"its program call failed: .*the other island"):
            client.get(call.outputs[0], timeout=60)
        assert time.monotonic() - began < PROMPTLY


def test_a_refusal_the_session_outlived_is_not_given_as_why_it_ended_later(
    compilation_cache: Path,
) -> None:
    """A refused deletion of another client's buffer (the session went on) was given, later,
    as the reason the restarted scheduler ended the session; and a client's own close was
    said to be the scheduler's doing."""
    with LocalIsland(hosts=1, devices_per_host=2, compilation_cache=compilation_cache) as alone:
        client = IslandClient(alone.scheduler_endpoint, "bob")
        client.delete(["alice/b1-0000"])  # refused: not bob's
        client.put(np.zeros(4, np.float32), device=0)
        alone.restart_scheduler()
        assert re.search(ENDED, ended(client)), client.ended
        client.close()
        with IslandClient(alone.scheduler_endpoint, "carol") as carol:
            slow = carol.submit(
                carol.register(increment()), [0], [carol.put(np.zeros(4, np.float32), 0)], 1
            )
            carol.close()
            with pytest.raises(IslandError, match="is closed"):
                slow.wait(30)
