"""``@program``: a Python function calling compiled functions, traced into a dataflow graph
(``pathways_core.dataflow``) and dispatched all at once.

Running a program submits every node before any finishes (parallel asynchronous dispatch): a
node's inputs are futures of nodes queued before it, so the islands run ahead of the client.
``sequential=True`` waits for each node before submitting the next, for comparison. A program
can also be written out as a PathwaysProgram resource and run later without its Python.
"""

from __future__ import annotations

import base64
import contextvars
import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from pydantic import ValidationError

from pathways_client.errors import DeletedError, NodeFailed
from pathways_client.functions import CompiledFunction
from pathways_client.futures import (
    HOST_OPERATIONS,
    ArrayFuture,
    Shaped,
    Specialized,
    call,
    describe,
    function_id_on,
    hold_until_done,
    host_array,
    is_weak,
    put,
    refuses_host_operations,
    release_aliases,
)
from pathways_client.island_client import IslandClient, IslandError, ProgramTooLarge
from pathways_client.parameters import Parameters, Statics, statics_key, with_statics
from pathways_client.slices import Slice
from pathways_core.dataflow import Dataflow, Node, Ref, Source
from pathways_core.manifests import problems_of
from pathways_core.resources import PathwaysProgram
from pathways_core.resources.program import (
    PROGRAM_NAME,
    FunctionArtifact,
)
from pathways_core.scheduling.programs import MAX_PROGRAM_NODES
from pathways_core.topology import format_shape
from pathways_core.wire import pb

_UPLOADS = ThreadPoolExecutor(max_workers=8, thread_name_prefix="upload")
_ACTIVE: contextvars.ContextVar[Trace | None] = contextvars.ContextVar("trace", default=None)


def active_trace() -> Trace | None:
    """The program being traced in this context, if any."""
    return _ACTIVE.get()


# Python on such a value cannot be traced into the graph: say what to do instead.
@refuses_host_operations(
    " inside a @pw.program: the program's values are arrays the islands will compute, so "
    "compute with them in pw.function calls (and with their results after the program "
    "returns); an argument the program uses as a Python value, in a loop or an if, must be "
    "static: pw.program(static_argnames=(...))",
    {
        **HOST_OPERATIONS,
        "a truth test": ("__bool__",),
        "the host value": ("__array__", "__float__", "__int__", "__index__"),
    },
)
class Traced(Shaped):
    """A value inside a program being traced: an argument, or a node's output."""

    __slots__ = ("aval", "ref", "slice")

    def __init__(self, ref: Ref, aval: jax.ShapeDtypeStruct, slice: Slice | None) -> None:
        self.ref = ref
        self.aval = aval
        self.slice = slice

    def __repr__(self) -> str:
        return f"Traced({describe(self.aval)}, {self.ref})"


@dataclass
class Trace:
    """What tracing records: the graph, its functions and the values captured as constants."""

    flow: Dataflow = field(default_factory=Dataflow)
    functions: dict[str, tuple[Slice, Specialized]] = field(default_factory=dict)
    constants: list[Any] = field(default_factory=list)
    argument_avals: list[jax.ShapeDtypeStruct] = field(default_factory=list)
    out_tree: Any = None
    # Island program ids by placement (session, each node's devices): see ``dispatch``.
    registered: dict[Any, str] = field(default_factory=dict)

    def record(
        self, function: CompiledFunction, specialized: Specialized, leaves: Sequence[Any]
    ) -> list[Traced]:
        """Add a call of ``function`` as a node; return its outputs as traced values."""
        inputs = []
        for leaf in leaves:
            if isinstance(leaf, Traced):
                inputs.append(leaf.ref)
            else:
                self.constants.append(leaf)
                inputs.append(Ref(Source.CONSTANT, len(self.constants) - 1))
        key = self._function_key(function, specialized)
        name = _unique(_label(function.name), {node.name for node in self.flow.nodes})
        self.flow.nodes.append(
            Node(name, key, function.slice.name, tuple(inputs), len(specialized.out_avals))
        )
        return [
            Traced(Ref(Source.NODE, index, name), aval, function.slice)
            for index, aval in enumerate(specialized.out_avals)
        ]

    def _function_key(self, function: CompiledFunction, specialized: Specialized) -> str:
        for key, (slice, known) in self.functions.items():
            if known is specialized and slice is function.slice:
                return key
        key = _unique(_label(function.name), set(self.functions))
        self.functions[key] = (function.slice, specialized)
        return key


