"""Start one island on this machine: a gang scheduler and executors with fake CPU devices, as
real processes talking gRPC on loopback. Used by the tests and the embedded mode.

Each start gives the island's processes a fresh random control token (``PATHWAYS_CONTROL_TOKEN``:
executors take the command stream only from a scheduler presenting it), unless the caller
gives one, in ``environment`` or in this process's own environment.
"""

from __future__ import annotations

import atexit
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from pathways_core.wire.streams import CONTROL_TOKEN_ENV

READY_TIMEOUT_SECONDS = 120.0
# Ports free_port() picks from: above the well-known and most registered services' ports.
PICKED_PORTS_LOW = 20000
# Starts tried when a port picked for a process was taken before it bound it.
PORT_ATTEMPTS = 3


def free_port() -> int:
    """A TCP port free on loopback now, for a process to bind later.

    It is picked below the kernel's ephemeral range: a port from that range (what binding port
    0 gives) may be handed to another socket binding port 0 before the process binds it, which
    killed an island's JAX coordinator now and then under parallel tests."""
    low = _ephemeral_low()
    for _ in range(64):
        port = random.randrange(PICKED_PORTS_LOW, low)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as probe:  # a range taken almost whole: any port will do
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux's default when unreadable)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768
    return low if low > PICKED_PORTS_LOW + 1024 else 32768


