"""A proxy backend whose work goes through the island schedulers, like every other client's.

Each IFRT session is one client of the island: it connects like the SDK does
(:func:`pathways_client.cluster.connect`, with the client name ``<tenant>.proxy-<id>-<session>``
so island traces show it), binds a virtual slice (through the REST API: a VirtualSlice charged
to the tenant's quota) and shows the client the slice's devices as devices ``0..n-1``. Then:

- arrays are island buffers: host data is uploaded with :meth:`IslandClient.put` (the whole
  array, to the executor of its first device; executors place it where computations need it),
  results of computations are the buffers the island names before they run;
- a ``Compile`` registers the client's portable StableHLO and compile options as a STABLEHLO
  function (device assignment made logical, ``0..n-1``), then asks the island to *describe* it
  on the slice's devices: the executors compile it (on their own devices, cached for the runs)
  and report shardings, layouts and shapes, which the client is told;
- an ``Execute`` is a computation submitted to the island scheduler on the slice's devices with
  the argument buffers: gang-scheduled in the island order, charged to the session's client by
  the island's policy (weights, priorities), recorded in the island trace; its outputs complete
  with the island's completion events;
- ``CopyToHostBuffer`` fetches with :meth:`IslandClient.get`, ``DeleteArray`` frees with
  :meth:`IslandClient.delete`.

The shards of an array (``DisassembleIntoSingleDeviceArrays``) are views of its buffer, uploaded
as buffers of their own only if a computation takes one as an input; reassembling the views of
one buffer gives that buffer back. Other assemblies go through the proxy's memory.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pathways_client.errors import ConnectError, PathwaysError, SliceError
from pathways_client.island_client import IslandBusy, IslandClient, IslandError, IslandUnavailable
from pathways_client.proxy.backend import (
    ArrayEntry,
    ArraySession,
    Backend,
    DeviceInfo,
    ExecutableMetadata,
    Platform,
    Result,
)
from pathways_client.proxy.errors import ProxyError
from pathways_client.proxy.types import (
    Index,
    ShardingSpec,
    normalized_index,
    relabelled,
    shard_indices,
    sharding_devices,
)
from pathways_core.wire import pb

log = logging.getLogger(__name__)

#: How long a fetch or a compile may wait for the island.
RESULT_TIMEOUT_SECONDS = 600.0
STABLEHLO = pb.FunctionRegistration.STABLEHLO
DONATE_INPUT = 3  # xla.ifrt.ArrayCopySemanticsProto.ARRAY_COPY_SEMANTICS_DONATE_INPUT


@dataclass(eq=False)
class _Buffer:
    """An island buffer of the session, shared by the arrays that alias it."""

    id: str
    shape: tuple[int, ...]
    done: Future | None = None  # the producing computation's completion (None: uploaded)
    refs: int = 0
    # The value fetched for the shards (views) of it being read, kept until each view has
    # been read once (a sharded array read by the client is read shard by shard), or while
    # views of it live, for views of the same shard. (Kept while views lived, a sharded
    # array read once pinned a host copy of it in the proxy for the array's life: JAX keeps
    # its shards as long as the array.)
    host: np.ndarray | None = None
    viewers: int = 0
    read: set[str] = field(default_factory=set)  # the views (their index) read since fetched
    # Held while its value is fetched for views: the shards the client reads at once wait for
    # one fetch (each fetched the whole value: 8 shards, 8 times the array's bytes).
    fetching: threading.Lock = field(default_factory=threading.Lock)


@dataclass(eq=False)
class _Array(ArrayEntry):
    """A client's array: (a shard of) an island buffer (None: failed, or freed)."""

    shape: tuple[int, ...] = ()
    dtype: np.dtype = field(default_factory=lambda: np.dtype(np.float32))
    spec: ShardingSpec = field(default_factory=lambda: ShardingSpec((0,)))
    buffer: _Buffer | None = None
    index: Index | None = None  # this array is buffer[index] (a shard); None: the whole value
    own: _Buffer | None = None  # a shard uploaded as a buffer of its own (a computation input)


