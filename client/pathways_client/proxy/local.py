"""A proxy backend running the clients' work on this process's JAX devices.

Arrays are ``jax.Array`` objects of the proxy process; compiled programs are XLA executables
compiled from the portable StableHLO the client sends, with the client's compile options. This
is the reference semantics of every request (what a client must see); the island backend routes
the same work through the island schedulers.

Use fake CPU devices (``jax_num_cpu_devices``) to serve N devices from one machine.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

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
from pathways_client.proxy.types import ShardingSpec
from pathways_core.hlo import donated_parameters

log = logging.getLogger(__name__)


@dataclass
class _Array(ArrayEntry):
    """A session's array: the JAX array (None: failed, or deleted)."""

    value: Any = None


@dataclass
class _Executable:
    """A compiled program and what the client is told about it."""

    executable: Any
    devices: list[Any]
    name: str
    out_shapes: list[tuple[tuple[int, ...], np.dtype]]
    # Serialized xla.OpSharding per result / parameter; None when XLA reports none (a program
    # on one device): the client is then told nothing, and results stay on that device.
    out_shardings: list[bytes] | None
    in_shardings: list[bytes] | None
    in_shapes: list[tuple[tuple[int, ...], np.dtype]]  # what each parameter takes
    memory_kinds: list[str] = field(default_factory=list)
    donated: list[int] = field(default_factory=list)  # parameters a run consumes


class _InUse:
    """JAX arrays a worker thread waits for or reads: deleting one meanwhile crashed jaxlib
    (a stock training loop donating each step's output to the next took the proxy down in
    ~1,500 steps: the step's output was deleted as donated while a thread still waited for
    it). Their deletion waits for the last such use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._uses: dict[int, int] = {}  # id(array) -> uses in progress
        self._doomed: dict[int, Any] = {}  # deleted meanwhile: deleted after the last use

    def hold(self, values: Sequence[Any]) -> None:
        """A use of ``values`` starts (before it is handed to a thread)."""
        with self._lock:
            for value in values:
                self._uses[id(value)] = self._uses.get(id(value), 0) + 1

    def release(self, values: Sequence[Any]) -> None:
        """A use of ``values`` ended; those deleted meanwhile are deleted now."""
        doomed = []
        with self._lock:
            for value in values:
                left = self._uses[id(value)] - 1
                if left:
                    self._uses[id(value)] = left
                else:
                    del self._uses[id(value)]
                    if id(value) in self._doomed:
                        doomed.append(self._doomed.pop(id(value)))
        for value in doomed:
            _delete(value)

    def delete(self, value: Any) -> None:
        """Delete ``value`` now, or after the uses in progress."""
        with self._lock:
            if id(value) in self._uses:
                self._doomed[id(value)] = value
                return
        _delete(value)


def _delete(value: Any) -> None:
    # Already freed by JAX when it was donated to a computation.
    with contextlib.suppress(Exception):
        value.delete()


class LocalBackend(Backend):
    """The clients' work on this process's JAX devices of ``platform`` (``cpu`` by default)."""

    def __init__(self, platform: str = "cpu", device_ids: list[int] | None = None) -> None:
        import jax

        self._jax_devices = jax.devices(platform)
        if device_ids is not None:
            by_id = {d.id: d for d in self._jax_devices}
            missing = [i for i in device_ids if i not in by_id]
            if missing:
                raise ValueError(f"device_ids {missing} are not devices of this process")
            self._jax_devices = [by_id[i] for i in device_ids]
        self.device_by_id = {d.id: d for d in self._jax_devices}
        client = self._jax_devices[0].client
        self.platform = Platform(
            name=client.platform, version=client.platform_version, runtime_type=client.runtime_type
        )
        self.client = client
        self.compile_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="proxy-compile")
        self.wait_pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="proxy-wait")
        self.gang = threading.Semaphore(1)
        self.in_use = _InUse()

    def devices(self) -> list[DeviceInfo]:
        return [
            DeviceInfo(id=d.id, kind=d.device_kind, platform=d.platform) for d in self._jax_devices
        ]

    def open_session(self, session: Any) -> LocalSession:
        return LocalSession(self, session)

    def jax_devices(self, ids: list[int] | tuple[int, ...], field_name: str) -> list[Any]:
        """The JAX devices of ``ids``; an unknown id is the client's error, named."""
        try:
            return [self.device_by_id[i] for i in ids]
        except KeyError as exc:
            raise ProxyError(
                "INVALID_ARGUMENT", f"{field_name}: device id {exc.args[0]} is not a device here"
            ) from None

    def jax_sharding(self, spec: ShardingSpec, field_name: str = "sharding") -> Any:
        """The JAX sharding of a decoded IFRT sharding."""
        from jax._src import sharding_impls
        from jax._src.lib import xla_client as xc

        devices = self.jax_devices(spec.device_ids, field_name)
        memory_kind = spec.memory_kind or None
        if spec.op_sharding is None:
            if len(devices) == 1:
                return sharding_impls.SingleDeviceSharding(devices[0], memory_kind=memory_kind)
            op = xc.OpSharding()
            op.type = xc.OpSharding.Type.REPLICATED
        else:
            op = xc.OpSharding()
            op.ParseFromString(spec.op_sharding)
        return sharding_impls.GSPMDSharding(devices, op, memory_kind=memory_kind)