class LaunchError(RuntimeError):
    """A process of the island did not start; the message includes the end of its log."""


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: no proxy


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[str]
    log: Path
    port: int = 0
    health_port: int = 0  # its liveness endpoint, GET /healthz
    arguments: list[str] = field(default_factory=list)  # what it was started with

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def answers(self, timeout: float) -> bool:
        """Whether its liveness endpoint answers within ``timeout`` seconds (as a kubelet's
        liveness probe asks)."""
        try:
            url = f"http://127.0.0.1:{self.health_port}/healthz"
            with _DIRECT.open(url, timeout=timeout) as answer:
                return answer.status == 200
        except (OSError, ValueError):
            return False

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class LocalIsland:
    """An island of ``hosts`` executors x ``devices_per_host`` fake CPU devices."""

    hosts: int = 2
    devices_per_host: int = 4
    policy: str = "fifo"
    max_in_flight: int = 16
    name: str = "local"
    # The scheduler's limits (see pathways_core.scheduling.limits); None: its defaults.
    max_queued: int | None = None
    max_queued_per_client: int | None = None
    max_queued_per_tenant: int | None = None
    max_artifact_bytes: int | None = None
    run_length: int | None = None
    trace_limit: int | None = None
    # Seconds after which the scheduler takes a silent executor (not even its heartbeat) as
    # lost; None: its default.
    executor_timeout: float | None = None
    # Multi-host islands form one JAX distributed group so slices may span executors; the
    # island is then one failure domain (the group aborts when an executor stays silent).
    distributed: bool = True
    workdir: Path | None = None
    compilation_cache: Path | None = None
    # Variables for the island's processes over this process's own (e.g. the PATHWAYS_TLS_*
    # files: the scheduler and executors then serve mutual TLS only; a PATHWAYS_CONTROL_TOKEN
    # here or in this process's environment is the island's, instead of a random one).
    environment: dict[str, str] = field(default_factory=dict)
    executors: list[Process] = field(default_factory=list)
    scheduler: Process | None = None
    # The running island's control token: kept out of repr and logs.
    _control_token: str = field(default="", repr=False, init=False)
    # The workdir start() made (none given): its logs and cache go with the island.
    _temporary: Path | None = field(default=None, repr=False, init=False)
    _restarts: int = field(default=0, repr=False, init=False)

    def __post_init__(self) -> None:
        for name in ("hosts", "devices_per_host", "max_in_flight"):
            if getattr(self, name) < 1:
                raise ValueError(f"LocalIsland's {name} must be >= 1, not {getattr(self, name)}")

    @property
    def scheduler_endpoint(self) -> str:
        assert self.scheduler is not None, "the island is not started"
        return self.scheduler.endpoint

    def start(self) -> LocalIsland:
        """Start the executors, then the scheduler; return once all answer (idempotent)."""
        if self.scheduler is not None:
            return self
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix=f"pathways-{self.name}-"))
            self._temporary = self.workdir  # removed by stop(): thousands piled up in /tmp
        self.workdir.mkdir(parents=True, exist_ok=True)
        # A launcher that exits without stopping its island leaves no processes behind.
        atexit.register(self.stop)
        # One token per start, shared by the scheduler (it sends it) and the executors (they
        # check it): a caller without it, such as another user's process on this machine,
        # cannot take their streams over (the user's own processes can read it in /proc).
        self._control_token = (
            self.environment.get(CONTROL_TOKEN_ENV)
            or os.environ.get(CONTROL_TOKEN_ENV)
            or secrets.token_urlsafe(32)
        )
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                return self._start_processes()
            except LaunchError as error:
                # A port picked for the group's coordinator may be taken before executor 0
                # binds it (by anything binding it by number): start again on another.
                if attempt < PORT_ATTEMPTS and _port_taken(str(error)):
                    self._stop_processes(grace=10.0)
                    continue
                self.stop()
                raise
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable")

    def _start_processes(self) -> LocalIsland:
        assert self.workdir is not None
        cache = self.compilation_cache or self.workdir / "xla-cache"
        group = []
        if self.distributed and self.hosts > 1:
            group = ["--hosts", str(self.hosts), "--coordinator", f"127.0.0.1:{free_port()}"]
        for index in range(self.hosts):
            self.executors.append(
                self._spawn(
                    f"executor-{index}",
                    [
                        "-m",
                        "pathways_executor",
                        *group,
                        "--index",
                        str(index),
                        "--first-device",
                        str(index * self.devices_per_host),
                        "--fake-devices",
                        str(self.devices_per_host),
                        "--compilation-cache",
                        str(cache),
                        "--health-port",
                        "0",
                    ],
                )
            )
        for process in self.executors:
            self._await_ready(process)
        arguments = [
            "-m",
            "pathways_scheduler",
            "--island",
            self.name,
            "--policy",
            self.policy,
            "--max-in-flight",
            str(self.max_in_flight),
            "--health-port",
            "0",
        ]
        for flag, limit in (
            ("--max-queued", self.max_queued),
            ("--max-queued-per-client", self.max_queued_per_client),
            ("--max-queued-per-tenant", self.max_queued_per_tenant),
            ("--max-artifact-bytes", self.max_artifact_bytes),
            ("--run-length", self.run_length),
            ("--trace-limit", self.trace_limit),
            ("--executor-timeout", self.executor_timeout),
        ):
            if limit is not None:
                arguments += [flag, str(limit)]
        for process in self.executors:
            arguments += ["--executor", process.endpoint]
        self.scheduler = self._spawn("scheduler", arguments)
        self._await_ready(self.scheduler)
        return self

    def stop(self, grace: float = 10.0) -> None:
        """Stop every process: SIGTERM, then SIGKILL after ``grace`` seconds."""
        self._stop_processes(grace)
        if self._temporary is not None:
            shutil.rmtree(self._temporary, ignore_errors=True)
            self.workdir = self._temporary = None

    def _stop_processes(self, grace: float) -> None:
        processes = [*self.executors, *([self.scheduler] if self.scheduler else [])]
        for process in processes:
            if process.popen.poll() is None:
                process.popen.send_signal(signal.SIGTERM)
                process.popen.send_signal(signal.SIGCONT)  # a stopped one takes it now
        for process in processes:
            try:
                process.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                process.popen.kill()
                process.popen.wait()
            for pipe in (process.popen.stdin, process.popen.stdout):
                if pipe:
                    pipe.close()
        self.executors, self.scheduler = [], None

    def exited(self) -> Process | None:
        """A process of the island that has exited, if one has (the island is one failure
        domain: its executors form one JAX group, so it is restarted whole)."""
        for process in self.processes():
            if process.popen.poll() is not None:
                return process
        return None

    def processes(self) -> list[Process]:
        """The island's processes: its executors, then its scheduler."""
        return [*self.executors, *([self.scheduler] if self.scheduler else [])]

    def kill_executor(self, index: int) -> None:
        """SIGKILL one executor (fault injection)."""
        self.executors[index].popen.kill()
        self.executors[index].popen.wait()

    def restart_executors(self, *indexes: int) -> None:
        """Start executors again, each a new process at its endpoint, as a kubelet restarts
        a container (what is left of the old ones is killed first); return once all answer.
        The scheduler takes them back. The executors of one JAX group are restarted together
        (the group's coordinator ends the group when a restarted member joins it)."""
        restarted = []
        for index in indexes:
            old = self.executors[index]
            self.kill_executor(index)
            for pipe in (old.popen.stdin, old.popen.stdout):
                if pipe:
                    pipe.close()
            self._restarts += 1
            arguments = list(old.arguments)
            if "--port" not in arguments:  # at its endpoint, as the first restart put it
                arguments += ["--port", str(old.port)]
            process = self._spawn(f"executor-{index}-restart-{self._restarts}", arguments)
            self.executors[index] = process
            restarted.append(process)
        for process in restarted:
            self._await_ready(process)

    def restart_scheduler(self) -> None:
        """SIGKILL the scheduler and start it again at its endpoint, as a kubelet restarts its
        container (its executors stay, as their StatefulSet's pods do); return once it
        answers. Its clients' sessions end with the old one."""
        old = self.scheduler
        assert old is not None, "start() the island first"
        old.popen.kill()
        old.popen.wait()
        for pipe in (old.popen.stdin, old.popen.stdout):
            if pipe:
                pipe.close()
        self._restarts += 1
        arguments = list(old.arguments)
        if "--port" not in arguments:
            arguments += ["--port", str(old.port)]
        self.scheduler = self._spawn(f"scheduler-restart-{self._restarts}", arguments)
        self._await_ready(self.scheduler)

    def __enter__(self) -> LocalIsland:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _spawn(self, name: str, arguments: list[str]) -> Process:
        assert self.workdir is not None
        log = self.workdir / f"{name}.log"
        environment = {
            **os.environ,
            **self.environment,
            CONTROL_TOKEN_ENV: self._control_token,
            "PYTHONUNBUFFERED": "1",
            "JAX_PLATFORMS": "cpu",
        }
        environment.pop("XLA_FLAGS", None)  # each executor sets its own device count
        with log.open("w") as stderr:
            popen = subprocess.Popen(
                # Each process stops once its standard input closes: this process holds the
                # pipes' other ends, so the island goes with it even if it dies unstopped.
                [sys.executable, *arguments, "--exit-with-launcher"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                env=environment,
                # Its own process group, so a terminal's Ctrl-C reaches only the launcher, which
                # stops the island in order; but not its own session: Linux gives every session
                # an equal CPU share (autogroups), which on a small machine starves the devices'
                # threads and runs an island's collectives at ~60% of the same program in
                # processes of one session.
                process_group=0,
            )
        return Process(name, popen, log, arguments=arguments)

    def _await_ready(self, process: Process) -> None:
        line: list[str] = []
        reader = threading.Thread(
            target=lambda: line.append(process.popen.stdout.readline()), daemon=True
        )
        reader.start()
        reader.join(READY_TIMEOUT_SECONDS)
        try:
            ready = json.loads(line[0])
            process.port = int(ready["port"])
            process.health_port = int(ready.get("health") or 0)
        except (IndexError, ValueError, KeyError, TypeError):
            raise LaunchError(
                f"{process.name} did not start (exit code {process.popen.poll()}); its log "
                f"{process.log} ends with:\n{process.tail()}"
            ) from None


def _port_taken(failure: str) -> bool:
    """Whether a process's start failed because a port it was to bind was taken."""
    return "Failed to add port" in failure or "Address already in use" in failure
