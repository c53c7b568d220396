"""A local island's control token: every start draws a random one (unless the caller gives
one), its scheduler and executors share it, it never reaches logs, and an executor refuses a
command stream that does not present it while the island keeps computing.

The processes' environments are read from ``/proc/<pid>/environ`` (what they really got), and
a token is shown to be the executors' by a stream that presents it and gets an event back.
"""

from __future__ import annotations

import socket
from pathlib import Path

import grpc
import pytest
from conftest import assert_chain_runs

from pathways_client.launcher import LocalIsland
from pathways_client.rpc import stub
from pathways_core.wire import EXECUTOR, SCHEDULER, pb
from pathways_core.wire.streams import CONTROL_TOKEN_ENV, HANDSHAKE_TIMEOUT_SECONDS, frame, messages

# Every executor answers or hangs up within this (its handshake timeout plus slack).
BOUND = HANDSHAKE_TIMEOUT_SECONDS + 25


def environment_of(pid: int) -> dict[str, str]:
    """The environment a process was started with."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (entry.split(b"=", 1) for entry in raw.split(b"\0") if b"=" in entry)
    return {key.decode(): value.decode(errors="replace") for key, value in pairs}


def tokens_of(island: LocalIsland) -> list[str | None]:
    assert island.scheduler is not None
    return [
        environment_of(process.popen.pid).get(CONTROL_TOKEN_ENV)
        for process in [island.scheduler, *island.executors]
    ]


def control_endpoints(island: LocalIsland) -> list[tuple[str, int]]:
    """(host, port) of each executor's command stream, as the executors report it."""
    with grpc.insecure_channel(island.scheduler_endpoint) as channel:
        info = stub(channel, SCHEDULER, "Info")(pb.Empty(), timeout=30)
    found = []
    for executor in info.executors:
        with grpc.insecure_channel(executor.endpoint) as channel:
            own = stub(channel, EXECUTOR, "Info")(pb.Empty(), timeout=30)
        host, port = own.control_endpoint.rsplit(":", 1)
        found.append((host, int(port)))
    return found


def hello_and_run(token: str, computation: str) -> bytes:
    """A would-be scheduler's first bytes: a hello with ``token``, then a computation of a
    function never registered (an accepted stream answers it with a failure event)."""
    hello = pb.ExecutorCommand(hello=pb.ControlHello(island="local", token=token))
    run = pb.ExecutorCommand(
        seq=1, run=pb.Computation(id=computation, function_id="f" * 64, devices=[0])
    )
    return frame(pb.CommandBatch(commands=[hello])) + frame(pb.CommandBatch(commands=[run]))


def first_event(address: tuple[str, int], data: bytes) -> pb.ExecutorEvent | None:
    """Send ``data`` on a command stream; the first event the executor sends back, or ``None``
    when it hung up without a word (within ``BOUND``; a silent open stream fails the test)."""
    with socket.create_connection(address, timeout=10) as connection:
        connection.settimeout(BOUND)
        try:
            connection.sendall(data)
            for batch in messages(connection.recv, pb.EventBatch.FromString):
                if batch.events:
                    return batch.events[0]
        except (ConnectionResetError, BrokenPipeError):
            return None
        return None


def test_an_island_draws_a_token_and_its_executors_refuse_strangers(
    compilation_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(CONTROL_TOKEN_ENV, raising=False)  # the island must draw its own
    island = LocalIsland(hosts=2, devices_per_host=2, compilation_cache=compilation_cache)
    with island:
        tokens = tokens_of(island)
        token = tokens[0]
        assert token is not None and len(token) >= 43  # secrets.token_urlsafe(32)
        assert tokens == [token] * 3  # the scheduler's is the executors'
        assert token not in repr(island)
        controls = control_endpoints(island)
        strangers = {
            # What any caller could send while the token was unset (the empty token).
            "empty token": hello_and_run("", "stranger/empty"),
            "wrong token": hello_and_run("guess", "stranger/wrong"),
            "the token but its last character": hello_and_run(token[:-1], "stranger/short"),
            "commands without a hello": frame(
                pb.CommandBatch(
                    commands=[pb.ExecutorCommand(seq=1, delete=pb.DeleteBuffers(ids=["x"]))]
                )
            ),
        }
        for what, data in strangers.items():
            for control in controls:
                assert first_event(control, data) is None, what  # dropped, told nothing
        assert_chain_runs(island, "checker")  # the scheduler still holds its streams
        assert island.workdir is not None
        for log in island.workdir.glob("*.log"):
            assert token not in log.read_text(errors="replace"), log.name

        # The token drawn is the one the executors check: with the scheduler gone, a stream
        # presenting it is taken and answered (the failure of the unknown function).
        assert island.scheduler is not None
        island.scheduler.popen.kill()
        island.scheduler.popen.wait()
        for index, control in enumerate(controls):
            event = first_event(control, hello_and_run(token, f"owner/{index}"))
            assert event is not None, f"executor {index} refused its own token"
            assert event.computation_id == f"owner/{index}" and not event.ok
            assert "never registered" in event.message, event.message

    # The next start draws a new one.
    with island:
        assert tokens_of(island)[0] not in (None, token)


def test_a_token_the_caller_gives_wins(
    compilation_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A token in ``environment`` wins over this process's, which wins over a random one."""
    monkeypatch.setenv(CONTROL_TOKEN_ENV, "from-the-process")
    island = LocalIsland(
        hosts=1,
        devices_per_host=2,
        compilation_cache=compilation_cache,
        environment={CONTROL_TOKEN_ENV: "from-the-caller"},
    )
    with island:
        assert tokens_of(island) == ["from-the-caller"] * 2
        (control,) = control_endpoints(island)
        assert first_event(control, hello_and_run("from-the-process", "stranger/p")) is None
    with LocalIsland(hosts=1, devices_per_host=2, compilation_cache=compilation_cache) as island:
        assert tokens_of(island) == ["from-the-process"] * 2