class LocalSession(ArraySession):
    """A session's arrays and executables on the local JAX devices."""

    backend: LocalBackend
    array_type = _Array

    # -- arrays --------------------------------------------------------------------------------

    def _store(self, handle: int, array: ArrayEntry) -> int:
        handle = handle or self.new_handle()
        with self._lock:
            self.arrays[handle] = array
        return handle

    def _check_sharding(self, spec: ShardingSpec, field_name: str) -> None:
        self.backend.jax_sharding(spec, field_name)

    def _from_host(self, value: np.ndarray, spec: ShardingSpec, field_name: str) -> _Array:
        import jax

        return _Array(jax.device_put(value, self.backend.jax_sharding(spec, field_name)))

    def _from_shards(
        self,
        dtype: np.dtype,
        shape: tuple[int, ...],
        spec: ShardingSpec,
        shards: Iterator[tuple[int, np.ndarray]],
        where: str,
    ) -> _Array:
        import jax

        sharding = self.backend.jax_sharding(spec, f"{where}.array_spec.sharding")
        devices = self.backend.jax_devices(spec.device_ids, f"{where}.array_spec")
        parts = [
            jax.device_put(host.astype(dtype, copy=False), devices[position])
            for position, host in shards
        ]
        return _Array(jax.make_array_from_single_device_arrays(shape, sharding, parts))

    def _assemble(self, parts: list[_Array], spec: ShardingSpec, shape: tuple[int, ...]) -> _Array:
        import jax

        sharding = self.backend.jax_sharding(spec)
        values = [part.value for part in parts]
        return _Array(jax.make_array_from_single_device_arrays(shape, sharding, values))

    def _disassemble(self, array: _Array) -> list[_Array]:
        value = array.value
        order = list(value.sharding._device_assignment)  # the IFRT device list's order
        by_device = {s.device: s.data for s in value.addressable_shards}
        return [_Array(by_device[d]) for d in order if d in by_device]

    def _fully_replicated(self, array: _Array) -> bool:
        return array.value.is_fully_replicated

    def _first_shard(self, array: _Array) -> _Array:
        first = array.value.sharding._device_assignment[0]
        return _Array(next(s.data for s in array.value.addressable_shards if s.device == first))

    def _copy(
        self, array: _Array, device_ids: tuple[int, ...], memory_kind: str, field_name: str
    ) -> _Array:
        import jax

        sharding = array.value.sharding
        if device_ids:
            devices = self.backend.jax_devices(list(device_ids), "device_ids")
            sharding = _with_devices(sharding, devices)
        if memory_kind:
            sharding = sharding.with_memory_kind(memory_kind)
        # A copy even onto the same devices: the source may be deleted (or donated) next.
        return _Array(jax.device_put(array.value, sharding, may_alias=False))

    def _reader(self, array: _Array) -> Callable[[], np.ndarray]:
        value = array.value
        in_use = self.backend.in_use

        def read() -> np.ndarray:
            # A copy: on CPU devices np.asarray is a view of the device buffer, which the
            # client may delete or donate while its host buffer is kept.
            in_use.hold([value])
            try:
                return np.array(value)
            finally:
                in_use.release([value])

        return read

    def _when_ready(self, arrays: list[_Array], response: Callable[[], Any]) -> Future:
        import jax

        values = [array.value for array in arrays]
        in_use = self.backend.in_use
        in_use.hold(values)

        def wait() -> Any:
            try:
                jax.block_until_ready(values)
            finally:
                in_use.release(values)
            return response()

        return self.backend.wait_pool.submit(wait)

    def _free(self, array: _Array) -> None:
        if array.value is not None:
            self.backend.in_use.delete(array.value)
        array.value = None

    def _is_deleted(self, array: _Array) -> bool:
        return array.deleted or (array.value is not None and array.value.is_deleted())

    # -- executables ---------------------------------------------------------------------------

    def _start_compile(self, program: bytes, options: Any, devices: list[int]) -> Future:
        from jax._src.lib import xla_client as xc

        bytecode = _bytecode(program)
        try:
            compile_options = xc.CompileOptions.ParseFromString(
                options.compile_options.SerializeToString()
            )
        except Exception as exc:
            raise ProxyError("INVALID_ARGUMENT", f"compile_options: cannot decode: {exc}") from exc
        on = self.backend.jax_devices(devices, "compile_options.device_assignment")
        return self.backend.compile_pool.submit(self._compile, bytecode, compile_options, on)

    def _compile(self, program: bytes, compile_options: Any, devices: list[Any]) -> Any:
        from jax._src.lib import xla_client as xc

        _prepare_cpu_kernels()

        try:
            executable = self.backend.client.compile_and_load(
                program, xc.DeviceList(tuple(devices)), compile_options
            )
        except Exception as exc:
            raise ProxyError("INVALID_ARGUMENT", f"program: compilation failed: {exc}") from exc
        entry = _Executable(
            executable=executable,
            devices=devices,
            name=_module_name(executable),
            out_shapes=_result_shapes(program),
            out_shardings=_shardings(executable.get_output_shardings()),
            in_shardings=_shardings(executable.get_parameter_shardings()),
            in_shapes=_parameter_shapes(program),
            memory_kinds=[k for kinds in executable.get_output_memory_kinds() for k in kinds],
            donated=_donated_parameters(executable),
        )
        return self._compiled(entry, entry.name, [d.id for d in devices], executable.fingerprint)

    def _donated(self, executable: _Executable) -> Sequence[int]:
        return executable.donated

    def _metadata(self, executable: _Executable) -> ExecutableMetadata:
        exe = executable.executable
        return ExecutableMetadata(
            parameter_shardings=executable.in_shardings,
            result_shardings=executable.out_shardings,
            parameter_layouts=[_minor_to_major(item) for item in exe.get_parameter_layouts()],
            result_layouts=[_minor_to_major(item) for item in exe.get_output_layouts()],
            result_memory_kinds=[list(kinds) for kinds in exe.get_output_memory_kinds()],
            generated_code_bytes=exe.size_of_generated_code_in_bytes(),
        )

    def _parameters(self, executable: _Executable) -> int:
        return len(executable.in_shapes)

    def _results(self, executable: _Executable) -> list[Result]:
        ids = tuple(d.id for d in executable.devices)
        kinds, shardings = executable.memory_kinds, executable.out_shardings
        return [
            (
                shape,
                dtype,
                ShardingSpec(
                    ids,
                    kinds[i] if i < len(kinds) else "",
                    shardings[i] if shardings is not None else None,
                ),
            )
            for i, (shape, dtype) in enumerate(executable.out_shapes)
        ]

    def _launch(
        self,
        executable: _Executable,
        args: list[_Array],
        results: list[Result],
        result_handles: list[int],
    ) -> tuple[list[int], Future]:
        import jax

        for i, (arg, (shape, dtype)) in enumerate(zip(args, executable.in_shapes, strict=True)):
            value = arg.value
            if tuple(value.shape) != shape or value.dtype != dtype:
                # As the island backend says: XLA compares byte sizes alone, and ran an
                # int32[4] as the float32[4] it takes (garbage back, no error).
                raise ProxyError(
                    "INVALID_ARGUMENT",
                    f"args_handles[{i}] is {value.dtype}{list(value.shape)}; the executable "
                    f"takes {dtype}{list(shape)}",
                )
        # One multi-device computation at a time, in one order for every device: XLA's CPU
        # collectives deadlock (and abort the process) when several runs' participants
        # wait for each other. The client still pipelines: its requests queue here.
        gang = len(executable.devices) > 1
        if gang:
            self.backend.gang.acquire()
        try:
            ran = executable.executable.execute_sharded([a.value for a in args])
            per_output = ran.disassemble_into_single_device_arrays()
            if len(per_output) != len(results):
                raise ProxyError(
                    "INTERNAL",
                    f"executable returned {len(per_output)} outputs, expected {len(results)}",
                )
            outputs = [
                jax.make_array_from_single_device_arrays(
                    shape, self.backend.jax_sharding(spec), shards
                )
                for (shape, _dtype, spec), shards in zip(results, per_output, strict=True)
            ]
            handles = [
                self._store(result_handles[i] if result_handles else 0, _Array(out))
                for i, out in enumerate(outputs)
            ]

            in_use = self.backend.in_use
            in_use.hold(outputs)

            def finish() -> None:
                try:
                    jax.block_until_ready(outputs)
                finally:
                    in_use.release(outputs)
                    if gang:
                        self.backend.gang.release()

            return handles, self.backend.wait_pool.submit(finish)
        except Exception:
            if gang:
                self.backend.gang.release()
            raise

    def _program_text(self, executable: _Executable) -> str:
        return "\n".join(m.to_string() for m in executable.executable.hlo_modules())

    def _costs(self, executable: _Executable) -> dict[str, float]:
        costs = executable.executable.cost_analysis()
        return {
            key: float(value)
            for key, value in dict(costs).items()
            if isinstance(value, float | int) and not isinstance(value, bool)
        }


