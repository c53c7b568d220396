"""``connect()``: a session with a cluster's islands, and the virtual slices it holds.

Three ways in:

- directly to island schedulers (``islands={"name": "host:port"}``, or a running ``LocalIsland``):
  slices are bound by this client with the allocator of ``pathways_core`` over the islands'
  devices; other clients bind their own, so clients share devices and the island schedulers
  divide device time between them;
- inside Kubernetes, from the settings the operator injects into a program's pod
  (``PATHWAYS_SLICES``, ``PATHWAYS_PROGRAM``, ``PATHWAYS_TENANT``, ``PATHWAYS_WEIGHT``,
  ``PATHWAYS_PRIORITY``, ``PATHWAYS_STEPS``): the slices are already bound, by name, and
  ``cluster.steps`` is the program's ``spec.steps``;
- ``PATHWAYS_ISLANDS`` (``name=host:port,...``) for the direct mode from the environment;
- through the REST API (``connect("http://host:port", token=...)``, ``PATHWAYS_API`` and
  ``PATHWAYS_TOKEN``, or ``connect(state=DIR)`` for the embedded cluster ``pathways up`` started):
  slices are VirtualSlices the cluster's resource manager binds, charged to the tenant's quota.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from pathways_client.api_client import ApiCallError, ApiClient
from pathways_client.errors import ConnectError, SliceError
from pathways_client.island_client import IslandClient, SessionRefused, Trace, check_share
from pathways_client.slices import Slice
from pathways_core.accelerators import AcceleratorKind
from pathways_core.allocator import Allocator, Bound, IslandInventory, Request
from pathways_core.control.programs import island_client_name
from pathways_core.manifests import problems_of
from pathways_core.resources import SliceRequest
from pathways_core.resources.base import GROUP_VERSION
from pathways_core.resources.virtual_slice import (
    DEFAULT_LEASE_SECONDS,
    MAX_LEASE_SECONDS,
    MIN_LEASE_SECONDS,
)
from pathways_core.topology import format_shape, parse_shape
from pathways_core.wire.credentials import SESSION_CREDENTIALS_ENV, credentials_problem

ENV_SLICES = "PATHWAYS_SLICES"
ENV_ISLANDS = "PATHWAYS_ISLANDS"
ENV_API, ENV_TOKEN = "PATHWAYS_API", "PATHWAYS_TOKEN"
BIND_TIMEOUT_SECONDS = 120.0
logger = logging.getLogger("pathways.client")
# Pending reasons that no release elsewhere can change: fail at once instead of waiting.
NEVER_FITS = {"NoMatchingIsland", "ShapeDoesNotFit", "InvalidSpec"}


class DirectDevices:
    """The islands' devices as bound without a resource manager, shared by the sessions given
    it (a proxy's): one allocator, so their slices never overlap (each session's own placed
    every slice on the first devices)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.allocator: Allocator | None = None


