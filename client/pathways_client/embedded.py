"""The embedded local mode: a whole Pathways cluster on one machine, with no Kubernetes.

``pathways up`` starts a detached *supervisor* process (``python -m pathways_client.embedded
--state DIR ...``) that owns, until ``pathways down`` sends it SIGTERM:

- the islands: :class:`~pathways_client.launcher.LocalIsland` processes (a gang scheduler and
  executors with fake CPU devices on loopback), listed with their endpoints in
  ``DIR/islands.json``;
- the embedded resource manager (``python -m pathways_api.manager``): the operator's
  reconciliation decisions over the SQLite store ``DIR/pathways.db``; it runs programs' Jobs
  as local processes;
- the REST API (``python -m pathways_api`` in embedded mode) on 127.0.0.1, with the tokens
  of ``DIR/tokens.yaml`` (created on the first ``up``, one token per tenant, mode 0600).

``DIR/cluster.json`` records the pids and ports; everything else in ``DIR`` survives ``down``
and the next ``up`` (the API keeps its port when it is free), so objects, bindings, logs and
traces are kept across restarts. Default state directory: ``$PATHWAYS_STATE`` or
``~/.pathways``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pathways_client.launcher import LocalIsland

DEFAULT_TENANTS = ("default",)
READY_TIMEOUT = 300.0


def default_state() -> Path:
    """``$PATHWAYS_STATE`` or ``~/.pathways``."""
    return Path(os.environ.get("PATHWAYS_STATE") or Path.home() / ".pathways")


@dataclass(frozen=True)
class IslandSpec:
    """One local island to start."""

    name: str
    hosts: int = 1
    devices_per_host: int = 4
    policy: str = "proportional-share"
    max_in_flight: int = 16


@dataclass
class ClusterInfo:
    """What ``DIR/cluster.json`` records."""

    supervisor: int
    api: str = ""
    api_pid: int = 0
    manager_pid: int = 0
    islands: dict[str, dict[str, Any]] = field(default_factory=dict)
    ready: bool = False
    started: float = 0.0
    error: str | None = None


class EmbeddedError(RuntimeError):
    """The embedded cluster could not start or answer; the message says where to look."""


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child (never waited for) is dead too.
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def read_info(state: Path) -> ClusterInfo | None:
    """The recorded cluster, if its supervisor still runs."""
    path = state / "cluster.json"
    try:
        info = ClusterInfo(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None
    return info if _alive(info.supervisor) else None


def tokens(state: Path) -> dict[str, str]:
    """Tenant -> its first token, from the state directory's tokens file."""
    try:
        document = yaml.safe_load((state / "tokens.yaml").read_text()) or {}
    except OSError:
        return {}
    return {
        name: entry["tokens"][0]
        for name, entry in (document.get("tenants") or {}).items()
        if entry.get("tokens")
    }


def ensure_tenants(
    state: Path, tenants: Sequence[str], quotas: dict[str, int] | None = None
) -> dict[str, str]:
    """Add tenants (with a fresh random token each) to the tokens file; keep existing ones."""
    path = state / "tokens.yaml"
    try:
        document = yaml.safe_load(path.read_text()) or {}
    except OSError:
        document = {}
    entries = document.setdefault("tenants", {})
    for name in tenants:
        if name not in entries:
            entries[name] = {"tokens": [secrets.token_urlsafe(24)]}
            if quotas:
                entries[name]["quotas"] = dict(quotas)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.write_text(yaml.safe_dump(document, sort_keys=True))
    path.chmod(0o600)
    return tokens(state)


# -- the supervisor (runs detached) ------------------------------------------------------------


