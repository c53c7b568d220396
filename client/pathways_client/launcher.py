"""Start one island on this machine: a gang scheduler and executors with fake CPU devices, as
real processes talking gRPC on loopback. Used by the tests and the embedded mode."""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

READY_TIMEOUT_SECONDS = 120.0


def free_port() -> int:
    """A TCP port free on loopback now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class LaunchError(RuntimeError):
    """A process of the island did not start; the message includes the end of its log."""


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[str]
    log: Path
    port: int = 0

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

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
    # Multi-host islands form one JAX distributed group so slices may span executors; the
    # island is then one failure domain (the group aborts when an executor stays silent).
    distributed: bool = True
    workdir: Path | None = None
    compilation_cache: Path | None = None
    executors: list[Process] = field(default_factory=list)
    scheduler: Process | None = None

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
        # A launcher that exits without stopping its island leaves no processes behind.
        atexit.register(self.stop)
        cache = self.compilation_cache or self.workdir / "xla-cache"
        group = []
        if self.distributed and self.hosts > 1:
            group = ["--hosts", str(self.hosts), "--coordinator", f"127.0.0.1:{free_port()}"]
        try:
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
            ]
            for process in self.executors:
                arguments += ["--executor", process.endpoint]
            self.scheduler = self._spawn("scheduler", arguments)
            self._await_ready(self.scheduler)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every process: SIGTERM, then SIGKILL after a grace period."""
        processes = [*self.executors, *([self.scheduler] if self.scheduler else [])]
        for process in processes:
            if process.popen.poll() is None:
                process.popen.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.popen.kill()
                process.popen.wait()
            if process.popen.stdout:
                process.popen.stdout.close()
        self.executors, self.scheduler = [], None

    def kill_executor(self, index: int) -> None:
        """SIGKILL one executor (fault injection)."""
        self.executors[index].popen.kill()
        self.executors[index].popen.wait()

    def __enter__(self) -> LocalIsland:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _spawn(self, name: str, arguments: list[str]) -> Process:
        assert self.workdir is not None
        log = self.workdir / f"{name}.log"
        environment = {**os.environ, "PYTHONUNBUFFERED": "1", "JAX_PLATFORMS": "cpu"}
        environment.pop("XLA_FLAGS", None)  # each executor sets its own device count
        with log.open("w") as stderr:
            popen = subprocess.Popen(
                [sys.executable, *arguments],
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                env=environment,
                start_new_session=True,
            )
        return Process(name, popen, log)

    def _await_ready(self, process: Process) -> None:
        line: list[str] = []
        reader = threading.Thread(
            target=lambda: line.append(process.popen.stdout.readline()), daemon=True
        )
        reader.start()
        reader.join(READY_TIMEOUT_SECONDS)
        try:
            process.port = int(json.loads(line[0])["port"])
        except (IndexError, ValueError, KeyError, TypeError):
            raise LaunchError(
                f"{process.name} did not start (exit code {process.popen.poll()}); its log "
                f"{process.log} ends with:\n{process.tail()}"
            ) from None
