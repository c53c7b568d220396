"""The embedded local mode: a whole Pathways cluster on one machine, with no Kubernetes.

``pathways up`` starts a detached *supervisor* process (``python -m pathways_client.embedded
--state DIR ...``, holding ``DIR/supervisor.lock``, which names its pid) that owns, until
``pathways down`` sends it SIGTERM:

- the islands: :class:`~pathways_client.launcher.LocalIsland` processes (a gang scheduler and
  executors with fake CPU devices on loopback), listed with their endpoints in
  ``DIR/islands.json``;
- the embedded resource manager (``python -m pathways_api.manager``): the operator's
  reconciliation decisions over the SQLite store ``DIR/pathways.db``; it runs programs' Jobs
  as local processes;
- the REST API (``python -m pathways_api`` in embedded mode) on 127.0.0.1, with the tokens
  of ``DIR/tokens.yaml`` (created on the first ``up``, one token per tenant, mode 0600).

At SIGTERM the supervisor stops the API, then the manager, which stops the programs' runs and
records them as interrupted (the next ``up`` starts them again). Each run's wrapper
(``python -m pathways_api.run_job``) is in a process group of its own, to outlive a manager that
dies (the restarted one adopts it): so the runs a manager left behind (it did not stop in time,
it had died, or ``down`` had to kill the supervisor's process group) are stopped by the
supervisor, or else by ``down``, as the manager would have stopped them (:func:`stop_runs`).

``DIR/cluster.json`` records the pids and ports; everything else in ``DIR`` survives ``down``
and the next ``up`` (the API keeps its port when it is free), so objects, bindings, logs and
traces are kept across restarts. Default state directory: ``$PATHWAYS_STATE`` or
``~/.pathways``.

The supervisor looks at its children every :data:`WATCH_INTERVAL` seconds and starts again
whichever died, as Kubernetes recreates pods:

- an island whose scheduler or any executor exited, or stopped answering its liveness probe
  (``GET /healthz`` every :data:`PROBE_INTERVAL` seconds; :data:`PROBE_FAILURES` failures in a
  row, as a kubelet's liveness probe: a stopped or hung process), is one lost failure domain
  (its executors form one JAX group): it is reported down in ``islands.json`` (no ready host,
  no scheduler; the manager marks it Degraded and moves or preempts its slices), whatever still
  runs of it
  is stopped, and it is started again whole with the same devices, at new endpoints, then
  published ready with its ``generation`` counted up;
- the manager is started again (it adopts the runs still running, see
  :mod:`pathways_api.manager`); the API is started again on the same port, so the URL in
  ``cluster.json`` stays valid.

A component that dies soon after each start (within :data:`STABLE_AFTER` seconds) is started
again after a growing delay (0.5, 1, 2 ... up to :data:`MAX_BACKOFF` seconds), at most
:data:`MAX_QUICK_FAILURES` times in a row: the next such failure leaves it down, and
``cluster.json`` records the error with the last line of the component's log (its cause, such
as ``Address already in use``). One that ran longer is started again at once.
``cluster.json`` counts the restarts of each component (``pathways status`` shows them).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import itertools
import json
import os
import re
import secrets
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from pathways_client.launcher import LocalIsland
from pathways_client.tls import load as load_tls
from pathways_core.manifests import Problem, problems_of
from pathways_core.resources import IslandSpec as IslandModel
from pathways_core.resources.base import DNS_LABEL_PATTERN
from pathways_core.wire.credentials import SESSION_KEY_ENV, SESSION_KEYS_FILE

DEFAULT_TENANTS = ("default",)
READY_TIMEOUT = 300.0
WATCH_INTERVAL = 0.2
"""Seconds between two looks of the supervisor at its children."""
STABLE_AFTER = 10.0
"""A component that ran this many seconds since it was started is healthy: its next failure
is the first of a new streak (started again at once)."""
MAX_QUICK_FAILURES = 5
"""How many times in a row a component that failed within STABLE_AFTER seconds of its start
is started again: the next such failure leaves it down, the error recorded in
``cluster.json``."""
MAX_BACKOFF = 10.0
PROBE_INTERVAL = 5.0
"""Seconds between two liveness probes of an island's processes."""
PROBE_TIMEOUT = 2.0
PROBE_FAILURES = 3
"""Probes failed in a row that make a process unresponsive (its island is restarted)."""
SUPERVISOR_RUNNING = 3
"""The exit status of a supervisor started for a state whose supervisor already runs."""


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
    topology: str = ""
    """Mesh shape of the island's devices, such as ``2x4``; empty for one axis of them all."""

    @property
    def mesh(self) -> str:
        """The island's topology as its Island records it."""
        return self.topology or str(self.hosts * self.devices_per_host)

    def problems(self) -> list[Problem]:
        """What an Island of these fake CPU devices would be refused for (wire field names:
        ``topology``, ``hosts``, ``devicesPerHost``); empty when it is valid."""
        fields = {"hosts": self.hosts, "devicesPerHost": self.devices_per_host}
        try:
            IslandModel.model_validate(
                {"acceleratorKind": "cpu-fake", "topology": self.mesh, **fields}
            )
        except ValidationError as error:
            return problems_of(error, IslandModel)
        return []


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
    restarts: dict[str, int] = field(default_factory=dict)
    """Times each component was started again: ``manager``, ``api``, ``island/NAME``."""


class EmbeddedError(RuntimeError):
    """The embedded cluster could not start or answer; the message says where to look."""


class StopIncomplete(EmbeddedError):
    """``down`` left part of the cluster running; the message names it, with its pids."""


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