class Supervisor:
    """Starts and owns the islands, the manager and the API of one state directory."""

    def __init__(self, state: Path, islands: Sequence[IslandSpec], port: int | None) -> None:
        self.state = state
        self.specs = list(islands)
        self.port = port
        self.islands: list[LocalIsland] = []
        self.children: dict[str, subprocess.Popen[str]] = {}
        self.info = ClusterInfo(supervisor=os.getpid(), started=time.time())
        self._stop = threading.Event()

    def _write(self) -> None:
        path = self.state / "cluster.json"
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(asdict(self.info), indent=2))
        temporary.replace(path)

    def _spawn(self, name: str, arguments: list[str]) -> tuple[subprocess.Popen[str], dict]:
        log = (self.state / f"{name}.log").open("a")
        popen = subprocess.Popen(
            [sys.executable, *arguments],
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "PATHWAYS_API_MODE": "embedded"},
        )
        self.children[name] = popen
        assert popen.stdout is not None
        line = popen.stdout.readline()
        # Nobody else reads its stdout: drain it, so a chatty child never blocks on a full pipe.
        threading.Thread(target=popen.stdout.read, daemon=True).start()
        try:
            return popen, json.loads(line)
        except ValueError:
            raise EmbeddedError(
                f"the {name} did not start (exit code {popen.poll()}); see "
                f"{self.state / (name + '.log')}"
            ) from None

    def start(self) -> None:
        """Start everything, in dependency order; record it in ``cluster.json``."""
        self._write()
        cache = self.state / "xla-cache"
        registered: dict[str, dict[str, Any]] = {}
        for spec in self.specs:
            island = LocalIsland(
                hosts=spec.hosts,
                devices_per_host=spec.devices_per_host,
                policy=spec.policy,
                max_in_flight=spec.max_in_flight,
                name=spec.name,
                workdir=self.state / "islands" / spec.name,
                compilation_cache=cache,
            )
            island.workdir.mkdir(parents=True, exist_ok=True)  # type: ignore[union-attr]
            island.start()
            self.islands.append(island)
            registered[spec.name] = {
                "endpoint": island.scheduler_endpoint,
                "hosts": spec.hosts,
                "devicesPerHost": spec.devices_per_host,
                "policy": spec.policy,
            }
            self.info.islands[spec.name] = {
                **registered[spec.name],
                "pids": [p.popen.pid for p in [*island.executors, island.scheduler] if p],
            }
            self._write()
        (self.state / "islands.json").write_text(json.dumps(registered, indent=2))
        if not (self.state / "tokens.yaml").exists():
            ensure_tenants(self.state, DEFAULT_TENANTS)
        manager, _ = self._spawn(
            "manager", ["-m", "pathways_api.manager", "--state", str(self.state)]
        )
        self.info.manager_pid = manager.pid
        port = self.port if self.port is not None else 0
        if port and not _port_free(port):
            port = 0
        api, ready = self._spawn(
            "api",
            [
                "-m",
                "pathways_api",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--state",
                str(self.state),
            ],
        )
        self.info.api_pid = api.pid
        self.info.api = f"http://127.0.0.1:{ready['port']}"
        _wait_healthy(self.info.api, api)
        self.info.ready = True
        self._write()

    def serve(self) -> None:
        """Run until SIGTERM, then stop everything."""
        signal.signal(signal.SIGTERM, lambda *_: self._stop.set())
        signal.signal(signal.SIGINT, lambda *_: self._stop.set())
        try:
            self.start()
        except BaseException as error:
            self.info.error = str(error)
            self._write()
            self.shutdown()
            raise
        while not self._stop.wait(1.0):
            for name, child in self.children.items():
                if child.poll() is not None and not self.info.error:
                    self.info.error = f"the {name} exited with code {child.returncode}"
                    self._write()
        self.shutdown()

    def shutdown(self) -> None:
        """API first (no new work), then the manager (it records running Jobs as lost),
        then the islands."""
        for name in ("api", "manager"):
            child = self.children.get(name)
            if child is not None and child.poll() is None:
                child.terminate()
                try:
                    child.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
        for island in self.islands:
            island.stop()
        self.info.ready = False
        self.info.api_pid = self.info.manager_pid = 0
        self._write()


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as probe:
        # As the API binds it: connections of the last run lingering in TIME_WAIT are fine.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _wait_healthy(url: str, process: subprocess.Popen[str], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise EmbeddedError(f"the API exited with code {process.returncode}")
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"{url}/healthz", timeout=2) as answer,
        ):
            if answer.status == 200:
                return
        time.sleep(0.1)
    raise EmbeddedError(f"the API at {url} did not answer /healthz within {timeout:.0f} s")


