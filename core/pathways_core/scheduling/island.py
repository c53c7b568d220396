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
- functions and programs are kept while an open session uses them (registered, submitted or
  called them): once the last such session ends they are forgotten here and on the executors
  (after every command that used them), so an island serving many sessions for weeks holds
  only what its open sessions use;
- a lost executor (its stream ended, or it went silent) fails its work at once and work on it
  is refused; one restarted and taken back in its place (``executor_rejoined``) runs work
  again, while what the lost one held, and work queued before the loss that ran on it, stay
  lost (refused or failed naming the loss);
- bad requests are rejected at once with a message naming what is wrong;
- work reads, and a session deletes, only the session's own buffers (the queue keeps order
  within a client alone: another's could be read before it was made or after it was freed);
- outputs of work that failed at dispatch will never be made: work reading them fails at
  dispatch, or is refused, naming the first failure;
- work of an ended session still running keeps its ids taken until it finishes, and its
  outcome goes to no later session of the same name;
- a client's completion may wait for its next event (``ToClient.deferrable``) while the client
  has ``HOLD_WHILE_PENDING`` or more other computations queued or running, at most
  ``MAX_HELD_COMPLETIONS`` in a row: a client keeping a pipeline full is woken once per batch
  of completions, not per completion. One with at most one other outstanding (a loop
  dispatching a step ahead, a chain waiting on each call) gets each at once, and failures
  always go out at once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from pathways_core.scheduling.costs import DeviceTimeCosts
from pathways_core.scheduling.limits import (
    DEFAULT_MAX_ARTIFACT_BYTES,
    DEFAULT_MAX_QUEUED,
    artifact_problem,
    busy_message,
    default_max_queued_per_client,
)
from pathways_core.scheduling.programs import (
    REGISTER_IN_SESSION,
    Program,
    check_program,
    intermediate_id,
    slice_problem,
)
from pathways_core.scheduling.queue import DEFAULT_RUN_LENGTH, IslandQueue, Policy, QueueFull
from pathways_core.scheduling.trace import DEFAULT_TRACE_LIMIT, IslandTrace, Snapshot, in_order
from pathways_core.wire import pb

Event = pb.ClientEvent
FORGET_PIECE = 1024  # ids per forget command (64 hex digits each)
# A client's completions may be held back while it has this many other computations queued
# or running, at most this many in a row (see the module docstring). Woken per completion,
# eight tenants' client processes spent 267-285 µs of CPU per computation on two cores shared
# with the island, one tenant 185-190; held, 181-190 for both.
HOLD_WHILE_PENDING = 2
MAX_HELD_COMPLETIONS = 32


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
    # May go out with the client's next event instead of at once (a completion while it has
    # more work outstanding; see the module docstring).
    deferrable: bool = False


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


@dataclass(slots=True)
class ClientUsage:
    """What a client's work did on the island (counters, from its first session on)."""

    completed: int = 0  # computations and program calls that finished well
    failed: int = 0  # ... that failed (on an executor, or lost with one)
    refused: int = 0  # ... refused when submitted (a bad request, or the island busy)
    device_ns: int = 0  # device time its work held: per executor, run time x its devices


# Usage of this many clients at most is kept: those of ended sessions go first.
MAX_USAGE_CLIENTS = 1024
MAX_READY_EARLY = 65_536  # buffers said to be made before they were placed, kept at most


@dataclass(frozen=True)
class _Call:
    call: pb.ProgramCall
    program: Program


# A program call's report from one executor: its event, client and call.
_CallReport = tuple[pb.ExecutorEvent, str, _Call]
# A trace entry: a record, or a reported call standing for its nodes' records.
TraceEntry = TraceRecord | _CallReport


