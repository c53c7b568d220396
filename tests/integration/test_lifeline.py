"""The embedded mode's processes stop with their supervisor (``lifeline.py``: standard input
closed) and, stopped by SIGTERM while it is open, exit cleanly rather than abort."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

MODULES = ["pathways_api", "pathways_scheduler", "pathways_executor"]

PROCESS = """
import signal, threading
from {module}.lifeline import stop_when_stdin_closes
stopped = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stopped.set())
stop_when_stdin_closes()
print("ready", flush=True)
assert stopped.wait(60)
print("stopped", flush=True)
"""


def _start(module: str) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", PROCESS.format(module=module)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stdout.readline() == "ready\n"
    return process


@pytest.mark.parametrize("module", MODULES)
def test_a_process_stops_when_its_standard_input_closes(module: str) -> None:
    process = _start(module)
    assert process.stdin is not None
    process.stdin.close()
    assert process.wait(timeout=30) == 0, process.stderr.read()  # type: ignore[union-attr]
    assert process.stdout.read() == "stopped\n"


@pytest.mark.parametrize("module", MODULES)
def test_a_process_stopped_while_its_standard_input_is_open_exits_cleanly(module: str) -> None:
    """``pathways down`` sends SIGTERM while the watching thread still reads: the interpreter's
    shutdown must not wait for that read (it aborted with "Fatal Python error:
    _enter_buffered_busy" when the thread read ``sys.stdin``)."""
    process = _start(module)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert out == "stopped\n" and "Fatal Python error" not in err


def test_an_executor_joining_a_group_stops_when_its_launcher_goes() -> None:
    """Joining a group whose coordinator is gone, it took SIGTERM (JAX's handler) and went on
    waiting, minutes after its launcher."""
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        coordinator = f"127.0.0.1:{unused.getsockname()[1]}"  # nothing listens there
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "pathways_executor", "--fake-devices", "1", "--port", "0"),
            *("--hosts", "2", "--index", "1", "--coordinator", coordinator),
            "--exit-with-launcher",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(4)  # importing JAX, then waiting for the coordinator
        assert process.poll() is None
        assert process.stdin is not None
        process.stdin.close()
        process.wait(timeout=20)
    finally:
        process.kill()


def test_a_local_island_makes_its_workdir_and_removes_the_temporary_one_it_made(
    tmp_path,
) -> None:
    """A missing workdir was a FileNotFoundError; the temporary ones piled up in /tmp."""
    from pathways_client.launcher import LocalIsland

    nested = tmp_path / "a" / "b"
    with LocalIsland(hosts=1, devices_per_host=1, workdir=nested):
        assert (nested / "scheduler.log").exists()
    assert nested.exists()  # given: kept, with its logs
    island = LocalIsland(hosts=1, devices_per_host=1).start()
    made = island.workdir
    assert made is not None and made.exists()
    island.stop()
    assert not made.exists() and island.workdir is None


def test_a_local_island_whose_coordinator_port_was_taken_starts_on_another(
    monkeypatch, tmp_path
) -> None:
    """A port picked for the JAX group's coordinator and bound by something else before
    executor 0 bound it killed the island's start now and then in CI ("Failed to add port")."""
    from pathways_client import launcher

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    taken_port = taken.getsockname()[1]
    picked = iter([taken_port])
    monkeypatch.setattr(launcher, "free_port", lambda: next(picked, None) or _any_port())
    try:
        with launcher.LocalIsland(hosts=2, devices_per_host=1, workdir=tmp_path) as island:
            assert len(island.executors) == 2 and island.exited() is None
            coordinator = island.executors[0].arguments.index("--coordinator") + 1
            assert island.executors[0].arguments[coordinator] != f"127.0.0.1:{taken_port}"
    finally:
        taken.close()


def test_free_ports_are_picked_below_the_kernels_ephemeral_range() -> None:
    """Binding port 0 never hands out a port free_port() picked."""
    from pathways_client.launcher import PICKED_PORTS_LOW, free_port

    ranges = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
    low = int(ranges.split()[0])
    assert all(PICKED_PORTS_LOW <= free_port() < low for _ in range(20))


def _any_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
