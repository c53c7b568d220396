"""The island dispatcher: the pure state machine inside an island's gang scheduler.

Every stimulus (a client's message, an executor's event, a lost executor) goes in as a method
call and comes out as instructions: commands for executors and events for clients. The server
around it only moves messages. Guarantees:

- one island order: every command gets the next sequence number and goes to every executor that
  holds a device of the computation, so all executors see the same order;
- a client's computations, registrations and deletions keep their order (a deletion waits for
  the computations queued before it);
- at most ``max_in_flight`` computations are dispatched and unfinished, which is where the policy
  (FIFO or proportional share) decides who goes next; the rest wait in the queue, bounded by
  ``max_queued`` in all and ``max_queued_per_client`` per client (beyond either, the
  computation is refused with an ``island busy: ...; retry later`` message naming the island
  and the limit; see :mod:`pathways_core.scheduling.limits`);
- deletions are never refused: they are merged into the client's last queued deletion, so they
  never grow the queue by more than one per queued computation;
- function artifacts larger than ``max_artifact_bytes`` are refused at registration;
- bad requests are rejected at once with a message naming what is wrong.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from pathways_core.scheduling.limits import (
    DEFAULT_MAX_ARTIFACT_BYTES,
    DEFAULT_MAX_QUEUED,
    artifact_problem,
    busy_message,
    default_max_queued_per_client,
)
from pathways_core.scheduling.queue import DEFAULT_RUN_LENGTH, IslandQueue, Policy, QueueFull
from pathways_core.wire import pb

Event = pb.ClientEvent


@dataclass(frozen=True)
class ExecutorSpec:
    """An executor of the island: its index, endpoint and the island devices it owns."""

    index: int
    endpoint: str
    devices: tuple[int, ...]
    data_endpoint: str = ""


@dataclass(frozen=True)
class ToExecutor:
    executor: int
    command: pb.ExecutorCommand


@dataclass(frozen=True)
class ToClient:
    client: str
    event: pb.ClientEvent


Instruction = ToExecutor | ToClient


@dataclass(frozen=True)
class TraceRecord:
    """One computation on one executor: which client's work occupied which devices when."""

    seq: int
    computation_id: str
    client: str
    name: str
    devices: tuple[int, ...]
    executor: int
    start_ns: int
    end_ns: int
    ok: bool


@dataclass
class _InFlight:
    client: str
    computation: pb.Computation
    waiting: set[int]
    errors: list[str] = field(default_factory=list)
    pulls: set[str] = field(default_factory=set)  # inputs read from another executor


@dataclass
class _Delete:
    ids: list[str]  # grows while it waits: later deletions of the client join it