class LeaseKeeper:
    """Renews the leases of a session's slices, from a thread of its own (started with the
    first), on connections of its own; tells ``lost`` of a slice whose lease ran out anyway
    (the process was frozen longer than the lease) or that went."""

    def __init__(self, api: ApiClient, seconds: int, lost: Callable[[str, str], None]) -> None:
        self.seconds = seconds
        self._api = api
        self._lost = lost
        self._names: set[str] = set()
        self._uids: dict[str, str | None] = {}  # renewed as that object only
        self._renewed: dict[str, float] = {}  # monotonic: when the last renewal was asked
        self._failure: dict[str, str] = {}  # why the last renewal of a slice failed
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def hold(self, name: str, since: float, uid: str | None = None) -> None:
        """Renew ``name`` (the object ``uid``, when known) from now on; its lease began at
        ``since`` (monotonic, before the request that made it was sent: no later than the
        cluster's start of it)."""
        with self._lock:
            self._names.add(name)
            self._uids[name] = uid
            self._renewed[name] = since
            if self._thread is None and not self._stop.is_set():
                self._api = self._api.another()
                self._thread = threading.Thread(
                    target=self._run, name="pathways-slice-leases", daemon=True
                )
                self._thread.start()

    def drop(self, name: str) -> None:
        """Renew ``name`` no more (released or given up)."""
        with self._lock:
            self._names.discard(name)
            self._uids.pop(name, None)
            self._renewed.pop(name, None)
            self._failure.pop(name, None)

    def overdue(self, name: str) -> str | None:
        """Why ``name``'s lease may have run out, when this session cannot tell it has not:
        no renewal asked since longer than the lease went through (the API unreachable,
        throttling, or this process frozen); ``None`` while it is surely held."""
        with self._lock:
            since = self._renewed.get(name)
            failure = self._failure.get(name)
        if since is None or time.monotonic() - since < self.seconds:
            return None
        return (
            f"its lease was last renewed {time.monotonic() - since:.0f} s ago, longer than its "
            f"{self.seconds} s{f' (renewals failed: {failure})' if failure else ''}: the "
            "cluster may have given its devices to another slice"
        )

    def stop(self) -> None:
        """Stop renewing (the session's slices are deleted, or left to run out)."""
        self._stop.set()
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join(timeout=5)
            self._api.close()

    def renew_all(self) -> None:
        """Renew every held lease once."""
        with self._lock:
            names = sorted(self._names)
            uids = dict(self._uids)
        for name in names:
            if self._stop.is_set():
                return
            asked = time.monotonic()  # before the API stamps it: never later than the API's
            try:
                self._api.renew(name, uids.get(name))
            except ApiCallError as error:
                if error.status == 404 or (error.status == 409 and "ran out" in error.message):
                    with self._lock:
                        held = name in self._names  # not released by the session meanwhile
                    if held:
                        self.drop(name)  # gone, or its lease ran out: for good
                        self._lost(name, error.message)
                    continue
                # Unreachable, throttled, restarting: the next round tries again.
                with self._lock:
                    self._failure[name] = str(error)
                logger.warning(
                    "could not renew the lease of slice %r (trying again in %.0f s; it is "
                    "released if not renewed for %d s): %s",
                    name,
                    self.seconds / 3,
                    self.seconds,
                    error,
                )
            except Exception:  # the session closed its connections under a late renewal
                if self._stop.is_set():
                    return
                logger.warning("could not renew the lease of slice %r", name, exc_info=True)
            else:
                with self._lock:
                    if name in self._names:
                        self._renewed[name] = asked
                        self._failure.pop(name, None)

    def _run(self) -> None:
        while not self._stop.wait(self.seconds / 3):
            self.renew_all()


