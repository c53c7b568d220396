"""The executor's engine: runs the island scheduler's commands strictly in order.

Commands arrive in island order. Registrations load artifacts; runs resolve their inputs (local
buffers, or buffers pulled from other executors, started as soon as the command arrives so
transfers overlap earlier work), dispatch the compiled function asynchronously (JAX returns
future arrays at once), and hand the computation to a completion thread that reports when the
devices finished it (by its token: a scalar output ready exactly then, so that a later
computation may take its other outputs over meanwhile). A failure fails the computation's
outputs, so consumers fail fast with the cause, and the executor keeps going; a computation
spanning hosts that fails on one before its launch is launched there all the same, on zeros
(its collectives need every host).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable as Fn
from collections.abc import Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import jax
import numpy as np
from jax._src import core, dtypes
from jax._src.interpreters import pxla
from jax._src.lib import xla_client as xc
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

from pathways_core.wire import pb
from pathways_executor.arrays import HostShards
from pathways_executor.artifact_check import ArtifactChecker
from pathways_executor.buffers import (
    PENDING,
    UPSTREAM,
    BufferError,
    BufferStore,
    root_cause,
    unknown,
)
from pathways_executor.functions import Callable, FunctionCache, FunctionError, check_inputs
from pathways_executor.programs import Plan, Source, Step, output_id, plan

log = logging.getLogger(__name__)

# How long one pull of an input waits at its holder before asking again (see Puller.pull).
INPUT_TIMEOUT_SECONDS = 120.0
# Multi-device computations dispatched to the devices and not finished. On small CPU hosts,
# more than a few collectives queued at once deadlock XLA's in-process rendezvous and gloo alike
# (seen with plain JAX too), so an executor never runs further ahead of its devices than this.
# At the bound it waits for its oldest computations until RESUME_AT are left, holding of each
# only what tells it is done (its token; a function without one, its outputs): the devices
# never run dry, and the runner wakes once per few computations. Waiting for all of them, as a
# JAX loop blocking every few steps does, cost -C on two hosts at 16 floats ~15% of its steps
# per second (its devices ran dry at each wait).
MAX_OUTSTANDING = 8
RESUME_AT = 4
# How the runtime launches a multi-device computation on this host's devices (see
# ``_launch_path``): on the caller's thread when one device here takes part, else on each
# device's launch thread.
ONE_HERE = "one device here"
SEVERAL_HERE = "several devices here"
# Completions held while more work is in hand go out at the latest this long after the first
# of them finished, or once this many are held.
LINGER_SECONDS = 0.002
MAX_HELD = 256
# Compiled functions an executor holds at most (one for each function and device set run here
# lately): ~1.5 MiB each for the smallest on CPU. One dropped is compiled again at its next run.
MAX_EXECUTABLES = 256
# Dispatched computations are handed to the completion thread together: woken once per
# computation, it took the interpreter from the runner as often (the engine alone ran a 16-stage
# chain of trivial stages in 1.7-2.0 ms with it, 1.4-1.5 ms handing over per batch).
HAND_OVER_EVERY = 32
_IDLE: Any = object()  # the runner ran out of work
_REPLACED: Any = object()  # in the command queue: the scheduler was replaced
# Device sets reported apart (one completion thread each, see ``Runner._lane``); the
# computations of any others share the executor-wide lane.
MAX_LANES = 16
EXECUTED_KEPT = 10_000
# The store's key of the whole of a buffer this executor holds in part (see ``partial`` in
# ``pb.InputSource``): no client's id starts with it.
WHOLE = "\x00whole/"
# Outputs of computations that failed on the devices, remembered to name the first failure
# when a computation reading one fails in turn (the devices pass the error on).
FAILED_KEPT = 4096


def _donatable(
    computation: pb.Computation,
    function: Callable,
    values: list[Any],
    arguments: list[Any],
    last_uses: set[str],
    watched: set[str],
) -> tuple[int, ...]:
    """Positions of the inputs this computation may take over: their last use, read once,
    passed as stored (not a copy), of an output's shape, dtype and sharding, and not an output
    the completion thread may still wait for (``watched``: its wait would fail)."""
    if not last_uses or not function.donatable:
        return ()
    inputs = list(computation.inputs)
    return tuple(
        sorted(
            position
            for position in function.donatable
            if inputs[position] in last_uses
            and inputs[position] not in watched
            and inputs.count(inputs[position]) == 1
            and arguments[position] is values[position]  # a device array, laid out as expected
        )
    )


def _launch_path(devices: Sequence[jax.Device]) -> str | None:
    """How the runtime launches a computation on ``devices`` here, None for one device (no
    collective). The two paths order launches apart: a collective launched on one device
    here could overtake one launched on several, which other hosts launched in the
    commands' order, and both hung waiting for each other (see ``Runner._bound_outstanding``)."""
    if len(devices) <= 1:
        return None
    process = jax.process_index()
    here = sum(1 for device in devices if device.process_index == process)
    return ONE_HERE if here == 1 else SEVERAL_HERE


def place(
    value: Any, sharding: jax.sharding.Sharding, alone: Fn[[], None] | None = None
) -> jax.Array:
    """An input laid out as the function expects. On a slice spanning hosts the result is a
    global array of which this process supplies its own shards; every executor of the slice
    runs the same command, so collective resharding happens in the same order everywhere.
    Such resharding is launched whichever way its devices say (see ``_launch_path``): with
    ``alone``, called first (to wait for the collectives in flight), it is done before this
    returns, so it neither overtakes nor is overtaken by another collective."""
    array = isinstance(value, jax.Array)
    if array and value.sharding == sharding:
        return value  # the common case in a chain; device_put would cost ~15 µs to do nothing
    if isinstance(value, HostShards):  # this process's devices' shards, uploaded here
        return jax.make_array_from_callback(value.shape, sharding, value.__getitem__)
    single = isinstance(sharding, SingleDeviceSharding)
    if single and array:
        moved = _copy_to_device(value, sharding)
        if moved is not None:
            return moved
    if single or sharding.is_fully_addressable:
        if isinstance(value, np.ndarray):
            placed = _put_host_array(value, sharding)
            if placed is not None:
                return placed
        return jax.device_put(value, sharding)
    if array and not value.is_fully_addressable:
        if alone is not None:
            alone()
        if value.sharding._device_assignment != sharding._device_assignment:
            value = _onto_devices(value, sharding)
        placed = jax.jit(lambda x: x, out_shardings=sharding)(value)
        if alone is not None:
            placed.block_until_ready()
        return placed
    host = np.asarray(value)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def _onto_devices(value: jax.Array, sharding: jax.sharding.Sharding) -> jax.Array:
    """``value`` (spanning hosts) replicated over the devices of ``sharding``, in that
    sharding's order: a jitted reshard refuses an argument on other devices, or on the same
    in another order. Replicated on its own devices first (a collective of its makers' hosts,
    all of which run this command: the scheduler sends a reader on fewer hosts a whole copy
    instead), each host then copies its whole onto its devices of ``sharding``."""
    mine = jax.sharding.Mesh(np.array(value.sharding._device_assignment), ("devices",))
    whole = jax.jit(lambda x: x, out_shardings=NamedSharding(mine, PartitionSpec()))(value)
    held = {shard.device: shard.data for shard in whole.addressable_shards}
    any_copy = next(iter(held.values()))
    process = jax.process_index()
    copies = [
        held[device] if device in held else jax.device_put(any_copy, device)
        for device in sharding._device_assignment
        if device.process_index == process
    ]
    theirs = jax.sharding.Mesh(np.array(sharding._device_assignment), ("devices",))
    return jax.make_array_from_single_device_arrays(
        value.shape, NamedSharding(theirs, PartitionSpec()), copies
    )


# The runtime call ``device_put`` ends in for a copy between devices; None in a jaxlib without
# it (copies then take ``device_put``).
_COPY = getattr(xc, "batched_copy_array_to_devices_with_sharding", None)
# Per single-device sharding, the arguments after the arrays ``_COPY`` takes to copy to it.
_COPY_ARGUMENTS: dict[SingleDeviceSharding, tuple[list[Any], ...]] = {}


