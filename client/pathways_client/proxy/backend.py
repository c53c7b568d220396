"""What a proxy session runs on: the devices it shows the client and the work it does.

A :class:`Backend` describes the devices a client sees (``InitResponse``) and opens one
:class:`SessionState` per session; the state has one ``handle_<request>`` method per IFRT request
kind it supports (``handle_init_request``, ``handle_compile_request``, ...). A request kind with no
method is answered ``UNIMPLEMENTED`` with its name.

:class:`ArraySession` handles the requests on arrays and executables for a backend that holds
them: the handles, the checks of each request and the shape of each answer are the same for
every such backend; where arrays live and how programs compile and run are its subclass's.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from pathways_client.proxy.errors import ProxyError
from pathways_client.proxy.types import (
    ShardingSpec,
    decode_sharding,
    default_layout,
    dtype_kind,
    encode_hlo_sharding,
    fill_dtype,
    from_host_buffer,
    to_host_buffer,
    to_numpy_dtype,
)

if TYPE_CHECKING:
    from pathways_client.proxy.session import Session

#: Memory kinds of a PjRt CPU device, in the order their ids are given (kind ids 0, 1, 2).
CPU_MEMORY_KINDS = ("device", "pinned_host", "unpinned_host")
_MEMORY_NAMES = {
    "device": ("CpuDeviceMemory", "CPU_DEVICE"),
    "pinned_host": ("PinnedHostMemory", "PINNED_HOST"),
    "unpinned_host": ("UnpinnedHostMemorySpace", "UNPINNED_HOST"),
}
#: Server-generated handles start here; the client mints its own below this.
SERVER_HANDLES_START = 1 << 63
# Threads copying one session's values to the host (each session its own: one session's many
# large reads at once held up every other session's small ones, up to a second).
COPY_THREADS = 4
#: The program and compile-option kinds a ``Compile`` may carry (``xla.ifrt.Serialized``).
XLA_PROGRAM = "xla::ifrt::XlaProgram"
XLA_COMPILE_OPTIONS = "xla::ifrt::XlaCompileOptions"


@dataclass(frozen=True)
class DeviceInfo:
    """A device as the client sees it."""

    id: int
    kind: str = "cpu"
    platform: str = "cpu"
    attributes: dict[str, str | int | bool | float] = field(default_factory=dict)


@dataclass(frozen=True)
class Platform:
    """The platform the client sees; JAX lowers programs for ``name``."""

    name: str = "cpu"
    version: str = "cpu"
    id: int = 0
    runtime_type: str = "pjrt_ifrt"


class Backend:
    """Devices and work behind the proxy; subclasses implement the sessions' requests."""

    platform = Platform()

    def devices(self) -> list[DeviceInfo]:
        """The devices every session of this backend sees."""
        raise NotImplementedError

    def open_session(self, session: Session) -> SessionState:
        """The per-session state answering the session's requests."""
        return SessionState(self, session)


class SessionState:
    """Per-session handlers common to every backend: init and futures."""

    def __init__(self, backend: Backend, session: Session) -> None:
        self.backend = backend
        self.session = session
        self.p = session.protocol
        self._handles = itertools.count(SERVER_HANDLES_START)
        self._lock = threading.Lock()
        self.futures: dict[int, Future] = {}

    def close(self) -> None:
        """Free everything the session holds."""

    def new_handle(self) -> int:
        """A server-generated handle (above every client-generated one)."""
        with self._lock:
            return next(self._handles)

    def add_future(self, future: Future, handle: int | None = None) -> int:
        """Keep ``future`` for a later ``CheckFuture``; returns its handle."""
        handle = handle if handle else self.new_handle()
        with self._lock:
            self.futures[handle] = future
        return handle

    # -- handlers ------------------------------------------------------------------------------

    def handle_init_request(self, request: Any) -> Any:
        """``InitRequest``: the platform, devices and memories this session may use."""
        p, backend = self.p, self.backend
        response = p.InitResponse()
        response.session_id = self.session.session_id
        response.platform_name = backend.platform.name
        response.platform_version = backend.platform.version
        response.platform_id = backend.platform.id
        response.process_index = 0
        response.runtime_type = backend.platform.runtime_type
        memory_ids = itertools.count()
        for index, device in enumerate(backend.devices()):
            d = response.all_devices.add()
            d.id = device.id
            d.local_device_id = index
            d.local_hardware_id = index
            d.platform_name = device.platform
            d.device_kind = device.kind
            d.debug_string = f"{device.platform}:{device.id}"
            d.to_string = f"{device.platform.capitalize()}Device(id={device.id})"
            _attributes(d.attributes, device.attributes)
            for kind_id, kind in enumerate(CPU_MEMORY_KINDS):
                memory_id = next(memory_ids)
                d.memory_ids.append(memory_id)
                if kind_id == 0:
                    d.default_memory_id = memory_id
                m = response.memories.add()
                m.id = memory_id
                m.memory_space_kind = kind
                m.kind_id = kind_id
                m.device_ids.append(device.id)
                debug, short = _MEMORY_NAMES.get(kind, (kind, kind.upper()))
                m.debug_string = f"{debug}(id={memory_id}, process_index=0, client=proxy)"
                m.to_string = f"{short}_{memory_id}"
            response.addressable_device_ids.append(device.id)
            response.primary_device_ids.append(device.id)
        return response

    def handle_check_future_request(self, request: Any) -> Future:
        """``CheckFutureRequest``: answered when the future completes (once per future)."""
        with self._lock:
            future = self.futures.pop(request.future_handle, None)
        if future is None:
            raise ProxyError("NOT_FOUND", f"future_handle {request.future_handle} is unknown")
        return answer_when_done(future, self.p.CheckFutureResponse)