class Cluster:
    """A client's session with one or more islands. Close it (or use ``with``) when done."""

    def __init__(
        self,
        islands: Mapping[str, str],
        *,
        client: str | None = None,
        tenant: str = "default",
        weight: int = 1,
        priority: int = 0,
        bound: Mapping[str, Slice] | None = None,
        api: ApiClient | None = None,
        steps: int = 1,
        devices: DirectDevices | None = None,
        lease_seconds: int | None = DEFAULT_LEASE_SECONDS,
        credentials: Mapping[str, str] | None = None,
    ) -> None:
        """``credentials``: per island, what its session may claim, signed by the cluster's
        resource manager (``PATHWAYS_SESSION_CREDENTIALS`` in a program it runs)."""
        if not islands and api is None:
            raise ConnectError("no islands to connect to")
        self.api = api
        # The steps the program's spec asks a driver for (PATHWAYS_STEPS); 1 elsewhere.
        self.steps = steps
        self.islands = dict(islands)
        self.client = client or f"{tenant}-{uuid.uuid4().hex[:8]}"
        self.tenant = tenant
        self.weight = weight
        self.priority = priority
        self._credentials = dict(credentials or {})
        self._sessions: dict[str, IslandClient] = {}
        self._lock = threading.Lock()
        self._direct = devices or DirectDevices()
        self._bound: dict[str, Slice] = {}
        self._names = 0
        self._closed = False
        # Slices made through the API are leased: the cluster releases those of a session
        # killed before it could delete them.
        self._leases = (
            LeaseKeeper(api, lease_seconds, self._lease_lost)
            if api is not None and lease_seconds is not None
            else None
        )
        for name, item in (bound or {}).items():
            item.cluster = self
            self._bound[name] = item

    # -- islands -----------------------------------------------------------------------------

    def session(self, island: str) -> IslandClient:
        """The session with ``island``'s scheduler, opened on first use; ConnectError once
        this connection is closed."""
        with self._lock:
            self._check_open()
            session = self._sessions.get(island)
            if session is None:
                endpoint = self.islands.get(island)
                if endpoint is None:
                    raise ConnectError(
                        f"unknown island {island!r}; this session knows "
                        f"{', '.join(sorted(self.islands))}"
                    )
                try:
                    session = IslandClient(
                        endpoint,
                        self.client,
                        weight=self.weight,
                        priority=self.priority,
                        credential=self._credential(island),
                    )
                except SessionRefused as error:
                    raise ConnectError(
                        f"island {island!r} at {endpoint} refused the session: {error}"
                    ) from None
                except Exception as error:
                    raise ConnectError(
                        f"island {island!r} at {endpoint} did not answer: {error}"
                    ) from None
                self._sessions[island] = session
            return session

    def _credential(self, island: str) -> str:
        """The credential of this session with ``island``: the one given, else through the
        API one granting the devices of the tenant's slices bound there now."""
        if self.api is None or island in self._credentials:
            return self._credentials.get(island, "")
        try:
            return self.api.session_credential(island, self.client)
        except ApiCallError as error:
            raise ConnectError(
                f"the API gave no credential for island {island!r}: {error}"
            ) from None

    def _renew(self, island: str) -> None:
        """Present the open session with ``island`` (if any) a credential granting the
        tenant's slices there now; one the API does not give is logged, and the session goes
        on under the one before (work on devices it lacks is refused, saying so)."""
        session = self._sessions.get(island)
        if session is None or self.api is None:
            return
        try:
            credential = self._credential(island)
        except ConnectError as error:
            logger.warning("%s", error)
            return
        if credential:
            session.renew(credential)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (a ``with pw.connect(...)`` block ended)."""
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise ConnectError(
                "this connection was closed (its 'with pw.connect(...)' block ended, or close() "
                "was called): its islands freed its arrays; take results before closing, and "
                "connect again for more work"
            )

    def open_session(self, island: str) -> IslandClient | None:
        """The session with ``island`` if one is open (never opens one)."""
        return self._sessions.get(island)

    # -- slices ------------------------------------------------------------------------------

    def slice(
        self,
        name: str | None = None,
        *,
        devices: int | None = None,
        shape: Sequence[int] | str | None = None,
        island: str | None = None,
        accelerator: str | None = None,
        island_selector: Mapping[str, str] | None = None,
        time_shared: bool = False,
        timeout: float = BIND_TIMEOUT_SECONDS,
    ) -> Slice:
        """A virtual slice: ``name`` alone returns a slice bound for this program (inside
        Kubernetes); otherwise ``devices`` (a count) or ``shape`` (a mesh) requests one, on
        ``island`` or wherever it fits, of an ``accelerator`` kind (``tpu-v5e``, ``cpu-fake``,
        ...) and on islands whose labels match ``island_selector`` (through the API: a
        VirtualSlice, ``time_shared`` to
        share devices with other tenants' time-shared slices, waiting up to ``timeout`` for it
        to be bound). Raises ``SliceError`` with the reason when it cannot be bound."""
        self._check_open()
        if devices is None and shape is None:
            if name is not None and name in self._bound:
                return self._bound[name]
            known = ", ".join(sorted(self._bound)) or "none"
            raise SliceError(
                f"no bound slice named {name!r} (bound slices: {known}); request one with "
                "devices=N or shape=(...)"
            )
        if (devices is None) == (shape is None):
            raise SliceError("request a slice with devices=N or shape=(...), not both")
        if devices is not None and int(devices) < 1:
            raise SliceError(f"devices must be at least 1 (got {devices})")
        if isinstance(shape, str):
            try:
                shape = parse_shape(shape)
            except ValueError as error:
                raise SliceError(f"shape: {error}") from None
        shape = tuple(shape) if shape is not None else (int(devices),)  # type: ignore[arg-type]
        if not all(isinstance(side, int | np.integer) and side >= 1 for side in shape):
            raise SliceError(f"shape {list(shape)} must have positive integer sides")
        with self._lock:
            self._names += 1
            # Through the API, names are the tenant's VirtualSlices: keep this session's apart.
            prefix = f"{self.client.replace('.', '-')}-slice" if self.api is not None else "slice"
            name = name or f"{prefix}-{self._names}"
            if name in self._bound:
                raise SliceError(f"this session already holds a slice named {name!r}")
        size = {"devices": devices} if devices is not None else {"shape": format_shape(shape)}
        where: dict[str, Any] = {}
        if island:
            where["island"] = island
        if accelerator:
            where["acceleratorKind"] = accelerator
        if island_selector:
            where["islandSelector"] = {"matchLabels": dict(island_selector)}
        try:
            spec = SliceRequest.model_validate(size | where)
        except ValidationError as error:
            raise SliceError(f"slice {name!r}: {problems_of(error, SliceRequest)[0]}") from None
        if self.api is not None:
            bound = self._bind_through_api(name, shape, spec.to_wire(), time_shared, timeout)
            self._bound[name] = bound
            self._renew(bound.island)  # a session opened before: these devices too
            return bound
        # Fake CPU devices have no physical topology: any devices make a mesh of any shape.
        request = Request(
            key=self._direct_key(name),
            tenant=self.tenant,
            count=math.prod(shape),
            island=island,
            kind=spec.accelerator_kind,
            selector=spec.island_selector,
        )
        with self._direct.lock:
            allocator = self._direct_allocator()
            for island_name in sorted(self.islands):
                # Devices of executors the scheduler lost are not bound (until it takes them
                # back, restarted).
                session = self.session(island_name)
                lost = session.lost_executors
                allocator.set_health(
                    island_name,
                    [d for d, owner in session.device_owner.items() if owner in lost],
                )
            decision = allocator.allocate(request, preempt=False)
        if not isinstance(decision, Bound):
            raise SliceError(f"slice {name!r} ({list(shape)}) cannot be bound: {decision.message}")
        binding = decision.binding
        bound = Slice(name, binding.island, binding.devices, shape, cluster=self)
        self._bound[name] = bound
        return bound

    def release(self, item: Slice) -> None:
        """Give a slice's devices back (idempotent): to this session's allocator, or by
        deleting its VirtualSlice through the API."""
        if self._bound.get(item.name) is item:
            del self._bound[item.name]
            item.released = True
            with self._direct.lock:
                if self._direct.allocator is not None:
                    self._direct.allocator.release(self._direct_key(item.name))
            if self.api is not None and (failed := self._delete_slice(item.name, item.uid)):
                raise SliceError(failed)
            if self.api is not None:
                self._renew(item.island)  # its devices no longer

    def _lease_lost(self, name: str, why: str) -> None:
        """A slice's lease ran out (or it went) while this session held it: it is unusable."""
        item = self._bound.get(name)
        if item is None or item.released:
            return  # this session released it itself meanwhile
        logger.warning("slice %r was released by the cluster: %s", name, why)
        item.lost = why
        item.released = True

    def check_lease(self, item: Slice) -> None:
        """SliceError if ``item``'s lease may have run out (see :meth:`LeaseKeeper.overdue`):
        its devices may be another slice's by now."""
        why = self._leases.overdue(item.name) if self._leases is not None else None
        if why is not None:
            raise SliceError(
                f"slice {item.name!r} cannot be used: {why}; release it and request a new one"
            )

    def _bind_through_api(
        self,
        name: str,
        shape: tuple[int, ...],
        spec: dict[str, Any],
        time_shared: bool,
        timeout: float,
    ) -> Slice:
        assert self.api is not None
        if time_shared:
            spec["timeShared"] = True
        if self._leases is not None:
            spec["leaseSeconds"] = self._leases.seconds
        document = {
            "apiVersion": GROUP_VERSION,
            "kind": "VirtualSlice",
            "metadata": {"name": name},
            "spec": spec,
        }
        refused = False  # the API refused the submission: nothing of it to delete
        uid = None  # of the VirtualSlice made: one made later under its name is another's
        asked = time.monotonic()  # the lease begins no earlier than this
        try:
            try:
                uid = (self.api.submit(document).get("metadata") or {}).get("uid")
            except ApiCallError:
                refused = True
                raise
            if self._leases is not None:  # while it waits too: it would be released
                self._leases.hold(name, asked, uid)
            deadline = time.monotonic() + timeout
            while True:
                status = self.api.get("virtualslices", name).get("status") or {}
                if status.get("phase") == "Bound":
                    break
                reason, message = status.get("reason"), status.get("message") or ""
                if reason in NEVER_FITS or status.get("phase") in ("Preempted", "Released"):
                    raise SliceError(f"slice {name!r} cannot be bound: {reason}: {message}")
                if time.monotonic() > deadline:
                    raise SliceError(
                        f"slice {name!r} is still not bound after {timeout:.0f} s "
                        f"({reason or 'Pending'}: {message or 'waiting for the resource manager'})"
                    )
                time.sleep(0.1)
            island_name = status["island"]
            endpoint = (self.api.get("islands", island_name).get("status") or {}).get(
                "schedulerEndpoint"
            )
            if not endpoint:
                raise SliceError(f"island {island_name!r} of slice {name!r} has no scheduler yet")
            ended = self._sessions.get(island_name)
            if ended is not None and ended.ended:
                # Its first call would fail: the slice would hold devices and quota for no one.
                raise ConnectError(
                    f"slice {name!r} was bound on island {island_name!r}, whose session with "
                    f"this connection ended ({ended.ended}): connect again (pw.connect) for a "
                    "new session and slices"
                )
        except BaseException as error:
            # Whatever stopped it (Ctrl-C, SIGTERM while it waited, even before the API's
            # answer to the submission came back): the slice goes, or it would bind later and
            # hold its devices and quota for no one.
            if not refused and (failed := self._delete_slice(name, uid)) is not None:
                logger.warning("%s", failed)
            if isinstance(error, ApiCallError):
                raise SliceError(f"slice {name!r} was refused: {error}") from None
            raise
        self.islands[island_name] = endpoint
        return Slice(name, island_name, tuple(status["devices"]), shape, cluster=self, uid=uid)

    def _delete_slice(self, name: str, uid: str | None) -> str | None:
        """Delete a slice's VirtualSlice (the object ``uid``, when known: not one made since
        under its name), on a fresh connection if the one in use fails (an interrupted
        request can leave it broken, and the slice would stay); why it could not be deleted,
        or None."""
        assert self.api is not None
        if self._leases is not None:
            self._leases.drop(name)
        failure = ""
        for attempt in range(2):
            try:
                self.api.delete("virtualslices", name, uid)
                return None
            except ApiCallError as error:
                if error.status == 404:
                    return None  # gone already
                failure = str(error)
            except Exception as error:  # the connection pool itself, left broken
                failure = f"{type(error).__name__}: {error}"
            if attempt == 0:
                self.api.reconnect()
        lasts = "its lease runs out" if self._leases is not None else "it is deleted"
        return (
            f"slice {name!r} could not be deleted ({failure}): it holds its devices until "
            f"{lasts}; delete it with `pathways delete {name} --kind virtualslices`"
        )

    def _direct_key(self, name: str) -> str:
        # Sessions sharing one allocator name their slices alike ("slice-1"): keep them apart.
        return f"{self.client}/{name}"

    def _direct_allocator(self) -> Allocator:
        """The allocator of slices bound without a resource manager (call with the lock of
        ``self._direct`` held)."""
        if self._direct.allocator is None:
            allocator = Allocator()
            for island in sorted(self.islands):
                info = self.session(island).info
                owned = [len(executor.devices) for executor in info.executors]
                allocator.add_island(
                    IslandInventory(
                        name=island,
                        kind=AcceleratorKind.CPU_FAKE,
                        shape=(sum(owned),),
                        devices_per_host=max(owned, default=1),
                    )
                )
            self._direct.allocator = allocator
        return self._direct.allocator

    def trace(self, island: str | None = None) -> Trace:
        """An island's trace: one record per computation per executor (seq, client, node,
        devices, start and end in ns), in island order. The island keeps a bounded trace:
        ``dropped_until_ns`` names the clients whose oldest records it let go of, and until
        when."""
        name = island or next(iter(sorted(self.islands)))
        trace = self.session(name).trace()
        return Trace(sorted(trace, key=lambda record: record.seq), trace.dropped_until_ns)

    # -- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        """Close every island session (queued work still runs; results are no longer fetched)
        and refuse more work. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            session.close()
        if self.api is not None:
            for item in list(self._bound.values()):
                try:
                    self.release(item)
                except SliceError as error:  # the others are still released
                    logger.warning("%s", error)
            if self._leases is not None:
                self._leases.stop()
            self.api.close()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(
    target: Any = None,
    *,
    islands: Mapping[str, str] | None = None,
    token: str | None = None,
    state: str | Path | None = None,
    client: str | None = None,
    tenant: str | None = None,
    weight: int | None = None,
    priority: int | None = None,
    devices: DirectDevices | None = None,
    lease_seconds: int | None = DEFAULT_LEASE_SECONDS,
) -> Cluster:
    """Connect to a cluster's islands.

    ``target`` may be a running ``LocalIsland`` (or a list of them), or the REST API's URL
    (with ``token``, else ``$PATHWAYS_TOKEN``); ``islands`` maps island names to scheduler
    endpoints; ``state`` is the folder of an embedded cluster (``pathways up``), reached
    through its API as ``tenant``. With none of these, the settings come from the environment:
    the ones the operator injects into a program's pod, ``PATHWAYS_API``, or
    ``PATHWAYS_ISLANDS``. Slices bound without a resource manager come from ``devices``, when
    several connections share them. Through the API, the cluster releases this session's
    slices once it stopped renewing them for ``lease_seconds`` (it renews them while it runs;
    ``None``: held until deleted, even if the process is killed first).
    """
    if lease_seconds is not None and (
        isinstance(lease_seconds, bool)
        or not isinstance(lease_seconds, int | np.integer)
        or not MIN_LEASE_SECONDS <= lease_seconds <= MAX_LEASE_SECONDS
    ):
        raise ValueError(
            f"lease_seconds must be whole seconds from {MIN_LEASE_SECONDS} to "
            f"{MAX_LEASE_SECONDS}, or None for slices held until deleted (got {lease_seconds!r})"
        )
    check_share(1 if weight is None else weight, 0 if priority is None else priority, "connect")
    lease_seconds = None if lease_seconds is None else int(lease_seconds)  # np.int64 too
    if islands is not None and not isinstance(islands, Mapping):
        raise TypeError(
            f"islands must map island names to scheduler endpoints, such as "
            f"{{'local': '127.0.0.1:8470'}} (got {type(islands).__name__})"
        )
    env = os.environ
    if (
        state is not None
        or (isinstance(target, str) and "://" in target)
        or (target is None and islands is None and not env.get(ENV_SLICES) and env.get(ENV_API))
    ):
        return _connect_api(
            target or env.get(ENV_API),
            token,
            state,
            client,
            tenant,
            weight,
            priority,
            lease_seconds,
        )
    tenant = tenant or env.get("PATHWAYS_TENANT") or "default"
    weight = weight if weight is not None else int(env.get("PATHWAYS_WEIGHT", "1"))
    priority = priority if priority is not None else int(env.get("PATHWAYS_PRIORITY", "0"))
    bound: dict[str, Slice] = {}
    if target is not None:
        running = target if isinstance(target, list | tuple) else [target]
        names = [item.name for item in running]
        if len(set(names)) != len(names):
            raise ValueError(
                f"connect: islands share a name ({', '.join(sorted(names))}): give each "
                "LocalIsland its own, LocalIsland(..., name='a')"
            )
        islands = {item.name: item.scheduler_endpoint for item in running}
    elif islands is None and env.get(ENV_SLICES):
        islands, bound = _slices_from_env(env[ENV_SLICES])
        client = client or island_client_name(env.get("PATHWAYS_PROGRAM", "")) or None
    elif islands is None and env.get(ENV_ISLANDS):
        islands = _islands_from_env(env[ENV_ISLANDS])
    if not islands:
        raise ConnectError(
            "no cluster to connect to: pass a LocalIsland or islands={'name': 'host:port'}, or "
            f"set {ENV_ISLANDS}=name=host:port (inside Kubernetes the operator sets {ENV_SLICES})"
        )
    steps = int(env.get("PATHWAYS_STEPS", "1")) if bound else 1
    return Cluster(
        islands,
        client=client,
        tenant=tenant,
        weight=weight,
        priority=priority,
        bound=bound,
        steps=steps,
        devices=devices,
        credentials=_credentials_from_env(env),
    )