def _copy_arguments(sharding: SingleDeviceSharding) -> tuple[list[Any], ...]:
    """What ``_COPY`` takes after the arrays to copy one array to ``sharding``'s device, made
    once (looking the device list up costs ~4 µs, as much as half the copy)."""
    arguments = _COPY_ARGUMENTS.get(sharding)
    if arguments is None:
        devices = sharding._internal_device_list.addressable_device_list
        arguments = _COPY_ARGUMENTS[sharding] = (
            [devices],
            [sharding],
            [xc.ArrayCopySemantics.REUSE_INPUT],
        )
    return arguments


def _copy_to_device(value: jax.Array, sharding: SingleDeviceSharding) -> jax.Array | None:
    """A single-device array copied to another device by the runtime call ``device_put`` ends
    in (~10 µs instead of ~25 µs through its Python layers: a stage of a pipeline pays it on
    every hop). None where this jaxlib lacks the call or the value is not a single-device
    array: the caller then uses ``device_put``."""
    if _COPY is None or not isinstance(value.sharding, SingleDeviceSharding):
        return None
    try:
        return _COPY([value], *_copy_arguments(sharding))[0]
    except (AttributeError, TypeError):
        return None


# The abstract value of a host array by shape and dtype (False where JAX would convert the
# dtype), bounded: shapes come from clients.
_AVALS: dict[tuple[tuple[int, ...], np.dtype], Any] = {}
MAX_AVALS = 1024
_HOST_PUT_DEVICES: dict[SingleDeviceSharding, list[jax.Device]] = {}


def _put_host_array(value: np.ndarray, sharding: jax.sharding.Sharding) -> jax.Array | None:
    """A host array put on this process's devices by the runtime call ``device_put`` ends in:
    on one device straight (~10 µs, against ~50 through ``shard_args``'s Python layers and
    ~160 through ``device_put``: every input pulled from another executor pays it on its way
    to the consumer's launch), else through ``shard_args``. None where this jax lacks the
    calls: the caller then uses ``device_put``."""
    try:
        if isinstance(sharding, SingleDeviceSharding) and type(value) is np.ndarray:
            key = (value.shape, value.dtype)
            aval = _AVALS.get(key)
            if aval is None:
                if len(_AVALS) >= MAX_AVALS:
                    _AVALS.clear()
                aval = core.shaped_abstractify(value)
                # float0 and dtypes JAX canonicalizes (float64 without x64) take the long way.
                if aval.dtype != value.dtype or value.dtype == dtypes.float0:
                    aval = False
                _AVALS[key] = aval
            if aval:
                devices = _HOST_PUT_DEVICES.get(sharding)
                if devices is None:  # a list: the runtime takes it ~10 µs faster than its own
                    devices = _HOST_PUT_DEVICES[sharding] = list(sharding.device_set)
                return xc.batched_device_put(aval, sharding, [value], devices)
        return pxla.shard_args([sharding], [None], [xc.ArrayCopySemantics.REUSE_INPUT], [value])[0]
    except (AttributeError, TypeError):
        return None


def last_uses(batch: Sequence[pb.ExecutorCommand]) -> dict[int, set[str]]:
    """Per run command of a batch (by position), the input buffers it is the last use of:
    their owner deletes them later in the same batch and no command between reads them. A
    client running a chain frees each intermediate once its consumer is queued, so the
    consumer may take the buffer over for its output, as a JAX loop donating its carry does.
    (The scheduler sends a deletion only once no other executor still pulls the buffer.)"""
    last_reader: dict[str, int] = {}
    uses: dict[int, set[str]] = {}
    for position, command in enumerate(batch):
        kind = command.WhichOneof("kind")
        if kind == "run":
            for buffer_id in command.run.inputs:
                last_reader[buffer_id] = position
        elif kind == "call":  # a reader too, though it takes no argument over
            for buffer_id in command.call.arguments:
                last_reader[buffer_id] = position
        elif kind == "delete":
            for buffer_id in command.delete.ids:
                reader = last_reader.pop(buffer_id, None)
                if reader is not None:
                    uses.setdefault(reader, set()).add(buffer_id)
    return uses


# A node of a program call: its index, what is ready once it is done, when it was dispatched.
_Node = tuple[int, Sequence[Any], int]


@dataclass(eq=False)
class _Dispatched:
    """A computation handed to the devices, until it is reported."""

    command: pb.ExecutorCommand
    # What is ready exactly when the computation is done: its token, or its outputs when the
    # function has no token (such outputs are never taken over before it is reported). Only
    # these are held: outputs the client deletes meanwhile are freed at once.
    awaited: Sequence[Any]
    dispatched_ns: int
    # Whether ``awaited`` are the outputs.
    through_outputs: bool = False
    # A program call: its nodes here as (index, awaited, dispatched_ns), each reported with
    # its own times, put in groups (see ``send_nodes``) and ended by None (a call of
    # collectives is handed over at its first, so its nodes are stamped as they end, not when
    # the last is dispatched); then, set before that None, the first failure among them, if
    # any, and its outputs awaited through themselves (``_watched`` until reported).
    nodes: queue.SimpleQueue[list[_Node] | None] | None = None
    # Nodes dispatched since the last group was put.
    unsent: list[_Node] = field(default_factory=list)
    failure: str = ""
    watched: tuple[str, ...] = ()
    # A call handed over before its last node is in ``nodes``.
    dispatching: bool = False
    # A call's program as planned here (its nodes' names, for failures).
    plan: Plan | None = None

    @property
    def devices(self) -> tuple[int, ...]:
        """The island devices a computation runs on (a call's are the executor's)."""
        return tuple(sorted(self.command.run.devices))

    def send_nodes(self) -> None:
        """Put the nodes dispatched since the last group as one group: when the runner is
        about to wait for anything, and once the call is dispatched. The completion thread
        then wakes once a group, not twice a node (it took the runner's place in the
        interpreter each time): on a 4-device all-reduce chain its CPU per node halved.
        Handing the call over only once dispatched (no wake-up meanwhile) ran 4-11% faster
        still, but stamped every node that ended before then at once."""
        if self.unsent:
            assert self.nodes is not None
            self.nodes.put(self.unsent)
            self.unsent = []


# How a node's inputs reach its device when each is an output of a node before it here and
# the function takes each on one device (a chain's node): per input, its name, whether this is
# its last read (then it is dropped as it is read), the sharding it goes to and what the
# runtime's copy takes to move it there. Once a call ran every node, such inputs fit without a
# check, and moving them straight costs ~24 µs a node less than ``_arguments`` and ``place``
# (the engine alone dispatched a 16-node chain in 1.07-1.33 ms, against 1.45-1.72 ms).
_Moves = tuple[tuple[str, bool, SingleDeviceSharding, tuple[list[Any], ...]], ...]


class _Bound(NamedTuple):
    """A program's step resolved for its devices (see ``Runner._bind``)."""

    function: Callable
    devices: list[jax.Device]
    donatable: tuple[int, ...]  # positions of the inputs it may take over
    moves: _Moves | None
    path: str | None  # how the runtime launches it (``_launch_path``)


def _moved(
    moves: _Moves, local: dict[str, Any], donatable: tuple[int, ...], through: set[str]
) -> tuple[list[Any], tuple[int, ...]]:
    """A chain node's arguments, each taken from ``local`` and on its device, and the
    positions it may take over: those in ``donatable`` passed as they were (not a copy)
    whose producer's token is awaited (not ``through`` its outputs)."""
    arguments: list[Any] = []
    donations: tuple[int, ...] = ()
    for position, (name, last, sharding, copy_arguments) in enumerate(moves):
        value = local.pop(name) if last else local[name]
        current = value.sharding
        if current != sharding:
            if type(current) is SingleDeviceSharding:
                value = _COPY([value], *copy_arguments)[0]
            else:  # from a multi-device node
                value = place(value, sharding)
        elif position in donatable and name not in through:
            donations += (position,)
        arguments.append(value)
    return arguments, donations