def _attributes(proto: Any, values: dict[str, str | int | bool | float]) -> None:
    """Fill an ``xla.ifrt.AttributeMapProto``."""
    for key, value in values.items():
        entry = proto.attributes[key]
        if isinstance(value, bool):
            entry.bool_value = value
        elif isinstance(value, int):
            entry.int64_value = value
        elif isinstance(value, float):
            entry.float_value = value
        else:
            entry.string_value = str(value).encode()


def answer_when_done(future: Future, response: Callable[[], Any]) -> Future:
    """A future of ``response()`` once ``future`` succeeds, or of its error."""
    out: Future = Future()

    def done(f: Future) -> None:
        error = f.exception()
        if error is not None:
            out.set_exception(error)
        else:
            out.set_result(response())

    future.add_done_callback(done)
    return out


def completed(value: Any = None, error: BaseException | None = None) -> Future:
    """A future that is already done."""
    future: Future = Future()
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)
    return future


class StaticBackend(Backend):
    """Devices only (no execution): answers the handshake, device listing and host buffers."""

    def __init__(self, devices: list[DeviceInfo], platform: Platform | None = None) -> None:
        self._devices = list(devices)
        if platform is not None:
            self.platform = platform

    def devices(self) -> list[DeviceInfo]:
        return list(self._devices)


# -- arrays and executables ----------------------------------------------------------------------


@dataclass(kw_only=True, eq=False)
class ArrayEntry:
    """A session's array as an :class:`ArraySession` keeps it; subclasses say where its value
    lives. ``error``: the error that made it (reported whenever it is used). Entries compare
    by identity."""

    error: ProxyError | None = None
    deleted: bool = False


#: A result of an executable as the client is told it: global shape, dtype and sharding.
Result = tuple[tuple[int, ...], np.dtype, ShardingSpec]


@dataclass(frozen=True)
class ExecutableMetadata:
    """What ``LoadedExecutableMetadata`` tells the client about a compiled program."""

    # Serialized xla.OpSharding per parameter / result; None when none is reported (a program
    # on one device).
    parameter_shardings: list[bytes] | None
    result_shardings: list[bytes] | None
    parameter_layouts: list[list[int]]  # minor_to_major of each parameter
    result_layouts: list[list[int]]
    result_memory_kinds: list[list[str]]
    generated_code_bytes: int


