"""The bulk data plane over real loopback sockets: kept connections, error replies, restarts."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest

from pathways_core.wire.arrays import Assembly
from pathways_executor.data_plane import DataPlaneServer, Puller


class Buffers:
    """A lookup for the server that counts the connections it was asked on."""

    def __init__(self, values: dict[str, np.ndarray]) -> None:
        self.values = values
        self.threads: set[threading.Thread] = set()

    def __call__(self, buffer_id: str, timeout: float, appear: float | None = None) -> np.ndarray:
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


def test_a_pull_until_ready_asks_again_while_the_holder_has_not_computed_it() -> None:
    """A holder answers "not ready within" each round its producer is still running; asked
    until ready, the pull waits for it (a consumer of another host's long step failed at
    the first round), and still ends at once on any other answer."""
    from pathways_executor.buffers import not_ready

    rounds = []

    def holder(buffer_id: str, timeout: float, appear: float | None = None) -> np.ndarray:
        rounds.append(timeout)
        if buffer_id == "c/long" and len(rounds) < 3:
            time.sleep(timeout)
            raise LookupError(f"{not_ready(buffer_id)} {timeout} s")
        if buffer_id == "c/long":
            return np.arange(3, dtype=np.float32)
        raise LookupError(f"buffer {buffer_id!r} failed: its producer ran out of memory")

    server = DataPlaneServer(holder)
    puller = Puller()
    try:
        assembly = Assembly()
        puller.pull(server.endpoint, "c/long", 0.2, assembly, until_ready=True)
        np.testing.assert_array_equal(assembly.array, np.arange(3))
        assert len(rounds) == 3
        with pytest.raises(LookupError, match="not ready within"):
            rounds.clear()
            puller.pull(server.endpoint, "c/long", 0.2, Assembly())  # one round only
        with pytest.raises(LookupError, match="ran out of memory"):
            puller.pull(server.endpoint, "c/bad", 0.2, Assembly(), until_ready=True)
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


def test_whole_arrays_of_every_layout_arrive_byte_for_byte() -> None:
    """Each dtype and shape, small (one write with its header) and large (header, then the
    bytes), a non-contiguous host array among them, and each layout twice (its header is
    then the one made the first time, on both sides)."""
    import ml_dtypes

    values = {
        "c/scalar": np.array(3.5, np.float32),
        "c/bf16": np.arange(12, dtype=np.float32).astype(ml_dtypes.bfloat16).reshape(3, 4),
        "c/bool": np.array([True, False, True]),
        "c/int8": np.arange(-4, 4, dtype=np.int8),
        "c/strided": np.arange(20, dtype=np.float64).reshape(4, 5)[:, ::2],
        "c/large": np.arange(1 << 16, dtype=np.float32),  # 256 KiB: past one small write
        "c/empty": np.zeros((0, 3), np.float32),
    }
    server = DataPlaneServer(Buffers(values))
    puller = Puller()
    try:
        for _ in range(2):
            for buffer_id, value in values.items():
                got = fetch(puller, server.endpoint, buffer_id)
                assert got.dtype == value.dtype and got.shape == value.shape, buffer_id
                assert got.tobytes() == np.ascontiguousarray(value).tobytes(), buffer_id
    finally:
        puller.close()
        server.close()


def test_a_pull_from_a_holder_declared_lost_ends_at_once_with_the_reason() -> None:
    """A stopped holder's kernel still accepts the connection; the pull waited minutes."""
    silent = socket.create_server(("127.0.0.1", 0))  # accepts (in the kernel), never answers
    endpoint = f"127.0.0.1:{silent.getsockname()[1]}"
    puller = Puller()
    failures: list[BaseException] = []

    def pull() -> None:
        try:
            fetch(puller, endpoint, "b")
        except BaseException as error:
            failures.append(error)

    waiting = threading.Thread(target=pull)
    waiting.start()
    time.sleep(0.3)
    started = time.monotonic()
    puller.down(endpoint, "executor 1 is unreachable: it sent nothing for 30 s")
    waiting.join(5)
    assert not waiting.is_alive() and time.monotonic() - started < 2
    (failure,) = failures
    assert isinstance(failure, ConnectionError) and "sent nothing for 30 s" in str(failure)
    with pytest.raises(ConnectionError, match="sent nothing"):  # later pulls fail at once
        fetch(puller, endpoint, "c")
    silent.close()


def test_a_pull_cut_by_its_holders_death_names_the_loss_told_just_after() -> None:
    """The holder's death closes the connection before its loss is told: the pull said only
    that the connection ended."""
    dying = socket.create_server(("127.0.0.1", 0))
    endpoint = f"127.0.0.1:{dying.getsockname()[1]}"

    def die_mid_request() -> None:
        connection, _ = dying.accept()
        connection.recv(1)
        connection.close()

    threading.Thread(target=die_mid_request, daemon=True).start()
    puller = Puller()
    loss = "executor 1 (127.0.0.1:1) is unreachable: its command stream ended"
    threading.Timer(0.5, puller.down, (endpoint, loss)).start()
    with pytest.raises(ConnectionError, match=r"unreachable: its command stream ended"):
        fetch(puller, endpoint, "b")
    dying.close()