def _connect_api(
    url: str | None,
    token: str | None,
    state: str | Path | None,
    client: str | None,
    tenant: str | None,
    weight: int | None,
    priority: int | None,
    lease_seconds: int | None,
) -> Cluster:
    """A session whose slices are VirtualSlices created through the REST API."""
    if state is not None:
        from pathways_client.embedded import read_info, tokens

        folder = Path(state).expanduser()
        info = read_info(folder)
        if info is None or not info.ready:
            raise ConnectError(f"no embedded cluster runs from {folder}: run 'pathways up' first")
        url = url or info.api
        tenant = tenant or "default"
        token = token or tokens(folder).get(tenant)
        if token is None:
            raise ConnectError(
                f"{folder}/tokens.yaml has no token for tenant {tenant!r}: add the tenant with "
                f"pathways up --state {folder} --tenant {tenant}"
            )
    token = token or os.environ.get(ENV_TOKEN)
    try:
        api = ApiClient(str(url), token)
    except ValueError as error:  # the URL or token is malformed; TLS settings half set
        raise ConnectError(str(error)) from None
    try:
        me = api.me()
        listed = api.list("islands")
    except ApiCallError as error:
        api.close()
        raise ConnectError(f"the API at {url} refused the session: {error}") from None
    endpoints = {
        item["metadata"]["name"]: (item.get("status") or {}).get("schedulerEndpoint")
        for item in listed
    }
    tenant = me.get("tenant", tenant or "default")
    # The API signs credentials for the tenant's own names only.
    if client is None or not client.startswith(f"{tenant}."):
        client = f"{tenant}.{client or uuid.uuid4().hex[:8]}"
    return Cluster(
        {name: endpoint for name, endpoint in endpoints.items() if endpoint},
        client=client,
        tenant=tenant,
        weight=1 if weight is None else weight,
        priority=0 if priority is None else priority,
        api=api,
        lease_seconds=lease_seconds,
    )