class ArraySession(SessionState):
    """The requests on arrays and executables, answered the same way by every backend that holds
    them: handles (client-named or server-generated), the checks of each request, errors naming
    the field, arrays of a failed request carrying its error, and the answers' shape.

    A subclass says where arrays live and how programs compile and run, in the methods below
    that raise ``NotImplementedError``; its arrays are ``array_type`` entries."""

    array_type: type[ArrayEntry] = ArrayEntry

    def __init__(self, backend: Backend, session: Session) -> None:
        super().__init__(backend, session)
        self.arrays: dict[int, ArrayEntry] = {}
        self.executables: dict[int, Any] = {}
        self.execute_results: dict[int, Future] = {}
        # Its threads start with its first copy.
        self.copies = ThreadPoolExecutor(COPY_THREADS, thread_name_prefix="proxy-copy")

    def close(self) -> None:
        self.copies.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            self.arrays.clear()
            self.executables.clear()
            self.execute_results.clear()
            self.futures.clear()

    @property
    def _timeout(self) -> float:
        return self.session.lookup_timeout

    # -- what a backend provides ---------------------------------------------------------------

    def _store(self, handle: int, array: ArrayEntry) -> int:
        """Keep ``array`` under ``handle`` (0: a new server handle); returns the handle."""
        raise NotImplementedError

    def _check_sharding(self, spec: ShardingSpec, field_name: str) -> None:
        """Refuse a sharding this session cannot place arrays with, naming ``field_name``."""
        raise NotImplementedError

    def _from_host(self, value: np.ndarray, spec: ShardingSpec, field_name: str) -> ArrayEntry:
        """A new array of a host value, placed with ``spec``."""
        raise NotImplementedError

    def _from_shards(
        self,
        dtype: np.dtype,
        shape: tuple[int, ...],
        spec: ShardingSpec,
        shards: Iterator[tuple[int, np.ndarray]],
        where: str,
    ) -> ArrayEntry:
        """A new array from host shards: ``(position in the sharding's devices, value)``, each
        consumed (and checked) as ``shards`` is iterated, so after the backend's own checks."""
        raise NotImplementedError

    def _assemble(
        self, parts: list[ArrayEntry], spec: ShardingSpec, shape: tuple[int, ...]
    ) -> ArrayEntry:
        """One array of ``shape`` from per-device arrays, in the sharding's device order."""
        raise NotImplementedError

    def _disassemble(self, array: ArrayEntry) -> list[ArrayEntry]:
        """The per-device arrays of ``array``, in its sharding's device order (new entries)."""
        raise NotImplementedError

    def _fully_replicated(self, array: ArrayEntry) -> bool:
        raise NotImplementedError

    def _first_shard(self, array: ArrayEntry) -> ArrayEntry:
        """The shard of a fully replicated array on its sharding's first device."""
        raise NotImplementedError

    def _copy(
        self, array: ArrayEntry, device_ids: tuple[int, ...], memory_kind: str, field_name: str
    ) -> ArrayEntry:
        """``array`` on other devices (``device_ids`` empty: the same) and memory kind (empty:
        the same)."""
        raise NotImplementedError

    def _reader(self, array: ArrayEntry) -> Callable[[], np.ndarray]:
        """A function returning the value of ``array`` on the host, once computed; called on a
        worker thread, it reads what ``array`` holds now (a later delete does not change it).
        Nothing may write to the value it returns: host buffers are made as views of it."""
        raise NotImplementedError

    def _when_ready(self, arrays: list[ArrayEntry], response: Callable[[], Any]) -> Future:
        """A future of ``response()`` once every array is computed, or of the first error."""
        raise NotImplementedError

    def _free(self, array: ArrayEntry) -> None:
        """``DeleteArray``: free what ``array`` holds (called under the session's lock)."""
        raise NotImplementedError

    def _delete(self, array: ArrayEntry) -> None:
        """Mark ``array`` deleted and free what it holds, once (under the session's lock):
        deleted by the client, or consumed by a run (donated)."""
        if not array.deleted:
            array.deleted = True
            self._free(array)

    def _forget(self, array: ArrayEntry) -> None:
        """``DestructArray``: the session no longer names ``array`` (under the lock)."""

    def _is_deleted(self, array: ArrayEntry) -> bool:
        return array.deleted

    def _start_compile(self, program: bytes, options: Any, devices: list[int]) -> Future:
        """Check a program for ``devices`` and compile it on a worker thread; the future is of
        the ``CompileResponse`` (see :meth:`_compiled`). ``options``: the client's
        ``XlaCompileOptionsProto``."""
        raise NotImplementedError

    def _metadata(self, executable: Any) -> ExecutableMetadata:
        raise NotImplementedError

    def _parameters(self, executable: Any) -> int:
        """How many arrays an execution of ``executable`` takes."""
        raise NotImplementedError

    def _results(self, executable: Any) -> list[Result]:
        raise NotImplementedError

    def _donated(self, executable: Any) -> Sequence[int]:
        """The parameters a run of ``executable`` consumes (donated)."""
        return ()

    def _launch(
        self,
        executable: Any,
        args: list[ArrayEntry],
        results: list[Result],
        result_handles: list[int],
    ) -> tuple[list[int], Future]:
        """Start an execution (argument and result counts checked): the result arrays' handles
        (``result_handles``, or new ones) and a future of its outcome."""
        raise NotImplementedError

    def _program_text(self, executable: Any) -> str:
        raise NotImplementedError

    def _costs(self, executable: Any) -> Mapping[str, float]:
        """XLA's cost analysis; raising when there is none."""
        raise NotImplementedError

    # -- arrays --------------------------------------------------------------------------------

    def array(self, handle: int, field_name: str = "array_handle") -> Any:
        """The live array of ``handle``; a deleted, failed or unknown one is named."""
        with self._lock:
            entry = self.arrays.get(handle)
        if entry is None:
            raise ProxyError("NOT_FOUND", f"{field_name}: array handle {handle} is unknown")
        if entry.error is not None:
            raise ProxyError(
                entry.error.code, f"{field_name}: array {handle} failed: {entry.error.message}"
            )
        if entry.deleted:
            raise ProxyError(
                "FAILED_PRECONDITION", f"{field_name}: array {handle} has been deleted"
            )
        return entry

    def put_error(self, handles: list[int], error: ProxyError) -> None:
        """Client-named arrays of a failed request carry its error (reported when used)."""
        for handle in handles:
            if handle:
                self._store(handle, self.array_type(error=error))

    def _failing(self, handles: list[int], build: Callable[[], Any]) -> Any:
        """Run ``build``; on failure, the arrays the client named carry the error too."""
        try:
            return build()
        except ProxyError as exc:
            self.put_error(handles, exc)
            raise
        except Exception as exc:
            # Devices out of memory say so, as plain JAX raises it; the rest is the request's.
            code = "RESOURCE_EXHAUSTED" if "RESOURCE_EXHAUSTED" in str(exc) else "INVALID_ARGUMENT"
            error = ProxyError(code, f"{type(exc).__name__}: {exc}")
            self.put_error(handles, error)
            raise error from exc

    def _take_host(self, message: Any) -> np.ndarray:
        """The host buffer a message names (consumed), as the array its ``dtype``, ``shape`` and
        ``byte_strides`` describe."""
        data = self.session.host_buffers.take(message.host_buffer_handle, self._timeout)
        strides = list(message.byte_strides.strides) if message.HasField("byte_strides") else None
        return from_host_buffer(
            data, to_numpy_dtype(message.dtype), tuple(message.shape.dims), strides
        )

    def _shards(self, spec: Any, where: str, count: int) -> Iterator[tuple[int, np.ndarray]]:
        """The host shards of one ``MakeArraysFromHostBufferShards`` spec, taken lazily."""
        for positions, buffer in zip(
            spec.addressable_shard_indices, spec.host_buffers, strict=True
        ):
            host = self._take_host(buffer)
            for position in positions.indices:
                if not 0 <= position < count:
                    raise ProxyError(
                        "INVALID_ARGUMENT",
                        f"{where}: shard index {position} is outside the sharding's "
                        f"{count} devices",
                    )
                yield position, host

    def handle_make_array_from_host_buffer_request(self, request: Any) -> Any:
        """``MakeArrayFromHostBuffer``: one host buffer, placed with a sharding."""

        def build() -> int:
            to_numpy_dtype(request.dtype)  # refused before the host buffer is consumed
            spec = decode_sharding(self.p, request.sharding)
            self._check_sharding(spec, "sharding")
            host = self._take_host(request)
            return self._store(request.array_handle, self._from_host(host, spec, "sharding"))

        response = self.p.MakeArrayFromHostBufferResponse()
        response.array_handle = self._failing([request.array_handle], build)
        return response

    def handle_make_arrays_from_host_buffer_shards_request(self, request: Any) -> Any:
        """``MakeArraysFromHostBufferShards``: arrays assembled from per-shard host buffers."""
        handles = list(request.array_handles)
        if handles and len(handles) != len(request.specs):
            raise ProxyError(
                "INVALID_ARGUMENT",
                f"array_handles has {len(handles)} entries for {len(request.specs)} specs",
            )

        def build() -> list[int]:
            out = []
            for i, spec in enumerate(request.specs):
                where = f"specs[{i}]"
                if len(spec.addressable_shard_indices) != len(spec.host_buffers):
                    raise ProxyError(
                        "INVALID_ARGUMENT",
                        f"{where}: {len(spec.addressable_shard_indices)} addressable_shard_indices "
                        f"but {len(spec.host_buffers)} host_buffers",
                    )
                dtype = to_numpy_dtype(spec.array_spec.dtype, f"{where}.array_spec.dtype")
                shape = tuple(spec.array_spec.shape.dims)
                sharding = decode_sharding(self.p, spec.array_spec.sharding, f"{where}.array_spec")
                shards = self._shards(spec, where, len(sharding.device_ids))
                array = self._from_shards(dtype, shape, sharding, shards, where)
                out.append(self._store(handles[i] if handles else 0, array))
            return out

        response = self.p.MakeArraysFromHostBufferShardsResponse()
        response.array_handles.extend(self._failing(handles, build))
        return response

    def handle_make_error_arrays_request(self, request: Any) -> Any:
        """``MakeErrorArrays``: arrays that carry the client's error."""
        error = ProxyError("UNKNOWN", request.error.message or "error array")
        handles = [h or self.new_handle() for h in request.array_handles] or [
            self.new_handle() for _ in request.array_specs
        ]
        self.put_error(handles, error)
        response = self.p.MakeErrorArraysResponse()
        response.array_handles.extend(handles)
        return response

    def handle_assemble_array_from_single_device_arrays_request(self, request: Any) -> Any:
        """``AssembleArrayFromSingleDeviceArrays``: one array from per-device arrays."""

        def build() -> int:
            parts = [
                self.array(h, f"single_device_array_handles[{i}]")
                for i, h in enumerate(request.single_device_array_handles)
            ]
            spec = decode_sharding(self.p, request.sharding)
            array = self._assemble(parts, spec, tuple(request.shape.dims))
            return self._store(request.result_handle, array)

        response = self.p.AssembleArrayFromSingleDeviceArraysResponse()
        response.array_handle = self._failing([request.result_handle], build)
        return response

    def handle_disassemble_into_single_device_arrays_request(self, request: Any) -> Any:
        """``DisassembleIntoSingleDeviceArrays``: the per-device arrays, in the sharding's order."""
        handles = list(request.result_handles)

        def build() -> list[int]:
            parts = self._disassemble(self.array(request.array_handle))
            if handles and len(handles) != len(parts):
                raise ProxyError(
                    "INVALID_ARGUMENT",
                    f"result_handles has {len(handles)} entries for {len(parts)} shards",
                )
            return [self._store(handles[i] if handles else 0, p) for i, p in enumerate(parts)]

        response = self.p.DisassembleIntoSingleDeviceArraysResponse()
        response.array_handles.extend(self._failing(handles, build))
        return response

    def handle_fully_replicated_shard_request(self, request: Any) -> Any:
        """``FullyReplicatedShard``: the shard on the sharding's first device."""

        def build() -> int:
            array = self.array(request.array_handle)
            if not self._fully_replicated(array):
                raise ProxyError(
                    "FAILED_PRECONDITION", f"array {request.array_handle} is not fully replicated"
                )
            return self._store(request.result_handle, self._first_shard(array))

        response = self.p.FullyReplicatedShardResponse()
        response.array_handle = self._failing([request.result_handle], build)
        return response

    def handle_copy_arrays_request(self, request: Any) -> Any:
        """``CopyArrays``: the arrays on other devices or memories (same layout of shards)."""
        handles = list(request.result_handles)
        memory_kind = request.memory_kind if request.HasField("memory_kind") else ""

        def build() -> list[int]:
            out = []
            for i, h in enumerate(request.array_handles):
                where = f"array_handles[{i}]"
                array = self._copy(
                    self.array(h, where), tuple(request.device_ids), memory_kind, where
                )
                out.append(self._store(handles[i] if handles else 0, array))
            return out

        response = self.p.CopyArraysResponse()
        response.array_handles.extend(self._failing(handles, build))
        return response

    def handle_copy_to_host_buffer_request(self, request: Any) -> Future:
        """``CopyToHostBuffer``: the array's bytes into the host buffer store, when computed.
        A worker copies them only once the array is computed: waiting holds no thread, so one
        session's reads of values still computing never hold up another's."""
        array = self.array(request.array_handle)
        read = self._reader(array)
        strides = list(request.byte_strides.strides) if request.HasField("byte_strides") else None
        handle = request.host_buffer_handle

        def copy() -> Any:
            data = to_host_buffer(read(), strides)
            error = self.session.host_buffers.store(handle, data)
            if error:
                raise ProxyError("ALREADY_EXISTS", error)
            return self.p.CopyToHostBufferResponse()

        answer: Future = Future()

        def copy_when_computed(ready: Future) -> None:
            error = ready.exception()
            if error is not None:
                answer.set_exception(error)
                return
            try:
                copying = self.copies.submit(copy)
            except RuntimeError:  # the session closed meanwhile
                answer.set_exception(ProxyError("CANCELLED", "the session ended"))
                return
            copying.add_done_callback(lambda done: _settle(answer, done))

        self._when_ready([array], lambda: None).add_done_callback(copy_when_computed)
        return answer

    def handle_check_value_ready_request(self, request: Any) -> Future:
        """``CheckValueReady``: answered when every value is computed (or with its error)."""
        arrays = [self.array(h, f"value_handles[{i}]") for i, h in enumerate(request.value_handles)]
        return self._when_ready(arrays, self.p.CheckValueReadyResponse)

    def handle_delete_array_request(self, request: Any) -> Any:
        """``DeleteArray``: free the arrays now; later use of them is an error."""
        unknown = []
        with self._lock:
            for handle in request.array_handle:
                entry = self.arrays.get(handle)
                if entry is None:
                    unknown.append(handle)
                else:
                    self._delete(entry)
        future = completed(
            error=ProxyError("NOT_FOUND", f"array_handle: unknown array handles {unknown}")
            if unknown
            else None
        )
        response = self.p.DeleteArrayResponse()
        response.deletion_future_handle = self.add_future(future)
        return response

    def handle_is_array_deleted_request(self, request: Any) -> Any:
        """``IsArrayDeleted``."""
        with self._lock:
            entry = self.arrays.get(request.array_handle)
        if entry is None:
            raise ProxyError(
                "NOT_FOUND", f"array_handle: array handle {request.array_handle} is unknown"
            )
        response = self.p.IsArrayDeletedResponse()
        response.deleted = self._is_deleted(entry)
        return response

    def handle_destruct_array_request(self, request: Any) -> Any:
        """``DestructArray``: the client dropped its references; forget the arrays."""
        missing = []
        with self._lock:
            for handle in request.array_handle:
                entry = self.arrays.pop(handle, None)
                if entry is None:
                    missing.append(handle)
                else:
                    self._forget(entry)
        if missing:
            raise ProxyError("NOT_FOUND", f"array_handle: unknown array handles {missing}")
        return self.p.DestructArrayResponse()

    def handle_get_default_layout_request(self, request: Any) -> Any:
        """``GetDefaultLayout``: dense row-major."""
        to_numpy_dtype(request.dtype)
        response = self.p.GetDefaultLayoutResponse()
        response.serialized_pjrt_layout = default_layout(len(request.dims))
        return response

    def handle_get_default_device_assignment_request(self, request: Any) -> Any:
        """``GetDefaultDeviceAssignment``: replicas x partitions over the devices in order."""
        replicas, partitions = request.num_replicas, request.num_partitions
        devices = self.backend.devices()
        if replicas * partitions > len(devices) or replicas < 1 or partitions < 1:
            raise ProxyError(
                "INVALID_ARGUMENT",
                f"num_replicas {replicas} x num_partitions {partitions} does not fit the "
                f"{len(devices)} devices",
            )
        response = self.p.GetDefaultDeviceAssignmentResponse()
        assignment = response.device_assignment
        assignment.replica_count = replicas
        assignment.computation_count = partitions
        for c in range(partitions):
            computation = assignment.computation_devices.add()
            for r in range(replicas):
                computation.replica_device_ids.append(devices[r * partitions + c].id)
        return response

    # -- executables ---------------------------------------------------------------------------

    def handle_compile_request(self, request: Any) -> Future:
        """``Compile``: the client's portable StableHLO and compile options, for the devices of
        its device assignment (the first device without one), compiled on a worker thread."""
        program, options = request.program, request.compile_options
        if program.type_name != XLA_PROGRAM:
            raise ProxyError(
                "UNIMPLEMENTED",
                f"program: {program.type_name or '(no type_name)'} programs are not supported; "
                f"the proxy compiles {XLA_PROGRAM} (StableHLO)",
            )
        if not program.data:
            raise ProxyError("INVALID_ARGUMENT", "program: the StableHLO module is empty")
        if options.type_name != XLA_COMPILE_OPTIONS:
            raise ProxyError(
                "UNIMPLEMENTED",
                f"compile_options: {options.type_name or '(no type_name)'} is not supported; "
                f"the proxy takes {XLA_COMPILE_OPTIONS}",
            )
        if request.host_callbacks:
            raise ProxyError(
                "UNIMPLEMENTED", "host_callbacks: host callbacks are not supported by the proxy yet"
            )
        try:
            proto = self.p.XlaCompileOptionsProto.FromString(options.data)
        except Exception as exc:
            raise ProxyError("INVALID_ARGUMENT", f"compile_options: cannot decode: {exc}") from exc
        assignment = proto.compile_options.executable_build_options.device_assignment
        devices = _assigned_devices(assignment) or [self.backend.devices()[0].id]
        return self._start_compile(program.data, proto, devices)

    def _compiled(
        self, executable: Any, name: str, devices: list[int], fingerprint: bytes | None
    ) -> Any:
        """Keep a compiled ``executable``; the ``CompileResponse`` telling the client of it."""
        handle = self.new_handle()
        with self._lock:
            self.executables[handle] = executable
        response = self.p.CompileResponse()
        response.loaded_executable_handle = handle
        response.name = name
        response.num_devices = len(devices)
        response.device_ids.extend(devices)
        response.addressable_device_ids.extend(devices)
        if fingerprint is not None:
            response.fingerprint_value = fingerprint
        response.ready_future_handle = self.add_future(completed())
        return response

    def executable(self, handle: int) -> Any:
        """The executable of ``handle``, or a NOT_FOUND naming it."""
        with self._lock:
            entry = self.executables.get(handle)
        if entry is None:
            raise ProxyError(
                "NOT_FOUND", f"loaded_executable_handle: executable {handle} is unknown"
            )
        return entry

    def handle_loaded_executable_metadata_request(self, request: Any) -> Any:
        """``LoadedExecutableMetadata``: shardings, layouts and memory kinds of its parameters
        and results."""
        metadata = self._metadata(self.executable(request.loaded_executable_handle))
        p = self.p
        response = p.LoadedExecutableMetadataResponse()
        op_sharding = p.message("xla.OpSharding")
        for shardings, target in (
            (metadata.parameter_shardings, response.parameter_shardings),
            (metadata.result_shardings, response.output_shardings),
        ):
            if shardings is not None:
                target.SetInParent()
                target.shardings.extend(op_sharding.FromString(s) for s in shardings)
        layout = p.message("xla.LayoutProto")
        for layouts, target in (
            (metadata.parameter_layouts, response.parameter_layouts_list),
            (metadata.result_layouts, response.output_layouts_list),
        ):
            target.SetInParent()
            target.layouts.extend(layout(minor_to_major=m) for m in layouts)
        for kinds in metadata.result_memory_kinds:
            response.output_memory_kinds.memory_kind_lists.add().memory_kinds.extend(kinds)
        response.donated_input_indices.SetInParent()
        response.donated_input_indices.donated_input_indices.extend(
            self._donated(self.executable(request.loaded_executable_handle))
        )
        response.compiled_memory_stats_error.code = 12
        response.compiled_memory_stats_error.message = "compiled memory stats are not reported"
        response.size_of_generated_code_in_bytes = metadata.generated_code_bytes
        return response

    def handle_loaded_executable_execute_request(self, request: Any) -> Any:
        """``LoadedExecutableExecute``: run it; outputs get the client's handles at once and
        complete asynchronously; the status future reports the run's outcome."""
        result_handles = list(request.result_array_handle)

        def run() -> tuple[list[int], list[Result], Future]:
            executable = self.executable(request.loaded_executable_handle)
            args = [self.array(h, f"args_handles[{i}]") for i, h in enumerate(request.args_handles)]
            expected = self._parameters(executable)
            if len(args) != expected:
                raise ProxyError(
                    "INVALID_ARGUMENT",
                    f"args_handles has {len(args)} arrays; the executable takes {expected}",
                )
            results = self._results(executable)
            for i, (_, dtype, _) in enumerate(results):  # before running: answerable outputs
                dtype_kind(dtype, f"output {i}")
            if result_handles and len(result_handles) != len(results):
                raise ProxyError(
                    "INVALID_ARGUMENT",
                    f"result_array_handle has {len(result_handles)} entries for {len(results)} "
                    "outputs",
                )
            handles, status = self._launch(executable, args, results, result_handles)
            with self._lock:  # what the run consumes is deleted, as JAX's runtime deletes it
                for position in self._donated(executable):
                    self._delete(args[position])
            return handles, results, status

        try:
            handles, results, status = self._failing(result_handles, run)
        except ProxyError as exc:
            if request.result_status_handle:
                self._record_status(request.result_status_handle, completed(error=exc))
            raise
        response = self.p.LoadedExecutableExecuteResponse()
        if request.execute_options.fill_status:
            status_handle = request.result_status_handle or self.new_handle()
            self._record_status(status_handle, status)
            response.status_handle = status_handle
        if not result_handles:
            for handle, (shape, dtype, spec) in zip(handles, results, strict=True):
                out = response.outputs.add()
                fill_dtype(out.dtype, dtype)
                out.shape.dims.extend(shape)
                encode_hlo_sharding(
                    self.p, out.sharding, list(spec.device_ids), spec.op_sharding, spec.memory_kind
                )
                out.array_handle = handle
        return response

    def _record_status(self, handle: int, future: Future) -> None:
        # Protocol 21 moved execution statuses to FetchExecuteResult; before, CheckFuture.
        if self.session.protocol_version >= 21:
            with self._lock:
                self.execute_results[handle] = future
        else:
            self.add_future(future, handle)

    def handle_loaded_executable_fetch_execute_result_request(self, request: Any) -> Future:
        """``LoadedExecutableFetchExecuteResult``: the run's outcome, when it is known."""
        with self._lock:
            future = self.execute_results.pop(request.result_status_handle, None)
        if future is None:
            raise ProxyError(
                "NOT_FOUND",
                f"result_status_handle: {request.result_status_handle} is unknown",
            )
        return answer_when_done(future, self.p.LoadedExecutableFetchExecuteResultResponse)

    def handle_loaded_executable_destruct_request(self, request: Any) -> Any:
        """``LoadedExecutableDestruct``: forget the executable."""
        with self._lock:
            entry = self.executables.pop(request.loaded_executable_handle, None)
        if entry is None:
            raise ProxyError(
                "NOT_FOUND",
                f"loaded_executable_handle: executable {request.loaded_executable_handle} "
                "is unknown",
            )
        return self.p.LoadedExecutableDestructResponse()

    def handle_loaded_executable_is_deleted_request(self, request: Any) -> Any:
        """``LoadedExecutableIsDeleted``: executables are never deleted, only destructed."""
        response = self.p.LoadedExecutableIsDeletedResponse()
        response.is_deleted = False
        return response

    def handle_loaded_executable_human_readable_program_text_request(self, request: Any) -> Any:
        """``LoadedExecutableHumanReadableProgramText``: the optimized HLO."""
        executable = self.executable(request.loaded_executable_handle)
        response = self.p.LoadedExecutableHumanReadableProgramTextResponse()
        response.human_readable_program_text = self._program_text(executable)
        return response

    def handle_loaded_executable_cost_analysis_request(self, request: Any) -> Any:
        """``LoadedExecutableCostAnalysis``: XLA's cost analysis (flops, bytes accessed)."""
        executable = self.executable(request.loaded_executable_handle)
        response = self.p.LoadedExecutableCostAnalysisResponse()
        try:
            costs = self._costs(executable)
        except Exception as exc:
            response.status.code = 12
            response.status.message = str(exc)
            return response
        response.attributes.SetInParent()
        for key, value in costs.items():
            response.attributes.attributes[key].float_value = float(value)
        return response


def _assigned_devices(assignment: Any) -> list[int]:
    """The device ids of an ``xla.DeviceAssignmentProto``, replica-major (none: empty)."""
    replicas, computations = assignment.replica_count, assignment.computation_count
    if not assignment.computation_devices:
        return []
    try:
        return [
            assignment.computation_devices[c].replica_device_ids[r]
            for r in range(replicas)
            for c in range(computations)
        ]
    except IndexError:
        raise ProxyError(
            "INVALID_ARGUMENT",
            f"compile_options.device_assignment: {replicas} replicas x {computations} "
            "computations do not match its device lists",
        ) from None


def _settle(future: Future, done: Future) -> None:
    """Give ``future`` the outcome of ``done``."""
    error = done.exception()
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(done.result())