@dataclass
class _Executable:
    """A program registered on the island and what its executors compiled it to."""

    function_id: str
    client_devices: list[int]  # the session's device ids, in the assignment's order
    island_devices: list[int]
    info: Any  # pb.CompiledProgram


Connector = Callable[[str], Any]  # client name -> pathways_client.cluster.Cluster


class IslandBackend(Backend):
    """Sessions on virtual slices of islands (see the module docstring).

    ``connector(client)`` opens a :class:`~pathways_client.cluster.Cluster` for one session;
    every session binds a slice of ``devices`` devices (on ``island``, or wherever it fits), or
    takes the slice already bound under ``slice_name``."""

    def __init__(
        self,
        connector: Connector,
        devices: int = 4,
        *,
        island: str | None = None,
        slice_name: str | None = None,
        tenant: str = "default",
        platform: Platform | None = None,
        device_kind: str = "cpu",
        owner: str | None = None,
    ) -> None:
        """``owner``: the island client name of the program this proxy serves, whose sessions
        are then ``<owner>+proxy-...`` (its session credentials open those; see
        :mod:`pathways_core.wire.credentials`)."""
        if devices < 1:
            raise ValueError(f"devices must be at least 1, not {devices}")
        self.connector = connector
        self.size = devices
        self.island = island
        self.slice_name = slice_name
        self.tenant = tenant
        self.device_kind = device_kind
        if platform is not None:
            self.platform = platform
        # Names this proxy's clients apart from another proxy's of the same tenant.
        tag = f"proxy-{uuid.uuid4().hex[:6]}"
        self.prefix = f"{owner}+{tag}" if owner else f"{tenant}.{tag}"
        self.compile_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="proxy-compile")

    def devices(self) -> list[DeviceInfo]:
        return [
            DeviceInfo(id=i, kind=self.device_kind, platform=self.platform.name)
            for i in range(self.size)
        ]

    def open_session(self, session: Any) -> IslandSession:
        return IslandSession(self, session)

    def probe(self) -> dict[str, Any]:
        """Open a session and bind its slice once: the island's platform and the slice's size.
        Adopts both (the devices every session sees); raises ``PathwaysError`` when the
        cluster cannot be reached or the slice cannot be bound."""
        cluster = self.connector(f"{self.prefix}-probe")
        try:
            bound = self._bind(cluster)
            executors = cluster.session(bound.island).info.executors
            platform = (executors[0].platform if executors else "") or "cpu"
            found = {"island": bound.island, "devices": list(bound.devices), "platform": platform}
            if self.slice_name is None:
                bound.release()
        finally:
            cluster.close()
        self.size = len(found["devices"])
        self.platform = Platform(name=platform, version=platform)
        self.device_kind = platform
        return found

    def _bind(self, cluster: Any) -> Any:
        if self.slice_name is not None:
            return cluster.slice(self.slice_name)
        return cluster.slice(devices=self.size, island=self.island)