class Program:
    """A traced Python function over compiled functions. Call it like the function: it
    returns futures (a pytree like the function's result)."""

    def __init__(
        self,
        fun: Callable[..., Any],
        name: str | None = None,
        static_argnums: int | Sequence[int] = (),
        static_argnames: str | Sequence[str] = (),
    ) -> None:
        self.fun = fun
        self.name = _label(name or getattr(fun, "__name__", "program"))
        self._parameters = Parameters(
            fun, f"program {self.name!r}", static_argnums, static_argnames
        )
        self._traces: dict[Any, Trace] = {}

    def _split(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any], Statics]:
        """A call's arguments that are arrays, and its static ones."""
        if not self._parameters.any_static:
            return args, kwargs, ()
        if kwargs:
            args, kwargs = self._parameters.bind(args, kwargs)
        return self._parameters.split_statics(args, kwargs)

    def trace(self, *args: Any, **kwargs: Any) -> Trace:
        """Trace the function for arguments shaped like ``args`` and ``kwargs`` (cached by
        shapes, and by the values of static arguments)."""
        args, kwargs, statics = self._split(args, kwargs)
        return self._trace(args, kwargs, statics)

    def _trace(self, args: tuple[Any, ...], kwargs: dict[str, Any], statics: Statics) -> Trace:
        leaves, tree = jax.tree.flatten((args, kwargs))
        avals = []
        for position, leaf in enumerate(leaves):
            try:
                avals.append(_aval(leaf))
            except TypeError as error:
                raise TypeError(f"program {self.name!r}: argument {position}: {error}") from None
        key = (
            tree,
            tuple(
                (tuple(a.shape), np.dtype(a.dtype), getattr(a, "weak_type", False)) for a in avals
            ),
            statics_key(statics),
        )
        cached = self._traces.get(key)
        if cached is not None:
            return cached
        trace = Trace(argument_avals=avals)
        trace.flow.arguments = len(avals)
        traced_args, traced_kwargs = jax.tree.unflatten(
            tree,
            [
                Traced(Ref(Source.ARGUMENT, i), aval, getattr(leaf, "slice", None))
                for i, (leaf, aval) in enumerate(zip(leaves, avals, strict=True))
            ],
        )
        traced_args, traced_kwargs = with_statics(traced_args, traced_kwargs, statics)
        token = _ACTIVE.set(trace)
        try:
            result = self.fun(*traced_args, **traced_kwargs)
        finally:
            _ACTIVE.reset(token)
        out_leaves, trace.out_tree = jax.tree.flatten(result)
        for position, leaf in enumerate(out_leaves):
            if not isinstance(leaf, Traced) or leaf.ref.source is not Source.NODE:
                raise TypeError(
                    f"program {self.name!r}: result {position} is not computed by a compiled "
                    f"function ({type(leaf).__name__}); programs return node outputs"
                )
        trace.flow.constants = len(trace.constants)
        trace.flow.outputs = tuple(leaf.ref for leaf in out_leaves)
        trace.flow.validate()
        self._traces[key] = trace
        return trace

    def __call__(self, *args: Any, sequential: bool = False, **kwargs: Any) -> Any:
        if active_trace() is not None:
            # Called inside another program: its calls become nodes of that program.
            return self.fun(*args, **kwargs)
        args, kwargs, statics = self._split(args, kwargs)
        trace = self._trace(args, kwargs, statics)
        outputs = dispatch(
            trace.flow,
            trace.functions,
            arguments=jax.tree.leaves((args, kwargs)),
            constants=trace.constants,
            sequential=sequential,
            registered=trace.registered,
        )
        # One output returned in several places: each its own future, as jax.jit's are.
        seen: set[int] = set()
        for position, output in enumerate(outputs):
            if id(output) in seen:
                outputs[position] = output.alias()
            seen.add(id(output))
        return jax.tree.unflatten(trace.out_tree, outputs)

    def to_resource(
        self,
        *args: Any,
        kwargs: Mapping[str, Any] | None = None,
        name: str | None = None,
        namespace: str | None = None,
        steps: int = 1,
        weight: int = 1,
        priority: int = 0,
    ) -> PathwaysProgram:
        """This program, with ``args`` (and ``kwargs``, its keyword arguments) baked in, as a
        PathwaysProgram resource: the cluster can run it with no Python. Arguments and
        captured values become source nodes (functions with no inputs that return them) on
        the slice of their first consumer."""
        args, kwargs, statics = self._split(args, dict(kwargs or {}))
        trace = self._trace(args, kwargs, statics)
        values = [*jax.tree.leaves((args, kwargs)), *trace.constants]
        functions = dict(trace.functions)
        flow = _with_source_nodes(trace, values, functions)
        slices = {item.name: item for item, _ in functions.values()}
        # A program over several islands stays so (its arrays cross between them); one on a
        # single island may run on whichever fits.
        pinned = len({item.island for item in slices.values()}) > 1
        document = {
            "metadata": {"name": name or self.name, "namespace": namespace},
            "spec": {
                "slices": [_program_slice(item, pinned) for item in slices.values()],
                "graph": flow.to_graph(
                    {
                        key: self._artifact(key, specialized.artifact)
                        for key, (_, specialized) in functions.items()
                    }
                ),
                "steps": steps,
                "weight": weight,
                "priority": priority,
            },
        }
        try:
            return PathwaysProgram.model_validate(document)
        except ValidationError as error:  # one line naming each field, as the API would
            problems = "; ".join(map(str, problems_of(error, PathwaysProgram)))
            raise ValueError(f"program {self.name!r} as a resource: {problems}") from None

    def _artifact(self, key: str, artifact: bytes) -> FunctionArtifact:
        """Function ``key`` of the resource, its artifact inline; a ValueError naming it when
        it cannot be (too large to inline)."""
        try:
            return FunctionArtifact(
                name=key,
                inline=base64.b64encode(artifact).decode(),
                sha256=hashlib.sha256(artifact).hexdigest(),
            )
        except ValidationError as error:
            problems = "; ".join(map(str, problems_of(error, FunctionArtifact)))
            raise ValueError(
                f"program {self.name!r} as a resource: function {key!r} ({len(artifact)} bytes "
                f"exported, arguments and captured values included): {problems}; pass large "
                "values as inputs of a driver program, or make them smaller"
            ) from None