# -- what the CLI calls --------------------------------------------------------------------------


def up(
    state: Path,
    islands: Sequence[IslandSpec],
    tenants: Sequence[str] = DEFAULT_TENANTS,
    progress: Callable[[str], None] | None = None,
    timeout: float = READY_TIMEOUT,
) -> ClusterInfo:
    """Start the cluster of ``state`` detached (or return the one already running)."""
    state.mkdir(parents=True, exist_ok=True)
    running = read_info(state)
    if running is not None and running.ready:
        ensure_tenants(state, tenants)
        return running
    if running is not None:
        raise EmbeddedError(
            f"a cluster of {state} is starting or failing (supervisor pid {running.supervisor}); "
            "run 'pathways down' first"
        )
    ensure_tenants(state, tenants)
    previous_port = None
    with contextlib.suppress(OSError, ValueError, KeyError):
        previous_port = int(
            json.loads((state / "cluster.json").read_text())["api"].rsplit(":", 1)[1]
        )
    arguments = [sys.executable, "-m", "pathways_client.embedded", "--state", str(state)]
    for spec in islands:
        arguments += [
            "--island",
            f"{spec.name}:{spec.hosts}:{spec.devices_per_host}:{spec.policy}:{spec.max_in_flight}",
        ]
    if previous_port:
        arguments += ["--port", str(previous_port)]
    with (state / "supervisor.log").open("a") as log:
        supervisor = subprocess.Popen(
            arguments,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,  # outlives the CLI and its terminal
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    deadline = time.monotonic() + timeout
    said = ""
    while time.monotonic() < deadline:
        info = read_info(state)
        if info is not None and info.supervisor == supervisor.pid:
            if info.ready:
                return info
            if info.error:
                break
            stage = f"islands {len(info.islands)}/{len(islands)}"
            if len(info.islands) == len(islands):
                stage = "resource manager and API"
            if progress is not None and stage != said:
                progress(stage)
                said = stage
        if supervisor.poll() is not None:
            break
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(supervisor.pid, signal.SIGTERM)
    tail = "\n".join((state / "supervisor.log").read_text(errors="replace").splitlines()[-15:])
    raise EmbeddedError(
        f"the embedded cluster did not start; {state}/supervisor.log ends with:\n{tail}"
    )


def down(state: Path, timeout: float = 90.0) -> bool:
    """Stop the cluster of ``state``; whether one was running."""
    info = read_info(state)
    if info is None:
        return False
    os.kill(info.supervisor, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _alive(info.supervisor):
        time.sleep(0.1)
    if _alive(info.supervisor):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(info.supervisor, signal.SIGKILL)
    return True


def main(argv: list[str] | None = None) -> None:
    """The supervisor: ``python -m pathways_client.embedded --state DIR --island ...``."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument(
        "--island", action="append", default=[], help="NAME:HOSTS:DEVICES:POLICY:MAX_IN_FLIGHT"
    )
    parser.add_argument("--port", type=int, default=None)
    arguments = parser.parse_args(argv)
    specs = []
    for item in arguments.island:
        name, hosts, devices, policy, in_flight = item.split(":")
        specs.append(IslandSpec(name, int(hosts), int(devices), policy, int(in_flight)))
    Supervisor(arguments.state, specs, arguments.port).serve()


if __name__ == "__main__":
    main()
