"""A client of one island: registers compiled functions, places arrays, submits computations
and fetches results. The SDK's programs are built on it.

The session with the scheduler (registrations, computations, deletions out; events back) is a
control stream of framed protobuf over raw TCP at the island's session endpoint (see
``pathways_core.wire.streams``); arrays and the island's information go over gRPC. With the
``PATHWAYS_TLS_*`` variables set, both are mutual TLS (``pathways_client.tls``)."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

import grpc
import numpy as np

from pathways_client.rpc import MESSAGE_OPTIONS, stub
from pathways_client.tls import Tls, channel, load
from pathways_core.control.programs import island_client_name
from pathways_core.scheduling.limits import (
    MAX_REQUEST_BYTES,
    artifact_limit_from,
    artifact_problem,
    client_window,
    is_busy,
)
from pathways_core.scheduling.programs import program_digest, slice_problem
from pathways_core.wire import EXECUTOR, SCHEDULER, pb
from pathways_core.wire.arrays import (
    Assembly,
    Region,
    explicit_region,
    native_order,
    numeric_dtype,
    region_chunks,
    to_chunks,
)
from pathways_core.wire.credentials import credential_needed
from pathways_core.wire.streams import (
    FRAME_LENGTH,
    MAX_FRAME_BYTES,
    FrameError,
    frame,
    frames,
    messages,
)

Event = pb.ClientEvent
# Longest a deletion waits for a message to ride along with (see IslandClient.delete).
logger = logging.getLogger(__name__)

QUIET_CONNECT_SECONDS = 5.0
"""How long a client waits for an island's scheduler before it says it is waiting (and why:
refused, unresolved, ...): a scheduler still starting answers within this, and a wrong
endpoint is not a minute of silence."""

DELETE_LINGER_SECONDS = 0.002
# How long a call that an executor's death broke waits for the scheduler to say it is lost.
LOSS_WAIT_SECONDS = 2.0
MAX_REASON = 4096  # characters of why a buffer placed on another island will never be
_BROKEN_CALL = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN, grpc.StatusCode.CANCELLED}
)
# Ids are unique across all of this process's sessions: a buffer keeps its id when another
# island pulls it, so two islands' sessions of one client must never mint the same one.
_IDS = itertools.count()


def _nonce() -> str:
    """The random part of an id: 64 bits."""
    return os.urandom(8).hex()


# Uploads of an input's shards to the executors after the first (the caller's thread takes it).
_PUTS = ThreadPoolExecutor(max_workers=8, thread_name_prefix="put-shards")


class IslandError(RuntimeError):
    """The island refused or failed a request; the message says why."""


class ProgramTooLarge(IslandError):
    """A program registration larger than one message to a scheduler may be: its nodes go one
    by one instead."""


class IslandUnavailable(IslandError):
    """The island could not do it, through no fault of the request: the session ended (its
    scheduler stopped, restarted or is unreachable) or an executor the work needed is lost.
    Connect again, or retry once the island is back."""


class SessionRefused(IslandError):
    """The island opens no session for this client as it asked (it needs a credential this
    client does not have): the message says why, and what to do instead."""


class IslandBusy(IslandError):
    """The island's queue (or this client's share of it) is full: the computation was refused
    and nothing of it kept; the message names the island and the limit. Retry later."""


@dataclass(frozen=True)
class Submitted:
    """A computation accepted for dispatch: its id, output buffer ids and completion future."""

    id: str
    outputs: tuple[str, ...]
    done: Future[None]

    def wait(self, timeout: float | None = 120.0) -> None:
        """Block until the computation completed; raise ``IslandError`` if it failed."""
        self.done.result(timeout)


def check_share(weight: int, priority: int, caller: str) -> None:
    """ValueError naming ``caller``'s argument unless ``weight`` is an int from 1 to 2**31-1
    and ``priority`` a 32-bit int (what a session's hello carries)."""
    if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight < 2**31:
        raise ValueError(f"{caller}: weight: expected an int from 1 to 2**31-1, got {weight!r}")
    if (
        isinstance(priority, bool)
        or not isinstance(priority, int)
        or not -(2**31) <= priority < 2**31
    ):
        raise ValueError(f"{caller}: priority: expected a 32-bit int, got {priority!r}")


class Trace(list[pb.TraceRecord]):
    """An island's trace records, and per client whose oldest records the island let go of
    (it keeps a bounded trace) the end of the latest one it lost, in ns: that client's
    records are complete only from then on."""

    def __init__(self, records: Iterable[pb.TraceRecord], dropped_until_ns: dict[str, int]):
        super().__init__(records)
        self.dropped_until_ns = dropped_until_ns


class IslandClient:
    """One client session with an island's scheduler.

    ``tls``: the ``PATHWAYS_TLS_*`` variables' by default (``TlsConfigError`` when they are
    half set), ``None`` for plaintext, or a ``pathways_client.tls.Tls``. ``connect_timeout``:
    how long to wait for the scheduler to answer (``IslandError`` then; twice that at most). A
    client's ids are ``<client>/...``, so islands refuse names holding '/': a name holding
    one is sent with '.' for it, as a program's ``namespace/name`` is
    (:func:`pathways_core.control.programs.island_client_name`)."""

    # Largest artifact ``register`` sends; None: $PATHWAYS_MAX_ARTIFACT_BYTES, else the default.
    max_artifact_bytes: int | None = None

    def __init__(
        self,
        endpoint: str,
        client: str,
        weight: int = 1,
        priority: int = 0,
        *,
        tls: Tls | Literal["environment"] | None = "environment",
        connect_timeout: float = 60.0,
        credential: str = "",
    ) -> None:
        """``credential``: what the session may claim, signed by the island's resource manager
        (islands with a session key open sessions with one only)."""
        check_share(weight, priority, "IslandClient")
        self.client = island_client_name(client)
        self._share = (weight, priority)
        self.endpoint = endpoint
        self._tls = load() if tls == "environment" else tls
        self._channel = channel(endpoint, MESSAGE_OPTIONS, self._tls)
        self.info = self._first_answer(connect_timeout)
        if self.info.credentials_required and not credential:
            self._channel.close()
            raise SessionRefused(credential_needed(self.info.island))  # before any session
        self.device_owner = {d: e.index for e in self.info.executors for d in e.devices}
        self._executors = {
            e.index: channel(e.endpoint, MESSAGE_OPTIONS, self._tls) for e in self.info.executors
        }
        # Reentrant: a future's finalizer (deleting its buffer) may run on whichever thread
        # the garbage collector interrupts, also one holding these locks.
        self._lock = threading.RLock()
        self._pending: dict[str, Future[None]] = {}
        # Flow control: at most this many computations outstanding, so a long chain of
        # submissions waits for room instead of running into the island's queue bounds.
        self.window = client_window(self.info.max_queued_per_client)
        # A caller blocked on a full window resumes once this many have completed, not at
        # the first: woken per completion, eight tenants' callers cost the shared host twice
        # the CPU per computation of one.
        self._refill = max(1, self.window // 4)
        self._room = threading.Condition(self._lock)
        self._functions: dict[str, Future[None]] = {}  # registrations: functions, programs
        # Per registered program: the executors holding each of its results.
        self._programs: dict[str, list[tuple[int, ...]]] = {}
        self._locations: dict[str, tuple[int, ...]] = {}  # buffer id -> executors holding it
        self._send_lock = threading.Lock()
        # Deletions ride along with the next message, or go when the last completion arrives,
        # or, made with nothing outstanding, at the latest DELETE_LINGER_SECONDS later: one
        # write and one message less per call of a chain, on both sides (a chain's call then
        # reaches the executor with the deletion of the call before it, in one command batch).
        self._deferred: list[pb.ClientMessage] = []
        self._deferred_lock = threading.RLock()
        self._flush_due = threading.Event()
        self._closing = False
        self._batching = threading.local()
        self._rejected = ""
        self._ended = ""
        # Executors the scheduler said are lost, and why: direct calls to them fail at once,
        # those in progress (``_calls``) are cancelled.
        self._lost: dict[int, str] = {e.index: e.lost for e in self.info.executors if e.lost}
        self._lost_changed = threading.Condition(self._lock)
        # Buffers that will never have a value, and why: held by an executor when it was lost
        # (gone for good, even once a restarted one is taken back in its place), or outputs of
        # work that failed. Their reads fail at once, saying so.
        self._gone: dict[str, str] = {}
        self._produces: dict[str, tuple[str, ...]] = {}  # unfinished work -> its outputs
        # Unfinished program calls -> their results, which are never computed only if the
        # call is refused (a failed call's nodes independent of the failure still run).
        self._call_results: dict[str, tuple[str, ...]] = {}
        # Buffers of this island placed on others (``export``): told when they never will be.
        self._exported: dict[str, list[IslandClient]] = {}
        # Calls to executors in progress, per executor, each with the buffer it reads (gets;
        # "" for uploads): cancelled when their executor is lost, the session ends or (a
        # get) the buffer will never be, so they end at once with the reason.
        self._calls: dict[int, dict[grpc.Future, str]] = {}
        host, port = _reachable(self.info.session_endpoint, endpoint)
        self._session = socket.create_connection((host, port), timeout=connect_timeout)
        if self._tls is not None:
            try:
                self._session = self._tls.connect_stream(self._session, host)
            except OSError as error:
                self._session.close()
                self.close_channels()
                raise IslandError(
                    f"the TLS handshake with the scheduler's session endpoint {host}:{port} "
                    f"failed: {error}"
                ) from None
        self._session.settimeout(None)
        self._session.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._send(self._hello(credential))
        self._reader = threading.Thread(target=self._read, name=f"session-{client}", daemon=True)
        self._reader.start()
        threading.Thread(target=self._flush_loop, name=f"deletions-{client}", daemon=True).start()

    def _hello(self, credential: str) -> pb.ClientMessage:
        weight, priority = self._share
        hello = pb.Hello(
            client=self.client, weight=weight, priority=priority, credential=credential
        )
        return pb.ClientMessage(hello=hello)

    def renew(self, credential: str) -> None:
        """Present a new credential within the session (one granting the devices of the
        slices held now); work sent after it is held to it. The island refuses one
        claiming more than it may (logged), and the session goes on under the one before."""
        self._send(self._hello(credential))

    @property
    def lost_executors(self) -> dict[int, str]:
        """The island's executors the scheduler said are lost (and has not taken back,
        restarted, since), and why."""
        with self._lock:
            return dict(self._lost)

    def wait_for_executors(self, timeout: float | None = None) -> bool:
        """Wait until no executor of the island is lost (each restarted and taken back by
        the scheduler); whether none is."""
        with self._lost_changed:
            self._lost_changed.wait_for(lambda: not self._lost or self._ended, timeout)
            return not self._lost

    @property
    def ended(self) -> str:
        """Why the session ended; empty while it is open."""
        with self._lock:
            return self._ended

    def _first_answer(self, connect_timeout: float) -> pb.IslandInfo:
        """The island's Info, waiting up to ``connect_timeout`` for its scheduler to be
        reachable (and saying so past ``QUIET_CONNECT_SECONDS``); ``IslandError`` with the
        reason once it was not."""
        info = stub(self._channel, SCHEDULER, "Info")
        quiet = min(QUIET_CONNECT_SECONDS, connect_timeout)
        waits = [quiet, connect_timeout - quiet] if connect_timeout > quiet else [quiet]
        for attempt, wait in enumerate(waits, 1):
            with contextlib.suppress(grpc.RpcError):
                return info(pb.Empty(), timeout=wait, wait_for_ready=True)
            try:  # once, not waiting for readiness: the error then says why (refused, ...)
                # Within the time asked for: a stopped scheduler answers neither.
                return info(pb.Empty(), timeout=min(10.0, connect_timeout))
            except grpc.RpcError as error:
                reason = _unanswered(self.endpoint, error, self._tls)
            if attempt < len(waits):
                logger.warning("%s; waiting up to %.0f s more for it", reason, waits[-1])
        self._channel.close()
        raise IslandError(reason)

    # -- requests ----------------------------------------------------------------------------

    def register(
        self, artifact: bytes, name: str = "", timeout: float = 60.0, kind: int = 0
    ) -> str:
        """Register a serialized ``jax.export`` artifact (or, with ``kind``
        ``pb.FunctionRegistration.STABLEHLO``, a serialized ``pb.StableHloProgram``); returns
        its function id. An artifact over :attr:`max_artifact_bytes` raises ``IslandError``
        before anything is sent (the island may have a lower limit of its own, and then refuses
        it the same way)."""
        artifact = bytes(artifact)
        function_id = hashlib.sha256(artifact).hexdigest()
        limit = self.max_artifact_bytes or artifact_limit_from(os.environ)
        too_large = artifact_problem(name or function_id[:12], len(artifact), limit, "the SDK")
        if too_large is not None:
            raise IslandError(too_large)
        registration = pb.FunctionRegistration(
            function_id=function_id, artifact=artifact, name=name, kind=kind
        )
        self._registered(function_id, pb.ClientMessage(function=registration)).result(timeout)
        return function_id

    def register_program(
        self,
        nodes: Sequence[pb.Computation],
        arguments: Sequence[str],
        results: Sequence[str],
        name: str = "",
        timeout: float = 60.0,
    ) -> str:
        """Register a program: ``nodes`` are computations (of registered functions) whose id,
        inputs and outputs are names local to the program; a node reads ``arguments`` and the
        outputs of nodes before it; ``results`` are the outputs a caller keeps. Returns its id.
        Each :meth:`call` of it is then one message, one place in the island's order and one
        completion. Raises ``IslandError`` naming what is wrong with it."""
        registration = pb.ProgramRegistration(
            name=name, nodes=list(nodes), arguments=list(arguments), results=list(results)
        )
        program_id = registration.program_id = program_digest(registration)
        message = pb.ClientMessage(program=registration)
        if message.ByteSize() > MAX_REQUEST_BYTES:  # the scheduler would refuse it
            raise ProgramTooLarge(
                f"a program of {len(nodes)} nodes registers in {message.ByteSize()} bytes, more "
                f"than the {MAX_REQUEST_BYTES} a scheduler accepts"
            )
        producers = {output: node for node in nodes for output in node.outputs}
        holders = [
            tuple(sorted({self.device_owner.get(d, -1) for d in producers[r].devices}))
            if r in producers
            else ()
            for r in results
        ]
        self._registered(program_id, message).result(timeout)
        self._programs[program_id] = holders
        return program_id

    def call(self, program_id: str, arguments: Sequence[str]) -> Submitted:
        """Queue a call of a registered program; returns at once with its future results
        (``outputs``) and completion (failing with the first of its nodes' failures)."""
        holders = self._programs.get(program_id)
        if holders is None:
            raise IslandError(f"program {program_id[:12]!r} was not registered by this client")
        call_id = self._new_id("p")
        result_ids = tuple(self._new_id("b") for _ in holders)
        # A failed call's results are not all lost: those of nodes independent of the failed
        # one are computed (and the rest fail on their executors, saying why).
        done = self._pending_future(call_id, (), result_ids)
        for buffer_id, executors in zip(result_ids, holders, strict=True):
            self._locations[buffer_id] = executors
        self._send(
            pb.ClientMessage(
                call=pb.ProgramCall(
                    id=call_id,
                    program_id=program_id,
                    arguments=list(arguments),
                    results=list(result_ids),
                )
            )
        )
        return Submitted(call_id, result_ids, done)

    def put(self, array: np.ndarray, device: int) -> str:
        """Upload a host array to the executor owning ``device``; returns its buffer id.
        ``IslandError`` for a device the island does not have, ``TypeError`` for an array of
        something other than numbers or booleans."""
        problem = slice_problem("put", [device], self.device_owner)
        if problem:
            raise IslandError(problem)
        array = _numeric("put", array)
        buffer_id = self._new_id("put")
        executor = self.device_owner[device]
        placed = pb.PlacedBuffer(buffer_id=buffer_id, executor=executor)
        announced = False
        try:
            with self._answered("put", executor):
                # Announced before the upload, as by put_shards: the session's end then
                # deletes it wherever it got to (and cancels the upload: see _read). Announced
                # after, on a session that had ended meanwhile, the word was lost (writes to
                # it fail silently) and the upload stayed on the executor for good.
                self._send(pb.ClientMessage(placed=placed))
                announced = True
                self._locations[buffer_id] = (executor,)
                call = stub(self._executors[executor], EXECUTOR, "PutArray").future(
                    to_chunks(buffer_id, array), timeout=120
                )
                with self._cancellable(executor, call):
                    call.result()
                if self._ended:  # ended as the upload finished: the buffer is of no use
                    raise self._end_error(f"put: {self._ended}")
        except IslandError:
            if announced:  # the scheduler forgets it, and frees what was stored of it
                self.delete([buffer_id])
            raise
        return buffer_id

    def put_shards(self, array: np.ndarray, regions: Mapping[int, Sequence[Region]]) -> str:
        """Upload to each executor in ``regions`` only its regions of a host array (the
        shards its devices take of an input sharded over them), to all at once; returns the
        buffer id. Errors as ``put``; a failed upload's error is raised once the others have
        ended (and what they stored is freed)."""
        unknown = sorted(set(regions) - set(self._executors))
        if not regions or unknown:
            raise IslandError(f"put_shards: no executors given, or unknown ones ({unknown})")
        array = _numeric("put_shards", array)
        try:  # said here, not as gRPC's "Exception iterating requests!" from the upload
            regions = {
                executor: [explicit_region(region, array.shape) for region in parts]
                for executor, parts in regions.items()
            }
        except ValueError as error:
            raise IslandError(f"put_shards: {error}") from None
        buffer_id = self._new_id("put")

        def upload(executor: int) -> None:
            shards = [(region, array[region]) for region in regions[executor]]
            chunks = region_chunks(buffer_id, array.dtype, array.shape, shards)
            with self._answered("put_shards", executor):
                call = stub(self._executors[executor], EXECUTOR, "PutArray").future(
                    chunks, timeout=120
                )
                with self._cancellable(executor, call):
                    call.result()

        first, *others = sorted(regions)
        # Announced first: a client that dies while some uploads are done and others are not
        # leaves nothing behind, as its session's end deletes the buffer where it is (one
        # announced after them left a finished shard on its executor for good).
        holders = [first, *others]
        placed = pb.PlacedBuffer(buffer_id=buffer_id, executors=holders)
        self._send(pb.ClientMessage(placed=placed))
        self._locations[buffer_id] = tuple(holders)
        uploads = {first: None, **{e: _PUTS.submit(upload, e) for e in others}}
        failure: IslandError | None = None
        for executor, done in uploads.items():
            try:
                upload(executor) if done is None else done.result()
            except IslandError as error:
                failure = failure or error
        if failure is not None:
            self.delete([buffer_id])
            raise failure
        return buffer_id

    def holders(self, buffer_id: str) -> pb.InputSource:
        """Where a buffer of this session lives: its executors' endpoints, for another island
        to pull it from."""
        executors = {e.index: e for e in self.info.executors}
        held = [executors[i] for i in self._locations.get(buffer_id, ()) if i in executors]
        if not held:
            raise IslandError(f"unknown buffer {buffer_id!r}")
        return pb.InputSource(
            buffer_id=buffer_id,
            executors=[e.endpoint for e in held],
            data_endpoints=[e.data_endpoint for e in held if e.data_endpoint],
        )

    def place_remote(self, source: pb.InputSource) -> str:
        """Make a buffer held on another island usable here: this island's executors pull it
        from its holders when a computation needs it. Returns its id (the same)."""
        self._send(
            pb.ClientMessage(placed=pb.PlacedBuffer(buffer_id=source.buffer_id, remote=source))
        )
        return source.buffer_id

    def submit(
        self,
        function_id: str,
        devices: Sequence[int],
        inputs: Sequence[str],
        outputs: int,
        name: str = "",
        *,
        describe: bool = False,
    ) -> Submitted:
        """Queue a computation; returns at once with its future outputs. ``describe``: compile
        a STABLEHLO function for ``devices`` and output its ``pb.CompiledProgram`` (as uint8)
        instead of running it."""
        if outputs < 0:
            raise ValueError(f"outputs must be >= 0, not {outputs}")
        computation_id = self._new_id("c")
        output_ids = tuple(self._new_id("b") for _ in range(outputs))
        done = self._pending_future(computation_id, output_ids)
        holders = tuple(sorted({self.device_owner[d] for d in devices if d in self.device_owner}))
        for buffer_id in output_ids:
            self._locations[buffer_id] = holders
        self._send(
            pb.ClientMessage(
                computation=pb.Computation(
                    id=computation_id,
                    client=self.client,
                    function_id=function_id,
                    devices=list(devices),
                    inputs=list(inputs),
                    outputs=list(output_ids),
                    name=name,
                    describe=describe,
                )
            )
        )
        return Submitted(computation_id, output_ids, done)

    def get(self, buffer_id: str, timeout: float = 120.0) -> np.ndarray:
        """Fetch a buffer's value to the host, waiting for it to be computed."""
        holders = self._locations.get(buffer_id)
        if not holders:
            raise IslandError(f"unknown buffer {buffer_id!r}")
        gone = self._gone.get(buffer_id)
        if gone is not None:
            raise IslandError(f"get {buffer_id!r}: {gone}")
        request = pb.ArrayRequest(buffer_id=buffer_id, timeout_seconds=timeout)
        # Each executor of the buffer's slice sends the shards it holds.
        assembly = Assembly()
        for executor in holders:
            with self._answered(f"get {buffer_id!r}", executor, buffer_id):
                get_array = stub(self._executors[executor], EXECUTOR, "GetArray")
                responses = get_array(request, timeout=timeout + 5)
                with self._cancellable(executor, responses, buffer_id):
                    assembly.add(responses)
            if assembly.complete:
                assert assembly.array is not None
                return assembly.array
        raise IslandError(f"the executors of buffer {buffer_id!r} sent only part of it")

    def export(self, buffer_id: str, to: IslandClient) -> None:
        """``buffer_id``, of this island, is placed on another (``to.place_remote``): once it
        is made (at once if it is), ``to`` is told, so work there reading it, held while it
        was placed ``pending``, goes; when it will never be (its computation failed, its
        executor was lost, this session ended), ``to`` is told, so that work fails at once,
        naming why, instead of waiting out its pull."""
        made = False
        with self._lock:
            gone = self._gone.get(buffer_id) or self._ended
            if not gone:
                self._exported.setdefault(buffer_id, []).append(to)
                made = not self._producing(buffer_id)
        if gone:
            to.remote_failed([buffer_id], self._why_gone(gone))
        elif made:  # else when its computation completes (see ``_on_event``)
            to.remote_ready([buffer_id])

    def _producing(self, buffer_id: str) -> bool:
        """Whether a computation or call of this session still to complete writes
        ``buffer_id`` (called holding the lock)."""
        return any(
            buffer_id in ids for ids in (*self._produces.values(), *self._call_results.values())
        )

    def remote_ready(self, buffer_ids: Sequence[str]) -> None:
        """Buffers placed here from another island while pending there are made (see
        ``export``): work reading them here may go."""
        if not self._ended:
            self._write([pb.ClientMessage(remote_ready=pb.RemoteReady(buffer_ids=buffer_ids))])

    def remote_failed(self, buffer_ids: Sequence[str], reason: str) -> None:
        """Buffers placed here from another island will never be (see ``export``)."""
        if not self._ended:
            failed = pb.RemoteFailed(buffer_ids=list(buffer_ids), reason=reason[:MAX_REASON])
            self._write([pb.ClientMessage(remote_failed=failed)])

    def _why_gone(self, reason: str) -> str:
        return f"it will never be here: on island {self.info.island!r}, {reason}"

    def _tell_importers(self, gone: dict[str, str]) -> None:
        """Tell the islands ``gone``'s exported buffers were placed on that they never
        will be (called holding no lock: it writes to their sessions)."""
        with self._lock:
            importers = {b: self._exported.pop(b, []) for b in gone}
        by_island: dict[tuple[int, str], tuple[IslandClient, list[str]]] = {}
        for buffer_id, reason in gone.items():
            for to in importers[buffer_id]:
                by_island.setdefault((id(to), reason), (to, []))[1].append(buffer_id)
        for (_, reason), (to, ids) in by_island.items():
            to.remote_failed(ids, self._why_gone(reason))

    def delete(self, buffer_ids: Sequence[str]) -> None:
        """Free buffers once the computations queued before this call have used them. One
        placed on another island and not made yet never will be there: work there reading
        it fails now, naming why (it waited for it for good)."""
        with self._lock:
            unmade = [b for b in buffer_ids if b in self._exported and self._producing(b)]
        if unmade:
            self._tell_importers(dict.fromkeys(unmade, "it was deleted before it was made"))
        for buffer_id in buffer_ids:
            self._locations.pop(buffer_id, None)
            self._gone.pop(buffer_id, None)
            self._exported.pop(buffer_id, None)
        message = pb.ClientMessage(delete=pb.DeleteBuffers(ids=list(buffer_ids)))
        if getattr(self._batching, "messages", None) is not None:
            self._send(message)
            return
        with self._lock, self._deferred_lock:
            self._deferred.append(message)
            idle = not self._pending
        if idle:  # else the last completion sends it, if no message took it along before
            self._flush_due.set()

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Send this thread's requests made inside the block as one message when it ends (a
        chain of submissions then crosses to the scheduler at once). Submissions still return
        at once; waiting on one inside the block would wait for the block's end forever."""
        pending = getattr(self._batching, "messages", None)
        if pending is not None:  # nested: the outermost block sends
            yield
            return
        self._batching.messages = []
        try:
            yield
        finally:
            queued, self._batching.messages = self._batching.messages, None
            self._write(queued)

    def trace(self) -> Trace:
        """The island's trace: which computation of which client ran where and when, and
        which clients' oldest records the island let go of (``Trace.dropped_until_ns``)."""
        answer = stub(self._channel, SCHEDULER, "GetTrace")(pb.TraceRequest(), timeout=60)
        return Trace(answer.records, dict(answer.dropped_until_ns))

    @contextlib.contextmanager
    def _answered(self, what: str, executor: int, reads: str = "") -> Iterator[None]:
        """gRPC's errors of a call to ``executor`` (reading buffer ``reads``, if a get) as
        ``IslandError`` naming it (a dead one was a bare ``UNAVAILABLE``); a call after
        ``close`` or the session's end refused saying so, and one they (or the buffer's
        failure) cut short failing with that reason."""
        if self._closing or self._ended:
            raise self._over(what)
        if executor in self._lost:
            raise IslandUnavailable(f"{what}: {self._lost[executor]}")
        try:
            yield
        except (grpc.RpcError, grpc.FutureCancelledError) as error:
            if self._closing or self._ended:  # and the call cancelled with it (see _read)
                raise self._over(what) from None
            gone = self._gone.get(reads) if reads else None
            if gone is not None and executor not in self._lost and _cancelled(error):
                raise IslandError(f"{what}: {gone}") from None  # see _on_event
            lost = self._loss(executor, error)
            if lost is not None:
                raise IslandUnavailable(f"{what}: {lost}") from None
            details = error.details() if isinstance(error, grpc.Call) else str(error)
            endpoint = next(e.endpoint for e in self.info.executors if e.index == executor)
            raise IslandError(f"{what}: executor {executor} ({endpoint}): {details}") from None

    def _over(self, what: str) -> IslandError:
        """Why a request can no longer be made: the session was closed, or ended."""
        if self._closing:
            return IslandError(f"{what}: the session with island {self.info.island!r} is closed")
        return self._end_error(f"{what}: {self._ended}")

    def _end_error(self, message: str) -> IslandError:
        """The error of a request the session's end failed: the island refused the session
        itself (its hello: the name, the credential) is the request's fault, not to retry as
        is; any other end is the island's (``IslandUnavailable``)."""
        return IslandError(message) if self._rejected else IslandUnavailable(message)

    def _loss(self, executor: int, error: Exception) -> str | None:
        """Why ``executor`` is lost, if the scheduler says it is. A call the executor's death
        broke fails before the scheduler's word comes (moments later): it is waited for a
        little, so the error says what happened rather than ``Stream removed``."""
        broken = not isinstance(error, grpc.Call) or error.code() in _BROKEN_CALL
        with self._lost_changed:
            if broken:
                self._lost_changed.wait_for(
                    lambda: executor in self._lost or self._ended, LOSS_WAIT_SECONDS
                )
            return self._lost.get(executor)

    @contextlib.contextmanager
    def _cancellable(self, executor: int, call: grpc.Future, reads: str = "") -> Iterator[None]:
        """Keep ``call`` (a gRPC call to ``executor``, reading buffer ``reads`` if a get) to
        cancel if the executor is lost, the session ends or the buffer will never be."""
        with self._lock:
            self._calls.setdefault(executor, {})[call] = reads
            # Lost, ended or gone between the check and the call.
            if executor in self._lost or self._ended or (reads and reads in self._gone):
                call.cancel()
        try:
            yield
        finally:
            with self._lock:
                self._calls[executor].pop(call, None)

    def close(self) -> None:
        self._closing = True
        self._flush_due.set()
        self._write([])  # deferred deletions
        with contextlib.suppress(OSError):  # the scheduler ends the session and its stream
            self._session.shutdown(socket.SHUT_WR)
        self._reader.join(timeout=10)
        self._session.close()
        self.close_channels()

    def close_channels(self) -> None:
        """Close the gRPC channels (``close`` does, after the session)."""
        for open_channel in [self._channel, *self._executors.values()]:
            open_channel.close()

    def __enter__(self) -> IslandClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- session -----------------------------------------------------------------------------

    def _wait_for_room(self) -> None:
        """Block while ``window`` computations are outstanding. What this thread batched so
        far is sent first: its completions are what makes room."""
        with self._lock:
            if len(self._pending) < self.window or self._ended:
                return
        batched = getattr(self._batching, "messages", None)
        if batched:
            self._batching.messages = []
            self._write(batched)
        with self._room:
            while len(self._pending) > self.window - self._refill and not self._ended:
                self._room.wait()

    def _registered(self, registration_id: str, message: pb.ClientMessage) -> Future[None]:
        """The island's answer to a function's or program's registration, sent once per
        session (a refused one may be sent again)."""
        with self._lock:
            future = self._functions.get(registration_id)
            if future is None:
                future = self._functions[registration_id] = Future()
                if self._ended:
                    future.set_exception(self._end_error(self._ended))
                self._send(message)
        return future

    def _pending_future(
        self, request_id: str, outputs: tuple[str, ...], results: tuple[str, ...] = ()
    ) -> Future[None]:
        """The completion of a computation or call about to be sent, once there is room:
        ``outputs`` are never computed if it is refused or fails, a call's ``results`` only
        if it is refused."""
        done: Future[None] = Future()
        self._wait_for_room()
        with self._lock:
            if self._ended:
                done.set_exception(self._end_error(self._ended))
            else:
                self._pending[request_id] = done
                self._produces[request_id] = outputs
                if results:
                    self._call_results[request_id] = results
        return done

    def _new_id(self, kind: str) -> str:
        # 64 random bits: an island reads a buffer to whoever names it, so ids are not
        # guessed from the counter (traces list computation ids, never buffer ids).
        return f"{self.client}/{kind}{next(_IDS)}-{_nonce()}"

    def _send(self, message: pb.ClientMessage) -> None:
        pending = getattr(self._batching, "messages", None)
        if pending is not None:
            pending.append(message)
        else:
            self._write([message])

    def _write(self, batch: list[pb.ClientMessage]) -> None:
        """Send messages in one frame, straight from the caller's thread, after the
        deletions deferred until now."""
        if self._deferred:
            with self._deferred_lock:
                batch, self._deferred = [*self._deferred, *batch], []
        if not batch:
            return
        data = frame(pb.ClientBatch(messages=batch))
        if len(data) > MAX_FRAME_BYTES + FRAME_LENGTH.size:
            # A batch of large registrations: in several frames, none the scheduler must
            # refuse (it would end the session).
            data = frames(batch, lambda group: pb.ClientBatch(messages=group))
        # A failed write means the session ended: the reader fails what is pending.
        with self._send_lock, contextlib.suppress(OSError):
            self._session.sendall(data)

    def _flush_loop(self) -> None:
        """Send deferred deletions no other message took along within the linger."""
        while True:
            self._flush_due.wait()
            if self._closing:
                return
            time.sleep(DELETE_LINGER_SECONDS)
            self._flush_due.clear()  # before looking: a deletion made after sets it again
            if self._deferred:
                self._write([])

    def _read(self) -> None:
        try:
            for batch in messages(self._session.recv, pb.ClientEventBatch.FromString):
                for event in batch.events:
                    self._on_event(event)
            if self._closing:  # the client's own close, not the scheduler's doing
                reason = f"the session with island {self.info.island!r} is closed"
            else:
                reason = self._rejected or (
                    f"the scheduler at {self.endpoint} closed the session (it stopped or "
                    "restarted; what the session held on the island is gone): connect again "
                    "to go on"
                )
        except (OSError, FrameError) as error:
            reason = (
                f"the scheduler at {self.endpoint} is unreachable ({error}; it stopped, "
                "restarted or the network failed): the session ended, connect again to go on"
            )
        with self._lock:
            waiting = [*self._pending.values(), *self._functions.values()]
            self._pending.clear()
            self._produces.clear()
            self._call_results.clear()
            self._ended = reason  # later requests fail at once with the same reason
            self._room.notify_all()
            self._lost_changed.notify_all()
            exported = dict.fromkeys(self._exported, f"the session ended: {reason}")
            calls = [call for held in self._calls.values() for call in held]
        for future in waiting:
            if not future.done():
                future.set_exception(self._end_error(reason))
        # Gets waiting for buffers the session's end deleted (or never made) would wait out
        # the executor's 30 s for them to appear, then say they were never announced; an
        # upload in progress would be kept for good. Cancelled, each fails with the reason.
        for call in calls:
            call.cancel()
        self._tell_importers(exported)

    def _on_event(self, event: pb.ClientEvent) -> None:
        if event.kind == Event.EXECUTOR_LOST:
            with self._lock:
                self._lost[event.executor] = event.message
                lost = {}
                for buffer_id, holders in list(self._locations.items()):
                    if event.executor in holders:
                        self._gone.setdefault(buffer_id, f"it was lost: {event.message}")
                        lost[buffer_id] = self._gone[buffer_id]
                self._lost_changed.notify_all()
                calls = list(self._calls.get(event.executor, {}))
            for call in calls:
                call.cancel()
            self._tell_importers(lost)
            return
        if event.kind == Event.EXECUTOR_REJOINED:
            rejoined = event.rejoined
            # A new channel: the old one may be waiting out gRPC's reconnect backoff.
            fresh = channel(rejoined.endpoint, MESSAGE_OPTIONS, self._tls)
            with self._lock:
                self._lost.pop(event.executor, None)
                stale, self._executors[event.executor] = self._executors[event.executor], fresh
                for executor in self.info.executors:  # its data endpoint changed
                    if executor.index == event.executor:
                        executor.CopyFrom(rejoined)
                self._lost_changed.notify_all()
            stale.close()
            return
        if event.kind == Event.REJECTED and event.ends_session:
            self._rejected = event.message  # why the scheduler ends the session
        elif event.kind == Event.REJECTED and not (
            event.computation_id or event.function_id or event.program_id
        ):  # no caller waits for it (a hello within the session, a placement, a deletion)
            logger.warning("island %r refused: %s", self.info.island, event.message)
            return
        failed: dict[str, str] = {}  # exported outputs that will never be
        made: dict[int, tuple[IslandClient, list[str]]] = {}  # exported outputs now made
        reads: Sequence[grpc.Future] = ()  # gets of outputs that will never be
        with self._lock:
            registered = event.function_id or event.program_id
            if event.kind in (Event.REGISTERED, Event.REJECTED) and registered:
                future = self._functions.get(registered)
                if event.kind == Event.REJECTED:
                    self._functions.pop(registered, None)
            else:
                future = self._pending.pop(event.computation_id, None)
                if future is not None and len(self._pending) == self.window - self._refill:
                    self._room.notify_all()
                outputs = self._produces.pop(event.computation_id, ())
                results = self._call_results.pop(event.computation_id, ())
                if event.kind in (Event.FAILED, Event.REJECTED):
                    reads = self._never_computed(event, outputs, results, failed)
                elif event.kind == Event.COMPLETED and self._exported:
                    for buffer_id in (*outputs, *results):
                        for to in self._exported.get(buffer_id, ()):
                            made.setdefault(id(to), (to, []))[1].append(buffer_id)
            idle = not self._pending and self._deferred
        for call in reads:
            call.cancel()
        if failed:
            self._tell_importers(failed)
        for to, ids in made.values():
            to.remote_ready(ids)
        if idle:  # nothing else will carry the deferred deletions soon
            self._write([])
        if future is None or future.done():
            return
        if event.kind in (Event.COMPLETED, Event.REGISTERED):
            future.set_result(None)
        elif event.kind == Event.REJECTED and is_busy(event.message):
            future.set_exception(IslandBusy(event.message))
        elif self._lost_in(event.message):
            future.set_exception(IslandUnavailable(event.message))
        else:
            future.set_exception(IslandError(event.message))

    def _never_computed(
        self,
        event: pb.ClientEvent,
        outputs: tuple[str, ...],
        results: tuple[str, ...],
        failed: dict[str, str],
    ) -> list[grpc.Future]:
        """Mark what a failed or refused computation (``outputs``) or call (``results``,
        only if refused or failed at dispatch: a call failing in one node still makes the
        results of others) was to write as never to be (adding the exported ones to
        ``failed``); returns the gets waiting for them, to cancel. Called holding the lock."""
        never = dict.fromkeys(outputs, f"its computation failed: {event.message}")
        if results and (event.kind == Event.REJECTED or event.unmade):
            done = "was refused" if event.kind == Event.REJECTED else "failed"
            never.update(dict.fromkeys(results, f"its program call {done}: {event.message}"))
        if not never:
            return []
        for buffer_id, why in never.items():  # a read would wait in vain
            self._gone.setdefault(buffer_id, why)
            if buffer_id in self._exported:
                failed[buffer_id] = self._gone[buffer_id]
        # A get already waiting for one waits for the executor to hear of it: 30 s, in vain,
        # then it said the buffer was not announced. Cancelled, it says why (see _answered).
        return [
            call for held in self._calls.values() for call, read in held.items() if read in never
        ]

    def _lost_in(self, message: str) -> bool:
        """Whether ``message`` is (or carries) a lost executor's: the scheduler fails the
        work that needed it with the message it announced the loss with, just before."""
        with self._lock:
            return any(lost in message for lost in self._lost.values() if lost)


def _cancelled(error: Exception) -> bool:
    """Whether a call ended because it was cancelled (by this client: see ``_cancellable``)."""
    if isinstance(error, grpc.Call):
        return error.code() == grpc.StatusCode.CANCELLED
    return isinstance(error, grpc.FutureCancelledError)


def _numeric(what: str, array: np.ndarray) -> np.ndarray:
    """``array`` as a numpy array, or ``TypeError`` if it is not of numbers or booleans."""
    array = native_order(np.asarray(array))
    try:
        numeric_dtype(array.dtype)
    except ValueError as error:
        raise TypeError(f"{what}: {error}; devices hold numbers and booleans") from None
    return array


def _unanswered(endpoint: str, error: grpc.RpcError, tls: Tls | None) -> str:
    """Why the scheduler did not answer, with what to check about TLS: to gRPC, a refused
    handshake looks like a closed connection."""
    details = error.details() if isinstance(error, grpc.Call) else str(error)
    message = f"the scheduler at {endpoint} did not answer: {details}"
    if error.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return message
    if tls is None:
        hint = "if the island serves TLS, set PATHWAYS_TLS_CERT, PATHWAYS_TLS_KEY, PATHWAYS_TLS_CA"
    elif not tls.settings.identity:
        hint = (
            "an island with TLS requires a client certificate: set PATHWAYS_TLS_CERT and "
            "PATHWAYS_TLS_KEY"
        )
    else:
        hint = (
            "with TLS, the island and this client must each hold a certificate signed by the "
            "other's CA (PATHWAYS_TLS_CA), and the island's must name the host it is reached "
            "at (or PATHWAYS_TLS_SERVER_NAME)"
        )
    return f"{message} ({hint})"


def _reachable(advertised: str, contacted: str) -> tuple[str, int]:
    """Where to reach an advertised host:port: a server listening on every interface
    advertises a wildcard host, reached at the host it was contacted at."""
    host, port = advertised.rsplit(":", 1)
    if host in ("", "0.0.0.0", "::", "[::]"):
        host = contacted.rsplit(":", 1)[0]
    return (host.strip("[]"), int(port))