def _with_devices(sharding: Any, devices: list[Any]) -> Any:
    """The same split of an array over other devices."""
    from jax._src import sharding_impls

    if len(devices) == 1:
        return sharding_impls.SingleDeviceSharding(devices[0], memory_kind=sharding.memory_kind)
    op = sharding._to_xla_hlo_sharding(1).to_proto()
    return sharding_impls.GSPMDSharding(devices, op, memory_kind=sharding.memory_kind)


def _shardings(shardings: Any) -> list[bytes] | None:
    return None if shardings is None else [s.SerializeToString() for s in shardings]


def _minor_to_major(layout: Any) -> list[int]:
    return list(layout._xla_layout().minor_to_major())


def _donated_parameters(executable: Any) -> list[int]:
    try:
        return donated_parameters(executable.hlo_modules()[0].to_string())
    except Exception:  # no module to read: none (the arrays then stay readable)
        return []


def _module_name(executable: Any) -> str:
    try:
        return executable.hlo_modules()[0].name
    except Exception:
        return "proxy_executable"


def _bytecode(program: bytes) -> bytes:
    """The MLIR bytecode of a portable StableHLO artifact."""
    from jax._src.interpreters import mlir
    from jax._src.lib import _jax

    try:
        with mlir.make_ir_context():
            module = _jax.mlir.deserialize_portable_artifact(program)
            return mlir.module_to_bytecode(module)
    except Exception as exc:
        raise ProxyError(
            "INVALID_ARGUMENT",
            f"program: not a StableHLO portable artifact ({len(program)} bytes): {exc}",
        ) from exc