@dataclass
class _InFlight:
    client: str
    item: pb.Computation | _Call
    waiting: set[int]
    usage: ClientUsage
    session: int  # the client's session that submitted it (see ``IslandDispatcher._session``)
    errors: list[str] = field(default_factory=list)
    pulls: set[str] = field(default_factory=set)  # inputs read from another executor
    device_ns: int = 0  # measured so far, over the executors that reported

    @property
    def id(self) -> str:
        return self.item.call.id if isinstance(self.item, _Call) else self.item.id


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
        trace_limit: int = DEFAULT_TRACE_LIMIT,
        *,
        island: str = "local",
        max_queued_per_client: int | None = None,
        max_artifact_bytes: int = DEFAULT_MAX_ARTIFACT_BYTES,
        run_length: int = DEFAULT_RUN_LENGTH,
        first_seq: int = 0,
        max_queued_per_tenant: int | None = None,
    ) -> None:
        """``first_seq``: the island order's numbers start after it (a restarted scheduler
        starts past its predecessor's, whose events executors may still send)."""
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1 (got {max_in_flight})")
        self.island = island
        self.executors = {spec.index: spec for spec in executors}
        self.device_owner = {d: spec.index for spec in executors for d in spec.devices}
        if max_queued_per_client is None:
            max_queued_per_client = default_max_queued_per_client(max_queued)
        self.costs = DeviceTimeCosts()  # what work is charged under proportional share
        self.queue: IslandQueue[pb.Computation | _Call | _Delete] = IslandQueue(
            policy,
            max_queued,
            max_queued_per_client,
            run_length,
            price=self._price,
            max_queued_per_tenant=max_queued_per_tenant,
        )
        self.max_in_flight = max_in_flight
        self.max_artifact_bytes = max_artifact_bytes
        self._deleting: set[str] = set()  # buffer ids whose deletion is queued
        # The trace: records, and program calls' executor events, whose nodes' records are
        # made only when the trace is read (~9 µs a node: made in the dispatcher, 20,000
        # calls' worth at a time held it for 3.5 s).
        self._trace: IslandTrace[TraceEntry] = IslandTrace(trace_limit)
        self._seq = first_seq
        self._functions: dict[str, pb.FunctionRegistration] = {}
        self._registered: set[tuple[str, int]] = set()  # (function or program id, executor)
        self._programs: dict[str, Program] = {}
        # The open sessions using each function and program, and each session's uses: a
        # program's users also use its functions, so no function goes before its programs.
        self._users: dict[str, set[str]] = {}  # function or program id -> clients
        self._uses: dict[str, set[str]] = {}  # client -> function and program ids
        self._buffers: dict[str, frozenset[int]] = {}  # buffer id -> executors holding it
        self._in_flight: dict[int, _InFlight] = {}  # seq -> computation
        self._running: dict[str, int] = {}  # client -> its computations in flight
        self._held: dict[str, int] = {}  # client -> completions deferred since its last event
        self._down: dict[int, str] = {}  # executor -> why
        self._rejoined = 0  # lost executors taken back (restarted)
        # What a lost executor held, and work queued before its loss that ran on it: gone or
        # failed for good (each id -> the loss), even once a restarted one is taken back.
        self._gone: dict[str, str] = {}  # buffer ids
        # Of those, outputs of work that failed at dispatch: never made, not lost.
        self._unmade: set[str] = set()
        self._doomed: dict[str, str] = {}  # computation and call ids
        # Buffers another executor is pulling for an unfinished computation: a deletion waits
        # for them (the holder would otherwise free the bytes before the pull).
        self._pulling: dict[str, int] = {}  # buffer id -> computations still reading it
        self._deferred: dict[str, frozenset[int]] = {}  # deleted buffer id -> its holders
        # Buffers held by another island's executors: pulled from there, never deleted here.
        self._remote: dict[str, pb.InputSource] = {}
        # Of those, ones placed before they were made there: work reading them is held in the
        # queue until the client says they are (RemoteReady) or never will be (RemoteFailed).
        self._awaited: set[str] = set()
        # Said to be made before they were placed here (the two come by different paths).
        self._ready_early: set[str] = set()
        # Executors that pulled a copy of a buffer: a deletion frees their copies too.
        self._copies: dict[str, set[int]] = {}
        # Buffers clients uploaded to this island's executors: their holders have them at once.
        self._uploaded: set[str] = set()
        # Ids of computations and calls accepted and not finished: a second one of an id in
        # use was accepted, and its events could not be told from the first's (a call's
        # intermediates, ``<call id>/...``, also live on the executors meanwhile).
        self._unfinished: set[str] = set()
        self._connected: set[str] = set()  # clients with an open session
        # The devices a session's credential lets its work name (sessions without one: any).
        self._granted: dict[str, frozenset[int]] = {}
        # Each open session's number: work of an ended session may still be running when a
        # new one of the same name opens, and its outcome is not the new session's.
        self._session: dict[str, int] = {}
        self._sessions_opened = 0
        self.usage: dict[str, ClientUsage] = {}
        # Per program, per executor: each node's devices there (a call's device time).
        self._node_devices: dict[str, dict[int, tuple[int, ...]]] = {}

    # -- clients -----------------------------------------------------------------------------

    def connect(
        self,
        client: str,
        weight: int = 1,
        priority: int = 0,
        *,
        tenant: str | None = None,
        devices: frozenset[int] | None = None,
    ) -> list[Instruction]:
        """A client's session opens (or says hello again with a new weight or priority); it
        is told of executors already lost. ``tenant``: its sessions share the per-tenant
        bound on the queue (set when the session opens); ``devices``: the only ones its work
        may name (its credential's grant; None: any), replaced by each hello."""
        self.queue.add_client(client, max(1, weight), priority, tenant)
        if devices is None:
            self._granted.pop(client, None)
        else:
            self._granted[client] = devices
        if client not in self._connected:  # not a hello again within the session
            self._sessions_opened += 1
            self._session[client] = self._sessions_opened
        self._connected.add(client)
        self._touch(client)
        return [ToClient(client, self._lost_event(index)) for index in sorted(self._down)]

    def _touch(self, client: str) -> None:
        """Move a client's usage last: the usage of the session that ended longest ago goes
        first (its order is of sessions opened and ended, not of work: that is the hot path)."""
        usage = self.usage.pop(client, None)
        if usage is not None:
            self.usage[client] = usage

    def _usage(self, client: str) -> ClientUsage:
        usage = self.usage.get(client)
        if usage is None:
            if len(self.usage) >= MAX_USAGE_CLIENTS:
                ended = next((c for c in self.usage if c not in self._connected), None)
                self.usage.pop(ended if ended is not None else next(iter(self.usage)))
            usage = self.usage[client] = ClientUsage()
        return usage

    def _lost_event(self, index: int) -> Event:
        return Event(kind=Event.EXECUTOR_LOST, executor=index, message=self._down[index])

    def disconnect(self, client: str) -> list[Instruction]:
        """A client's session ends: its queued work is dropped and its buffers deleted."""
        self.queue.remove_client(client)
        self._connected.discard(client)
        self._granted.pop(client, None)
        self._session.pop(client, None)
        self._touch(client)
        self._held.pop(client, None)
        prefix = f"{client}/"
        self._deleting = {i for i in self._deleting if not i.startswith(prefix)}
        # Ids of its work still running stay taken until it finishes: a new session of the
        # same name reusing one would be told of the old one's outcome as its own.
        running = {f.id for f in self._in_flight.values() if f.client == client}
        self._unfinished = {i for i in self._unfinished if i in running or not i.startswith(prefix)}
        self._doomed = {i: why for i, why in self._doomed.items() if not i.startswith(prefix)}
        self._ready_early = {i for i in self._ready_early if not i.startswith(prefix)}
        gone = [buffer_id for buffer_id in self._buffers if buffer_id.startswith(prefix)]
        unused = []
        for identifier in self._uses.pop(client, set()):
            users = self._users[identifier]
            users.discard(client)
            if not users:
                del self._users[identifier]
                unused.append(identifier)
        return self._delete_now(gone) + self._forget(unused) + self._dispatch()

    @property
    def sessions(self) -> int:
        """Clients with an open session."""
        return len(self._connected)

    @property
    def in_flight(self) -> int:
        """Computations and calls dispatched and not finished."""
        return len(self._in_flight)

    @property
    def executors_lost(self) -> int:
        """Executors lost now (work on them is refused until they are taken back)."""
        return len(self._down)

    @property
    def executors_rejoined(self) -> int:
        """Lost executors taken back, restarted, so far."""
        return self._rejoined

    def lost_reason(self, index: int) -> str:
        """Why executor ``index`` was lost; empty if it was not."""
        return self._down.get(index, "")

    @property
    def functions_held(self) -> int:
        """Functions some open session uses."""
        return len(self._functions)

    @property
    def programs_held(self) -> int:
        """Programs some open session uses."""
        return len(self._programs)

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
            self._use(client, function.function_id)
        return [ToClient(client, event)]

    def placed(self, client: str, message: pb.PlacedBuffer) -> list[Instruction]:
        """The client uploaded a buffer to an executor (or in parts to several), or names one
        held on another island."""
        problem = self._owned(client, message.buffer_id, "buffer")
        remote = message.remote if message.HasField("remote") else None
        holders = frozenset(message.executors or (message.executor,))
        if problem is None and remote is not None and not remote.data_endpoints:
            problem = f"remote buffer {message.buffer_id!r} names no data endpoint to pull from"
        elif problem is None and remote is None and not holders <= self.executors.keys():
            problem = f"there is no executor {min(holders - self.executors.keys())}"
        if problem is None and message.buffer_id in self._buffers:
            problem = f"buffer {message.buffer_id!r} exists already"
        elif problem is None and message.buffer_id in self._deferred:
            problem = f"buffer {message.buffer_id!r} is still being deleted: use a new id"
        if problem is not None:
            return [ToClient(client, Event(kind=Event.REJECTED, message=problem))]
        if remote is not None:
            source = pb.InputSource()
            source.CopyFrom(remote)
            source.buffer_id = message.buffer_id
            source.pending = False  # (for this scheduler only: executors pull it when told)
            if remote.pending and message.buffer_id not in self._ready_early:
                self._awaited.add(message.buffer_id)
            self._ready_early.discard(message.buffer_id)
            self._remote[message.buffer_id] = source
            self._buffers[message.buffer_id] = frozenset()
        else:
            self._buffers[message.buffer_id] = holders
            self._uploaded.add(message.buffer_id)
            # Uploaded to an executor lost before this word came: gone with it.
            lost = next((self._down[h] for h in sorted(holders) if h in self._down), None)
            if lost is not None:
                self._gone[message.buffer_id] = lost
        return []

    def remote_failed(self, client: str, message: pb.RemoteFailed) -> list[Instruction]:
        """Buffers the client placed here from another island will never be (their
        producer failed there, or its executor or session is gone): work queued on them fails
        at dispatch, and executors pulling them stop now (outside the island order)."""
        ids = [
            buffer_id
            for buffer_id in dict.fromkeys(message.buffer_ids)
            if buffer_id.startswith(f"{client}/") and buffer_id in self._remote
        ]
        if not ids:
            return []
        for buffer_id in ids:
            self._gone.setdefault(buffer_id, message.reason)
        self._awaited.difference_update(ids)  # work held on them goes, and fails at dispatch
        failed = pb.RemoteFailed(buffer_ids=ids, reason=message.reason)
        return [
            ToExecutor(index, pb.ExecutorCommand(remote_failed=failed))
            for index in sorted(self.executors)
            if index not in self._down
        ] + self._dispatch()

    def remote_ready(self, client: str, message: pb.RemoteReady) -> list[Instruction]:
        """Buffers the client placed here from another island while pending there are made:
        work held on them may go."""
        for buffer_id in dict.fromkeys(message.buffer_ids):
            if not buffer_id.startswith(f"{client}/"):
                continue
            if buffer_id in self._awaited:
                self._awaited.discard(buffer_id)
            elif buffer_id not in self._remote and len(self._ready_early) < MAX_READY_EARLY:
                self._ready_early.add(buffer_id)
        return self._dispatch()

    def _prefetches(self, reads: Iterable[tuple[str, frozenset[int]]]) -> list[Instruction]:
        """Pulls, from now on, of what held work reads of another island that is not made
        yet (``reads``: each input and the executors that will read it), by those executors
        (the work waits in the queue meanwhile): the transfer overlaps the work before it, as
        it did when such work waited in order."""
        sources: dict[int, list[pb.InputSource]] = {}
        for buffer_id, readers in reads:
            if buffer_id not in self._awaited:
                continue
            copies = self._copies.setdefault(buffer_id, set())  # a deletion frees them
            for executor in sorted(readers - self._down.keys() - copies):
                copies.add(executor)
                sources.setdefault(executor, []).append(self._remote[buffer_id])
        return [
            ToExecutor(executor, pb.ExecutorCommand(prefetch=pb.Prefetch(sources=pulled)))
            for executor, pulled in sorted(sources.items())
        ]

    def _awaits_remote(self, item: pb.Computation | _Call | _Delete) -> bool:
        """Whether ``item`` reads a buffer of another island not made there yet."""
        if isinstance(item, _Delete):
            return False
        inputs = item.call.arguments if isinstance(item, _Call) else item.inputs
        return any(buffer_id in self._awaited for buffer_id in inputs)

    def submit(self, client: str, computation: pb.Computation) -> list[Instruction]:
        """Validate a computation and queue it; dispatch whatever may go now."""
        problem = self._check(client, computation) or self._enqueue(client, computation)
        if problem is not None:
            self._usage(client).refused += 1
            return [_rejected(client, computation.id, problem)]
        self._unfinished.add(computation.id)
        self._use(client, computation.function_id)
        # Outputs exist from now on (as futures): later computations may consume them.
        owners = frozenset(self.device_owner[d] for d in computation.devices)
        for buffer_id in computation.outputs:
            self._buffers[buffer_id] = owners
        if self._awaited:  # (nothing of another island is awaited, mostly: no walk)
            reads = ((buffer_id, owners) for buffer_id in computation.inputs)
            return self._prefetches(reads) + self._dispatch()
        return self._dispatch()

    def _enqueue(self, client: str, item: pb.Computation | _Call) -> str | None:
        """Queue work; why it was refused (the island's queue is full), if it was."""
        try:
            self.queue.submit(client, item)  # work: priced when taken (``_price``)
        except QueueFull as full:
            return busy_message(
                self.island, client, full.queued, full.limit, full.per_client, full.tenant
            )
        return None

    def register_program(
        self, client: str, registration: pb.ProgramRegistration
    ) -> list[Instruction]:
        """Check a program and keep it: its calls are then one message each."""
        program_id = registration.program_id
        known = self._programs.get(program_id)
        program = known or check_program(registration, self._functions, self.device_owner)
        problem = (
            program
            if isinstance(program, str)
            else self._ungranted(client, program.device_set, f"program {program.name!r}")
        )
        if problem is not None:
            event = Event(kind=Event.REJECTED, program_id=program_id[:64], message=problem)
            return [ToClient(client, event)]
        assert not isinstance(program, str)
        if known is None:
            self._programs[program_id] = program
            self._node_devices[program_id] = {
                executor: tuple(
                    sum(self.device_owner[d] == executor for d in node.devices)
                    for node in registration.nodes
                )
                for executor in program.executors
            }
        self._use(client, program_id, program.function_ids)
        return [ToClient(client, Event(kind=Event.REGISTERED, program_id=program_id))]

    def call(self, client: str, call: pb.ProgramCall) -> list[Instruction]:
        """Validate a call of a registered program and queue it as one item; dispatch
        whatever may go now."""
        program = self._programs.get(call.program_id)
        problem = self._call_problem(client, call, program)
        if problem is None:
            assert program is not None
            problem = self._enqueue(client, _Call(call, program))
        if problem is not None:
            self._usage(client).refused += 1
            return [_rejected(client, call.id, problem)]
        assert program is not None
        self._unfinished.add(call.id)
        self._use(client, call.program_id, program.function_ids)
        for buffer_id, owners in zip(call.results, program.result_owners(), strict=True):
            self._buffers[buffer_id] = owners
        if self._awaited:
            reads = zip(call.arguments, program.argument_readers, strict=True)
            return self._prefetches(reads) + self._dispatch()
        return self._dispatch()

    def delete(self, client: str, ids: Sequence[str]) -> list[Instruction]:
        """Delete buffers once the client's computations queued before have been dispatched
        (another client's are refused, the rest go ahead)."""
        prefix = f"{client}/"
        mine: list[str] = []
        foreign: list[str] = []
        for i in dict.fromkeys(ids):
            if not i.startswith(prefix):
                foreign.append(i)
            elif i in self._buffers and i not in self._deleting:
                mine.append(i)
        refused = [_foreign_delete(client, foreign)] if foreign else []
        if not mine:
            return refused
        self._deleting.update(mine)
        last = self.queue.last(client)
        if isinstance(last, _Delete):
            # Nothing of the client's was queued since: the waiting deletion takes these too.
            last.ids.extend(mine)
            return refused
        # Never refused (refusing would leak the buffers): bounded by the computations queued.
        self.queue.submit(client, _Delete(mine), cost=0.0, bounded=False)
        return refused + self._dispatch()

    # -- executors ---------------------------------------------------------------------------

    def executor_event(self, event: pb.ExecutorEvent) -> list[Instruction]:
        """An executor finished (or failed) its part of a computation."""
        flight = self._in_flight.get(event.seq)
        if flight is None:
            return []  # a registration's failure, or a computation already failed
        device_ns = 0
        if isinstance(flight.item, _Call):
            if event.node_indices:  # a call refused before any node ran has none to trace
                self._keep((event, flight.client, flight.item), len(event.node_indices))
            program_id = flight.item.call.program_id
            devices = self._node_devices.get(program_id, {}).get(event.executor, ())
            for index, start_ns, end_ns in zip(
                event.node_indices, event.node_starts_ns, event.node_ends_ns, strict=False
            ):
                if index < len(devices):
                    device_ns += max(0, end_ns - start_ns) * devices[index]
        else:
            record = self._trace_record(
                event.seq,
                flight.client,
                flight.item,
                event.executor,
                event.start_ns,
                event.end_ns,
                event.ok,
            )
            self._keep(record, 1)
            device_ns = max(0, record.end_ns - record.start_ns) * len(record.devices)
        flight.usage.device_ns += device_ns
        flight.device_ns += device_ns
        flight.waiting.discard(event.executor)
        if not event.ok:
            flight.errors.append(event.message)
        if flight.waiting:
            return []
        return self._finish(event.seq) + self._dispatch()

    def executor_lost(self, index: int, reason: str) -> list[Instruction]:
        """An executor is unreachable: its computations fail now, and later ones touching its
        devices are refused, while the rest of the island keeps serving."""
        if index in self._down:
            return []
        spec = self.executors[index]
        message = f"executor {index} ({spec.endpoint}) is unreachable: {reason}"
        self._down[index] = message
        # The others stop reading its buffers now: a read from a silent holder waited
        # minutes, holding up everything after it on the reader's devices.
        instructions: list[Instruction] = [
            ToExecutor(other.index, self._peer_down(index, message))
            for other in self.executors.values()
            if other.index not in self._down and spec.data_endpoint
        ]
        # Clients stop uploading to it and reading from it directly (they waited 120 s).
        instructions += [ToClient(c, self._lost_event(index)) for c in sorted(self._connected)]
        for seq, flight in list(self._in_flight.items()):
            if index in flight.waiting:
                # Failed now, even if other executors have yet to report: spanning the lost
                # one, their part cannot end well (a collective waits for it until JAX gives
                # up on the group, ~100 s). Their later reports are ignored.
                flight.errors.append(message)
                instructions += self._finish(seq)
        # What it held is gone, and the work queued to run on it fails when its turn comes,
        # even if a restarted executor is taken back by then (clearer than a read that waits).
        for buffer_id, holders in self._buffers.items():
            if index in holders:
                self._gone.setdefault(buffer_id, message)
        for _, item in self.queue.waiting():
            if isinstance(item, _Call) and index in item.program.executors:
                self._doomed.setdefault(item.call.id, message)
            elif isinstance(item, pb.Computation) and any(
                self.device_owner[d] == index for d in item.devices
            ):
                self._doomed.setdefault(item.id, message)
        return instructions + self._dispatch()

    def _peer_down(self, index: int, message: str) -> pb.ExecutorCommand:
        spec = self.executors[index]
        down = pb.PeerDown(executor=index, data_endpoint=spec.data_endpoint, reason=message)
        return pb.ExecutorCommand(peer_down=down)

    def rejoin_problem(self, spec: ExecutorSpec) -> str | None:
        """Why a restarted executor cannot be taken back in the place of a lost one, if it
        cannot: it must be lost, and own the same devices."""
        old = self.executors.get(spec.index)
        if old is None or spec.index not in self._down:
            return f"executor {spec.index} is not a lost executor of island {self.island!r}"
        if tuple(spec.devices) != tuple(old.devices):
            return (
                f"executor {spec.index} now owns devices {list(spec.devices)}, not "
                f"{list(old.devices)} as before: it was started with other flags"
            )
        return None

    def executor_rejoined(self, spec: ExecutorSpec) -> list[Instruction]:
        """A lost executor, restarted, is taken back in its place (its endpoints may have
        changed; see ``rejoin_problem``): work may run on it again, and the other executors and
        the clients may read from it. What the lost one held stays gone; functions and programs
        are sent to it again before their next use there."""
        problem = self.rejoin_problem(spec)
        if problem is not None:
            raise ValueError(problem)
        index = spec.index
        del self._down[index]
        self.executors[index] = spec
        self._rejoined += 1
        # Programs spanning it are registered again everywhere: the others' plans pull their
        # intermediates from its data endpoint, which the restart changed.
        spanning = {pid for pid, program in self._programs.items() if index in program.executors}
        self._registered = {
            (identifier, executor)
            for identifier, executor in self._registered
            if executor != index and identifier not in spanning
        }
        for held in (self._buffers, self._deferred):
            for buffer_id, holders in held.items():
                if index in holders:
                    held[buffer_id] = holders - {index}
        for copies in self._copies.values():
            copies.discard(index)
        info = pb.ExecutorInfo(
            index=index,
            endpoint=spec.endpoint,
            devices=spec.devices,
            data_endpoint=spec.data_endpoint,
        )
        instructions: list[Instruction] = [
            ToExecutor(
                other,
                pb.ExecutorCommand(
                    peer_up=pb.PeerUp(executor=index, data_endpoint=spec.data_endpoint)
                ),
            )
            for other in self.executors
            if other != index and other not in self._down and spec.data_endpoint
        ]
        # It learns of the others still lost, as they were told of its loss.
        instructions += [
            ToExecutor(index, self._peer_down(other, message))
            for other, message in sorted(self._down.items())
            if self.executors[other].data_endpoint
        ]
        rejoined = Event(kind=Event.EXECUTOR_REJOINED, executor=index, rejoined=info)
        instructions += [ToClient(c, rejoined) for c in sorted(self._connected)]
        return instructions + self._dispatch()

    # -- internals ---------------------------------------------------------------------------

    def _ungranted(self, client: str, devices: Iterable[int], label: str) -> str | None:
        """Why ``label`` may not name ``devices`` in ``client``'s session (its credential
        grants it others only), or None."""
        granted = self._granted.get(client)
        if granted is None:
            return None
        outside = sorted(set(devices) - granted)
        if not outside:
            return None
        return (
            f"{label} names devices {outside[:16]} this session's credential does not grant "
            f"(it grants {sorted(granted)[:64]}): bind a slice holding them first"
        )

    def _owned(self, client: str, identifier: str, what: str) -> str | None:
        if not identifier.startswith(f"{client}/"):
            return f"{what} id {identifier!r} must start with the client name {client + '/'!r}"
        return None

    def _check(self, client: str, computation: pb.Computation) -> str | None:
        label = computation.name or computation.id
        problem = self._owned(client, computation.id, "computation")
        if problem:
            return problem
        if computation.id in self._unfinished:
            return f"computation {label!r}: id {computation.id!r} is taken by work not yet finished"
        if computation.function_id not in self._functions:
            return (
                f"computation {label!r} calls function {computation.function_id[:12]!r}, "
                f"which is not registered: {REGISTER_IN_SESSION}"
            )
        devices = list(computation.devices)
        problem = slice_problem(f"computation {label!r}", devices, self.device_owner)
        if problem:
            return problem
        if self._granted:
            problem = self._ungranted(client, devices, f"computation {label!r}")
            if problem:
                return problem
        down = [self._down[i] for i in {self.device_owner[d] for d in devices} if i in self._down]
        if down:
            return f"computation {label!r} cannot run: {down[0]}"
        prefix = f"{client}/"
        for buffer_id in computation.inputs:
            problem = self._input_problem(prefix, buffer_id, "computation")
            if problem:
                return f"computation {label!r} reads {problem}"
        return self._outputs_problem(client, f"computation {label!r}", computation.outputs)

    def _input_problem(self, prefix: str, buffer_id: str, kind: str) -> str | None:
        """What is wrong with ``kind`` of work reading a buffer (another client's, unknown,
        lost with an executor, or never to be made), if anything. Only the client's own: the
        queue keeps order within a client alone, so another's could be read before it is made
        or after it was deleted."""
        if not buffer_id.startswith(prefix):
            owner, slash, _ = buffer_id.partition("/")
            whose = f"belongs to client {owner!r}" if slash else "is no client's"
            return (
                f"buffer {buffer_id!r}, which {whose}: a {kind} reads only its own session's "
                f"buffers (ids starting with {prefix!r}); get the value and put it in this "
                "session to use it here"
            )
        if buffer_id not in self._buffers:
            return f"unknown buffer {buffer_id!r}"
        if buffer_id in self._gone:
            return f"buffer {buffer_id!r}, which {self._gone_phrase(buffer_id)}"
        return None

    def _gone_phrase(self, buffer_id: str) -> str:
        """Why a buffer in ``_gone`` cannot be read, as said of it."""
        why = self._gone[buffer_id]
        return f"will never be made: {why}" if buffer_id in self._unmade else f"was lost: {why}"

    def _outputs_problem(
        self, client: str, label: str, outputs: Sequence[str], scope: str = ""
    ) -> str | None:
        """What is wrong with the buffer ids a computation or call writes, if anything (a
        call's own intermediates are ``<scope>/...``)."""
        for buffer_id in outputs:
            problem = self._owned(client, buffer_id, "buffer")
            if problem:
                return problem
            if buffer_id in self._buffers or (scope and buffer_id.startswith(f"{scope}/")):
                return f"{label} writes buffer {buffer_id!r}, which exists already"
            if buffer_id in self._deferred:
                return (
                    f"{label} writes buffer {buffer_id!r}, which is still being deleted "
                    "(another executor is reading it): use a new id"
                )
        if len(set(outputs)) != len(outputs):
            return f"{label} names an output twice"
        return None

    def _call_problem(
        self, client: str, call: pb.ProgramCall, program: Program | None
    ) -> str | None:
        problem = self._owned(client, call.id, "call")
        if problem:
            return problem
        if program is None:
            return (
                f"call {call.id!r} names program {call.program_id[:12]!r}, which is not "
                f"registered: {REGISTER_IN_SESSION}"
            )
        registration = program.registration
        label = f"call {call.id!r} of program {program.name!r}"
        if len(call.arguments) != len(registration.arguments):
            return (
                f"{label} passes {len(call.arguments)} argument(s); the program takes "
                f"{len(registration.arguments)}"
            )
        if len(call.results) != len(registration.results):
            return (
                f"{label} names {len(call.results)} result(s); the program has "
                f"{len(registration.results)}"
            )
        down = [self._down[i] for i in program.executors if i in self._down]
        if down:
            return f"{label} cannot run: {down[0]}"
        if self._granted:
            problem = self._ungranted(client, program.device_set, label)
            if problem:
                return problem
        prefix = f"{client}/"
        for buffer_id in call.arguments:
            problem = self._input_problem(prefix, buffer_id, "program call")
            if problem:
                return f"{label} reads {problem}"
        if call.id in self._unfinished:
            return f"{label}: id {call.id!r} is taken by work not yet finished"
        for names in program.shared.values():
            for name in names:
                taken = intermediate_id(call.id, name)
                if taken in self._buffers or taken in self._deferred:
                    return (
                        f"{label} would keep its intermediate {name!r} as buffer {taken!r}, "
                        "which exists already: use a call id no buffer id starts with"
                    )
        return self._outputs_problem(client, label, call.results, scope=call.id)

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _dispatch(self) -> list[Instruction]:
        instructions: list[Instruction] = []
        while True:
            # At the bound on work in flight, only a free item (a deletion) behind the
            # computation just taken still goes, with it; ``next`` takes those first anyway.
            at_bound = len(self._in_flight) >= self.max_in_flight
            if at_bound:
                taken = self.queue.next_free()
            else:
                taken = self.queue.next(self._awaits_remote if self._awaited else None)
            if taken is None:
                break
            client, item = taken
            if isinstance(item, _Delete):
                self._deleting.difference_update(item.ids)
                instructions += self._delete_now(list(item.ids))
            elif isinstance(item, _Call):
                instructions += self._run_call(client, item)
            else:
                instructions += self._run(client, item)
        return instructions

    def _run(self, client: str, computation: pb.Computation) -> list[Instruction]:
        owners = sorted({self.device_owner[d] for d in computation.devices})
        label = f"computation {computation.name or computation.id!r}"
        failed = self._failed_on_dispatch(
            client, computation.id, label, owners, computation.inputs, computation.outputs
        )
        if failed is not None:
            self._unfinished.discard(computation.id)
            return [failed]
        instructions: list[Instruction] = []
        for executor in owners:
            instructions += self._register_on(executor, [computation.function_id])
        command_seq = self._next_seq()
        flight = _InFlight(
            client, computation, set(owners), self._usage(client), self._session.get(client, 0)
        )
        for executor in owners:
            command = pb.ExecutorCommand(seq=command_seq, run=computation)
            for buffer_id in computation.inputs:
                self._source(flight, command, buffer_id, executor, frozenset(owners))
            instructions.append(ToExecutor(executor, command))
        self._in_flight[command_seq] = flight
        self._running[client] = self._running.get(client, 0) + 1
        return instructions

    def _run_call(self, client: str, item: _Call) -> list[Instruction]:
        call, program = item.call, item.program
        label = f"call {call.id!r} of program {program.name!r}"
        failed = self._failed_on_dispatch(
            client, call.id, label, program.executors, call.arguments, call.results
        )
        if failed is not None:
            self._unfinished.discard(call.id)
            return [failed]
        instructions: list[Instruction] = []
        for executor in program.executors:
            instructions += self._register_on(executor, program.functions_on(executor))
            if (program.registration.program_id, executor) not in self._registered:
                self._registered.add((program.registration.program_id, executor))
                registration = self._program_registration(program, executor)
                command = pb.ExecutorCommand(seq=self._next_seq(), program=registration)
                instructions.append(ToExecutor(executor, command))
        command_seq = self._next_seq()
        flight = _InFlight(
            client, item, set(program.executors), self._usage(client), self._session.get(client, 0)
        )
        for executor in program.executors:
            command = pb.ExecutorCommand(seq=command_seq, call=call)
            for position, readers in enumerate(program.argument_readers):
                if executor in readers:
                    spans = program.argument_spans[position][executor]
                    self._source(flight, command, call.arguments[position], executor, spans)
            instructions.append(ToExecutor(executor, command))
        for position, name in enumerate(program.registration.results):
            result_id = call.results[position]
            copies = program.result_copies.get(name)
            if copies:
                self._copies.setdefault(result_id, set()).update(copies)
            if name in program.results_read_across:
                # Its client may delete it before the call's reader has pulled it.
                flight.pulls.add(result_id)
                self._pulling[result_id] = self._pulling.get(result_id, 0) + 1
        self._in_flight[command_seq] = flight
        self._running[client] = self._running.get(client, 0) + 1
        return instructions

    def _failed_on_dispatch(
        self,
        client: str,
        item_id: str,
        label: str,
        owners: Sequence[int],
        inputs: Sequence[str],
        outputs: Sequence[str],
    ) -> ToClient | None:
        """The failure of work whose executors (or whose inputs' holders) were lost while it
        was queued, if they were (it takes its place in the order all the same); its
        ``outputs`` are then marked never to be made."""
        seq = self._next_seq()
        why = self._doomed.pop(item_id, None)
        if why is None:
            why = next((self._down[i] for i in owners if i in self._down), None)
        lost = None
        if why is None and self._gone:
            lost = next((b for b in inputs if b in self._gone), None)
            if lost is not None:
                why = f"its input {lost!r} {self._gone_phrase(lost)}"
        if why is None:
            return None
        message = f"{label}: {why}"
        # No executor heard of its outputs: their readers fail at dispatch (or are refused)
        # naming the first work that failed, rather than wait for them on an executor. Down a
        # chain that cause is passed on as it is, so messages do not grow with the chain; an
        # output already lost with its executor stays lost.
        unmade = self._gone[lost] if lost in self._unmade else f"{label} failed: {why}"
        for buffer_id in outputs:
            if buffer_id not in self._gone:
                self._gone[buffer_id] = unmade
                self._unmade.add(buffer_id)
        return ToClient(
            client,
            Event(kind=Event.FAILED, computation_id=item_id, seq=seq, message=message, unmade=True),
        )

    def _register_on(self, executor: int, function_ids: Sequence[str]) -> list[Instruction]:
        """Registrations of the functions ``executor`` has not been sent yet."""
        instructions: list[Instruction] = []
        for function_id in function_ids:
            if (function_id, executor) not in self._registered:
                self._registered.add((function_id, executor))
                register = pb.ExecutorCommand(
                    seq=self._next_seq(), register=self._functions[function_id]
                )
                instructions.append(ToExecutor(executor, register))
        return instructions

    def _source(
        self,
        flight: _InFlight,
        command: pb.ExecutorCommand,
        buffer_id: str,
        executor: int,
        readers: frozenset[int] | None = None,
    ) -> None:
        """Where ``executor`` pulls an input it does not hold from, added to ``command``;
        also one it holds only in part: an output of a slice spanning hosts read by a
        computation on fewer of them (``readers``), which cannot reshard an array it does
        not hold whole."""
        holders = self._buffers.get(buffer_id, frozenset())
        partial = executor in holders
        if partial and (readers is None or len(holders) == 1 or holders <= readers):
            return
        if buffer_id not in flight.pulls:
            flight.pulls.add(buffer_id)
            self._pulling[buffer_id] = self._pulling.get(buffer_id, 0) + 1
        remote = self._remote.get(buffer_id)
        if remote is not None:
            self._copies.setdefault(buffer_id, set()).add(executor)
            command.sources.append(remote)
            return
        source = self._held_by(buffer_id, holders)
        if partial:  # the executor's delete of the buffer frees the whole with it
            source.partial = True
        else:
            self._copies.setdefault(buffer_id, set()).add(executor)
        command.sources.append(source)

    def _held_by(self, buffer_id: str, holders: frozenset[int] | set[int]) -> pb.InputSource:
        specs = [self.executors[h] for h in sorted(holders)]
        return pb.InputSource(
            buffer_id=buffer_id,
            executors=[spec.endpoint for spec in specs],
            data_endpoints=[spec.data_endpoint for spec in specs if spec.data_endpoint],
            uploaded=buffer_id in self._uploaded,
        )

    def _program_registration(self, program: Program, executor: int) -> pb.ProgramRegistration:
        """The registration ``executor`` gets: the program, and where each intermediate it
        pulls from other executors comes from."""
        registration = pb.ProgramRegistration()
        registration.CopyFrom(program.registration)
        for name, holders in sorted(program.pulls.get(executor, {}).items()):
            registration.sources.append(self._held_by(name, holders))
        for name, holders in sorted(program.wholes.get(executor, {}).items()):
            source = self._held_by(name, holders)
            source.partial = True
            registration.sources.append(source)
        return registration

    def _use(self, client: str, identifier: str, also: Sequence[str] = ()) -> None:
        """``client``'s session uses a function or program (and, for a program, ``also`` its
        functions): kept until the last session using it ends."""
        uses = self._uses.setdefault(client, set())
        if identifier in uses:
            return
        for used in (identifier, *also):
            if used not in uses:
                uses.add(used)
                self._users.setdefault(used, set()).add(client)

    def _forget(self, ids: list[str]) -> list[Instruction]:
        """Drop functions and programs no open session uses, here and on every executor
        that was sent them (after every command that used them: the island order)."""
        by_executor: dict[int, list[pb.Forget]] = {}
        for identifier in sorted(ids):
            is_program = self._programs.pop(identifier, None) is not None
            self._node_devices.pop(identifier, None)
            self._functions.pop(identifier, None)
            self.costs.forget(identifier)
            for executor in self.executors:
                if (identifier, executor) in self._registered:
                    self._registered.discard((identifier, executor))
                    pieces = by_executor.setdefault(executor, [pb.Forget()])
                    if len(pieces[-1].function_ids) + len(pieces[-1].program_ids) >= FORGET_PIECE:
                        pieces.append(pb.Forget())  # commands stay well inside a frame
                    kind = pieces[-1].program_ids if is_program else pieces[-1].function_ids
                    kind.append(identifier)
        return [
            ToExecutor(executor, pb.ExecutorCommand(seq=self._next_seq(), forget=piece))
            for executor, pieces in sorted(by_executor.items())
            if executor not in self._down
            for piece in pieces
        ]

    def _delete_now(self, ids: list[str]) -> list[Instruction]:
        by_executor: dict[int, list[str]] = {}
        for buffer_id in ids:
            holders = self._buffers.pop(buffer_id, frozenset())
            holders |= self._copies.pop(buffer_id, set())
            self._gone.pop(buffer_id, None)
            self._unmade.discard(buffer_id)
            self._uploaded.discard(buffer_id)
            self._remote.pop(buffer_id, None)
            self._awaited.discard(buffer_id)
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
        if self._running[flight.client] == 1:
            del self._running[flight.client]
        else:
            self._running[flight.client] -= 1
        released: dict[int, list[str]] = {}
        for buffer_id in flight.pulls:
            self._pulling[buffer_id] -= 1
            if self._pulling[buffer_id] == 0:
                del self._pulling[buffer_id]
                for executor in self._deferred.pop(buffer_id, frozenset()):
                    released.setdefault(executor, []).append(buffer_id)
        self._unfinished.discard(flight.id)
        if not flight.errors:
            self._measured(flight)
        if isinstance(flight.item, _Call):
            call, program = flight.item.call, flight.item.program
            for executor, names in program.shared.items():
                released.setdefault(executor, []).extend(
                    intermediate_id(call.id, name) for name in names
                )
        return [*self._delete_commands(released), *self._outcome(seq, flight)]

    def _price(self, item: pb.Computation | _Call | _Delete) -> float:
        """What work costs now under proportional share: its function's (or program's)
        measured device time."""
        if isinstance(item, _Call):
            return self.costs.cost(item.call.program_id, item.program.devices)
        if isinstance(item, _Delete):
            return 0.0
        return self.costs.cost(item.function_id, len(item.devices))

    def _measured(self, flight: _InFlight) -> None:
        """What work of the flight's function or program costs from now on."""
        item = flight.item
        if isinstance(item, _Call):
            self.costs.measured(item.call.program_id, item.program.devices, flight.device_ns)
        else:
            self.costs.measured(item.function_id, len(item.devices), flight.device_ns)

    def _outcome(self, seq: int, flight: _InFlight) -> list[ToClient]:
        """The client's event of finished work: none if a new session of the client's name
        opened since it was submitted (that session did not submit it)."""
        usage = flight.usage
        if flight.errors:
            usage.failed += 1
        else:
            usage.completed += 1
        client = flight.client
        session = self._session.get(client)
        if session is not None and session != flight.session:
            return []
        if flight.errors:
            event = Event(
                kind=Event.FAILED,
                computation_id=flight.id,
                seq=seq,
                message=_joined(flight.errors),
            )
        else:
            event = Event(kind=Event.COMPLETED, computation_id=flight.id, seq=seq)
        held = self._held.get(client, 0)
        deferrable = (
            not flight.errors
            and held < MAX_HELD_COMPLETIONS
            and self._running.get(client, 0) + self.queue.queued_by(client) >= HOLD_WHILE_PENDING
        )
        if deferrable:
            self._held[client] = held + 1
        else:  # also a session ended meanwhile: nothing kept of it
            self._held.pop(client, None)
        return [ToClient(client, event, deferrable)]

    @property
    def trace(self) -> list[TraceRecord]:
        """For every computation (and program node) on every executor, in the order their
        executors reported them: which client's work occupied which devices when (about
        ``trace_limit`` records in all, a client holding the most losing its oldest first:
        see :mod:`pathways_core.scheduling.trace`)."""
        return self.records_of(self.trace_entries())

    def trace_entries(self, clients: Collection[str] = ()) -> Snapshot[TraceEntry]:
        """What the trace holds now (of ``clients`` only, if any): its records, and the
        reported calls whose node records ``records_of`` makes. Taken under the lock dispatch
        holds, made into records outside it: making them is the slow part (seconds for a few
        hundred thousand)."""
        return self._trace.snapshot(clients)

    def trace_dropped_until_ns(self) -> Mapping[str, int]:
        """Per client whose oldest records the trace let go: the end of the latest of them."""
        return self._trace.dropped_until_ns()

    def records_of(self, entries: Snapshot[TraceEntry]) -> list[TraceRecord]:
        """The trace records ``entries`` (from ``trace_entries``) stand for, in order."""
        records: list[TraceRecord] = []
        for entry in in_order(entries):
            if isinstance(entry, TraceRecord):
                records.append(entry)
            else:
                records.extend(self._node_records(*entry))
        return records

    def _node_records(self, event: pb.ExecutorEvent, client: str, item: _Call) -> list[TraceRecord]:
        """A reported call's nodes on its executor, each its own trace record (id
        ``<call id>/<node id>``, its node's name), ok unless it failed on the devices."""
        nodes = item.program.registration.nodes
        records = []
        failed = set(event.node_failed)
        # Three arrays of one length, from an executor (not strict: a shorter one would only
        # cut the records short, not stop the island).
        for index, start_ns, end_ns in zip(
            event.node_indices, event.node_starts_ns, event.node_ends_ns, strict=False
        ):
            node = nodes[index]
            records.append(
                self._trace_record(
                    event.seq,
                    client,
                    node,
                    event.executor,
                    start_ns,
                    end_ns,
                    index not in failed,
                    computation_id=intermediate_id(item.call.id, node.id),
                    name=node.name or node.id,
                )
            )
        return records

    def _keep(self, entry: TraceEntry, size: int) -> None:
        """Add to the trace what stands for ``size`` records (see :class:`IslandTrace`)."""
        if isinstance(entry, TraceRecord):
            self._trace.keep(entry.client, entry, size, entry.end_ns)
        else:
            event, client, _ = entry
            self._trace.keep(client, entry, size, max(event.node_ends_ns, default=0))

    def _trace_record(
        self,
        seq: int,
        client: str,
        computation: pb.Computation,
        executor: int,
        start_ns: int,
        end_ns: int,
        ok: bool,
        *,
        computation_id: str = "",
        name: str = "",
    ) -> TraceRecord:
        devices = tuple(d for d in computation.devices if self.device_owner[d] == executor)
        return TraceRecord(
            seq,
            computation_id or computation.id,
            client,
            name or computation.name,
            devices,
            executor,
            start_ns,
            end_ns,
            ok,
        )


def _rejected(client: str, item_id: str, problem: str) -> ToClient:
    return ToClient(client, Event(kind=Event.REJECTED, computation_id=item_id, message=problem))


def _foreign_delete(client: str, ids: Sequence[str]) -> ToClient:
    """The refusal of a deletion of buffers not the client's (the rest of it goes ahead)."""
    first = ids[0]
    owner, slash, _ = first.partition("/")
    whose = f"client {owner!r}" if slash else "no client"
    more = f" (and {len(ids) - 1} more not this session's)" if len(ids) > 1 else ""
    message = (
        f"deleting buffer {first!r}{more} refused: it belongs to {whose}; a session deletes "
        f"only its own buffers (ids starting with {client + '/'!r}): delete it in the session "
        "that made it"
    )
    return ToClient(client, Event(kind=Event.REJECTED, message=message))


def _joined(errors: list[str]) -> str:
    """The executors' failures of one piece of work, each once: one that another carries (a
    failure passed on downstream names its first cause) is not said again."""
    distinct = list(dict.fromkeys(errors))
    return "; ".join(e for e in distinct if not any(e in other for other in distinct if other != e))