def program(
    fun: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    static_argnums: int | Sequence[int] = (),
    static_argnames: str | Sequence[str] = (),
) -> Any:
    """Turn a Python function that calls compiled functions into a ``Program``.

    ``static_argnums`` / ``static_argnames`` name arguments passed as Python values, not
    arrays, as with ``jax.jit``: a step count, a flag, a compiled function to call. Each
    distinct (hashable) value traces the program anew."""

    def wrap(target: Callable[..., Any]) -> Program:
        return Program(target, name, static_argnums, static_argnames)

    return wrap if fun is None else wrap(fun)


def dispatch(
    flow: Dataflow,
    functions: Mapping[str, tuple[Slice, Specialized]],
    arguments: Sequence[Any] = (),
    constants: Sequence[Any] = (),
    sequential: bool = False,
    registered: dict[Any, str] | None = None,
) -> list[ArrayFuture]:
    """Submit every node of ``flow`` in dependency order; return the outputs' futures.

    In parallel mode nothing waits: each node's inputs are futures of nodes already queued. A
    graph on one island goes as one call of a program registered there (``registered`` keeps
    its id per placement of the slices, for the next call). In sequential mode each node is
    awaited before the next is submitted.
    """
    order = flow.order()
    islands = {functions[node.function][0].island for node in order}
    # A graph larger than an island program may be (in nodes, or in the bytes of its
    # registration) goes node by node, as across islands.
    if not sequential and len(islands) == 1 and 0 < len(order) <= MAX_PROGRAM_NODES:
        try:
            return _call_on_island(
                flow,
                order,
                functions,
                arguments,
                constants,
                {} if registered is None else registered,
            )
        except ProgramTooLarge:
            pass
    produced: dict[tuple[str, int], ArrayFuture] = {}
    uploaded = _upload_host_values(order, functions, arguments, constants)

    def value(ref: Ref) -> Any:
        if ref.source is Source.NODE:
            return produced[(ref.node, ref.index)]
        if ref in uploaded:
            return uploaded[ref].result()
        return (arguments if ref.source is Source.ARGUMENT else constants)[ref.index]

    for node in order:
        slice, specialized = functions[node.function]
        outputs = call(
            slice.cluster_or_fail(),
            slice,
            specialized,
            [value(ref) for ref in node.inputs],
            node=node.name,
            names=[f"input {ref}" for ref in node.inputs],
        )
        for index, output in enumerate(outputs):
            produced[(node.name, index)] = output
        if sequential and outputs:
            outputs[0].wait()
    return [value(ref) for ref in flow.outputs]