def _program_shape(bytecode: bytes) -> Any:
    """A program's entry's parameter and result shapes (global: before SPMD partitioning)."""
    from jax._src.interpreters import mlir
    from jax._src.lib import _jax

    with mlir.make_ir_context():
        computation = _jax.mlir.mlir_module_to_xla_computation(
            bytecode, use_tuple_args=False, return_tuple=False
        )
    return computation.program_shape()


def _parameter_shapes(bytecode: bytes) -> list[tuple[tuple[int, ...], np.dtype]]:
    """The global shapes and dtypes of a program's parameters."""
    return [_shape(s) for s in _program_shape(bytecode).parameter_shapes()]


def _result_shapes(bytecode: bytes) -> list[tuple[tuple[int, ...], np.dtype]]:
    """The global shapes and dtypes of a program's results."""
    result = _program_shape(bytecode).result_shape()
    return [_shape(s) for s in (result.tuple_shapes() if result.is_tuple() else [result])]


def _shape(shape: Any) -> tuple[tuple[int, ...], np.dtype]:
    return tuple(shape.dimensions()), np.dtype(shape.numpy_dtype())


__all__ = ["LocalBackend", "LocalSession"]


@functools.cache
def _prepare_cpu_kernels() -> None:
    """Fill jaxlib's table of LAPACK kernels, as JAX does when it lowers a linear-algebra op:
    a program lowered by the JAX client and compiled here would otherwise call a null pointer
    (``pathways_executor.stablehlo.prepare_cpu_kernels`` does the same on executors)."""
    with contextlib.suppress(ImportError, AttributeError):  # another jaxlib: as it comes
        from jax._src.lax import linalg

        linalg.initialize_lapack()