def _is_supervisor(pid: int, state: Path) -> bool:
    """Whether ``pid`` is the running supervisor of ``state``, not a process that took its
    pid since (pids wrap quickly; a recorded one was signalled by ``down`` however it ended)."""
    if not _alive(pid):
        return False
    try:
        arguments = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return _lock_held(state) if not Path("/proc/self").exists() else False
    try:
        given = Path(os.fsdecode(arguments[arguments.index(b"--state") + 1]))
    except (ValueError, IndexError):
        return False
    return b"pathways_client.embedded" in arguments and given.resolve() == state.resolve()


def _exiting(pid: int) -> bool:
    """Whether ``pid`` is ending: alive, not yet a zombie, its command line already gone (the
    kernel drops it early in a process's exit, so it is no longer seen as the supervisor)."""
    try:
        return _alive(pid) and not Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _lock_held(state: Path) -> bool:
    """Whether a process holds ``state``'s supervisor lock (where ``/proc`` cannot tell)."""
    try:
        with (state / "supervisor.lock").open("a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(handle, fcntl.LOCK_UN)
            return False
    except OSError:
        return False


def _lock_holder(state: Path, wait: float = 5.0) -> int | None:
    """The pid of the supervisor that holds ``state``'s lock (found by the pid it wrote there,
    else by its command line: its ``cluster.json`` may be gone or name another process), or
    ``None`` when no process holds the lock. ``EmbeddedError`` when one does that is no
    supervisor of ``state`` after ``wait`` seconds (an ending supervisor loses its command line
    before its lock)."""
    deadline = time.monotonic() + wait
    while _lock_held(state):
        with contextlib.suppress(OSError, ValueError, IndexError):  # none written: older
            written = int((state / "supervisor.lock").read_text().split()[0])
            if _is_supervisor(written, state):
                return written
        with contextlib.suppress(OSError):
            for entry in Path("/proc").iterdir():
                if entry.name.isdigit() and _is_supervisor(int(entry.name), state):
                    return int(entry.name)
        if time.monotonic() > deadline:
            raise EmbeddedError(
                f"a process holds {state}/supervisor.lock but is no supervisor of {state}: find "
                f"it with 'fuser -v {state}/supervisor.lock', stop it, then try again"
            )
        time.sleep(0.1)
    return None


def _held_elsewhere(state: Path, pid: int) -> str:
    """Why ``up`` cannot start a supervisor of ``state``: another one, ``pid``, holds it."""
    return (
        f"another supervisor (pid {pid}) holds {state}, though {state}/cluster.json does not "
        f"name it (removed or written over): run 'pathways down --state {state}' to stop it "
        "(the state is kept), then 'pathways up'"
    )


def read_info(state: Path) -> ClusterInfo | None:
    """The recorded cluster, if its supervisor still runs."""
    path = state / "cluster.json"
    try:
        info = ClusterInfo(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None
    return info if _is_supervisor(info.supervisor, state) else None


def previous_islands(state: Path) -> list[IslandSpec]:
    """The islands the state directory's last cluster had (from ``islands.json``; none if it
    never ran or the file cannot be read)."""
    try:
        registered = json.loads((state / "islands.json").read_text())
        return [
            IslandSpec(
                name,
                int(entry["hosts"]),
                int(entry["devicesPerHost"]),
                str(entry["policy"]),
                topology=str(entry.get("topology") or ""),
            )
            for name, entry in sorted(registered.items())
        ]
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return []


def _tokens_document(state: Path) -> dict[str, Any]:
    """The state directory's tokens file, checked (an empty one when there is none);
    ``EmbeddedError`` naming the file and what is wrong with it."""
    path = state / "tokens.yaml"
    try:
        document = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        return {}
    except (OSError, yaml.YAMLError) as error:
        problem = str(error).replace("\n", " ")
    else:
        tenants = document.get("tenants", {}) if isinstance(document, dict) else None
        if not isinstance(tenants, dict):
            problem = "expected a mapping 'tenants: {name: {tokens: [...]}}'"
        else:
            problem = next(
                (
                    f"tenants.{name}.tokens: expected a list of non-empty strings"
                    for name, entry in tenants.items()
                    if not isinstance(entry, dict)
                    or not isinstance(entry.get("tokens"), list)
                    or not all(isinstance(t, str) and t for t in entry["tokens"])
                ),
                "",
            )
            if not problem:
                return document
    raise EmbeddedError(
        f"{path}: {problem}. Fix it, or move it away: the next 'pathways up' writes a new one "
        "(each tenant then gets a new token)"
    )


def tokens(state: Path) -> dict[str, str]:
    """Tenant -> its first token, from the state directory's tokens file."""
    document = _tokens_document(state)
    return {
        name: entry["tokens"][0]
        for name, entry in (document.get("tenants") or {}).items()
        if entry["tokens"]
    }


EXECUTOR_MEMORY = 256 << 20
"""About what one executor process takes (a Python with JAX: ~220 MiB idle, measured)."""
CLUSTER_MEMORY = 256 << 20
"""About what the supervisor, the API, the resource manager and a scheduler take together."""


def memory_problem(specs: Sequence[IslandSpec], available: int | None = None) -> str | None:
    """Why these islands cannot start on this machine (every host is an executor process),
    given ``available`` bytes (MemAvailable of /proc/meminfo when None, and no problem where
    that cannot be read); None when they fit."""
    if available is None:
        available = _memory_available()
        if available is None:
            return None
    executors = sum(spec.hosts for spec in specs)
    needed = executors * EXECUTOR_MEMORY + len(specs) * CLUSTER_MEMORY
    if needed <= available:
        return None
    return (
        f"{len(specs)} island(s) of {specs[0].hosts} host(s) start {executors} executor "
        f"processes, about {needed / (1 << 30):.1f} GiB of memory, and this machine has "
        f"{available / (1 << 30):.1f} GiB available: give fewer --hosts or --islands (each "
        "host is a process; more --devices per host cost little)"
    )


def _memory_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def tenant_problem(name: str) -> str | None:
    """Why ``name`` cannot be a tenant, whose name is its namespace's; None if it can."""
    if re.match(DNS_LABEL_PATTERN, name):
        return None
    return (
        f"{name!r} is not a lowercase RFC 1123 label (a-z, 0-9 and '-', at most 63 "
        "characters): a tenant's name is its namespace's"
    )


def ensure_tenants(
    state: Path, tenants: Sequence[str], quotas: dict[str, int] | None = None
) -> dict[str, str]:
    """Add tenants (with a fresh random token each) to the tokens file; keep existing ones.
    ValueError for a name that cannot be a tenant (each is a namespace: a DNS label)."""
    for name in tenants:
        problem = tenant_problem(name)
        if problem:
            raise ValueError(problem)
    path = state / "tokens.yaml"
    document = _tokens_document(state)
    entries = document.setdefault("tenants", {})
    missing = [name for name in tenants if name not in entries]
    for name in missing:
        entries[name] = {"tokens": [secrets.token_urlsafe(24)]}
        if quotas:
            entries[name]["quotas"] = dict(quotas)
    if missing or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_private(path, yaml.safe_dump(document, sort_keys=True))
    path.chmod(0o600)  # tenants' credentials: its user's alone, however it was made
    return tokens(state)


# -- the runs of the state's programs ----------------------------------------------------------
# The resource manager runs every Job under ``python -m pathways_api.run_job --record PREFIX``,
# which records in ``PREFIX.json`` its pid, that pid's start time and its command's pid (the
# command's process group); the record is read here as that module documents it, not through
# it: components never import each other (the import-linter contracts).

RUN_GRACE = 10.0
"""A run's seconds from SIGTERM to SIGKILL when its wrapper was given no ``--grace``."""
RUN_KILL_MARGIN = 5.0
"""How long after its grace period a stopped run's wrapper (which then kills what its command
left) is waited for before its process groups are SIGKILLed, as the manager waits; and then
how long they are waited for to end."""


@dataclass(frozen=True)
class Run:
    """A live run of one of the state's programs: its wrapper, checked against ``/proc``."""

    record: Path
    """Prefix of its files: ``STATE/runs/NAMESPACE/JOB`` (``.json``, ``.exit``, ``.lock``)."""
    pid: int
    """The wrapper's, leader of its process group."""
    start: int
    """When ``pid`` started (clock ticks since boot): a later process with its pid is not it."""
    command: int
    """The command's pid, leader of its own process group (0 while not started)."""
    grace: float

    def __str__(self) -> str:
        command = f", its command {self.command}" if self.command else ""
        return f"run {self.record.parent.name}/{self.record.name} (pid {self.pid}{command})"

    def alive(self) -> bool:
        return _process_start(self.pid) == self.start


def _process_start(pid: int) -> int | None:
    """When ``pid`` started (field 22 of ``/proc/PID/stat``); ``None`` if it does not run (a
    zombie counts as gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def _wrapper_grace(pid: int, record: Path) -> float | None:
    """The grace period of process ``pid`` if it is the run wrapper of ``record``, else
    ``None``: a copy of a state folder holds the records of another cluster's live runs, which
    are that cluster's to stop."""
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return None
    own = words[: words.index("--")] if "--" in words else words  # not the command's own
    options = dict(itertools.pairwise(own))  # each word -> the next: an option's value
    given = options.get("--record")
    if "pathways_api.run_job" not in own or given is None:
        return None
    if Path(given).resolve() != record.resolve():
        return None
    try:
        return float(options.get("--grace", RUN_GRACE))
    except ValueError:
        return RUN_GRACE


def live_runs(state: Path) -> list[Run]:
    """The runs of ``state``'s programs whose wrapper still runs."""
    runs = []
    for record_file in sorted((state / "runs").glob("*/*.json")):
        try:
            found = json.loads(record_file.read_text())
            pid, start, command = int(found["pid"]), int(found["start"]), found.get("child")
        except (OSError, ValueError, TypeError, KeyError):
            continue
        record = record_file.with_suffix("")
        if _process_start(pid) != start:
            continue
        grace = _wrapper_grace(pid, record)
        if grace is not None:
            runs.append(Run(record, pid, start, int(command or 0), grace))
    return runs


def _signal_group(group: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # gone, or not ours
        os.killpg(group, signum)


def stop_runs(state: Path) -> tuple[list[Run], list[Run]]:
    """Stop the live runs of ``state`` as the resource manager stops them at ``down`` (which
    it could not: it hung and was killed, or had died): SIGTERM to each wrapper's process
    group (the wrapper passes it on to its command's), then SIGKILL of both groups of those
    still there after their grace period. Their records are removed, so that the next ``up``
    starts them again as interrupted, from their checkpoints, as the manager's would be (its
    Job is active and left no record: see ``pathways_api.manager``). Returns the runs
    stopped and those still running."""
    runs = live_runs(state)
    if not runs:
        return [], []
    for run in runs:
        _signal_group(run.pid, signal.SIGTERM)
    deadline = time.monotonic() + max(run.grace for run in runs) + RUN_KILL_MARGIN
    while any(run.alive() for run in runs) and time.monotonic() < deadline:
        time.sleep(0.05)
    for run in runs:
        if run.alive():
            for group in (run.pid, run.command):
                if group:
                    _signal_group(group, signal.SIGKILL)
    deadline = time.monotonic() + RUN_KILL_MARGIN
    while any(run.alive() for run in runs) and time.monotonic() < deadline:
        time.sleep(0.05)
    stopped = [run for run in runs if not run.alive()]
    for run in stopped:
        # The exit status it wrote as it was stopped must not be read as its outcome.
        for suffix in (".json", ".exit", ".lock"):
            run.record.with_name(run.record.name + suffix).unlink(missing_ok=True)
    return stopped, [run for run in runs if run.alive()]


# -- the supervisor (runs detached) ------------------------------------------------------------


class Restarts:
    """The crash-loop guard of one component: when it may be started again, if ever."""

    def __init__(self, started: float) -> None:
        self.count = 0  # restarts so far
        self.streak = 0  # failures in a row, each soon after its start
        self.started = started  # when it was last started (monotonic)

    def failed(self, now: float) -> float | None:
        """Record a failure; the seconds to wait before the next start (none after a healthy
        run, then 0.5, 1, 2 ... :data:`MAX_BACKOFF`), or ``None`` once it failed more than
        :data:`MAX_QUICK_FAILURES` times in a row (it was started again that many times)
        within :data:`STABLE_AFTER` seconds of its start each time."""
        if now - self.started >= STABLE_AFTER:
            self.streak = 0
        self.streak += 1
        if self.streak > MAX_QUICK_FAILURES:
            return None
        return 0.0 if self.streak == 1 else min(MAX_BACKOFF, 0.5 * 2 ** (self.streak - 2))


class Supervisor:
    """Starts and owns the islands, the manager and the API of one state directory, and
    starts again whichever of them dies (see the module docstring)."""

    def __init__(self, state: Path, islands: Sequence[IslandSpec], port: int | None) -> None:
        self.state = state
        self.specs = {spec.name: spec for spec in islands}
        self.port = port
        self.islands: dict[str, LocalIsland] = {}
        self.children: dict[str, subprocess.Popen[str]] = {}
        self.info = ClusterInfo(supervisor=os.getpid(), started=time.time())
        self.registered: dict[str, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._lock = threading.RLock()
        self._guards: dict[str, Restarts] = {}
        self._restarting: dict[str, threading.Thread] = {}
        self._down: set[str] = set()  # components whose last start failed
        self._unresponsive: dict[str, str] = {}  # island -> which process failed its probes
        self._start_errors: dict[str, str] = {}  # component -> why its last start failed
        self._log_starts: dict[str, int] = {}  # child -> its log's size when it was started
        self._gave_up: set[str] = set()
        self._started_at = time.monotonic()  # when start() ended: every component's first start

    def _write(self) -> None:
        with self._lock:
            _write_json(self.state / "cluster.json", asdict(self.info))

    def _publish(self) -> None:
        """Write ``islands.json``, which the resource manager reads (atomically: it never
        sees half a file)."""
        with self._lock:
            _write_json(self.state / "islands.json", self.registered)

    def _say(self, message: str) -> None:
        _say(message)

    def _spawn(self, name: str, arguments: list[str]) -> tuple[subprocess.Popen[str], dict]:
        previous = self.children.get(name)
        if previous is not None and previous.stdin:  # the child this one replaces
            previous.stdin.close()
        with (self.state / f"{name}.log").open("a") as log:
            # The log is appended across starts: what this one says comes after this.
            self._log_starts[name] = os.fstat(log.fileno()).st_size
            popen = subprocess.Popen(
                # Each child stops once its standard input closes: the supervisor holds the
                # pipe's other end, so a supervisor killed unstopped leaves nothing running.
                [sys.executable, *arguments, "--exit-with-launcher"],
                stdout=subprocess.PIPE,
                stderr=log,
                stdin=subprocess.PIPE,
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
            try:
                popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait()
            log = self.state / f"{name}.log"
            last = _last_line(log, since=self._log_starts[name])
            raise EmbeddedError(
                f"the {name} did not start (exit code {popen.returncode})"
                + (f": {last}" if last else "")
                + f"; see {log}"
            ) from None

    # -- starting each component -----------------------------------------------------------------

    def _start_island(self, spec: IslandSpec) -> None:
        island = LocalIsland(
            hosts=spec.hosts,
            devices_per_host=spec.devices_per_host,
            policy=spec.policy,
            max_in_flight=spec.max_in_flight,
            name=spec.name,
            workdir=self.state / "islands" / spec.name,
            compilation_cache=self.state / "xla-cache",
            environment={SESSION_KEY_ENV: session_key(self.state, spec.name)},
        )
        island.workdir.mkdir(parents=True, exist_ok=True)  # type: ignore[union-attr]
        with self._lock:
            self.islands[spec.name] = island  # so that shutdown stops it, even half started
        island.start()
        generation = int(self.registered.get(spec.name, {}).get("generation", 0)) + 1
        entry = {
            "endpoint": island.scheduler_endpoint,
            "hosts": spec.hosts,
            "devicesPerHost": spec.devices_per_host,
            "policy": spec.policy,
            "topology": spec.mesh,
            "readyHosts": list(range(spec.hosts)),
            "schedulerReady": True,
            "generation": generation,
        }
        with self._lock:
            self.registered[spec.name] = entry
            self.info.islands[spec.name] = {
                **{
                    k: entry[k]
                    for k in ("endpoint", "hosts", "devicesPerHost", "topology", "policy")
                },
                "pids": [p.popen.pid for p in [*island.executors, island.scheduler] if p],
                "executors": [p.popen.pid for p in island.executors],
                "scheduler": island.scheduler.popen.pid if island.scheduler else 0,
                # Prometheus metrics of the scheduler, then of each executor.
                "metrics": [
                    f"http://127.0.0.1:{p.health_port}/metrics"
                    for p in [island.scheduler, *island.executors]
                    if p and p.health_port
                ],
                "generation": generation,
                "state": "ready",
                "startedAt": time.time(),
            }

    def _island_down(self, name: str, why: str) -> None:
        """Report a lost island to the resource manager: no host, no scheduler."""
        with self._lock:
            entry = self.registered.get(name)
            if entry is not None and entry.get("schedulerReady"):
                self.registered[name] = {**entry, "readyHosts": [], "schedulerReady": False}
                self._publish()
            if name in self.info.islands:
                self.info.islands[name]["state"] = f"restarting: {why}"
            self._write()

    def _start_manager(self) -> None:
        manager, _ = self._spawn(
            "manager", ["-m", "pathways_api.manager", "--state", str(self.state)]
        )
        self.info.manager_pid = manager.pid

    def _start_api(self, port: int) -> int:
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
        # The API serves HTTPS when the PATHWAYS_TLS_* variables give it a certificate.
        tls = load_tls()
        scheme = "https" if tls is not None and tls.settings.identity else "http"
        self.info.api = f"{scheme}://127.0.0.1:{ready['port']}"
        _wait_healthy(self.info.api, api, tls.client if tls is not None else None)
        return int(ready["port"])

    def start(self) -> None:
        """Start everything, in dependency order; record it in ``cluster.json``."""
        self._write()
        for spec in self.specs.values():
            self._go_on()
            self._start_island(spec)
            self._write()
        self._publish()
        if not (self.state / "tokens.yaml").exists():
            ensure_tenants(self.state, DEFAULT_TENANTS)
        self._go_on()
        self._start_manager()
        port = self.port if self.port is not None else 0
        if port and not _port_free(port):
            port = 0
        # Restarts reuse the port: the URL in cluster.json stays valid for clients.
        self._go_on()
        self.port = self._start_api(port)
        self._go_on()
        self._started_at = time.monotonic()
        self.info.ready = True
        self._write()

    def _go_on(self) -> None:
        """Raise if told to stop while starting: `pathways down` during `up` was answered
        after the whole start, and `up` then printed a cluster that was going away."""
        if self._stop.is_set():
            raise EmbeddedError("stopped while it started ('pathways down', or a signal)")

    # -- watching and restarting -----------------------------------------------------------------

    def watch(self) -> None:
        """One look at every component; start a restart of each one found dead."""
        for name, island in list(self.islands.items()):
            component = f"island/{name}"
            if component in self._restarting or component in self._gave_up:
                continue
            process = island.exited() if component not in self._down else None
            unresponsive = self._unresponsive.pop(name, None)
            if component in self._down or process is not None or unresponsive:
                if process is not None:
                    code = process.popen.returncode
                    why = f"{process.name} exited with code {code}{_cause(code, process.log)}"
                else:
                    failed = self._start_errors.get(component, "").splitlines()[:1]
                    why = unresponsive or ": ".join(["its last start failed", *failed])
                self._island_down(name, why)
                self._failed(component, f"island {name}: {why}", self._restart_island, name)
                if component in self._gave_up:
                    island.stop(grace=2.0)
        for name, restart in (("manager", self._restart_manager), ("api", self._restart_api)):
            child = self.children.get(name)
            if name in self._restarting or name in self._gave_up or child is None:
                continue
            if name in self._down or child.poll() is not None:
                code = child.returncode
                log, since = self.state / f"{name}.log", self._log_starts.get(name, 0)
                why = f"the {name} exited with code {code}{_cause(code, log, since)}"
                if code is None:  # its last start failed, though it runs (never answered)
                    failed = self._start_errors.get(name, "see its log")
                    why = f"the {name} could not be started again: {failed}"
                self._failed(name, why, restart)

    def probe(self) -> None:
        """Liveness probes of every island's processes, every :data:`PROBE_INTERVAL` seconds
        until stopped: an island with a process that failed :data:`PROBE_FAILURES` in a row
        is marked for :meth:`watch` to restart."""
        failures: dict[int, int] = {}  # pid -> probes failed in a row
        while not self._stop.wait(PROBE_INTERVAL):
            for name, island in list(self.islands.items()):
                if f"island/{name}" in self._restarting or name in self._unresponsive:
                    continue
                for process in island.processes():
                    pid = process.popen.pid
                    if not process.health_port or process.popen.poll() is not None:
                        continue  # an exit is seen by watch()
                    if process.answers(PROBE_TIMEOUT):
                        failures.pop(pid, None)
                        continue
                    failures[pid] = failures.get(pid, 0) + 1
                    if failures[pid] >= PROBE_FAILURES:
                        self._unresponsive[name] = (
                            f"{process.name} did not answer its liveness probe {failures[pid]} "
                            f"times in a row ({PROBE_TIMEOUT:g} s each: stopped or hung)"
                        )
                        break

    def _failed(self, component: str, why: str, restart: Callable[..., None], *args: Any) -> None:
        guard = self._guards.setdefault(component, Restarts(self._started_at))
        delay = guard.failed(time.monotonic())
        if delay is None:
            message = (
                f"{why}; it failed {guard.streak} times in a row, each within "
                f"{STABLE_AFTER:.0f} s of its start, so it is not started again (see "
                f"{self.state}/supervisor.log)"
            )
            self._say(message)
            self._gave_up.add(component)
            with self._lock:
                self.info.error = message
                self._write()
            return
        self._say(f"{why}; starting it again in {delay:.1f} s")
        thread = threading.Thread(
            target=self._restart,
            args=(component, guard, delay, restart, args),
            name=f"restart-{component}",
            daemon=True,
        )
        self._restarting[component] = thread
        thread.start()

    def _restart(
        self,
        component: str,
        guard: Restarts,
        delay: float,
        restart: Callable[..., None],
        args: tuple[Any, ...],
    ) -> None:
        try:
            if self._stop.wait(delay):
                return
            started = time.monotonic()
            restart(*args)
            guard.count += 1
            guard.started = time.monotonic()
            self._down.discard(component)
            with self._lock:
                self.info.restarts[component] = guard.count
                self._write()
            self._say(f"{component} started again in {time.monotonic() - started:.1f} s")
        except Exception as error:  # counted as another failure by the next watch
            # A start that failed is a start that died at once: counted from now, failures
            # in a row back off and end in giving up (they were each taken for the first of
            # a streak, restarted at once for ever).
            guard.started = time.monotonic()
            self._start_errors[component] = str(error) or repr(error)
            self._down.add(component)
            self._say(f"{component} could not be started again: {error}")
        finally:
            self._restarting.pop(component, None)

    def _restart_island(self, name: str) -> None:
        old = self.islands[name]
        # One failure domain: whatever still runs of it goes (a restarted executor could not
        # rejoin the island's JAX group), and it starts again whole, at new endpoints.
        old.stop(grace=2.0)
        if self._stop.is_set():
            return
        self._start_island(self.specs[name])
        if self._stop.is_set():
            self.islands[name].stop()
            return
        self._publish()

    def _restart_manager(self) -> None:
        if not self._stop.is_set():
            self._start_manager()

    def _restart_api(self) -> None:
        if not self._stop.is_set():
            self._start_api(self.port or 0)

    def serve(self) -> None:
        """Run until SIGTERM, restarting what dies, then stop everything."""
        signal.signal(signal.SIGTERM, lambda *_: self._stop.set())
        signal.signal(signal.SIGINT, lambda *_: self._stop.set())
        try:
            self.start()
        except BaseException as error:
            self.info.error = str(error)
            self._write()
            self.shutdown()
            raise
        threading.Thread(target=self.probe, name="liveness", daemon=True).start()
        while not self._stop.wait(WATCH_INTERVAL):
            try:
                self.watch()
            except Exception as error:  # a bug must not leave the cluster unwatched
                self._say(f"watching failed: {error!r}")
        self.shutdown()

    def shutdown(self) -> None:
        """API first (no new work), then the manager (it records running Jobs as lost),
        then the islands."""
        self._stop.set()
        for name in ("api", "manager"):
            thread = self._restarting.get(name)
            if thread is not None:
                thread.join(timeout=90)  # a restart under way ends before its child stops
        for name in ("api", "manager"):
            child = self.children.get(name)
            if child is not None and child.poll() is None:
                child.terminate()
                try:
                    child.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
            if child is not None and child.stdin:
                child.stdin.close()
        # The manager stops its runs at SIGTERM; one that did not stop in time (hung, or
        # stopped) and was killed, or that had died, left them running (each is a process
        # group of its own, to outlive a manager that dies: a restarted one adopts it).
        stopped, left = stop_runs(self.state)
        if stopped:
            self._say(f"stopped what the manager left running: {', '.join(map(str, stopped))}")
        if left:
            self._say(f"could not stop {', '.join(map(str, left))}: 'pathways down' tries again")
        for island in list(self.islands.values()):
            island.stop()
        for thread in list(self._restarting.values()):
            thread.join(timeout=30)
        for island in list(self.islands.values()):
            island.stop()  # what a restart under way started meanwhile
        self.info.ready = False
        self.info.api_pid = self.info.manager_pid = 0
        self._write()


def session_key(state: Path, island: str) -> str:
    """``island``'s session key, made at its first start and kept in ``session-keys.json``
    (its user's alone): runs and sessions signed for it before a restart still open."""
    path = state / SESSION_KEYS_FILE
    keys: Any = {}
    why = ""
    try:
        keys = json.loads(path.read_text())
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as error:
        keys, why = None, f"not JSON: {error}"
    if not isinstance(keys, dict):
        raise EmbeddedError(
            f"{path} cannot be read (expected JSON mapping islands to keys; "
            f"{why or type(keys).__name__}): move it away, and the next start makes new keys "
            "(runs started with the old ones cannot reconnect)"
        )
    if not isinstance(keys.get(island), str):
        keys[island] = secrets.token_urlsafe(32)
        _write_private(path, json.dumps(keys, indent=2))
    return keys[island]


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, readable by this user alone, whole or not at all (a reader,
    the API or a concurrent 'up', never sees half a file)."""
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    with os.fdopen(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
        out.write(text)
    os.replace(partial, path)


def _write_json(path: Path, value: Any) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(value, indent=2))
    temporary.replace(path)


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


def _wait_healthy(
    url: str,
    process: subprocess.Popen[str],
    context: ssl.SSLContext | None = None,
    timeout: float = 60.0,
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise EmbeddedError(f"the API exited with code {process.returncode}")
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"{url}/healthz", timeout=2, context=context) as answer,
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
    """Start the cluster of ``state`` detached (or return the one already running). Two at
    once on one state take turns: the second finds the cluster the first started."""
    state.mkdir(mode=0o700, parents=True, exist_ok=True)  # tenants' specs, logs and tokens
    with _locked(state / "up.lock"):
        return _up(state, islands, tenants, progress, timeout)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path``, waiting for it (it goes with the process that
    holds it, however that ends)."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _up(
    state: Path,
    islands: Sequence[IslandSpec],
    tenants: Sequence[str],
    progress: Callable[[str], None] | None,
    timeout: float,
) -> ClusterInfo:
    running = read_info(state)
    if running is not None and running.ready:
        return _joined(state, running, tenants)
    if running is not None and not running.error:
        # Started by an 'up' that went before it was ready (killed, its terminal closed):
        # waited for, as that 'up' would have (told to run 'down', one threw it away).
        info, failure = _await_ready(
            state,
            running.supervisor,
            len(islands),
            progress,
            time.monotonic() + timeout,
            lambda: read_info(state) is None,
        )
        if info is not None:
            return _joined(state, info, tenants)
        raise EmbeddedError(
            f"the embedded cluster did not start: {failure or 'its supervisor ended'} (see "
            f"{state / 'supervisor.log'})"
        )
    if running is not None:
        raise EmbeddedError(
            f"a cluster of {state} failed to start (supervisor pid {running.supervisor}): "
            f"{running.error}. Run 'pathways down' first"
        )
    holder = _lock_holder(state)
    if holder is not None:  # its supervisor runs, though its cluster.json does not say so
        raise EmbeddedError(_held_elsewhere(state, holder))
    ensure_tenants(state, tenants)
    previous_port = None
    with contextlib.suppress(OSError, ValueError, KeyError, IndexError, TypeError, AttributeError):
        previous_port = int(
            json.loads((state / "cluster.json").read_text())["api"].rsplit(":", 1)[1]
        )
    arguments = [sys.executable, "-m", "pathways_client.embedded", "--state", str(state)]
    for spec in islands:
        arguments += [
            "--island",
            f"{spec.name}:{spec.hosts}:{spec.devices_per_host}:{spec.policy}:{spec.max_in_flight}:"
            f"{spec.topology}",
        ]
    if previous_port:
        arguments += ["--port", str(previous_port)]
    with (state / "supervisor.log").open("a") as log:
        # The log is appended across starts: a failure shows only what this one wrote.
        log_start = os.fstat(log.fileno()).st_size
        supervisor = subprocess.Popen(
            arguments,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,  # outlives the CLI and its terminal
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        info, failure = _await_ready(
            state,
            supervisor.pid,
            len(islands),
            progress,
            time.monotonic() + timeout,
            lambda: supervisor.poll() is not None,
        )
    except BaseException:
        # Interrupted while it starts (Ctrl-C): the half-started cluster goes too (its
        # supervisor, a session of its own, ran on with its islands).
        _stop_starting(supervisor)
        raise
    if info is not None:
        return info
    exit_code = supervisor.poll()  # None: it still ran, and is stopped now
    _stop_starting(supervisor)
    raise EmbeddedError(
        _start_failure(state, supervisor.pid, exit_code, failure, log_start, timeout)
    )


def _joined(state: Path, running: ClusterInfo, tenants: Sequence[str]) -> ClusterInfo:
    """A ready cluster ``up`` found, its tenants' tokens made."""
    if running.error:  # said here: a bare table, and work then waited without a word
        raise EmbeddedError(
            f"the cluster of {state} runs without a part: {running.error}. Run 'pathways "
            "down', then 'pathways up', to start it whole again"
        )
    ensure_tenants(state, tenants)
    return running


def _await_ready(
    state: Path,
    supervisor: int,
    islands: int,
    progress: Callable[[str], None] | None,
    deadline: float,
    ended: Callable[[], bool],
) -> tuple[ClusterInfo | None, str | None]:
    """Wait until the cluster supervisor ``supervisor`` starts with ``islands`` islands is
    ready (its record), saying each stage; ``(None, its error or None)`` if it records an
    error, ``ended`` says it ended, or ``deadline`` passes first."""
    said = ""
    while time.monotonic() < deadline:
        info = read_info(state)
        if info is not None and info.supervisor == supervisor:
            if info.ready:
                return info, None
            if info.error:
                return None, info.error
            stage = f"islands {len(info.islands)}/{islands}"
            if len(info.islands) == islands:
                stage = "resource manager and API"
            if progress is not None and stage != said:
                progress(stage)
                said = stage
        if ended():
            break
        time.sleep(0.2)
    return None, None


def _start_failure(
    state: Path,
    supervisor: int,
    exit_code: int | None,
    failure: str | None,
    log_start: int,
    timeout: float,
) -> str:
    """Why the supervisor ``up`` started (pid ``supervisor``, which exited with
    ``exit_code``, or ran until ``up`` stopped it: ``None``) did not start the cluster: its
    error, then what it wrote to its log (from byte ``log_start``) that the error does not
    say already."""
    if exit_code == SUPERVISOR_RUNNING:  # one was started since 'up' looked
        with contextlib.suppress(EmbeddedError):
            holder = _lock_holder(state, wait=0.0)
            if holder is not None:
                return f"the embedded cluster did not start: {_held_elsewhere(state, holder)}"
    if failure is None:  # it recorded its error and ended before 'up' looked again
        with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
            recorded = json.loads((state / "cluster.json").read_text())
            if recorded.get("supervisor") == supervisor:
                failure = recorded.get("error") or None
    if failure is None:
        failure = (
            f"its supervisor exited with code {exit_code}"
            if exit_code is not None
            else f"it was not ready within {timeout:.0f} s"
        )
    log = state / "supervisor.log"
    said = [line for line in _lines_since(log, log_start) if failure not in line]
    shown = "\n".join(said[-15:])
    return f"the embedded cluster did not start: {failure}" + (
        f"\n{log} ends with:\n{shown}" if said else ""
    )


def _stop_starting(supervisor: subprocess.Popen[bytes]) -> None:
    """Stop a supervisor whose cluster did not start, and wait for it to end."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(supervisor.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        supervisor.wait(timeout=30)  # its last words are in its log once it has ended


def _last_line(log: Path, since: int = 0) -> str:
    """The last meaningful line a component wrote to its log after byte ``since`` (its error,
    when it failed: a traceback ends with it): not blank, nor a traceback's ``^^^`` marks."""
    return next(reversed(_lines_since(log, since)), "")[:500]


def _lines_since(log: Path, since: int) -> list[str]:
    """The meaningful lines of ``log`` after byte ``since`` (what one start of a component,
    or of the supervisor, wrote to a log appended across starts)."""
    try:
        with log.open("rb") as handle:
            handle.seek(since)
            text = handle.read().decode(errors="replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if line.strip(" ^~\t")]


def _cause(code: int | None, log: Path, since: int = 0) -> str:
    """What to add to "exited with code N": the signal that killed it, or the last line of
    what it wrote since it started (why it failed: ``OSError: [Errno 98] Address already in
    use``), which was only in its log."""
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f" (killed by {signal.Signals(-code).name})"
        return ""
    last = _last_line(log, since)
    return f": {last}" if last else ""


def _say(message: str) -> None:
    """A line of the supervisor's log (its standard output and error)."""
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}", flush=True)


def down(state: Path, timeout: float = 90.0) -> bool:
    """Stop the cluster of ``state`` (its supervisor, found by ``cluster.json`` or else by its
    lock) and the runs of its programs its resource manager left running; whether anything
    of it ran. :class:`StopIncomplete` naming, with their pids, the processes still running
    after that: only then is the cluster stopped."""
    info = read_info(state)
    try:
        supervisor = info.supervisor if info is not None else _lock_holder(state)
    except EmbeddedError as error:
        raise StopIncomplete(str(error)) from None
    children = _children_of(info) if info is not None else []
    if supervisor is not None:
        _stop_supervisor(state, supervisor, timeout)
    # The runs a manager that was killed, or had died, left behind (each is a process group of
    # its own): the supervisor stops them, unless it was killed too.
    stopped, runs_left = stop_runs(state)
    ended = supervisor is None or not (_is_supervisor(supervisor, state) or _exiting(supervisor))
    left = [] if ended else [f"the supervisor (pid {supervisor})"]
    left += [f"{name} (pid {pid})" for name, pid in _still_running(children)]
    left += [str(run) for run in runs_left]
    if left:
        pids = re.findall(r"(?:pid|command) (\d+)", " ".join(left))
        raise StopIncomplete(
            f"the embedded cluster of {state} is not stopped; still running: {', '.join(left)}. "
            f"Stop them with 'kill -KILL {' '.join(pids)}' (as a user allowed to)"
        )
    return supervisor is not None or bool(stopped)


def _stop_supervisor(state: Path, supervisor: int, timeout: float) -> None:
    """SIGTERM the supervisor and wait ``timeout`` seconds for it to stop its cluster; then
    SIGKILL its process group (with its API and manager; its islands' processes stop as the
    pipe it held closes)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(supervisor, signal.SIGTERM)
    with contextlib.suppress(ProcessLookupError):  # a stopped one takes it now
        os.kill(supervisor, signal.SIGCONT)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (
        _is_supervisor(supervisor, state) or _exiting(supervisor)
    ):
        time.sleep(0.1)
    if _is_supervisor(supervisor, state):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(supervisor, signal.SIGKILL)
        deadline = time.monotonic() + 5.0
        while _alive(supervisor) and time.monotonic() < deadline:
            time.sleep(0.05)


def _children_of(info: ClusterInfo) -> list[tuple[str, int]]:
    """The processes the supervisor of ``info`` started, named."""
    children = [("the API", info.api_pid), ("the resource manager", info.manager_pid)]
    for name, island in info.islands.items():
        children += [(f"island {name}'s process", pid) for pid in island.get("pids", [])]
    return [(name, pid) for name, pid in children if pid]


def _still_running(children: list[tuple[str, int]], wait: float = 10.0) -> list[tuple[str, int]]:
    """Those of ``children`` still running after up to ``wait`` seconds (each stops once the
    pipe its supervisor held closes)."""
    deadline = time.monotonic() + wait

    def running() -> list[tuple[str, int]]:
        return [(name, pid) for name, pid in children if _is_cluster_process(pid)]

    while (left := running()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def _is_cluster_process(pid: int) -> bool:
    """Whether ``pid`` runs as a process a supervisor started (not one that took its pid)."""
    try:
        return _alive(pid) and b"--exit-with-launcher" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def main(argv: list[str] | None = None) -> None:
    """The supervisor: ``python -m pathways_client.embedded --state DIR --island ...``."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument(
        "--island",
        action="append",
        default=[],
        help="NAME:HOSTS:DEVICES:POLICY:MAX_IN_FLIGHT:TOPOLOGY (an empty TOPOLOGY: one axis)",
    )
    parser.add_argument("--port", type=int, default=None)
    arguments = parser.parse_args(argv)
    # What the cluster writes (the store, every tenant's logs and checkpoints, the islands'
    # logs) is its user's alone, as tokens.yaml is.
    os.umask(0o077)
    specs = []
    for item in arguments.island:
        name, hosts, devices, policy, in_flight, topology = item.split(":")
        specs.append(IslandSpec(name, int(hosts), int(devices), policy, int(in_flight), topology))
    # One supervisor per state (a second would run the same store's Jobs twice): the lock
    # is held until this process ends, however it ends.
    lock = (arguments.state / "supervisor.lock").open("a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"another supervisor runs the cluster of {arguments.state}", file=sys.stderr)
        sys.exit(SUPERVISOR_RUNNING)
    # Who holds the lock, for 'down' and 'up' when cluster.json no longer says it.
    lock.truncate(0)
    lock.write(f"{os.getpid()}\n")
    lock.flush()
    try:
        Supervisor(arguments.state, specs, arguments.port).serve()
    except EmbeddedError as error:
        # Its message is the whole story ('pathways up' shows it): no traceback to read past.
        _say(f"the cluster did not start: {error}")
        sys.exit(1)


if __name__ == "__main__":
    main()