class IslandSession(ArraySession):
    """One IFRT session: one client of the island, on its own virtual slice."""

    backend: IslandBackend
    array_type = _Array

    def __init__(self, backend: IslandBackend, session: Any) -> None:
        super().__init__(backend, session)
        self.client = f"{backend.prefix}-{session.number}"
        self.cluster: Any = None
        self.slice: Any = None
        self._island: IslandClient | None = None

    # -- the session's slice -------------------------------------------------------------------

    def handle_init_request(self, request: Any) -> Any:
        """``InitRequest``: connect to the island as this session's client and bind its slice;
        the client sees the slice's devices as ``0..n-1``."""
        if self._island is None:
            self._open()
        return super().handle_init_request(request)

    def _open(self) -> None:
        try:
            cluster = self.backend.connector(self.client)
        except PathwaysError as error:
            raise ProxyError(
                "UNAVAILABLE", f"the Pathways cluster did not answer: {error}"
            ) from None
        try:
            bound = self.backend._bind(cluster)
            island = cluster.session(bound.island)
        except ConnectError as error:  # the island (or the API) did not answer
            cluster.close()
            raise ProxyError(
                "UNAVAILABLE", f"the Pathways cluster did not answer: {error}"
            ) from None
        except PathwaysError as error:
            cluster.close()
            raise ProxyError(
                "RESOURCE_EXHAUSTED", f"no virtual slice for this session: {error}"
            ) from None
        if bound.size != self.backend.size:
            cluster.close()
            raise ProxyError(
                "FAILED_PRECONDITION",
                f"slice {bound.name!r} has {bound.size} devices; this proxy serves "
                f"{self.backend.size}",
            )
        self.cluster, self.slice, self._island = cluster, bound, island
        log.info(
            "session %d: client %s on island %s devices %s",
            self.session.number,
            self.client,
            bound.island,
            list(bound.devices),
        )

    @property
    def island(self) -> IslandClient:
        if self._island is None:
            raise ProxyError("FAILED_PRECONDITION", "the session has not been initialized (Init)")
        if self.slice is not None:  # released by the cluster (its lease), or maybe: no more
            try:
                self.slice.cluster_or_fail()
            except SliceError as error:
                raise ProxyError("UNAVAILABLE", str(error)) from None
        return self._island

    def island_device(self, device: int, field_name: str) -> int:
        """The island device id of the session's device ``device``."""
        if self._island is None:  # no devices yet: said as such, not "not a device (0..-1)"
            raise ProxyError("FAILED_PRECONDITION", "the session has not been initialized (Init)")
        devices = self.slice.devices if self.slice is not None else ()
        if not 0 <= device < len(devices):
            raise ProxyError(
                "INVALID_ARGUMENT",
                f"{field_name}: device id {device} is not a device of this session "
                f"(0..{len(devices) - 1})",
            )
        return int(devices[device])

    def close(self) -> None:
        """End the island session: the island frees the session's buffers; the slice is
        released (through the API: its VirtualSlice is deleted)."""
        super().close()
        cluster, self.cluster, self._island = self.cluster, None, None
        if cluster is not None:
            try:
                if self.slice is not None and self.backend.slice_name is None:
                    self.slice.release()
                cluster.close()
            except Exception:
                log.exception("session %d: closing its island session failed", self.session.number)

    # -- buffers and arrays --------------------------------------------------------------------

    def _upload(self, value: np.ndarray, spec: ShardingSpec, field_name: str) -> _Buffer:
        """Upload a host array to the executor of the sharding's first device."""
        device = self.island_device(spec.device_ids[0], field_name)
        try:
            # Not np.ascontiguousarray: it makes a scalar an array of shape (1,).
            buffer_id = self.island.put(np.array(value, order="C", copy=None), device)
        except Exception as error:
            raise ProxyError(
                "UNAVAILABLE", f"uploading to island {self.slice.island!r} failed: {_why(error)}"
            ) from None
        return _Buffer(buffer_id, tuple(value.shape))

    def _hold(self, array: _Array) -> None:
        for buffer in (array.buffer, array.own):
            if buffer is not None:
                buffer.refs += 1
        if array.index is not None and array.buffer is not None:
            array.buffer.viewers += 1

    def _drop(self, array: _Array) -> None:
        """The array no longer holds its buffers; the island frees those no array holds."""
        freed = []
        if array.index is not None and array.buffer is not None:
            array.buffer.viewers -= 1
            if array.buffer.viewers <= 0:
                array.buffer.host = None
        for buffer in (array.buffer, array.own):
            if buffer is not None:
                buffer.refs -= 1
                if buffer.refs == 0:
                    freed.append(buffer.id)
        array.buffer = array.own = None
        if freed and self._island is not None:
            self._island.delete(freed)

    # DeleteArray frees the array's buffers (once the computations queued before have used
    # them); DestructArray frees those only the forgotten array held.
    _free = _forget = _drop

    def _store(self, handle: int, array: _Array) -> int:
        handle = handle or self.new_handle()
        with self._lock:
            self._hold(array)
            previous = self.arrays.get(handle)
            self.arrays[handle] = array
        if previous is not None:
            with self._lock:
                self._drop(previous)
        return handle

    def _check_sharding(self, spec: ShardingSpec, field_name: str) -> None:
        for device in spec.device_ids:
            self.island_device(device, field_name)

    def _fetch(self, buffer: _Buffer) -> np.ndarray:
        """A buffer's value on the host, once computed."""
        # Completed first: a computation the island refused (busy) is reported at once, not
        # after the executor gave up waiting for a buffer it never heard of.
        _wait(buffer.done, "array")
        try:
            return self.island.get(buffer.id, timeout=RESULT_TIMEOUT_SECONDS)
        except (IslandError, OSError) as error:
            raise ProxyError(_code(error), f"array: {_why(error)}") from None

    def _viewed(self, buffer: _Buffer, index: Index) -> np.ndarray:
        """A view (shard) of a buffer's value, fetched once for the views read one after
        another, and let go once each has been read."""
        with buffer.fetching:
            if buffer.host is None:
                buffer.host, buffer.read = self._fetch(buffer), set()
            value = buffer.host[index]
            buffer.read.add(repr(index))
            if len(buffer.read) >= buffer.viewers:
                buffer.host = None
            return value

    def _value(self, array: _Array) -> np.ndarray:
        assert array.buffer is not None
        return self._value_of(array.buffer, array.index)

    def _value_of(self, buffer: _Buffer, index: Index | None) -> np.ndarray:
        return self._fetch(buffer) if index is None else self._viewed(buffer, index)

    def _input(self, array: _Array, field_name: str) -> str:
        """The island buffer holding ``array``'s value (a shard is uploaded once, when first
        a computation takes it)."""
        assert array.buffer is not None
        if array.index is None:
            return array.buffer.id
        if array.own is None:
            own = self._upload(self._value(array), array.spec, field_name)
            with self._lock:
                own.refs += 1
                array.own = own
        return array.own.id

    # -- array requests ------------------------------------------------------------------------

    def _from_host(self, value: np.ndarray, spec: ShardingSpec, field_name: str) -> _Array:
        """A host value, uploaded to the island."""
        buffer = self._upload(value, spec, field_name)
        return _Array(tuple(value.shape), value.dtype, spec, buffer)

    def _from_shards(
        self,
        dtype: np.dtype,
        shape: tuple[int, ...],
        spec: ShardingSpec,
        shards: Iterator[tuple[int, np.ndarray]],
        where: str,
    ) -> _Array:
        """The array assembled from its shards' host buffers, uploaded whole."""
        self._check_sharding(spec, f"{where}.array_spec.sharding")
        indices = shard_indices(spec, shape)
        whole = np.empty(shape, dtype)
        covered = [False] * len(indices)
        for position, host in shards:
            target = whole[indices[position]]
            if target.shape != host.shape:
                raise ProxyError(
                    "INVALID_ARGUMENT",
                    f"{where}: the host buffer of shard {position} has shape "
                    f"{list(host.shape)}; the sharding gives it {list(target.shape)}",
                )
            whole[indices[position]] = host
            covered[position] = True
        missing = [p for p, done in enumerate(covered) if not done]
        if missing:
            raise ProxyError("INVALID_ARGUMENT", f"{where}: no host buffer for shards {missing}")
        buffer = self._upload(whole, spec, f"{where}.array_spec.sharding")
        return _Array(shape, dtype, spec, buffer)

    def _disassemble(self, array: _Array) -> list[_Array]:
        """One array per device of its sharding: the whole buffer where a device holds all of
        it, else a view."""
        if len(array.spec.device_ids) == 1:
            return [_alias(array)]
        parts = []
        for position, index in enumerate(shard_indices(array.spec, array.shape)):
            spec = ShardingSpec((array.spec.device_ids[position],), array.spec.memory_kind)
            shard = _slice_shape(array.shape, index)
            full = shard == array.shape and array.index is None
            view = None if full else _compose(array.index, index, array.shape)
            parts.append(_Array(shard, array.dtype, spec, array.buffer, view))
        return parts

    def _assemble(self, parts: list[_Array], spec: ShardingSpec, shape: tuple[int, ...]) -> _Array:
        """The buffer the parts are views of, when they are exactly its shards; otherwise
        assembled on the host and uploaded."""
        self._check_sharding(spec, "sharding")
        indices = shard_indices(spec, shape)
        if len(parts) != len(indices):
            raise ProxyError(
                "INVALID_ARGUMENT",
                f"single_device_array_handles has {len(parts)} arrays for a sharding of "
                f"{len(indices)} devices",
            )
        dtype = parts[0].dtype if parts else np.dtype(np.float32)
        source = parts[0].buffer if parts else None
        if (
            source is not None
            and source.shape == shape
            and all(
                p.buffer is source
                and normalized_index(p.index, shape) == normalized_index(index, shape)
                for p, index in zip(parts, indices, strict=True)
            )
        ):
            # The views of one buffer, put back together: that buffer.
            return _Array(shape, dtype, spec, source)
        value = np.empty(shape, dtype)
        for i, (part, index) in enumerate(zip(parts, indices, strict=True)):
            target = value[index]
            if target.shape != part.shape:
                raise ProxyError(
                    "INVALID_ARGUMENT",
                    f"single_device_array_handles[{i}] has shape {list(part.shape)}; the "
                    f"sharding gives it {list(target.shape)}",
                )
            value[index] = self._value(part)
        return _Array(shape, dtype, spec, self._upload(value, spec, "sharding"))

    def _fully_replicated(self, array: _Array) -> bool:
        return _replicated(array.spec)

    def _first_shard(self, array: _Array) -> _Array:
        """The same buffer, on the sharding's first device."""
        return _alias(array, ShardingSpec((array.spec.device_ids[0],), array.spec.memory_kind))

    def _copy(
        self, array: _Array, device_ids: tuple[int, ...], memory_kind: str, field_name: str
    ) -> _Array:
        """The same buffer, on other devices of the session (executors move the value when
        computations use it there)."""
        spec = array.spec
        if device_ids:
            if len(device_ids) != len(spec.device_ids):
                raise ProxyError(
                    "INVALID_ARGUMENT",
                    f"device_ids has {len(device_ids)} devices; {field_name} is on "
                    f"{len(spec.device_ids)}",
                )
            spec = ShardingSpec(device_ids, spec.memory_kind, spec.op_sharding, spec.replicated)
            self._check_sharding(spec, "device_ids")
        if memory_kind:
            spec = ShardingSpec(spec.device_ids, memory_kind, spec.op_sharding, spec.replicated)
        return _alias(array, spec)

    def handle_remap_arrays_request(self, request: Any) -> Any:
        """``RemapArrays``, for what JAX sends it for: an array's shards relabelled for its
        devices listed in another order (``jax.device_put`` onto a mesh of the same devices
        reordered), each device keeping its shard: the output shares the buffer. Plans that
        split or join arrays, or move a shard to another device, are UNIMPLEMENTED saying so."""
        handles = list(request.result_handles)
        plan = request.plan

        def build() -> list[int]:
            inputs = [
                self.array(h, f"array_handles[{i}]") for i, h in enumerate(request.array_handles)
            ]
            out = []
            for k, output in enumerate(plan.output_specs):
                where = f"plan.output_specs[{k}]"
                mappings = [m for m in plan.mappings if m.out_array == k]
                if len(mappings) != 1 or not 0 <= mappings[0].in_array < len(inputs):
                    raise ProxyError(
                        "UNIMPLEMENTED",
                        f"{where}: made of {len(mappings)} mappings; the Pathways proxy remaps "
                        "one input array's shards onto one output",
                    )
                source = inputs[mappings[0].in_array]
                devices, memory_kind = sharding_devices(self.p, output.sharding, where)
                if tuple(output.shape.dims) != tuple(source.shape):
                    raise ProxyError(
                        "INVALID_ARGUMENT",
                        f"{where}.shape: {list(output.shape.dims)}, not its input's "
                        f"{list(source.shape)}",
                    )
                _check_devices_kept(mappings[0], source.spec.device_ids, devices, where)
                spec = relabelled(source.spec, devices, memory_kind)
                self._check_sharding(spec, f"{where}.sharding")
                out.append(self._store(handles[k] if handles else 0, _alias(source, spec)))
            if request.copy_semantics == DONATE_INPUT:  # the outputs hold the buffers now
                with self._lock:
                    for source in inputs:
                        self._delete(source)
            return out

        response = self.p.RemapArraysResponse()
        response.array_handles.extend(self._failing(handles, build))
        return response

    def _reader(self, array: _Array) -> Callable[[], np.ndarray]:
        """The array's value fetched from the island, when computed: what it holds now (a
        delete meanwhile does not change what is read)."""
        buffer, index = array.buffer, array.index
        if buffer is None:
            raise ProxyError("FAILED_PRECONDITION", "array: it was deleted")
        return lambda: self._value_of(buffer, index)

    def _when_ready(self, arrays: list[_Array], response: Callable[[], Any]) -> Future:
        """Answered when the island has completed every value."""
        pending = [a.buffer.done for a in arrays if a.buffer is not None and a.buffer.done]
        return _all_done(pending, response)

    # -- executables ---------------------------------------------------------------------------

    def _start_compile(self, program: bytes, options: Any, devices: list[int]) -> Future:
        """Register the program with the island and have its executors compile it for the
        session's devices; answered with what they compiled."""
        assignment = options.compile_options.executable_build_options.device_assignment
        if assignment.computation_devices:
            # Logical ids: the program is the same whichever devices run it (registered once).
            replicas, computations = assignment.replica_count, assignment.computation_count
            for c in range(computations):
                ids = assignment.computation_devices[c].replica_device_ids
                for r in range(replicas):
                    ids[r] = r * computations + c
        if len(set(devices)) != len(devices):
            raise ProxyError(
                "INVALID_ARGUMENT",
                f"compile_options.device_assignment names a device twice: {devices}",
            )
        island_devices = [
            self.island_device(d, "compile_options.device_assignment") for d in devices
        ]
        artifact = pb.StableHloProgram(
            module=program,
            compile_options=options.compile_options.SerializeToString(deterministic=True),
        ).SerializeToString(deterministic=True)
        return self.backend.compile_pool.submit(
            self._compile, artifact, list(devices), island_devices
        )

    def _compile(self, artifact: bytes, devices: list[int], island_devices: list[int]) -> Any:
        island = self.island
        label = f"proxy-{hashlib.sha256(artifact).hexdigest()[:12]}"
        try:
            function_id = island.register(
                artifact, label, timeout=RESULT_TIMEOUT_SECONDS, kind=STABLEHLO
            )
        except (IslandError, TimeoutError) as error:
            raise ProxyError(
                _blame(error, "INVALID_ARGUMENT"), f"program: the island refused it: {_why(error)}"
            ) from None
        submitted = island.submit(function_id, island_devices, [], 1, name="compile", describe=True)
        try:
            try:
                submitted.wait(RESULT_TIMEOUT_SECONDS)
            except IslandBusy as error:
                raise ProxyError("RESOURCE_EXHAUSTED", f"program: {error}") from None
            except (IslandError, TimeoutError) as error:
                raise ProxyError(
                    _blame(error, "INVALID_ARGUMENT"), f"program: compilation failed: {_why(error)}"
                ) from None
            try:
                raw = island.get(submitted.outputs[0], timeout=RESULT_TIMEOUT_SECONDS)
                info = pb.CompiledProgram.FromString(np.ascontiguousarray(raw).tobytes())
            except (IslandError, OSError, ValueError) as error:
                raise ProxyError(
                    "INTERNAL", f"program: reading what it compiled to: {error}"
                ) from None
        finally:
            island.delete(list(submitted.outputs))
        entry = _Executable(function_id, devices, island_devices, info)
        return self._compiled(entry, info.name, devices, info.fingerprint or None)

    def _metadata(self, executable: _Executable) -> ExecutableMetadata:
        """What the executors compiled the program to."""
        info = executable.info
        return ExecutableMetadata(
            parameter_shardings=[a.sharding for a in info.parameters]
            if info.parameter_shardings
            else None,
            result_shardings=[a.sharding for a in info.results] if info.result_shardings else None,
            parameter_layouts=[list(a.minor_to_major) for a in info.parameters],
            result_layouts=[list(a.minor_to_major) for a in info.results],
            result_memory_kinds=[[a.memory_kind or "device" for a in info.results]],
            generated_code_bytes=info.generated_code_bytes,
        )

    def _parameters(self, executable: _Executable) -> int:
        return len(executable.info.parameters)

    def _donated(self, executable: _Executable) -> Sequence[int]:
        return executable.info.donated_parameters

    def _results(self, executable: _Executable) -> list[Result]:
        return [
            (tuple(result.shape), np.dtype(result.dtype), _result_spec(executable, i))
            for i, result in enumerate(executable.info.results)
        ]

    def handle_loaded_executable_execute_request(self, request: Any) -> Any:
        """``LoadedExecutableExecute``: a computation on the island with the argument buffers;
        the outputs get the client's handles at once and complete with the island's events."""
        # An unknown executable fails the request alone (no result array or status is kept).
        self.executable(request.loaded_executable_handle)
        return super().handle_loaded_executable_execute_request(request)

    def _launch(
        self,
        executable: _Executable,
        args: list[_Array],
        results: list[Result],
        result_handles: list[int],
    ) -> tuple[list[int], Future]:
        for i, (arg, parameter) in enumerate(zip(args, executable.info.parameters, strict=True)):
            if arg.shape != tuple(parameter.shape) or arg.dtype.name != parameter.dtype:
                raise ProxyError(
                    "INVALID_ARGUMENT",
                    f"args_handles[{i}] is {arg.dtype.name}{list(arg.shape)}; the executable "
                    f"takes {parameter.dtype}{list(parameter.shape)}",
                )
        inputs = [self._input(a, f"args_handles[{i}]") for i, a in enumerate(args)]
        submitted = self.island.submit(
            executable.function_id,
            executable.island_devices,
            inputs,
            len(results),
            name=executable.info.name,
        )
        handles = []
        for i, (buffer_id, (shape, dtype, spec)) in enumerate(
            zip(submitted.outputs, results, strict=True)
        ):
            array = _Array(shape, dtype, spec, _Buffer(buffer_id, shape, submitted.done))
            handles.append(self._store(result_handles[i] if result_handles else 0, array))
        return handles, _all_done([submitted.done], lambda: None)

    def _program_text(self, executable: _Executable) -> str:
        """The optimized HLO the executors made."""
        return executable.info.hlo_text

    def _costs(self, executable: _Executable) -> Mapping[str, float]:
        """From the executors."""
        return executable.info.cost_analysis