def _call_on_island(
    flow: Dataflow,
    order: list[Node],
    functions: Mapping[str, tuple[Slice, Specialized]],
    arguments: Sequence[Any],
    constants: Sequence[Any],
    registered: dict[Any, str],
) -> list[ArrayFuture]:
    """A program whose nodes all run on one island: registered there once per placement of
    its slices (remembered in ``registered``) and called with one message, one place in the
    island's order and one completion."""
    first = functions[order[0].function][0]
    cluster, island = first.cluster_or_fail(), first.island
    session = cluster.session(island)
    used = list(
        dict.fromkeys(ref for node in order for ref in node.inputs if ref.source is not Source.NODE)
    )
    results = list(dict.fromkeys(flow.outputs))
    # Per session: a reopened session (a restarted island) has the program registered anew.
    placement = (session, tuple(functions[node.function][0].devices for node in order))
    program_id = registered.get(placement)
    if program_id == "":
        raise ProgramTooLarge("registered before: too large")
    if program_id is None:
        try:
            program_id = _register_program(session, island, order, functions, used, results)
        except ProgramTooLarge:
            registered[placement] = ""  # the next calls go node by node at once
            raise
        registered[placement] = program_id
    uploaded = _upload_host_values(order, functions, arguments, constants)
    buffer_ids: list[str] = []
    foreign: list[ArrayFuture] = []  # aliases of inputs from other islands, held for the call
    try:
        for ref in used:
            given = (arguments if ref.source is Source.ARGUMENT else constants)[ref.index]
            if ref in uploaded:
                # Deleted when dropped: after this call, which was queued before.
                buffer_ids.append(uploaded[ref].result().buffer_id)
                continue
            try:
                buffer_ids.append(given.buffer_on(island))
            except DeletedError as error:
                raise DeletedError(f"input {ref} of the program: {error}") from None
            if given.slice.island != island:
                foreign.append(given.alias())
        submitted = session.call(program_id, buffer_ids)
    except BaseException:
        release_aliases(foreign)
        raise
    hold_until_done(submitted.done, foreign)
    producers = {node.name: functions[node.function] for node in order}
    futures = {}
    for ref, buffer_id in zip(results, submitted.outputs, strict=True):
        slice, specialized = producers[ref.node]
        aval = specialized.out_avals[ref.index]
        futures[ref] = ArrayFuture(cluster, slice, buffer_id, aval, ref.node, submitted.done)
    return [futures[ref] for ref in flow.outputs]


def _register_program(
    session: IslandClient,
    island: str,
    order: list[Node],
    functions: Mapping[str, tuple[Slice, Specialized]],
    used: list[Ref],
    results: list[Ref],
) -> str:
    nodes = []
    for node in order:
        slice, specialized = functions[node.function]
        function_id = function_id_on(session, specialized, island)
        nodes.append(
            pb.Computation(
                id=node.name,
                function_id=function_id,
                devices=list(slice.devices),
                inputs=[_local_name(ref) for ref in node.inputs],
                outputs=[_local_name(Ref(Source.NODE, i, node.name)) for i in range(node.outputs)],
                name=node.name,
            )
        )
    try:
        return session.register_program(
            nodes, [_local_name(ref) for ref in used], [_local_name(ref) for ref in results]
        )
    except ProgramTooLarge:
        raise
    except IslandError as error:
        raise NodeFailed(order[0].name, island, f"program refused: {error}") from None