class IslandDispatcher:
    """See the module docstring."""

    def __init__(
        self,
        executors: Sequence[ExecutorSpec],
        policy: Policy | str = Policy.FIFO,
        max_queued: int = DEFAULT_MAX_QUEUED,
        max_in_flight: int = 16,
        trace_limit: int = 200_000,
        *,
        island: str = "local",
        max_queued_per_client: int | None = None,
        max_artifact_bytes: int = DEFAULT_MAX_ARTIFACT_BYTES,
        run_length: int = DEFAULT_RUN_LENGTH,
    ) -> None:
        self.island = island
        self.executors = {spec.index: spec for spec in executors}
        self.device_owner = {d: spec.index for spec in executors for d in spec.devices}
        if max_queued_per_client is None:
            max_queued_per_client = default_max_queued_per_client(max_queued)
        self.queue: IslandQueue[pb.Computation | _Delete] = IslandQueue(
            policy, max_queued, max_queued_per_client, run_length
        )
        self.max_in_flight = max_in_flight
        self.max_artifact_bytes = max_artifact_bytes
        self._deleting: set[str] = set()  # buffer ids whose deletion is queued
        self.trace: list[TraceRecord] = []
        self._trace_limit = trace_limit
        self._seq = 0
        self._functions: dict[str, pb.FunctionRegistration] = {}
        self._registered: set[tuple[str, int]] = set()  # (function id, executor)
        self._buffers: dict[str, frozenset[int]] = {}  # buffer id -> executors holding it
        self._in_flight: dict[int, _InFlight] = {}  # seq -> computation
        self._down: dict[int, str] = {}  # executor -> why
        # Buffers another executor is pulling for an unfinished computation: a deletion waits
        # for them (the holder would otherwise free the bytes before the pull).
        self._pulling: dict[str, int] = {}  # buffer id -> computations still reading it
        self._deferred: dict[str, frozenset[int]] = {}  # deleted buffer id -> its holders
        # Buffers held by another island's executors: pulled from there, never deleted here.
        self._remote: dict[str, pb.InputSource] = {}
        # Executors that pulled a copy of a buffer: a deletion frees their copies too.
        self._copies: dict[str, set[int]] = {}

    # -- clients -----------------------------------------------------------------------------

    def connect(self, client: str, weight: int = 1, priority: int = 0) -> list[Instruction]:
        """A client's session opens (or says hello again with a new weight or priority)."""
        self.queue.add_client(client, max(1, weight), priority)
        return []

    def disconnect(self, client: str) -> list[Instruction]:
        """A client's session ends: its queued work is dropped and its buffers deleted."""
        self.queue.remove_client(client)
        prefix = f"{client}/"
        self._deleting = {i for i in self._deleting if not i.startswith(prefix)}
        gone = [buffer_id for buffer_id in self._buffers if buffer_id.startswith(prefix)]
        return self._delete_now(gone) + self._dispatch()

    def register(self, client: str, function: pb.FunctionRegistration) -> list[Instruction]:
        """Store a compiled function; executors get it before its first use."""
        event = Event(kind=Event.REGISTERED, function_id=function.function_id)
        label = function.name or function.function_id[:12]
        too_large = artifact_problem(
            label, len(function.artifact), self.max_artifact_bytes, f"island {self.island!r}"
        )
        if too_large is not None:
            event.kind, event.message = Event.REJECTED, too_large
            return [ToClient(client, event)]
        digest = hashlib.sha256(function.artifact).hexdigest()
        if digest != function.function_id:
            event.kind = Event.REJECTED
            event.message = (
                f"function {function.name or function.function_id[:12]!r}: the artifact's "
                f"sha256 {digest[:12]} does not match its id {function.function_id[:12]}"
            )
        else:
            self._functions.setdefault(function.function_id, function)
        return [ToClient(client, event)]

    def placed(self, client: str, message: pb.PlacedBuffer) -> list[Instruction]:
        """The client uploaded a buffer to an executor, or names one held on another island."""
        problem = self._owned(client, message.buffer_id, "buffer")
        remote = message.remote if message.HasField("remote") else None
        if problem is None and remote is not None and not remote.data_endpoints:
            problem = f"remote buffer {message.buffer_id!r} names no data endpoint to pull from"
        elif problem is None and remote is None and message.executor not in self.executors:
            problem = f"there is no executor {message.executor}"
        if problem is None and message.buffer_id in self._buffers:
            problem = f"buffer {message.buffer_id!r} exists already"
        if problem is not None:
            return [ToClient(client, Event(kind=Event.REJECTED, message=problem))]
        if remote is not None:
            source = pb.InputSource()
            source.CopyFrom(remote)
            source.buffer_id = message.buffer_id
            self._remote[message.buffer_id] = source
            self._buffers[message.buffer_id] = frozenset()
        else:
            self._buffers[message.buffer_id] = frozenset({message.executor})
        return []

    def submit(self, client: str, computation: pb.Computation) -> list[Instruction]:
        """Validate a computation and queue it; dispatch whatever may go now."""
        problem = self._check(client, computation)
        if problem is None:
            try:
                self.queue.submit(client, computation, cost=float(len(computation.devices)))
            except QueueFull as full:
                problem = busy_message(
                    self.island, client, full.queued, full.limit, full.per_client
                )
        if problem is not None:
            return [
                ToClient(
                    client,
                    Event(kind=Event.REJECTED, computation_id=computation.id, message=problem),
                )
            ]
        # Outputs exist from now on (as futures): later computations may consume them.
        owners = frozenset(self.device_owner[d] for d in computation.devices)
        for buffer_id in computation.outputs:
            self._buffers[buffer_id] = owners
        return self._dispatch()

    def delete(self, client: str, ids: Sequence[str]) -> list[Instruction]:
        """Delete buffers once the client's computations queued before have been dispatched."""
        prefix = f"{client}/"
        mine = [
            i
            for i in dict.fromkeys(ids)
            if i.startswith(prefix) and i in self._buffers and i not in self._deleting
        ]
        if not mine:
            return []
        self._deleting.update(mine)
        last = self.queue.last(client)
        if isinstance(last, _Delete):
            # Nothing of the client's was queued since: the waiting deletion takes these too.
            last.ids.extend(mine)
            return []
        # Never refused (refusing would leak the buffers): bounded by the computations queued.
        self.queue.submit(client, _Delete(mine), cost=0.0, bounded=False)
        return self._dispatch()

    # -- executors ---------------------------------------------------------------------------

    def executor_event(self, event: pb.ExecutorEvent) -> list[Instruction]:
        """An executor finished (or failed) its part of a computation."""
        flight = self._in_flight.get(event.seq)
        if flight is None:
            return []  # a registration's failure, or a computation already failed
        computation = flight.computation
        self._record(
            event.seq,
            flight.client,
            computation,
            event.executor,
            event.start_ns,
            event.end_ns,
            event.ok,
        )
        flight.waiting.discard(event.executor)
        if not event.ok:
            flight.errors.append(event.message)
        if flight.waiting:
            return []
        return self._finish(event.seq) + self._dispatch()

    def executor_lost(self, index: int, reason: str) -> list[Instruction]:
        """An executor is unreachable: its computations fail now, and later ones touching its
        devices are refused, while the rest of the island keeps serving."""
        spec = self.executors[index]
        message = f"executor {index} ({spec.endpoint}) is unreachable: {reason}"
        self._down[index] = message
        instructions: list[Instruction] = []
        for seq, flight in list(self._in_flight.items()):
            if index in flight.waiting:
                flight.waiting.discard(index)
                flight.errors.append(message)
                if not flight.waiting:
                    instructions += self._finish(seq)
        return instructions + self._dispatch()

    # -- internals ---------------------------------------------------------------------------

    def _owned(self, client: str, identifier: str, what: str) -> str | None:
        if not identifier.startswith(f"{client}/"):
            return f"{what} id {identifier!r} must start with the client name {client + '/'!r}"
        return None

    def _check(self, client: str, computation: pb.Computation) -> str | None:
        label = computation.name or computation.id
        problem = self._owned(client, computation.id, "computation")
        if problem:
            return problem
        if computation.function_id not in self._functions:
            return (
                f"computation {label!r} calls function {computation.function_id[:12]!r}, "
                "which was never registered"
            )
        devices = list(computation.devices)
        if not devices:
            return f"computation {label!r} names no devices"
        unknown = sorted({d for d in devices if d not in self.device_owner})
        if unknown:
            return (
                f"computation {label!r} names devices {unknown} the island does not have "
                f"(it has 0..{len(self.device_owner) - 1})"
            )
        if len(set(devices)) != len(devices):
            return f"computation {label!r} names a device twice"
        down = [self._down[i] for i in {self.device_owner[d] for d in devices} if i in self._down]
        if down:
            return f"computation {label!r} cannot run: {down[0]}"
        for buffer_id in computation.inputs:
            if buffer_id not in self._buffers:
                return f"computation {label!r} reads unknown buffer {buffer_id!r}"
        for buffer_id in computation.outputs:
            problem = self._owned(client, buffer_id, "buffer")
            if problem:
                return problem
            if buffer_id in self._buffers:
                return f"computation {label!r} writes buffer {buffer_id!r}, which exists already"
        if len(set(computation.outputs)) != len(computation.outputs):
            return f"computation {label!r} names an output twice"
        return None

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _dispatch(self) -> list[Instruction]:
        instructions: list[Instruction] = []
        while True:
            # At the bound on work in flight, only a free item (a deletion) behind the
            # computation just taken still goes, with it; ``next`` takes those first anyway.
            at_bound = len(self._in_flight) >= self.max_in_flight
            taken = self.queue.next_free() if at_bound else self.queue.next()
            if taken is None:
                break
            client, item = taken
            if isinstance(item, _Delete):
                self._deleting.difference_update(item.ids)
                instructions += self._delete_now(list(item.ids))
            else:
                instructions += self._run(client, item)
        return instructions

    def _run(self, client: str, computation: pb.Computation) -> list[Instruction]:
        owners = sorted({self.device_owner[d] for d in computation.devices})
        down = [self._down[i] for i in owners if i in self._down]
        seq = self._next_seq()
        if down:
            failed = Event(
                kind=Event.FAILED,
                computation_id=computation.id,
                seq=seq,
                message=f"computation {computation.name or computation.id!r}: {down[0]}",
            )
            return [ToClient(client, failed)]
        instructions: list[Instruction] = []
        for executor in owners:
            if (computation.function_id, executor) not in self._registered:
                self._registered.add((computation.function_id, executor))
                register = pb.ExecutorCommand(
                    seq=self._next_seq(), register=self._functions[computation.function_id]
                )
                instructions.append(ToExecutor(executor, register))
        command_seq = self._next_seq()
        flight = _InFlight(client, computation, set(owners))
        for executor in owners:
            command = pb.ExecutorCommand(seq=command_seq, run=computation)
            for buffer_id in computation.inputs:
                holders = self._buffers.get(buffer_id, frozenset())
                if executor in holders:
                    continue
                if buffer_id not in flight.pulls:
                    flight.pulls.add(buffer_id)
                    self._pulling[buffer_id] = self._pulling.get(buffer_id, 0) + 1
                self._copies.setdefault(buffer_id, set()).add(executor)
                remote = self._remote.get(buffer_id)
                if remote is not None:
                    command.sources.append(remote)
                else:
                    specs = [self.executors[h] for h in sorted(holders)]
                    command.sources.add(
                        buffer_id=buffer_id,
                        executors=[spec.endpoint for spec in specs],
                        data_endpoints=[spec.data_endpoint for spec in specs if spec.data_endpoint],
                    )
            instructions.append(ToExecutor(executor, command))
        self._in_flight[command_seq] = flight
        return instructions

    def _delete_now(self, ids: list[str]) -> list[Instruction]:
        by_executor: dict[int, list[str]] = {}
        for buffer_id in ids:
            holders = self._buffers.pop(buffer_id, frozenset())
            holders |= self._copies.pop(buffer_id, set())
            self._remote.pop(buffer_id, None)
            if self._pulling.get(buffer_id):
                self._deferred[buffer_id] = holders
                continue
            for executor in holders:
                by_executor.setdefault(executor, []).append(buffer_id)
        return self._delete_commands(by_executor)

    def _delete_commands(self, by_executor: dict[int, list[str]]) -> list[Instruction]:
        return [
            ToExecutor(
                executor,
                pb.ExecutorCommand(seq=self._next_seq(), delete=pb.DeleteBuffers(ids=buffer_ids)),
            )
            for executor, buffer_ids in sorted(by_executor.items())
            if executor not in self._down
        ]

    def _finish(self, seq: int) -> list[Instruction]:
        flight = self._in_flight.pop(seq)
        released: dict[int, list[str]] = {}
        for buffer_id in flight.pulls:
            self._pulling[buffer_id] -= 1
            if self._pulling[buffer_id] == 0:
                del self._pulling[buffer_id]
                for executor in self._deferred.pop(buffer_id, frozenset()):
                    released.setdefault(executor, []).append(buffer_id)
        return [*self._delete_commands(released), self._outcome(seq, flight)]

    def _outcome(self, seq: int, flight: _InFlight) -> ToClient:
        if flight.errors:
            event = Event(
                kind=Event.FAILED,
                computation_id=flight.computation.id,
                seq=seq,
                message="; ".join(dict.fromkeys(flight.errors)),
            )
        else:
            event = Event(kind=Event.COMPLETED, computation_id=flight.computation.id, seq=seq)
        return ToClient(flight.client, event)

    def _record(
        self,
        seq: int,
        client: str,
        computation: pb.Computation,
        executor: int,
        start_ns: int,
        end_ns: int,
        ok: bool,
    ) -> None:
        if len(self.trace) >= self._trace_limit:
            del self.trace[: self._trace_limit // 10]
        devices = tuple(d for d in computation.devices if self.device_owner[d] == executor)
        self.trace.append(
            TraceRecord(
                seq,
                computation.id,
                client,
                computation.name,
                devices,
                executor,
                start_ns,
                end_ns,
                ok,
            )
        )