# -- helpers -------------------------------------------------------------------------------------


def _slice_shape(shape: tuple[int, ...], index: Index) -> tuple[int, ...]:
    return tuple(max(0, s.stop - s.start) for s in normalized_index(index, shape))


def _compose(outer: Index | None, inner: Index, shape: tuple[int, ...]) -> Index:
    """``inner`` (an index into a view ``buffer[outer]``) as an index into the buffer."""
    if outer is None:
        return normalized_index(inner, shape)
    view_shape = _slice_shape(shape, outer)
    inner = normalized_index(inner, view_shape)
    return tuple(
        slice(o.start + i.start, o.start + i.stop) for o, i in zip(outer, inner, strict=True)
    )


def _alias(array: _Array, spec: ShardingSpec | None = None) -> _Array:
    """Another array over the same buffer (and shard)."""
    return _Array(
        array.shape, array.dtype, spec or array.spec, array.buffer, array.index, array.own
    )


def _replicated(spec: ShardingSpec) -> bool:
    if spec.op_sharding is None or len(spec.device_ids) == 1:
        return True
    from jax._src.lib import xla_client as xc

    op = xc.OpSharding()
    op.ParseFromString(spec.op_sharding)
    return xc.HloSharding.from_proto(op).is_replicated()


def _result_spec(entry: _Executable, i: int) -> ShardingSpec:
    result = entry.info.results[i]
    return ShardingSpec(
        tuple(entry.client_devices),
        result.memory_kind,
        result.sharding if entry.info.result_shardings else None,
    )


