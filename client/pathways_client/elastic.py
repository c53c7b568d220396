"""Elastic training: survive the loss of a slice and continue on the rest.

In the spirit of pathways-utils' ``elastic_retry``: a function wrapped by
``Manager.elastic_retry`` is called again when a computation fails because devices went away
(an executor died). Before each retry the manager finds which of its slices lost devices and
drops them; the function reads ``manager.available`` and resumes from its own last checkpoint
(host state it saved, such as fetched parameters):

    manager = pw.elastic.Manager(cluster, slices)

    @manager.elastic_retry(max_retries=2)
    def train():
        replicas = manager.available          # the slices still alive
        step, params = pw.checkpoint.restore() or (0, init)  # where the last attempt stopped
        ...

Failures that are not a loss of devices (a bad input, a bug) are raised at once.

A lost slice comes back once every executor of its devices was restarted and taken back by
its scheduler (a kubelet restarts a killed executor's container): each retry begins by taking
back the slices that did, and ``manager.wait_for_slices()`` waits for them.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import grpc

from pathways_client import tls
from pathways_client.cluster import Cluster
from pathways_client.errors import ConnectError, NodeFailed, PathwaysError, SliceError
from pathways_client.island_client import IslandClient
from pathways_client.rpc import stub
from pathways_client.slices import Slice
from pathways_core.wire import EXECUTOR, SCHEDULER, Service, pb

T = TypeVar("T")
PROBE_TIMEOUT_SECONDS = 2.0


class SlicesLost(PathwaysError):
    """Every slice is gone, or the retries are used up; ``lost`` names the slices lost."""

    def __init__(self, message: str, lost: Sequence[Slice]) -> None:
        super().__init__(message)
        self.lost = list(lost)


class Manager:
    """Tracks which of a program's slices are still usable and retries work after losses."""

    def __init__(self, cluster: Cluster, slices: Sequence[Slice]) -> None:
        if not slices:
            raise ValueError("Manager: slices: expected at least one slice")
        names = [item.name for item in slices]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"Manager: slices: each slice once, but {twice} appear twice")
        self.cluster = cluster
        self.slices = list(slices)
        self.lost: list[Slice] = []
        self.events: list[tuple[int, str, list[str]]] = []  # (attempt, error, slices lost)
        self._lock = threading.Lock()

    @property
    def available(self) -> list[Slice]:
        """The slices not found lost (by :meth:`find_lost`, which every retry calls, less
        those :meth:`find_returned` took back), in their original order."""
        return [item for item in self.slices if item not in self.lost]

    def find_lost(self) -> list[Slice]:
        """Find which available slices lost devices; mark and return the newly lost. A slice is
        lost when an executor holding one of its devices was declared lost by its island's
        scheduler or does not answer, when the session with that scheduler ended (the
        scheduler stopped: what the island held is gone) or cannot be opened (its scheduler
        does not answer), or when the slice itself is unusable (see :meth:`_unusable`: its
        lease ran out, it was deleted). ``ConnectError`` only once the connection is closed."""
        with self._lock:
            dead: dict[str, set[int] | None] = {}  # None: the whole island
            owners: dict[str, dict[int, int]] = {}  # device -> executor, per island alive
            for island in {item.island for item in self.available}:
                session = self._session(island)
                if session is None or session.ended:
                    dead[island] = None
                    continue
                known = session.lost_executors
                owners[island] = session.device_owner
                dead[island] = set(known) | {
                    executor.index
                    for executor in session.info.executors
                    if executor.index not in known and not _answers(executor.endpoint)
                }
            newly = [
                item
                for item in self.available
                if self._unusable(item) is not None
                or _touches(item, dead[item.island], owners.get(item.island, {}))
            ]
            self.lost.extend(newly)
            return newly

    def _session(self, island: str) -> IslandClient | None:
        """The session with ``island``'s scheduler, opened if it was not; ``None`` when it
        cannot be: the scheduler is down, so the island's slices are lost, not the whole
        search for lost ones (its ``ConnectError`` hid the healthy islands' slices from the
        retry). A closed connection's ``ConnectError`` is raised: no slice of it can come
        back, and it is the caller's to see."""
        if self.cluster.closed:
            return self.cluster.session(island)  # its ConnectError: the connection was closed
        session = self.cluster.open_session(island)
        if session is not None:
            return session
        endpoint = self.cluster.islands.get(island)
        # Opening waits up to a minute for a scheduler that is down; a probe tells in seconds.
        if endpoint is not None and not _scheduler_answers(endpoint):
            return None
        try:
            return self.cluster.session(island)
        except ConnectError:
            if self.cluster.closed:  # closed meanwhile
                raise
            return None

    def _unusable(self, item: Slice) -> str | None:
        """Why ``item`` cannot be used whatever its executors do: released (by the cluster, as
        its lease ran out or it was deleted, or by this session), or its lease overdue (this
        process was frozen or the API unreachable: its devices may be another's)."""
        if released := _released(item):
            return released
        try:
            self.cluster.check_lease(item)
        except SliceError as error:
            return str(error)
        return None

    def find_returned(self) -> list[Slice]:
        """Find which lost slices came back; make them available again and return them. A
        slice comes back when its island's session is still open (or, never opened, can now
        be: its scheduler is back) and every executor holding one of its devices was taken
        back by the scheduler (restarted) and answers."""
        with self._lock:
            returned = []
            for item in self.lost:
                session = self._session(item.island)
                if session is None or session.ended or self._unusable(item) is not None:
                    continue
                lost = session.lost_executors
                holders = {session.device_owner.get(device) for device in item.devices}
                endpoints = {e.index: e.endpoint for e in session.info.executors}
                if not holders & lost.keys() and all(
                    index in endpoints and _answers(endpoints[index]) for index in holders
                ):
                    returned.append(item)
            self.lost = [item for item in self.lost if item not in returned]
            return returned

    def wait_for_slices(
        self, count: int | None = None, timeout: float | None = None, poll_interval: float = 1.0
    ) -> list[Slice]:
        """Wait until at least ``count`` slices (all of them when ``None``) are available,
        finding those lost since the last look and taking back those that came back; return
        the available ones. ``TimeoutError``
        naming the slices still lost after ``timeout`` seconds (``None``: no limit)."""
        wanted = len(self.slices) if count is None else count
        if isinstance(wanted, bool) or not isinstance(wanted, int) or wanted < 0:
            raise ValueError(f"wait_for_slices: count: expected an int >= 0, got {count!r}")
        if wanted > len(self.slices):
            raise ValueError(
                f"wait_for_slices: count: {wanted} slices asked for; the manager has "
                f"{len(self.slices)}"
            )
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            # Lost ones first: a slice not yet found lost (the island's scheduler restarted
            # since the last look) was counted as available.
            self.find_lost()
            self.find_returned()
            if len(self.available) >= wanted:
                return self.available
            self._check_returnable(wanted)
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(
                    f"{len(self.available)} of {wanted} slices available after {timeout:g} s; "
                    f"still lost: {[item.name for item in self.lost]}"
                )
            time.sleep(poll_interval)

    def _check_returnable(self, wanted: int) -> None:
        """SlicesLost at once if fewer than ``wanted`` slices can ever be available: a slice
        whose island's session ended (its scheduler restarted), or that was released, never
        comes back on this connection, and waiting for it would wait for ever. One whose
        island's session could not be opened may: its scheduler may come back."""
        with self._lock:
            ended = {
                item.name: why
                for item in self.lost
                if (why := _ended(self.cluster.open_session(item.island)) or _released(item))
            }
            if len(self.slices) - len(ended) >= wanted:
                return
            gone = [item for item in self.lost if item.name in ended]
        reasons = "; ".join(f"{name}: {why}" for name, why in ended.items())
        raise SlicesLost(
            f"{len(self.slices) - len(ended)} of the {wanted} slices asked for can come back: "
            f"{sorted(ended)} are gone for good ({reasons}); connect again (pw.connect) for "
            "new sessions and slices",
            gone,
        )

    def elastic_retry(
        self,
        max_retries: int | Callable[..., T] = 3,
        on_elastic_event: Callable[[int, BaseException, list[Slice]], None] | None = None,
    ) -> Any:
        """Retry the wrapped function up to ``max_retries`` times after losses of devices.
        ``on_elastic_event(attempt, error, lost)`` is called before each retry.

        A failure is a loss when a slice available as the attempt began is lost by the time
        it failed (found lost now, or by another function of this manager meanwhile): a
        computation failing (``NodeFailed``), the cluster unreachable (``ConnectError``), a
        result not computed in time (``TimeoutError``: a host stopped) or a nested retry
        giving up (``SlicesLost``), a slice released by the cluster (``SliceError``: its
        lease ran out, it was deleted). Other failures are raised at once. Used bare
        (``@manager.elastic_retry``), it retries 3 times."""
        if callable(max_retries):
            return self.elastic_retry()(max_retries)
        if isinstance(max_retries, bool) or not isinstance(max_retries, int):
            raise TypeError(
                f"elastic_retry: max_retries: expected an int >= 0, got {max_retries!r}"
            )
        if max_retries < 0:
            raise ValueError(f"elastic_retry: max_retries: expected an int >= 0, got {max_retries}")
        retries = max_retries

        def decorate(function: Callable[..., T]) -> Callable[..., T]:
            @functools.wraps(function)
            def wrapper(*args: Any, **kwargs: Any) -> T:
                attempt = 0
                while True:
                    if self.lost:  # those whose executors were restarted meanwhile
                        self.find_returned()
                    began_with = self.available
                    try:
                        return function(*args, **kwargs)
                    except (
                        NodeFailed,
                        ConnectError,
                        SliceError,
                        SlicesLost,
                        TimeoutError,
                    ) as error:
                        self.find_lost()
                        lost = [item for item in began_with if item in self.lost]
                        if not lost:
                            raise  # not a loss of devices: the user's to fix
                        attempt += 1
                        self.events.append((attempt, str(error), [s.name for s in lost]))
                        if attempt > retries or not self.available:
                            done = attempt - 1
                            raise SlicesLost(
                                f"lost slices {[s.name for s in self.lost]} "
                                f"({len(self.available)} left) after {done} "
                                f"{'retry' if done == 1 else 'retries'}: {error}",
                                self.lost,
                            ) from error
                        if on_elastic_event is not None:
                            on_elastic_event(attempt, error, lost)

            return wrapper

        return decorate


def _released(item: Slice) -> str:
    """Why ``item`` was released for good, or ""."""
    if item.lost is not None:
        return f"released by the cluster: {item.lost}"
    return "released by this session" if item.released else ""


def _ended(session: IslandClient | None) -> str:
    """Why ``session`` ended, or "" (also for none opened)."""
    return session.ended if session is not None else ""


def _touches(item: Slice, dead: set[int] | None, owner: dict[int, int]) -> bool:
    """Whether ``item`` has a device on a ``dead`` executor (``None``: the whole island)."""
    if dead is None:
        return True
    return any(owner.get(device) in dead for device in item.devices)


def _answers(endpoint: str) -> bool:
    """Whether the executor at ``endpoint`` answers."""
    return _probe(endpoint, EXECUTOR)


def _scheduler_answers(endpoint: str) -> bool:
    """Whether the scheduler at ``endpoint`` answers."""
    return _probe(endpoint, SCHEDULER)


def _probe(endpoint: str, service: Service) -> bool:
    channel = tls.channel(endpoint, [], tls.load())
    try:
        stub(channel, service, "Info")(pb.Empty(), timeout=PROBE_TIMEOUT_SECONDS)
        return True
    except grpc.RpcError:
        return False
    finally:
        channel.close()