def _local_name(ref: Ref) -> str:
    """A value's name inside an island program (no '/': a call's buffers are
    ``<call id>/<name>``)."""
    if ref.source is Source.NODE:
        return f"{ref.node}.{ref.index}"
    return f"{ref.source.value}-{ref.index}"


def _upload_host_values(
    order: list[Node],
    functions: Mapping[str, tuple[Slice, Specialized]],
    arguments: Sequence[Any],
    constants: Sequence[Any],
) -> dict[Ref, Future[ArrayFuture]]:
    """Start uploading every host value the nodes use, once each, to the slice of its first
    consumer; uploads overlap each other and the submission of nodes that do not need them."""
    first_use: dict[Ref, Slice] = {}
    for node in order:
        for ref in node.inputs:
            if ref.source is not Source.NODE and ref not in first_use:
                given = (arguments if ref.source is Source.ARGUMENT else constants)[ref.index]
                if not isinstance(given, ArrayFuture):
                    first_use[ref] = functions[node.function][0]
    if not first_use:
        return {}

    def upload(ref: Ref) -> ArrayFuture:
        given = (arguments if ref.source is Source.ARGUMENT else constants)[ref.index]
        return put(given, first_use[ref])

    return {ref: _UPLOADS.submit(upload, ref) for ref in first_use}


def _with_source_nodes(
    trace: Trace, values: list[Any], functions: dict[str, tuple[Slice, Specialized]]
) -> Dataflow:
    """The trace's graph with every argument and constant produced by a source node."""
    first_consumer: dict[int, Slice] = {}
    offset = trace.flow.arguments
    slices = {item.name: item for item, _ in functions.values()}
    for node in trace.flow.nodes:
        for ref in node.inputs:
            if ref.source is not Source.NODE:
                index = ref.index + (offset if ref.source is Source.CONSTANT else 0)
                first_consumer.setdefault(index, slices[node.slice])
    names = {node.name for node in trace.flow.nodes}
    sources: dict[int, str] = {}
    source_nodes = []
    for index, slice in sorted(first_consumer.items()):
        value = np.asarray(values[index])
        label = f"argument-{index}" if index < offset else f"constant-{index - offset}"
        node_name = _unique(label, names)
        names.add(node_name)
        constant = CompiledFunction(lambda v=value: v, slice, name=node_name)
        key = _unique(node_name, set(functions))
        functions[key] = (slice, constant.specialize())
        source_nodes.append(Node(node_name, key, slice.name, (), 1))
        sources[index] = node_name

    def rewire(ref: Ref) -> Ref:
        if ref.source is Source.NODE:
            return ref
        index = ref.index + (offset if ref.source is Source.CONSTANT else 0)
        return Ref(Source.NODE, 0, sources[index])

    flow = Dataflow(
        nodes=source_nodes
        + [
            Node(n.name, n.function, n.slice, tuple(rewire(r) for r in n.inputs), n.outputs)
            for n in trace.flow.nodes
        ],
        outputs=trace.flow.outputs,
    )
    flow.validate()
    return flow


def _program_slice(item: Slice, pinned: bool) -> dict[str, Any]:
    """A slice of the program's resource: its size or mesh, and its island when ``pinned``."""
    size: dict[str, Any] = (
        {"devices": item.size} if len(item.shape) == 1 else {"shape": format_shape(item.shape)}
    )
    return {"name": item.name, **size, **({"island": item.island} if pinned else {})}


def _aval(value: Any) -> jax.ShapeDtypeStruct:
    if isinstance(value, ArrayFuture | Traced):
        return value.aval
    array = host_array(value)
    # A Python number is weakly typed, as in jax.jit.
    return jax.ShapeDtypeStruct(array.shape, array.dtype, weak_type=is_weak(value))


def _label(name: str) -> str:
    """A DNS label short enough to name a program (what resource names of programs, nodes
    and functions must be)."""
    label = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[: PROGRAM_NAME.max_length]
    return label.rstrip("-") or "node"


def _unique(name: str, taken: set[str]) -> str:
    if name not in taken:
        return name
    counter = 2
    while f"{name}-{counter}" in taken:
        counter += 1
    return f"{name}-{counter}"