def _wait(done: Future | None, what: str) -> None:
    if done is None:
        return
    try:
        done.result(RESULT_TIMEOUT_SECONDS)
    except (IslandError, TimeoutError) as error:
        raise ProxyError(_code(error), f"{what}: {_why(error)}") from None


def _code(error: BaseException) -> str:
    """The status code a failure of the island's reaches the client with: an island too busy
    or devices out of memory (the executor's JAX says ``RESOURCE_EXHAUSTED``, as plain JAX
    raises it) are ``RESOURCE_EXHAUSTED``, an island gone (its session ended, an executor
    lost) ``UNAVAILABLE``, the rest ``INTERNAL``."""
    exhausted = isinstance(error, IslandBusy) or "RESOURCE_EXHAUSTED" in str(error)
    return "RESOURCE_EXHAUSTED" if exhausted else _blame(error, "INTERNAL")


def _blame(error: BaseException, otherwise: str) -> str:
    """``UNAVAILABLE`` when the island, not the request, failed it; else ``otherwise``."""
    return "UNAVAILABLE" if isinstance(error, IslandUnavailable) else otherwise


def _all_done(futures: list[Future], make: Callable[[], Any]) -> Future:
    """A future of ``make()`` once every future is done, or of the first failure (as a
    ``ProxyError``); waits on callbacks, not threads."""
    out: Future = Future()
    remaining = [len(futures)]
    lock = threading.Lock()
    if not futures:
        out.set_result(make())
        return out

    def done(f: Future) -> None:
        error = f.exception()
        with lock:
            remaining[0] -= 1
            last = remaining[0] == 0
        if out.done():
            return
        if error is not None:
            code = _code(error)
            with _suppress_set():
                out.set_exception(ProxyError(code, _why(error)))
        elif last:
            with _suppress_set():
                out.set_result(make())

    for future in futures:
        future.add_done_callback(done)
    return out