@dataclass(frozen=True)
class _LinkRun:
    """Consecutive links of a chain: steps on one device, each reading one input, the one
    output of the step just before it (on one device too, and read nowhere else), and making
    one output, with no token on either side (so no input is taken over). A run may start at
    a head: such a step reading one of the call's arguments instead, taken when the argument
    is in hand on one device with the shape and dtype the head takes. Once a call ran every
    step, a run is dispatched in a tight loop of launches: the general loop body cost ~20 µs
    a node more (the engine alone, alternated in one process: 46 µs a node against 66, a
    16-node chain's call 1.08 ms against 1.43 ms). A jax.export function moves its input
    from another device itself, within its call (``Callable.moves_inputs``): 33 µs a node
    against 41 with a copy before each launch."""

    end: int  # the position after the run's last step
    input: str  # the first link's input, a local output ("" after a head)
    # Per link: its node's index, its jitted function, and the arguments of the copy to its
    # device (None: the input is on its device already, or the function moves it; a head's
    # copy reuses the argument's buffer where it is on that device).
    links: tuple[tuple[int, Any, tuple[list[Any], ...] | None], ...]
    output: str  # the last link's output, its result position and whether it is a buffer
    result: int
    stored: bool
    head: Callable | None = None  # a head's function, and the argument it reads
    argument: int = -1


def _is_link(known: Plan, position: int) -> bool:
    """Whether a checked plan's step at ``position`` is a link (see _LinkRun)."""
    if position == 0:
        return False
    step, before = known.steps[position], known.steps[position - 1]
    function, devices, _, moves, _ = known.bound[position]
    producer, producer_devices = known.bound[position - 1][:2]
    return (
        moves is not None
        and len(moves) == 1
        and moves[0][1]  # its last read
        and len(before.outputs) == 1
        and moves[0][0] == before.outputs[0][0]
        and len(devices) == len(producer_devices) == 1
        and function.token_sharding is None
        and producer.token_sharding is None
        and function.out_count == len(step.outputs) == 1
    )


def _is_head(known: Plan, position: int) -> bool:
    """Whether a checked plan's step at ``position`` is a head (see _LinkRun)."""
    step = known.steps[position]
    function, devices = known.bound[position][:2]
    return (
        _COPY is not None
        and len(step.inputs) == 1
        and step.inputs[0][0] is Source.ARGUMENT
        and len(devices) == 1
        and isinstance(function.in_shardings[0], SingleDeviceSharding)
        and function.token_sharding is None
        and function.out_count == len(step.outputs) == 1
    )


def _link_runs(known: Plan) -> dict[int, _LinkRun]:
    """A checked plan's runs of links by their first position. A link whose output is a
    buffer ends its run. A run from a head is also found from the link after it, for calls
    whose argument the head does not take."""
    runs: dict[int, _LinkRun] = {}
    positions: list[int] = []

    def close() -> None:
        if positions:
            runs[positions[0]] = _link_run(known, positions)
            if len(positions) > 1 and runs[positions[0]].head is not None:
                runs[positions[1]] = _link_run(known, positions[1:])
            positions.clear()

    for position, step in enumerate(known.steps):
        if not _is_link(known, position):
            close()
            if not _is_head(known, position):
                continue
        positions.append(position)
        if step.stored[0]:
            close()
    close()
    return runs


def _link_run(known: Plan, positions: list[int]) -> _LinkRun:
    """The run of links at ``positions`` (consecutive) of a checked plan, from a head if the
    first is one."""
    links = []
    for position in positions:
        function, devices, _, moves, _ = known.bound[position]
        if function.moves_inputs:
            copy = None
        elif moves is None:  # a head
            copy = _copy_arguments(function.in_shardings[0])
        else:
            producer_device = known.bound[position - 1].devices[0]
            copy = moves[0][3] if producer_device != devices[0] else None
        links.append((known.steps[position].index, function.run, copy))
    first, last = known.steps[positions[0]], known.steps[positions[-1]]
    ((output, result),) = last.outputs
    head = first.inputs[0][0] is Source.ARGUMENT
    return _LinkRun(
        end=positions[-1] + 1,
        input="" if head else first.inputs[0][2],
        links=tuple(links),
        output=output,
        result=result,
        stored=last.stored[0],
        head=known.bound[positions[0]].function if head else None,
        argument=first.inputs[0][1] if head else -1,
    )


# Donating variants to compile, by function and positions: one node's arguments each (holding
# every node's would keep each intermediate alive until the call's end).
_Variants = dict[tuple[int, tuple[int, ...]], tuple[Callable, list[Any]]]


class ComputationError(Exception):
    """A computation could not run; the message is what the client sees."""


class InputFailed(Exception):
    """Input ``position`` of a computation is the output of one that failed on its devices,
    found as it was laid out for its reader (copied to the host to spread over hosts):
    the failure is its maker's, not the reader's."""

    def __init__(self, position: int, error: Exception) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.position = position


def _failed(value: Any) -> bool:
    """Whether ``value`` is an array whose computation failed."""
    if not isinstance(value, jax.Array):
        return False
    try:
        value.block_until_ready()
    except Exception:
        return True
    return False