def _credentials_from_env(env: Mapping[str, str]) -> dict[str, str]:
    """The islands' session credentials the resource manager gave this program, if any."""
    value = env.get(SESSION_CREDENTIALS_ENV)
    if not value:
        return {}
    problem = credentials_problem(value)
    if problem is not None:
        raise ConnectError(problem)
    return json.loads(value)


def _islands_from_env(value: str) -> dict[str, str]:
    islands = {}
    for item in filter(None, (part.strip() for part in value.split(","))):
        name, sep, endpoint = item.partition("=")
        if not sep or not name or not endpoint:
            raise ConnectError(f"{ENV_ISLANDS}: expected name=host:port, got {item!r}")
        islands[name] = endpoint
    return islands


def _slices_from_env(value: str) -> tuple[dict[str, str], dict[str, Slice]]:
    try:
        described = json.loads(value)
        islands: dict[str, str] = {}
        bound: dict[str, Slice] = {}
        for name, entry in described.items():
            devices = tuple(int(d) for d in entry["devices"])
            shape = tuple(entry.get("shape") or (len(devices),))
            islands[entry["island"]] = entry["scheduler"]
            bound[name] = Slice(name, entry["island"], devices, shape)
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise ConnectError(
            f"{ENV_SLICES} must be JSON mapping slice names to {{island, scheduler, devices, "
            f"shape}}: {error}"
        ) from None
    return islands, bound
