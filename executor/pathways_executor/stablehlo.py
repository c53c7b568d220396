"""STABLEHLO functions: raw StableHLO programs with XLA compile options, compiled here.

A stock JAX program using the IFRT proxy sends portable StableHLO and the ``CompileOptions`` it
chose; the proxy registers them as one ``pb.StableHloProgram`` artifact. The executor compiles it
for the devices of each computation that calls it, with the options' device assignment mapped
onto those devices (the artifact's assignment holds logical ids ``0..n-1``), and calls the
compiled executable directly. A computation with ``describe`` set asks only what the program
compiled to (``pb.CompiledProgram``): shardings, layouts, shapes, the optimized HLO.

Compile options come from clients: options that make XLA read or write files (dump folders,
autotune caches) are reset to this executor's own defaults before compiling.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax._src import compiler
from jax._src import lib as jax_lib
from jax._src.interpreters import mlir
from jax._src.lib import _jax
from jax._src.lib import xla_client as xc
from jax.sharding import SingleDeviceSharding

from pathways_core.hlo import donated_parameters
from pathways_core.wire import pb

# Debug options naming files or folders XLA reads or writes: a client's values are replaced by
# the executor's defaults.
_FILE_OPTIONS = (
    "xla_dump_to",
    "xla_gpu_cuda_data_dir",
    "xla_gpu_dump_autotune_logs_to",
    "xla_gpu_dump_autotune_results_to",
    "xla_gpu_kernel_cache_file",
    "xla_gpu_load_autotune_results_from",
    "xla_gpu_per_fusion_autotune_cache_dir",
)
# Words of XLA flag names (env_option_overrides) that touch files: such overrides are dropped.
_FILE_WORDS = ("dump", "dir", "file", "path", "_to", "_from", "cache")
# The optimized HLO text sent back with a description is cut beyond this.
MAX_HLO_TEXT = 4 << 20


class ProgramError(Exception):
    """A STABLEHLO artifact cannot be loaded or compiled as asked."""


@dataclass(frozen=True)
class Program:
    """A loaded STABLEHLO artifact: MLIR bytecode, compile options, and its signature."""

    label: str
    bytecode: bytes
    options: bytes
    in_avals: tuple[jax.ShapeDtypeStruct, ...]
    out_avals: tuple[jax.ShapeDtypeStruct, ...]
    num_replicas: int
    num_partitions: int

    @property
    def nr_devices(self) -> int:
        return self.num_replicas * self.num_partitions


@dataclass(frozen=True)
class Compiled:
    """A program compiled for one device set."""

    run: Any
    in_shardings: tuple[Any, ...]
    description: bytes


def load(label: str, artifact: bytes, check: Any = None) -> Program:
    """Parse a ``pb.StableHloProgram`` artifact. ``check`` (the executor's artifact checker)
    parses the module in a helper process first; it returns why not, or None."""
    try:
        program = pb.StableHloProgram.FromString(artifact)
    except Exception as error:
        raise ProgramError(
            f"function {label!r} is not a StableHloProgram: {type(error).__name__}: {error}"
        ) from None
    if not program.module:
        raise ProgramError(f"function {label!r}: StableHloProgram.module is empty")
    if check is not None:
        problem = check(bytes(program.module))
        if problem is not None:
            raise ProgramError(f"function {label!r}: module: {problem}")
    try:
        with mlir.make_ir_context():
            module = _jax.mlir.deserialize_portable_artifact(program.module)
            bytecode = mlir.module_to_bytecode(module)
        computation = _jax.mlir.mlir_module_to_xla_computation(
            bytecode, use_tuple_args=False, return_tuple=False
        )
        shape = computation.program_shape()
    except Exception as error:
        raise ProgramError(
            f"function {label!r}: module is not StableHLO this executor can compile "
            f"(jax {jax.__version__}): {type(error).__name__}: {error}"
        ) from None
    try:
        options = xc.CompileOptions.ParseFromString(program.compile_options)
    except Exception as error:
        raise ProgramError(
            f"function {label!r}: compile_options is not an xla.CompileOptionsProto: {error}"
        ) from None
    build = options.executable_build_options
    replicas, partitions = max(1, build.num_replicas), max(1, build.num_partitions)
    result = shape.result_shape()
    results = result.tuple_shapes() if result.is_tuple() else [result]
    return Program(
        label=label,
        bytecode=bytecode,
        options=bytes(program.compile_options),
        in_avals=tuple(_aval(s) for s in shape.parameter_shapes()),
        out_avals=tuple(_aval(s) for s in results),
        num_replicas=replicas,
        num_partitions=partitions,
    )


@functools.cache
def prepare_cpu_kernels() -> None:
    """Fill jaxlib's table of LAPACK kernels, as JAX does when it lowers a linear-algebra op
    (``jnp.linalg.inv``, ``cholesky``, ``eigh``, orthogonal initializers): a program lowered by
    a client and compiled here would otherwise call a null pointer and take the executor, and
    the island's group with it, down."""
    with contextlib.suppress(ImportError, AttributeError):  # another jaxlib: as it comes
        from jax._src.lax import linalg

        linalg.initialize_lapack()


def compile_for(program: Program, devices: list[jax.Device]) -> Compiled:
    """Compile ``program`` for ``devices`` (in the computation's order)."""
    prepare_cpu_kernels()
    if len(devices) != program.nr_devices:
        raise ProgramError(
            f"function {program.label!r} was compiled for {program.num_replicas} replica(s) x "
            f"{program.num_partitions} partition(s) = {program.nr_devices} device(s) but the "
            f"computation names {len(devices)}"
        )
    options = xc.CompileOptions.ParseFromString(program.options)
    _sanitize(options)
    grid = np.array(devices, dtype=object).reshape(program.num_replicas, program.num_partitions)
    ids = np.array([d.id for d in devices]).reshape(grid.shape)
    options.device_assignment = xc.DeviceAssignment.create(ids)
    device_list = xc.DeviceList(tuple(devices))
    backend = devices[0].client
    try:
        with mlir.make_ir_context():
            module = mlir.ir.Module.parse(program.bytecode)
            executable = compiler.compile_or_get_cached(
                backend, module, grid, options, [], device_list
            )
    except Exception as error:
        raise ProgramError(
            f"function {program.label!r} does not compile for devices "
            f"{[d.id for d in devices]}: {type(error).__name__}: {error}"
        ) from None
    in_ops = executable.get_parameter_shardings()
    out_ops = executable.get_output_shardings()
    out_kinds = [k for kinds in executable.get_output_memory_kinds() for k in kinds]
    in_shardings = tuple(
        _sharding(devices, None if in_ops is None else in_ops[i])
        for i in range(len(program.in_avals))
    )
    out_shardings = tuple(
        _sharding(
            devices,
            None if out_ops is None else out_ops[i],
            out_kinds[i] if i < len(out_kinds) else None,
        )
        for i in range(len(program.out_avals))
    )
    out_avals = program.out_avals

    def run(*arguments: jax.Array) -> list[jax.Array]:
        results = executable.execute_sharded(list(arguments))
        per_output = results.disassemble_into_single_device_arrays()
        return [
            jax.make_array_from_single_device_arrays(aval.shape, sharding, shards)
            for aval, sharding, shards in zip(out_avals, out_shardings, per_output, strict=True)
        ]

    return Compiled(run, in_shardings, _describe(program, executable, in_ops, out_ops, out_kinds))


def _sharding(devices: list[jax.Device], op: Any, memory_kind: str | None = None) -> Any:
    """The JAX sharding of a parameter or result: XLA's OpSharding over the devices."""
    from jax._src import sharding_impls

    if op is None or len(devices) == 1:
        return SingleDeviceSharding(devices[0], memory_kind=memory_kind)
    return sharding_impls.GSPMDSharding(devices, op, memory_kind=memory_kind)


def _sanitize(options: Any) -> None:
    """Reset the options that name files to this executor's defaults (see module docstring)."""
    debug = options.executable_build_options.debug_options
    defaults = xc.CompileOptions().executable_build_options.debug_options
    for name in _FILE_OPTIONS:
        if not hasattr(debug, name):
            continue
        if name == "xla_gpu_cuda_data_dir":
            # Its default cannot be read back through these bindings: use the CUDA folder
            # this process's JAX would use, as JAX itself does when it compiles.
            setattr(debug, name, getattr(jax_lib, "cuda_path", None) or "")
        else:
            setattr(debug, name, getattr(defaults, name))
    overrides = list(options.env_option_overrides)
    kept = [(k, v) for k, v in overrides if not any(w in k.lower() for w in _FILE_WORDS)]
    if len(kept) != len(overrides):
        options.env_option_overrides = kept


def _describe(
    program: Program, executable: Any, in_ops: Any, out_ops: Any, out_kinds: list[str]
) -> bytes:
    """The ``pb.CompiledProgram`` of an executable, serialized."""
    info = pb.CompiledProgram(
        parameter_shardings=in_ops is not None, result_shardings=out_ops is not None
    )
    try:
        modules = executable.hlo_modules()
        info.name = modules[0].name
        text = "\n".join(m.to_string() for m in modules)
        info.hlo_text = text[:MAX_HLO_TEXT]
        info.donated_parameters.extend(donated_parameters(text))
    except Exception:
        info.name = program.label
    fingerprint = executable.fingerprint
    if fingerprint is not None:
        info.fingerprint = fingerprint
    _describe_arrays(info.parameters, program.in_avals, in_ops, executable.get_parameter_layouts())
    results = _describe_arrays(
        info.results, program.out_avals, out_ops, executable.get_output_layouts()
    )
    for array, kind in zip(results, out_kinds, strict=False):
        if kind:
            array.memory_kind = kind
    with contextlib.suppress(Exception):  # not every backend reports it
        info.generated_code_bytes = executable.size_of_generated_code_in_bytes()
    try:
        for key, value in dict(executable.cost_analysis()).items():
            if isinstance(value, float | int) and not isinstance(value, bool):
                info.cost_analysis[key] = float(value)
    except Exception:  # not every backend reports costs
        pass
    return info.SerializeToString()


def _describe_arrays(arrays: Any, avals: Any, ops: Any, layouts: Any) -> list[Any]:
    """Add one ``pb.CompiledArray`` per aval to ``arrays``: dtype, shape, the sharding (``ops``:
    XLA's per array, or ``None``) and the layout; returns them."""
    added = []
    for i, aval in enumerate(avals):
        array = arrays.add(dtype=np.dtype(aval.dtype).name, shape=aval.shape)
        if ops is not None:
            array.sharding = ops[i].SerializeToString()
        if i < len(layouts):
            array.minor_to_major.extend(layouts[i]._xla_layout().minor_to_major())
        added.append(array)
    return added


def _aval(shape: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(shape.dimensions()), np.dtype(shape.numpy_dtype()))