class Runner:
    """Executes commands in order on this host's devices; ``emit`` receives events, several
    at once when several computations finished together."""

    def __init__(
        self,
        index: int,
        island_devices: dict[int, jax.Device],
        fetch: Fn[[pb.InputSource], np.ndarray],
        emit: Fn[[list[pb.ExecutorEvent]], None],
        max_executables: int = MAX_EXECUTABLES,
    ) -> None:
        self.index = index
        self.devices = island_devices
        self.buffers = BufferStore()
        # Artifacts come from clients: their modules are parsed in a helper process first.
        checker = ArtifactChecker()
        checker.start_soon()
        self.functions = FunctionCache(checker=checker)
        self._fetch = fetch
        self._emit = emit
        # Batches of commands as they arrived (one hand-off per batch), or None to stop.
        self._commands: queue.Queue[list[pb.ExecutorCommand] | None] = queue.Queue()
        # Completion lanes by device set (island device ids), each a queue of lists of
        # _Dispatched, _IDLE, an Event to set once all before it are stamped, or None to stop,
        # read by a thread of its own; program calls go in the executor-wide lane.
        here = jax.process_index()
        self._local = tuple(
            sorted(d for d, device in island_devices.items() if device.process_index == here)
        )
        self._lanes: dict[tuple[int, ...], queue.Queue[Any]] = {}
        self._lanes_lock = threading.Lock()
        # Lanes handed work since the runner was last idle (each is then told it is).
        self._touched: set[tuple[int, ...]] = set()
        # Dispatched by the runner, not yet handed to the completion thread.
        self._dispatched: list[_Dispatched] = []
        # The program call being dispatched, if any (its nodes so far go with a hand-over).
        self._calling: _Dispatched | None = None
        # Outputs of unreported computations without a token: the completion thread waits for
        # them, so no later computation takes them over until then. The runner adds, the
        # completion thread removes (each a single set operation).
        self._watched: set[str] = set()
        # Registered programs as this executor runs them, by program id (planned by the
        # command reader when the registration arrives, read by the run loop).
        self._plans: dict[str, Plan] = {}
        # Per forget command (by seq): the plans it drops, as the command reader found them (a
        # program registered again after it, already read, keeps its new plan).
        self._retiring: dict[int, list[tuple[str, Plan | None]]] = {}
        # Functions compiled for a slice, by (function id, island devices), least recently
        # run first: at most max_executables (a sweep over a static argument would otherwise
        # keep an executable per value on an executor its island's tenants share).
        self._functions: OrderedDict[
            tuple[str, tuple[int, ...]], tuple[Callable, list[jax.Device]]
        ] = OrderedDict()
        self.max_executables = max_executables
        self.inputs_taken_over = 0  # by their last use, for tests and the executor's Info
        self._transfers = ThreadPoolExecutor(max_workers=8, thread_name_prefix="transfer")
        self._transfers_lock = threading.Lock()
        # Buffers held here in part whose whole was assembled beside them (under WHOLE + id).
        self._wholes: set[str] = set()
        # When each device's last reported computation ended (trace stamps, see ``_span``).
        self._last_end_ns: dict[int, int] = {}
        self._stamp_lock = threading.Lock()
        self._idle = True  # the run loop has no command in hand
        # Multi-device computations dispatched and not yet waited for, oldest first: what is
        # ready once each is done (see MAX_OUTSTANDING).
        self._in_flight: deque[Sequence[Any]] = deque()
        self._in_flight_path: str | None = None  # how they were launched (``_launch_path``)
        # The latest computation ids in execution order, for tests and traces (bounded: an
        # executor runs for weeks).
        self.executed: deque[str] = deque(maxlen=EXECUTED_KEPT)
        # Output id -> the first failure behind it (see FAILED_KEPT); written by the lanes.
        self._failed: dict[str, str] = {}
        self._failed_lock = threading.Lock()
        self._lane(self._local)
        threading.Thread(target=self._run_loop, name="runner", daemon=True).start()

    def submit(self, commands: Sequence[pb.ExecutorCommand]) -> None:
        """Accept the next commands of the island order, as one batch: the run loop is woken
        once for all of them (waking it at the first would have it compete with this thread
        for the interpreter while the rest are read)."""
        for command in commands:
            kind = command.WhichOneof("kind")
            if kind == "run":
                # Announce the outputs now so consumers on other executors can wait for them,
                # and start pulling remote inputs while earlier work runs.
                for buffer_id in command.run.outputs:
                    self.buffers.expect(buffer_id)
                self._start_transfers(command.sources)
            elif kind == "program":
                registration = command.program
                self._plans[registration.program_id] = plan(
                    registration, self._hosts, jax.process_index()
                )
            elif kind == "forget":
                ids = command.forget.program_ids
                self._retiring[command.seq] = [(i, self._plans.get(i)) for i in ids]
            elif kind == "call" and (known := self._plans.get(command.call.program_id)):
                for buffer_id in known.stored_ids(command.call):
                    self.buffers.expect(buffer_id)
                self._start_transfers([*command.sources, *known.pulls(command.call)])
        if commands:
            self._commands.put(list(commands))

    def stop(self) -> None:
        self._commands.put(None)
        with self._lanes_lock:
            for lane in self._lanes.values():
                lane.put(None)
        self._transfers.shutdown(wait=False, cancel_futures=True)

    def put_array(self, buffer_id: str, value: np.ndarray | HostShards) -> bool:
        """A client's upload: a host array (or the shards of one this process's devices
        take), placed on devices when a computation uses it; ``False`` if the buffer was
        deleted before the upload arrived (nothing is kept)."""
        return self.buffers.upload(buffer_id, value)

    # -- the ordered loop ---------------------------------------------------------------------

    def _hosts(self, node: pb.Computation) -> frozenset[Hashable]:
        """The processes holding a program node's devices: this island's executors in its
        distributed group, else this one (its own devices) and the devices it cannot reach."""
        return frozenset(
            self.devices[d].process_index if d in self.devices else ("unreachable", d)
            for d in node.devices
        )

    def prefetch(self, sources: Sequence[pb.InputSource]) -> None:
        """Start pulling inputs of work not sent yet (outside the order): the work, once
        here, finds them pulled or in flight. A prefetch of a buffer not announced within the
        holder's 30 s (its producer queued long on its island) leaves nothing: the work's own
        pull, once its producer is made, tries again, rather than finding that failure."""
        with self._transfers_lock:
            for source in sources:
                if source.buffer_id not in self.buffers:
                    self._start_transfer(source, source.buffer_id, prefetched=True)

    def _start_transfers(self, sources: Sequence[pb.InputSource]) -> None:
        with self._transfers_lock:  # (the ordered loop's, and a prefetch's, at once)
            self._start_transfers_locked(sources)

    def _start_transfers_locked(self, sources: Sequence[pb.InputSource]) -> None:
        for source in sources:
            if source.partial:  # held here in part: its whole goes beside it
                if WHOLE + source.buffer_id not in self.buffers:
                    self._wholes.add(source.buffer_id)
                    self._start_transfer(source, WHOLE + source.buffer_id)
            elif source.buffer_id not in self.buffers:
                self._start_transfer(source, source.buffer_id)

    def _start_transfer(self, source: pb.InputSource, key: str, prefetched: bool = False) -> None:
        future = self.buffers.expect(key)

        def pull() -> None:
            try:
                future.set_result(self._fetch(source))
            except Exception as error:
                if future.done():
                    return
                # Not announced yet: the work comes only once its producer is made, and pulls
                # it again then. (Any other failure is the work's: its pull would meet it too.)
                unannounced = unknown(source.buffer_id) in str(error)
                if prefetched and unannounced and self.buffers.forget_pending(key, future):
                    return
                future.set_exception(error)

        self._transfers.submit(pull)

    def _run_loop(self) -> None:
        while (batch := self._commands.get()) is not None:
            if batch is _REPLACED:
                self._drop_everything()
                continue
            self._idle = False
            last = last_uses(batch)
            for position, command in enumerate(batch):
                kind = command.WhichOneof("kind")
                if kind == "register":
                    self._hand_over()  # loading an artifact takes a while
                    self._register(command)
                elif kind == "delete":
                    for buffer_id in command.delete.ids:
                        self.buffers.delete(buffer_id)
                        if buffer_id in self._wholes:
                            self._wholes.discard(buffer_id)
                            self.buffers.delete(WHOLE + buffer_id)
                elif kind == "run":
                    self._run(command, last.get(position, set()))
                    if len(self._dispatched) >= HAND_OVER_EVERY:
                        self._hand_over()
                elif kind == "call":
                    self._call(command)
                elif kind == "forget":
                    self._forget(command)
            self._hand_over()
            if self._commands.empty():
                # Nothing more in hand: completions go out as soon as they are known.
                self._idle = True
                for key in self._touched:
                    self._lanes[key].put(_IDLE)
                self._touched.clear()

    def remote_failed(self, failed: pb.RemoteFailed) -> None:
        """Buffers of another island this executor may be pulling will never be: a
        computation waiting for one fails now, naming why (it waited out the pull: 30 s a
        holder, up to 120 s, holding up everything after it here)."""
        for buffer_id in failed.buffer_ids:
            error = BufferError(f"buffer {buffer_id!r}: {failed.reason}")
            for key in (buffer_id, WHOLE + buffer_id):  # (its whole, pulled beside a part)
                if key in self.buffers and not self.buffers.ready(key):
                    self.buffers.fail(key, error)

    def replaced(self) -> None:
        """Its scheduler was replaced (restarted alone, as its pod is): what the sessions of
        the one before left is no one's. Pending buffers fail now (a computation waiting for
        one, from another island, say, stops waiting); once the commands that one sent have
        run, every buffer, function and program goes. Before, they stayed for good."""
        gone = BufferError(
            f"executor {self.index}'s scheduler was replaced (restarted): what the sessions "
            "of the one before held is gone"
        )
        for buffer_id in self.buffers.ids():
            self.buffers.fail(buffer_id, gone)  # (one set already keeps its value)
        self._commands.put(_REPLACED)  # after the commands queued before

    def _drop_everything(self) -> None:
        self._hand_over()
        for buffer_id in self.buffers.ids():
            self.buffers.delete(buffer_id)
        self._wholes.clear()
        self.functions.forget_all()
        self._functions.clear()
        self._plans.clear()
        self._retiring.clear()

    def _hand_over(self) -> None:
        """Give what was dispatched to the completion thread: at the end of a batch, every
        ``HAND_OVER_EVERY`` computations, and before the runner waits for anything (with the
        nodes of the call being dispatched so far, as one group)."""
        if self._dispatched:
            by_lane: dict[tuple[int, ...], list[_Dispatched]] = {}
            for record in self._dispatched:
                key = self._local if record.nodes is not None else record.devices
                by_lane.setdefault(key, []).append(record)
            for key, records in by_lane.items():
                key = key if key in self._lanes else self._lane(key)
                self._lanes[key].put(records)
                self._touched.add(key)
            self._dispatched = []
        if self._calling is not None:
            self._calling.send_nodes()

    def _hand_over_call(self) -> None:
        """Hand over what was dispatched with the call being dispatched, if any, before its
        last node: its nodes are then stamped as they end (see ``send_nodes``), not a node
        dispatched before a wait for another executor's output as ending after it."""
        calling = self._calling
        if calling is not None and not calling.dispatching:
            calling.dispatching = True
            self._dispatched.append(calling)
        self._hand_over()

    def _lane(self, devices: tuple[int, ...]) -> tuple[int, ...]:
        """The key of the lane reporting computations on ``devices``, started on first use.
        Each device set's completions go out as they are done, not after those of another
        set dispatched before them (a tenant's 1 ms computation waited 120 ms on average for
        another tenant's 200 ms ones on other devices of the host). Beyond ``MAX_LANES`` sets,
        the executor-wide lane."""
        with self._lanes_lock:
            if devices not in self._lanes:
                if len(self._lanes) >= MAX_LANES:
                    return self._local
                self._lanes[devices] = lane = queue.Queue()
                threading.Thread(
                    target=self._completion_loop, args=(lane,), name="completions", daemon=True
                ).start()
        return devices

    def _register(self, command: pb.ExecutorCommand) -> None:
        registration = command.register
        try:
            self.functions.register(
                registration.function_id,
                registration.artifact,
                registration.name,
                kind=registration.kind,
            )
        except FunctionError as error:
            failed = pb.ExecutorEvent(
                seq=command.seq, ok=False, message=str(error), executor=self.index
            )
            self._emit([failed])

    def _forget(self, command: pb.ExecutorCommand) -> None:
        """Drop functions and programs no session uses any more (every command using them
        came before this one)."""
        for program_id, retired in self._retiring.pop(command.seq, []):
            if self._plans.get(program_id) is retired:
                del self._plans[program_id]
        function_ids = set(command.forget.function_ids)
        if function_ids:
            self.functions.forget(function_ids)
            for key in [key for key in self._functions if key[0] in function_ids]:
                del self._functions[key]

    @property
    def programs(self) -> int:
        """Programs planned here and not forgotten."""
        return len(self._plans)

    def _run(self, command: pb.ExecutorCommand, last_uses: set[str]) -> None:
        computation = command.run
        held: list[str] = []  # inputs awaited: held so that a deletion meanwhile waits
        function: Callable | None = None
        devices: list[jax.Device] = []
        launched = False
        try:
            key = (computation.function_id, tuple(computation.devices))
            function, devices = self._executable(computation, key)
            if computation.describe:
                self._describe(command, function.description, time.time_ns())
                return
            if taken := self.buffers.first_set(computation.outputs):
                raise ComputationError(self._taken(taken))
            values = []
            partial = {s.buffer_id for s in command.sources if s.partial} if command.sources else ()
            for buffer_id in computation.inputs:
                if buffer_id in partial:
                    buffer_id = WHOLE + buffer_id
                value = self.buffers.peek(buffer_id)
                if value is PENDING:
                    value = self._await_input(buffer_id, held)
                values.append(value)
            collective = _launch_path(devices)
            arguments = self._arguments(function, values, collective)
            donations = _donatable(
                computation, function, values, arguments, last_uses, self._watched
            )
            # Stamped as launched: the time to compile, wait for inputs and place them is not
            # the devices'.
            launched = True  # (an exception in the launch: it was not, anywhere)
            record, outputs, unprepared = self._dispatch(
                command, function, arguments, donations, time.time_ns()
            )
            if len(outputs) != len(computation.outputs):
                raise ComputationError(
                    f"function {function.name!r} returns {len(outputs)} output(s) but the "
                    f"computation names {len(computation.outputs)}"
                )
        except (BufferError, FunctionError, ComputationError) as error:
            failure = str(error)
        except InputFailed as error:
            failure = f"buffer {computation.inputs[error.position]!r} failed: {error}"
        except Exception as error:  # XLA or JAX refused the call
            failure = f"{type(error).__name__}: {error}"
        else:
            failure = ""
        finally:
            for buffer_id in held:
                self.buffers.release(buffer_id)
        if failure:
            if function is not None and not launched:
                self._launch_unused(function, devices)
            self._fail(command, failure)
            return
        if record.through_outputs:
            self._watched.update(computation.outputs)
        for buffer_id, value in zip(computation.outputs, outputs, strict=True):
            self.buffers.set(buffer_id, value)
        if collective:
            self._note_collective(record.awaited, collective)
        self.executed.append(computation.id)
        self._dispatched.append(record)
        if unprepared:
            self._await_stamped()
            function.prepare_donating(unprepared, arguments)

    def _launch_unused(self, function: Callable, devices: Sequence[jax.Device]) -> None:
        """Launch, on zeros, a function that failed here before its launch (an input that
        failed or never came, an output id taken), if it spans hosts; its outputs are not
        used. The other hosts of its slice launch it, and its collectives need every host:
        one host missing hung them, then paired every later collective of the island's hosts
        with the wrong one (other tenants got wrong values, then hung)."""
        process = jax.process_index()
        path = _launch_path(devices)
        if path is None or all(device.process_index == process for device in devices):
            return
        try:
            self._bound_outstanding(path)
            zeros = [
                place(np.zeros(aval.shape, aval.dtype), sharding)
                for aval, sharding in zip(function.in_avals, function.in_shardings, strict=True)
            ]
            awaited, _, _, _ = self._launch(function, zeros, ())
            self._note_collective(awaited, path)
        except Exception:  # the failure reported is the first one
            log.exception("executor %d: launching %r on zeros failed", self.index, function.name)

    def _taken(self, buffer_id: str) -> str:
        return (
            f"output {buffer_id!r} holds a value on executor {self.index} already (uploaded "
            "under that id, never issued by the scheduler): it is left as it is"
        )

    def _await_stamped(self) -> None:
        """Wait until what was dispatched is finished and stamped, before compiling: that
        holds the interpreter and the devices' threads, and no computation in the trace may
        carry it."""
        self._hand_over()
        with self._lanes_lock:
            lanes = list(self._lanes.values())
        marks = [threading.Event() for _ in lanes]
        for lane, stamped in zip(lanes, marks, strict=True):
            lane.put(stamped)
        for stamped in marks:
            stamped.wait()

    def _arguments(
        self, function: Callable, values: list[Any], collective: str | None, check: bool = True
    ) -> list[Any]:
        """The inputs laid out as ``function`` expects (checked first unless ``check`` is
        false), once there is room for a multi-device computation launched as ``collective``
        says (see ``_bound_outstanding``)."""
        if check:
            check_inputs(function, values)
        if collective:
            self._bound_outstanding(collective)
        placed = []
        for position, (value, sharding) in enumerate(
            zip(values, function.in_shardings, strict=True)
        ):
            try:
                placed.append(place(value, sharding, self._await_all_in_flight))
            except Exception as error:
                if _failed(value):
                    raise InputFailed(position, error) from error
                raise
        return placed

    def _note_collective(self, awaited: Sequence[Any], path: str) -> None:
        """A multi-device computation was dispatched, launched as ``path`` says (see
        ``_bound_outstanding``)."""
        self._in_flight.append(awaited)
        self._in_flight_path = path

    def _call(self, command: pb.ExecutorCommand) -> None:
        """This executor's nodes of a program call, in program order, each dispatched as a
        computation is. An output read only here lives during the call alone (a node takes
        its buffer over at its last read); the rest become buffers. The call is reported once,
        with each node's times. A failed node's outputs fail, so the nodes reading them fail
        with its cause (naming it once), and the call fails with the first failure; the nodes
        that do not depend on it still run (a collective spanning executors must run on all of
        them)."""
        call = command.call
        record = _Dispatched(command, [], time.time_ns(), nodes=queue.SimpleQueue())
        assert record.nodes is not None
        to_prepare: _Variants = {}
        self._calling = record
        try:
            known = record.plan = self._plans.get(call.program_id)
            taken = known and self.buffers.first_set(known.stored_ids(call))
            if known is None:
                record.failure = (
                    f"call {call.id!r}: program {call.program_id[:12]!r} was never registered "
                    f"on executor {self.index}"
                )
            elif taken:
                record.failure = f"call {call.id!r}: {self._taken(taken)}"
                error = ComputationError(record.failure)
                for buffer_id in known.stored_ids(call):
                    self.buffers.fail(buffer_id, error)
            else:
                to_prepare = self._call_nodes(call, known, record)
        finally:
            self._calling = None
            record.send_nodes()
            record.nodes.put(None)
            if record.dispatching:
                record.dispatching = False
            else:  # handed over with what follows, as a computation is
                self._dispatched.append(record)
        if to_prepare:
            self._await_stamped()
            for (_, positions), (function, arguments) in to_prepare.items():
                function.prepare_donating(positions, arguments)

    def _call_nodes(self, call: pb.ProgramCall, known: Plan, record: _Dispatched) -> _Variants:
        """Dispatch the call's nodes, each put in ``record.nodes`` once dispatched; returns
        the donating variants to compile."""
        assert record.nodes is not None
        local: dict[str, Any] = {}
        through: set[str] = set()  # local outputs awaited through themselves: kept whole
        failed: dict[str, str] = {}  # local outputs that failed: the first failure behind them
        watched: list[str] = []
        failure = ""
        to_prepare: _Variants = {}
        bound, checked = known.bound, known.checked
        resume = 0  # the position after a run of links dispatched
        for position, step in enumerate(known.steps):
            if position < resume:
                continue
            run = known.links.get(position) if known.links else None
            if run is not None and (value := self._run_input(call, run, local)) is not None:
                problem = self._run_links(
                    call, known, run, value, local, through, watched, failed, record
                )
                failure = failure or problem
                resume = run.end
                continue
            node = step.node
            upstream = (
                next((failed[n] for _, _, n in step.inputs if n in failed), "") if failed else ""
            )
            if upstream:
                with contextlib.suppress(Exception):  # its own failure is named below it
                    resolved = bound.get(position) or bound.setdefault(position, self._bind(step))
                    self._launch_unused(resolved.function, resolved.devices)
                self._fail_outputs(call, step, upstream, failed)
                continue
            held: list[str] = []
            resolved = None
            launched = False
            try:
                resolved = bound.get(position)
                if resolved is None:
                    resolved = bound[position] = self._bind(step)
                function, _, donatable, moves, collective = resolved
                if moves is not None and checked:
                    # A chain's node, the common case: see _Moves.
                    arguments, donations = _moved(moves, local, donatable, through)
                else:
                    if step.local_only:
                        # each dropped at its last read, so freed once read (as a JAX loop does)
                        values = [
                            local.pop(name) if last else local[name]
                            for name, last in step.local_reads
                        ]
                    else:
                        values = self._node_inputs(call, step, local, held)
                    arguments = self._arguments(
                        function, values, collective, check=not (checked and step.local_only)
                    )
                    donations = (
                        tuple(
                            i
                            for i in donatable
                            # placed as it was (not a copy), and its producer's token awaited
                            if arguments[i] is values[i] and step.inputs[i][2] not in through
                        )
                        if donatable
                        else ()
                    )
                started = time.time_ns()  # as launched (see _run)
                launched = True
                awaited, outputs, unprepared, through_outputs = self._launch(
                    function, arguments, donations
                )
                if len(outputs) != len(step.outputs):
                    raise ComputationError(
                        f"function {function.name!r} returns {len(outputs)} output(s) but the "
                        f"node names {len(step.outputs)}"
                    )
            except (BufferError, FunctionError, ComputationError) as error:
                problem = self._node_failure(call, node, str(error))
            except InputFailed as error:  # its maker's failure, named as such
                name = step.inputs[error.position][2]
                maker = next(
                    (s.node for s in known.steps if any(out == name for out, _ in s.outputs)),
                    None,
                )
                problem = (
                    self._node_failure(call, maker, str(error))
                    if maker is not None
                    else self._node_failure(call, node, f"its input {name!r} failed: {error}")
                )
            except Exception as error:  # XLA or JAX refused the call
                problem = self._node_failure(call, node, f"{type(error).__name__}: {error}")
            else:
                problem = ""
            finally:
                for buffer_id in held:
                    self.buffers.release(buffer_id)
            if problem:
                if resolved is not None and not launched:
                    self._launch_unused(resolved.function, resolved.devices)
                failure = failure or problem
                self._fail_outputs(call, step, problem, failed)
                continue
            for (name, result), stored, value in zip(
                step.outputs, step.stored, outputs, strict=True
            ):
                if stored:
                    buffer_id = output_id(call, name, result)
                    self.buffers.set(buffer_id, value)
                    if through_outputs:
                        watched.append(buffer_id)
                else:
                    local[name] = value
                    if through_outputs:
                        through.add(name)
            record.unsent.append((step.index, awaited, started))
            if collective:
                if not record.dispatching:
                    # The call's collectives end one by one while the rest are launched
                    # (each launch blocks a while): handed over at the first, its nodes are
                    # stamped a group at a time as they end, not once the call is dispatched.
                    # (A chain of single-device nodes is short; watched while dispatched, its
                    # nodes woke the completion thread each, and a 16-stage chain across hosts
                    # ran ~5% slower.)
                    self._hand_over_call()
                self._note_collective(awaited, collective)
            if unprepared:
                to_prepare.setdefault((id(function), unprepared), (function, arguments))
        if not (known.checked or failure):
            known.checked, known.links = True, _link_runs(known)
        self._watched.update(watched)
        self.executed.append(call.id)
        record.failure, record.watched = failure, tuple(watched)
        return to_prepare

    def _run_input(self, call: pb.ProgramCall, run: _LinkRun, local: dict[str, Any]) -> Any | None:
        """A run's first input, taken from ``local``, if the run can go: a local output in hand,
        or a head's argument on one device with the shape and dtype it takes. None: the
        general loop takes the step (and checks the argument)."""
        if run.head is None:
            return local.pop(run.input) if run.input in local else None
        if run.argument >= len(call.arguments):  # the general loop names what is missing
            return None
        value = self.buffers.peek(call.arguments[run.argument])
        if (
            isinstance(value, jax.Array)
            and type(value.sharding) is SingleDeviceSharding
            and (value.shape, value.dtype) == run.head.signature[0]
        ):
            return value
        return None

    def _run_links(
        self,
        call: pb.ProgramCall,
        known: Plan,
        run: _LinkRun,
        value: Any,
        local: dict[str, Any],
        through: set[str],
        watched: list[str],
        failed: dict[str, str],
        record: _Dispatched,
    ) -> str:
        """Dispatch a run of links from its first input ``value``, as ``_call_nodes`` does its
        nodes; returns the first failure, if any."""
        unsent = record.unsent
        first = len(unsent)
        try:
            for index, function, copy_arguments in run.links:
                started = time.time_ns()
                if copy_arguments is not None:
                    value = _COPY([value], *copy_arguments)[0]
                outputs = function(value)
                value = outputs[0]
                unsent.append((index, outputs, started))
        except Exception as error:  # XLA or JAX refused the call; the links after it fail
            start = run.end - len(run.links) + len(unsent) - first
            failing = known.steps[start].node
            problem = self._node_failure(call, failing, f"{type(error).__name__}: {error}")
            for step in known.steps[start : run.end]:
                self._fail_outputs(call, step, problem, failed)
            return problem
        if run.stored:
            buffer_id = output_id(call, run.output, run.result)
            self.buffers.set(buffer_id, value)
            watched.append(buffer_id)
        else:
            local[run.output] = value
            through.add(run.output)
        return ""

    def _bind(self, step: Step) -> _Bound:
        """A step's function resolved for its devices, the positions of the inputs it may
        take over (a local output at its last read, of an output's shape and layout), how
        its inputs are moved to its device where that takes no checks (see _Moves), and how
        the runtime launches it."""
        node = step.node
        key = (node.function_id, tuple(node.devices))
        function, devices = self._executable(node, key)
        shardings = function.in_shardings
        moves = None
        if (
            step.local_only
            and _COPY is not None
            and len(shardings) == len(step.local_reads)
            and all(isinstance(sharding, SingleDeviceSharding) for sharding in shardings)
        ):
            moves = tuple(
                (name, last, sharding, _copy_arguments(sharding))
                for (name, last), sharding in zip(step.local_reads, shardings, strict=True)
            )
        donatable = tuple(sorted(step.last_reads & function.donatable))
        return _Bound(function, devices, donatable, moves, _launch_path(devices))

    def _node_inputs(
        self, call: pb.ProgramCall, step: Step, local: dict[str, Any], held: list[str]
    ) -> list[Any]:
        """A step's inputs: local outputs (each dropped at its last read), the call's
        arguments and buffers (awaited if not made yet, held meanwhile)."""
        values = []
        for slot, (source, index, name) in enumerate(step.inputs):
            if source is Source.LOCAL:
                values.append(local.pop(name) if slot in step.last_reads else local[name])
                continue
            buffer_id = (
                call.arguments[index] if source is Source.ARGUMENT else output_id(call, name, index)
            )
            if source is Source.WHOLE or buffer_id in self._wholes:  # (an argument held in part)
                buffer_id = WHOLE + buffer_id
            value = self.buffers.peek(buffer_id)
            if value is PENDING:
                value = self._await_input(buffer_id, held)
            values.append(value)
        return values

    def _node_failure(self, call: pb.ProgramCall, node: pb.Computation, message: str) -> str:
        return (
            f"computation {node.name or node.id!r} of call {call.id!r} failed on executor "
            f"{self.index}: {message}"
        )

    def _fail_outputs(
        self, call: pb.ProgramCall, step: Step, failure: str, failed: dict[str, str]
    ) -> None:
        """A node's outputs fail with ``failure``: buffers for their readers anywhere, local
        ones in ``failed`` for the nodes after it here."""
        error = ComputationError(failure)
        for (name, result), stored in zip(step.outputs, step.stored, strict=True):
            if stored:
                self.buffers.fail(output_id(call, name, result), error)
            else:
                failed[name] = failure

    def _executable(
        self, computation: pb.Computation, key: tuple[str, tuple[int, ...]]
    ) -> tuple[Callable, list[jax.Device]]:
        """The function of a computation compiled for its slice's devices, compiling it if
        it is not held (first run there, or dropped as least recently run); held by ``key``
        (function id, island devices)."""
        found = self._functions.get(key)
        if found is not None:
            self._functions.move_to_end(key)
            return found
        devices = self._slice_devices(computation)
        self._hand_over()  # compiling takes a while: completions go on meanwhile
        compiled = self._functions[key] = (
            self.functions.callable(computation.function_id, devices),
            devices,
        )
        while len(self._functions) > self.max_executables:
            self._functions.popitem(last=False)
        return compiled

    @property
    def executables(self) -> int:
        """Compiled functions held, one per function and device set."""
        return len(self._functions)

    def _await_input(self, buffer_id: str, held: list[str]) -> Any:
        """An input not in hand yet (pending, pulled from another executor, or failed),
        waited for while held; raises if it is unknown or failed."""
        if not self.buffers.acquire(buffer_id):
            raise ComputationError(f"unknown buffer {buffer_id!r}")
        held.append(buffer_id)
        if not self.buffers.ready(buffer_id):
            self._hand_over_call()  # completions go on while this input is awaited
        # Not bounded: its producer is ahead of this computation in the island's order (here,
        # or on another executor, pulled until ready while that executor answers; the
        # scheduler tells its loss), and it comes or fails. Bounded, a consumer of another
        # host's long step (another tenant's, say) failed at 120 s for nothing.
        return self.buffers.get(buffer_id, None)

    def _dispatch(
        self,
        command: pb.ExecutorCommand,
        function: Callable,
        arguments: list[Any],
        donations: tuple[int, ...],
        dispatched: int,
    ) -> tuple[_Dispatched, Sequence[Any], tuple[int, ...]]:
        """Hand the computation to the devices, the inputs at ``donations`` becoming its
        outputs' buffers once the variant of the function that takes them over is compiled;
        returns its record, its outputs, and the positions to compile that variant for if it
        is not yet."""
        awaited, outputs, unprepared, through_outputs = self._launch(function, arguments, donations)
        return _Dispatched(command, awaited, dispatched, through_outputs), outputs, unprepared

    def _launch(
        self, function: Callable, arguments: list[Any], donations: tuple[int, ...]
    ) -> tuple[Sequence[Any], Sequence[Any], tuple[int, ...], bool]:
        """Run ``function`` (see ``_dispatch``); returns what is ready once it is done, its
        outputs, the positions to compile a donating variant for, and whether what is
        awaited are the outputs themselves (no token)."""
        run = function.donating(donations) if donations else function.run
        unprepared = ()
        if run is None:  # compiled and run once later, for the computations after this one
            run, unprepared = function.run, donations
        else:
            self.inputs_taken_over += len(donations)
        results = run(*arguments)  # flat where traced here: the outputs, then any token
        if function.token_sharding is not None:
            return results[-1:], results[:-1], unprepared, False
        if function.traced is None:  # a STABLEHLO program's pytree
            results = jax.tree.leaves(results)
        return results, results, unprepared, True

    def _describe(self, command: pb.ExecutorCommand, description: bytes, dispatched: int) -> None:
        """A computation asking what its function compiled to (compiled above, on these
        devices): its one output is the serialized ``pb.CompiledProgram``, as uint8."""
        computation = command.run
        if not description:
            raise ComputationError(
                f"function {computation.function_id[:12]!r} is not a STABLEHLO function: only "
                "those can be described"
            )
        if computation.inputs or len(computation.outputs) != 1:
            raise ComputationError("a describe computation takes no inputs and names one output")
        value = np.frombuffer(description, dtype=np.uint8)
        self.buffers.set(computation.outputs[0], value)
        self.executed.append(computation.id)
        self._dispatched.append(_Dispatched(command, [], dispatched))

    def _bound_outstanding(self, path: str) -> None:
        """Wait, before launching a multi-device computation as ``path`` says, for the oldest
        ones in flight until RESUME_AT are left if MAX_OUTSTANDING are; for all of them if
        they were launched the other way: the runtime orders each way's launches apart, so
        the next could overtake them here and not on another host (a 4-device collective and
        a 2-device one across two hosts hung so, each host in the other's first)."""
        if self._in_flight and path != self._in_flight_path:
            self._await_all_in_flight()
        elif len(self._in_flight) >= MAX_OUTSTANDING:
            self._await_in_flight(len(self._in_flight) - RESUME_AT)

    def _await_all_in_flight(self) -> None:
        """Wait for every multi-device computation in flight."""
        self._await_in_flight(len(self._in_flight))

    def _await_in_flight(self, count: int) -> None:
        """Wait for the oldest ``count`` multi-device computations in flight."""
        if not count:
            return
        self._hand_over()
        done = [self._in_flight.popleft() for _ in range(count)]
        # Newest first: on one device set, once it is done so are the others.
        for awaited in reversed(done):
            for value in awaited:
                # Its failure is reported on completion; a reported computation's outputs
                # may have been taken over since.
                with contextlib.suppress(Exception):
                    value.block_until_ready()

    def _slice_devices(self, computation: pb.Computation) -> list[jax.Device]:
        missing = [d for d in computation.devices if d not in self.devices]
        if missing:
            raise ComputationError(
                f"devices {missing} of computation {computation.name or computation.id!r} are "
                f"not reachable from executor {self.index} (it reaches {sorted(self.devices)}; "
                "slices spanning hosts need the island's executors in one distributed group)"
            )
        return [self.devices[d] for d in computation.devices]

    def _fail(self, command: pb.ExecutorCommand, message: str) -> None:
        computation = command.run
        label = computation.name or computation.id
        error = ComputationError(
            f"computation {label!r} failed on executor {self.index}: {message}"
        )
        for buffer_id in computation.outputs:
            self.buffers.fail(buffer_id, error)
        self.executed.append(computation.id)
        now = time.time_ns()
        self._emit(
            [
                pb.ExecutorEvent(
                    seq=command.seq,
                    computation_id=computation.id,
                    ok=False,
                    message=str(error),
                    start_ns=now,
                    end_ns=now,
                    executor=self.index,
                )
            ]
        )

    def _completion_loop(self, lane: queue.Queue[Any]) -> None:
        """Report finished computations. While the runner has more work in hand, completions
        are held and sent together (one message instead of one per computation: the scheduler
        and clients then spend their time on dispatch, not on events); once the runner has
        run out of work they go out as soon as they are known, and never later than
        ``LINGER_SECONDS`` after the first one finished, so a client waiting on one is never
        kept waiting behind a long queue."""
        held: list[pb.ExecutorEvent] = []
        first = 0.0
        while True:
            timeout = max(0.0, first + LINGER_SECONDS - time.monotonic()) if held else None
            try:
                item = lane.get(timeout=timeout)
            except queue.Empty:
                item = _IDLE  # held long enough
            if isinstance(item, threading.Event):  # what came before it is stamped
                item.set()
                continue
            if isinstance(item, list):
                if not held:
                    first = time.monotonic()
                item.reverse()
                while item:  # each output let go of as soon as it is reported
                    record = item.pop()
                    if record.dispatching and held:
                        # A call still being dispatched may keep this thread a while:
                        # what is known goes first.
                        self._emit(held)
                        held, first = [], time.monotonic()
                    held.append(self._complete(record))
            if item is None:
                self._emit(held)
                return
            if item is not _IDLE:
                busy = not self._idle
                if busy and len(held) < MAX_HELD and time.monotonic() - first < LINGER_SECONDS:
                    continue
            if held:
                self._emit(held)
                held = []

    def _complete(self, record: _Dispatched) -> pb.ExecutorEvent:
        if record.nodes is not None:
            return self._complete_call(record)
        command = record.command
        ok, message = True, ""
        try:
            for awaited in record.awaited:
                awaited.block_until_ready()
        except Exception as error:
            ok, message = False, self._device_failure(command.run, error)
        if record.through_outputs:  # later computations may take them over now
            self._watched.difference_update(command.run.outputs)
        end = time.time_ns()
        start = self._span(record.devices, record.dispatched_ns, end)
        return pb.ExecutorEvent(
            seq=command.seq,
            computation_id=command.run.id,
            ok=ok,
            message=message,
            start_ns=start,
            end_ns=end,
            executor=self.index,
        )

    def _device_failure(self, computation: pb.Computation, error: Exception) -> str:
        """Why a computation failed on the devices: its own error, or, when it read the output
        of one that failed before it (its error passed on by the devices), that failure,
        named once as a failed buffer's is."""
        label = computation.name or computation.id
        with self._failed_lock:
            upstream = next((b for b in computation.inputs if b in self._failed), None)
            if upstream is not None:
                origin = root_cause(self._failed[upstream])
                message = f"buffer {upstream!r}{UPSTREAM}{origin}"
            else:
                message = f"{type(error).__name__}: {error}"
                origin = f"computation {label!r} failed on executor {self.index}: {message}"
        self._note_failed(computation.outputs, origin)
        return message

    def _note_failed(self, buffer_ids: Sequence[str], origin: str) -> None:
        """Outputs of work that failed on the devices, and the first failure behind them."""
        with self._failed_lock:
            for buffer_id in buffer_ids:
                self._failed[buffer_id] = origin
            while len(self._failed) > FAILED_KEPT:
                del self._failed[next(iter(self._failed))]

    def failure_of(self, buffer_id: str) -> str | None:
        """The first failure behind an output of work that failed on the devices here, if it
        is remembered (see FAILED_KEPT)."""
        with self._failed_lock:
            return self._failed.get(buffer_id)

    def _span(self, devices: Sequence[int], dispatched: int, end: int) -> int:
        """When a computation on ``devices`` that was done at ``end`` started: the devices
        start it when it is dispatched or when the previous one on any of them ended,
        whichever is later. (Lanes sharing a device may report out of order: then at most
        ``end``.)"""
        with self._stamp_lock:
            last = self._last_end_ns
            start = min(max([dispatched, *(last.get(d, 0) for d in devices)]), end)
            for device in devices:
                last[device] = max(last.get(device, 0), end)
        return start

    def _stamp(self, event: pb.ExecutorEvent, group: list[_Node], end: int) -> None:
        """Times for a group of a call's nodes, all done by ``end``: each starts once the
        one before it here ended (or when it was dispatched, if later) and takes an even
        share of the time left until ``end``. A group of one is stamped as it ended; a
        group of like nodes (a chain's steps) gets what each took."""
        indices, starts, ends = [], [], []
        with self._stamp_lock:
            last = max(self._last_end_ns.get(d, 0) for d in self._local)
            for position, (index, _, dispatched) in enumerate(group):
                start = min(max(dispatched, last), end)
                last = start + (end - start) // (len(group) - position)
                indices.append(index)
                starts.append(start)
                ends.append(last)
            for device in self._local:
                self._last_end_ns[device] = max(self._last_end_ns.get(device, 0), last)
        event.node_indices.extend(indices)
        event.node_starts_ns.extend(starts)
        event.node_ends_ns.extend(ends)

    def _complete_call(self, record: _Dispatched) -> pb.ExecutorEvent:
        """A program call's report: each node's times here, stamped a group of nodes at a
        time as they are done (see ``_stamp``)."""
        call = record.command.call
        event = pb.ExecutorEvent(
            seq=record.command.seq, computation_id=call.id, executor=self.index
        )
        failed = ""  # the first node failing on the devices
        failing: list[Step] = []
        assert record.nodes is not None
        while (group := record.nodes.get()) is not None:
            in_group = ""
            # The newest first: on one device set, once it is done so are the others.
            for index, awaited, _ in reversed(group):
                try:
                    for value in awaited:
                        value.block_until_ready()
                except Exception as error:  # the group's first failing node is named last
                    assert record.plan is not None  # a call with nodes was planned here
                    step = next(s for s in record.plan.steps if s.index == index)
                    failing.append(step)
                    message = f"{type(error).__name__}: {error}"
                    in_group = self._node_failure(call, step.node, message)
            failed = failed or in_group
            self._stamp(event, group, time.time_ns())
        if failing:
            event.node_failed.extend(sorted(step.index for step in failing))
            # A read of a result they made names the first failure, not the devices' words.
            self._note_failed(
                [
                    output_id(call, name, result)
                    for step in failing
                    for (name, result), stored in zip(step.outputs, step.stored, strict=True)
                    if stored
                ],
                failed,
            )
        failure = record.failure or failed  # a dispatch failure comes first, as before
        if record.watched:  # later computations may take them over now
            self._watched.difference_update(record.watched)
        event.ok, event.message = not failure, failure
        if event.node_indices:
            event.start_ns, event.end_ns = event.node_starts_ns[0], event.node_ends_ns[-1]
        else:
            event.start_ns = event.end_ns = time.time_ns()
        return event