class _suppress_set:
    """Ignore a second outcome set on a future (two callbacks racing)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, error: Any, trace: Any) -> bool:
        from concurrent.futures import InvalidStateError

        return kind is not None and issubclass(kind, InvalidStateError)


def _why(error: BaseException) -> str:
    return str(error) or type(error).__name__


__all__ = ["IslandBackend", "IslandSession", "shard_indices"]


def _check_devices_kept(
    mapping: Any, before: Sequence[int], after: Sequence[int], where: str
) -> None:
    """UNIMPLEMENTED unless ``mapping`` takes every shard of an array on devices ``before`` to
    the place of the same device in ``after``."""
    pairs: list[tuple[int, int]] = []
    intervals = zip(
        *(mapping.from_start, mapping.from_end, mapping.from_step),
        *(mapping.to_start, mapping.to_end, mapping.to_step),
        strict=False,
    )
    for start, end, step, to_start, to_end, to_step in intervals:
        sources, targets = range(start, end, step or 1), range(to_start, to_end, to_step or 1)
        # Measured before any pair is made: a 96-byte request naming 10**7 shards grew the
        # proxy by 1.3 GB before it was refused (10**12: all its memory).
        if len(sources) != len(targets) or len(pairs) + len(sources) > len(after):
            pairs.clear()
            break
        pairs += zip(sources, targets, strict=True)
    kept = all(
        0 <= i < len(before) and 0 <= j < len(after) and before[i] == after[j] for i, j in pairs
    )
    if not kept or len(before) != len(after) or len({j for _, j in pairs}) != len(after):
        raise ProxyError(
            "UNIMPLEMENTED",
            f"{where}: the Pathways proxy remaps an array's shards only onto the devices "
            "holding them (the same devices listed in another order)",
        )
