"""Compiled functions: ``jax.export`` artifacts loaded once, compiled once per device set."""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding

from pathways_core.scheduling.limits import artifact_limit_from, artifact_problem
from pathways_core.wire import pb
from pathways_executor import stablehlo
from pathways_executor.artifact_check import ArtifactChecker

STABLEHLO = pb.FunctionRegistration.STABLEHLO
# Functions whose outputs take this many bytes per device or more end in a token (see
# ``Callable.token_sharding``). A token is one more buffer per launch (~3 µs, ~15% of a small
# computation's dispatch); below this size an output held until its computation is reported,
# and a new buffer where it could have been taken over, cost less than that.
TOKEN_FROM_BYTES = 32 * 1024


class FunctionError(Exception):
    """A function cannot be loaded or called as asked."""


@dataclass(frozen=True)
class Callable:
    """A function ready to run on one device set: the jitted call and where its inputs go."""

    name: str
    run: Any
    in_shardings: tuple[Any, ...]
    in_avals: tuple[Any, ...]
    out_count: int
    # STABLEHLO functions: what the program compiled to (a serialized pb.CompiledProgram).
    description: bytes = b""
    # Inputs whose buffer an output can reuse (same shape, dtype and sharding as an output):
    # ``donating`` may hand them to the computation when it is their last use.
    donatable: frozenset[int] = frozenset()
    # The jitted Python function behind ``run``, where there is one (jax.export artifacts).
    # It returns its outputs flat (no pytree to walk on every call), then its token if any.
    traced: Any = None
    # ``run`` takes an input on another of this process's devices and moves it itself, in
    # its C++ call (single-device jax.export functions): a chain's link then costs ~7 µs less
    # than a copy before the call (36 against 29 µs a link in a bare loop).
    moves_inputs: bool = False
    # Where ``traced`` puts its last result, a token: a boolean scalar that is ready exactly
    # when the computation is done. The executor waits for it instead of the outputs, which
    # a later computation may take over meanwhile. None: no token (the outputs are waited for,
    # and not taken over until the computation is reported; see TOKEN_FROM_BYTES).
    token_sharding: Any = None
    _donating: dict[tuple[int, ...], Any] = field(default_factory=dict, repr=False)
    _refused: set[tuple[int, ...]] = field(default_factory=set, repr=False)
    # (shape, dtype) per input: checked on every call, so compared as plain tuples.
    signature: tuple[tuple[tuple[int, ...], np.dtype], ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        signature = tuple((tuple(aval.shape), np.dtype(aval.dtype)) for aval in self.in_avals)
        object.__setattr__(self, "signature", signature)

    def donating(self, positions: tuple[int, ...]) -> Any | None:
        """``run`` handing the inputs at ``positions`` to the computation (their buffers become
        its outputs' instead of new ones); None until ``prepare_donating`` made it."""
        return self._donating.get(positions)

    def prepare_donating(self, positions: tuple[int, ...], arguments: list[Any]) -> None:
        """Compile the variant of ``run`` donating ``positions`` and run it once on copies of
        ``arguments``: a new executable's first run is slow, and the computation taking over
        an input would carry that time in the trace (so would the input's producer, reported
        with it). If that fails, the variant is never tried again: ``run`` always works."""
        if positions in self._refused:
            return
        try:
            donating = jax.jit(
                self.traced,
                out_shardings=_traced_shardings(self.out_count, self.token_sharding),
                donate_argnums=positions,
            )
            copies = [a.copy() if i in positions else a for i, a in enumerate(arguments)]
            jax.block_until_ready(donating(*copies))
        except Exception as error:  # whatever the reason, it runs as it did
            self._refused.add(positions)
            print(
                f"executor: {self.name!r} runs without donating {positions}: {error}",
                file=sys.stderr,
                flush=True,
            )
            return
        self._donating[positions] = donating


class FunctionCache:
    """Loaded artifacts by function id; compiles them for a device set (the runner keeps the
    compiled forms, a bounded number of them)."""

    def __init__(
        self, max_artifact_bytes: int | None = None, checker: ArtifactChecker | None = None
    ) -> None:
        # Parses artifacts' modules in a helper process before they are loaded here.
        self._checker = checker
        # The scheduler enforces the island's limit; checked again here (same setting).
        self.max_artifact_bytes = max_artifact_bytes or artifact_limit_from(os.environ)
        self._lock = threading.Lock()
        self._exported: dict[str, tuple[str, Any]] = {}
        self._failed: dict[str, str] = {}

    def register(self, function_id: str, artifact: bytes, name: str = "", kind: int = 0) -> None:
        """Load an artifact (``kind``: a ``pb.FunctionRegistration.Kind``, jax.export by
        default); raises ``FunctionError`` (and remembers why) if it is corrupt."""
        label = name or function_id[:12]
        with self._lock:
            if function_id in self._exported:
                # Loaded already (an id is its artifact's hash): a later copy, even a corrupt
                # one, changes nothing.
                return
        try:
            too_large = artifact_problem(
                label, len(artifact), self.max_artifact_bytes, "this executor"
            )
            if too_large is not None:
                raise FunctionError(too_large)
            digest = hashlib.sha256(artifact).hexdigest()
            if digest != function_id:
                raise FunctionError(
                    f"function {label!r}: artifact digest {digest[:12]} does not match its id "
                    f"{function_id[:12]} (corrupted in transit or storage)"
                )
            # A STABLEHLO artifact is parsed (and checked) by the stablehlo module instead.
            loaded = self._stablehlo(label, artifact) if kind == STABLEHLO else None
            try:
                exported = loaded or jax.export.deserialize(bytearray(artifact))
            except Exception as error:
                raise FunctionError(
                    f"function {label!r} is not a jax.export artifact this executor can load "
                    f"(jax {jax.__version__}): {type(error).__name__}: {error}"
                ) from None
            if loaded is None and (symbolic := symbolic_dimension(exported)) is not None:
                raise FunctionError(
                    f"function {label!r} has a symbolic dimension ({symbolic}): an island "
                    "compiles each function once for fixed shapes; export it with concrete "
                    "ones (jax.ShapeDtypeStruct((4, 8), ...), not jax.export.symbolic_shape)"
                )
            if self._checker is not None and loaded is None:
                try:
                    problem = self._checker.check(bytes(exported.mlir_module_serialized))
                except RuntimeError as error:
                    problem = str(error)
                if problem is not None:
                    raise FunctionError(
                        f"function {label!r} is not a jax.export artifact this executor can "
                        f"load: {problem}"
                    )
        except FunctionError as error:
            with self._lock:
                self._failed[function_id] = str(error)
            raise
        with self._lock:
            self._exported[function_id] = (label, exported)
            self._failed.pop(function_id, None)

    def forget(self, function_ids: Collection[str]) -> None:
        """Drop functions no session uses any more (a later registration of the same id
        loads it again)."""
        with self._lock:
            for function_id in function_ids:
                self._exported.pop(function_id, None)
                self._failed.pop(function_id, None)

    def forget_all(self) -> None:
        """Drop every function (its scheduler was replaced: no session uses any)."""
        with self._lock:
            self._exported.clear()
            self._failed.clear()

    @property
    def loaded(self) -> int:
        """Functions registered and not forgotten."""
        return len(self._exported)

    def callable(self, function_id: str, devices: list[jax.Device]) -> Callable:
        """The function compiled for these devices (in the slice's virtual order)."""
        with self._lock:
            if function_id in self._failed:
                raise FunctionError(self._failed[function_id])
            if function_id not in self._exported:
                raise FunctionError(f"function {function_id[:12]} was never registered")
            name, exported = self._exported[function_id]
        if isinstance(exported, stablehlo.Program):
            return self._stablehlo_callable(name, exported, devices)
        if exported.nr_devices != len(devices):
            raise FunctionError(
                f"function {name!r} was exported for {exported.nr_devices} device(s) but the "
                f"slice has {len(devices)}"
            )
        if len(devices) == 1:
            replicated = SingleDeviceSharding(devices[0])
            shardings = tuple(replicated for _ in exported.in_avals)
            out_shardings = tuple(replicated for _ in exported.out_avals)
        else:
            mesh = _mesh(exported, devices)
            replicated = NamedSharding(mesh, PartitionSpec())
            shardings = tuple(s or replicated for s in exported.in_shardings_jax(mesh))
            out_shardings = tuple(s or replicated for s in exported.out_shardings_jax(mesh))
        inputs = list(zip(exported.in_avals, shardings, strict=True))
        outputs = list(zip(exported.out_avals, out_shardings, strict=True))
        # Only slices within this process take inputs over (executors of a slice spanning
        # hosts could otherwise run differently compiled programs of one collective). An
        # exported function with outputs of TOKEN_FROM_BYTES or more per device ends in a
        # token, which tells when its computation is done without holding its outputs: a
        # program call's intermediates are freed at their last read, as a JAX loop drops them,
        # not kept until the call is reported.
        in_process = _in_process(shardings)
        token = replicated if _bytes_per_device(outputs) >= TOKEN_FROM_BYTES else None

        def traced(*arguments: Any) -> tuple[jax.Array, ...]:
            results = tuple(jax.tree.leaves(exported.call(*arguments)))
            return results if token is None else (*results, jnp.zeros((), jnp.bool_))

        single = len(devices) == 1
        placed = {"in_shardings": shardings} if single else {}
        # Outputs go where the exported function puts them; with no inputs to carry the slice's
        # devices into the call, they are told (else it runs on one device, and refuses to).
        told = None if single or exported.in_avals else out_shardings
        run = jax.jit(traced, out_shardings=_traced_shardings(len(outputs), token, told), **placed)
        return Callable(
            name=name,
            run=run,
            in_shardings=shardings,
            in_avals=tuple(exported.in_avals),
            out_count=len(exported.out_avals),
            donatable=_reusable(inputs, outputs) if in_process else frozenset(),
            traced=traced,
            moves_inputs=single,
            token_sharding=token,
        )

    def _stablehlo(self, label: str, artifact: bytes) -> stablehlo.Program:
        """Load a STABLEHLO artifact, its module parsed by the checker's helper first."""

        def check(module: bytes) -> str | None:
            if self._checker is None:
                return None
            try:
                return self._checker.check(module)
            except RuntimeError as error:
                return str(error)

        try:
            return stablehlo.load(label, artifact, check)
        except stablehlo.ProgramError as error:
            raise FunctionError(str(error)) from None

    def _stablehlo_callable(self, name: str, program: Any, devices: list[jax.Device]) -> Callable:
        """A STABLEHLO program compiled on this executor for ``devices``."""
        try:
            try:
                compiled = stablehlo.compile_for(program, devices)
            except MemoryError:
                # Seen now and then on loaded 2-core CI machines while reading the compiled
                # program's shardings and layouts (cause not found yet): compiled once more.
                print(
                    f"executor: MemoryError compiling {name!r}; compiling it again",
                    file=sys.stderr,
                    flush=True,
                )
                compiled = stablehlo.compile_for(program, devices)
        except stablehlo.ProgramError as error:
            raise FunctionError(str(error)) from None
        except MemoryError as error:
            raise FunctionError(
                f"function {name!r}: out of memory compiling it ({error!r})"
            ) from None
        return Callable(
            name=name,
            run=compiled.run,
            in_shardings=compiled.in_shardings,
            in_avals=program.in_avals,
            out_count=len(program.out_avals),
            description=compiled.description,
        )


def _traced_shardings(
    out_count: int, token_sharding: Any, outputs: tuple[Any, ...] | None = None
) -> tuple[Any, ...]:
    """A ``traced`` function's output shardings: its outputs' (``outputs``, else as exported),
    then its token's."""
    token = () if token_sharding is None else (token_sharding,)
    return (*(outputs if outputs is not None else [None] * out_count), *token)


def symbolic_dimension(exported: jax.export.Exported) -> str | None:
    """Where ``exported`` has a symbolic dimension ("input 0 is float32[b,4]"), or None."""
    for side, avals in (("input", exported.in_avals), ("output", exported.out_avals)):
        for position, aval in enumerate(avals):
            if any(jax.export.is_symbolic_dim(size) for size in aval.shape):
                return f"{side} {position} is {aval.str_short()}"
    return None


def _bytes_per_device(outputs: list[tuple[Any, Any]]) -> int:
    """The bytes of one device's shards of ``outputs`` (aval, sharding)."""
    return sum(
        int(np.prod(sharding.shard_shape(aval.shape))) * np.dtype(aval.dtype).itemsize
        for aval, sharding in outputs
    )


def _in_process(shardings: tuple[Any, ...]) -> bool:
    """Whether every sharding's devices are this process's own."""
    return all(sharding.is_fully_addressable for sharding in shardings)


def _reusable(inputs: list[tuple[Any, Any]], outputs: list[tuple[Any, Any]]) -> frozenset[int]:
    """Positions of the inputs whose buffer an output can take over: each output matches
    at most one input of the same shape, dtype and sharding."""
    free = list(outputs)
    positions = set()
    for position, (aval, sharding) in enumerate(inputs):
        for output in free:
            out_aval, out_sharding = output
            if (aval.shape, aval.dtype) == (out_aval.shape, out_aval.dtype) and (
                sharding.is_equivalent_to(out_sharding, len(aval.shape))
            ):
                free.remove(output)
                positions.add(position)
                break
    return frozenset(positions)


def _mesh(exported: Any, devices: list[jax.Device]) -> Mesh:
    """The mesh to run an exported function on: the slice's devices (in virtual order) laid out
    like the mesh it was exported with, so its named shardings apply unchanged."""
    named = [
        sharding.mesh
        for sharding in (
            *getattr(exported, "_in_named_shardings", ()),
            *getattr(exported, "_out_named_shardings", ()),
        )
        if sharding is not None
    ]
    if getattr(exported, "_has_named_shardings", False) and named:
        abstract = named[0]
        grid = np.array(devices, dtype=object).reshape(abstract.axis_sizes)
        return Mesh(grid, abstract.axis_names, axis_types=abstract.axis_types)
    # Artifacts with HLO shardings only are mesh-independent: any mesh of the right size works.
    return Mesh(np.array(devices), ("devices",))


def check_inputs(function: Callable, values: list[Any]) -> None:
    """Raise ``FunctionError`` naming the first input whose shape or dtype is not expected."""
    signature = function.signature
    if len(values) == len(signature) and all(
        getattr(value, "shape", None) == shape and getattr(value, "dtype", None) == dtype
        for value, (shape, dtype) in zip(values, signature, strict=True)
    ):
        return
    if len(values) != len(function.in_avals):
        raise FunctionError(
            f"function {function.name!r} takes {len(function.in_avals)} input(s), got {len(values)}"
        )
    for index, (value, aval) in enumerate(zip(values, function.in_avals, strict=True)):
        shape, dtype = tuple(np.shape(value)), np.dtype(getattr(value, "dtype", None))
        if shape != tuple(aval.shape) or dtype != aval.dtype:
            raise FunctionError(
                f"input {index} of function {function.name!r} is {dtype}{list(shape)}, expected "
                f"{aval.dtype}{list(aval.shape)}"
            )
