"""``@function``: a JAX function placed on a virtual slice becomes a compiled function.

It is exported with ``jax.export`` for the slice's mesh (abstract: no local devices needed),
registered with the slice's island once per content hash, and called like the function itself:
calls return futures at once. Inside a ``@program`` the calls are recorded instead.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from pathways_client.futures import (
    ArrayFuture,
    Specialized,
    call,
    describe,
    host_array,
    input_shardings,
    is_weak,
    struct_of,
)
from pathways_client.parameters import Parameters, Statics, statics_key, with_statics
from pathways_client.slices import Slice


class CompiledFunction:
    """A JAX function on a slice. Call it with arrays, futures, or pytrees of them."""

    def __init__(
        self,
        fun: Callable[..., Any],
        slice: Slice,
        *,
        in_shardings: Any = None,
        out_shardings: Any = None,
        axes: Sequence[str] | None = None,
        input_specs: Sequence[Any] | None = None,
        name: str | None = None,
        static_argnums: int | Sequence[int] = (),
        static_argnames: str | Sequence[str] = (),
    ) -> None:
        if not callable(fun):
            raise TypeError(f"pw.function places a callable (got {type(fun).__name__})")
        if not isinstance(slice, Slice):
            raise TypeError(f"slice must be a Slice from cluster.slice(...) (got {slice!r})")
        self.fun = fun
        self.slice = slice
        self.name = name or getattr(fun, "__name__", "function").replace("_", "-").strip("-<>")
        self.mesh = slice.mesh(tuple(axes) if axes else None)
        self._in_shardings = in_shardings
        self._out_shardings = out_shardings
        self._parameters = Parameters(
            fun, f"function {self.name!r}", static_argnums, static_argnames
        )
        if input_specs is not None and self._parameters.any_static:
            raise TypeError("give input_specs or static arguments, not both")
        self._fixed = None
        if input_specs is not None:
            self._fixed = [
                jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype), spec)
                for spec in input_specs
            ]
        self._specialized: dict[tuple[Any, ...], Specialized] = {}

    # -- compiling ---------------------------------------------------------------------------

    def specialize(self, *avals: Any, **keyword_avals: Any) -> Specialized:
        """The function exported for arguments of these shapes and dtypes (pytrees of
        ``jax.ShapeDtypeStruct``, by position and by keyword); cached."""
        return self._specialize(avals, keyword_avals, ())

    def _specialize(
        self, avals: tuple[Any, ...], keyword_avals: dict[str, Any], statics: Statics
    ) -> Specialized:
        """:meth:`specialize`, the static arguments' values put back in their places."""
        leaves, tree = jax.tree.flatten((avals, keyword_avals))
        key = (
            tree,
            tuple(
                (tuple(a.shape), np.dtype(a.dtype), getattr(a, "weak_type", False)) for a in leaves
            ),
            statics_key(statics),
        )
        cached = self._specialized.get(key)
        if cached is not None:
            return cached
        if jax.config.jax_debug_nans or jax.config.jax_debug_infs:
            warnings.warn(
                f"function {self.name!r}: jax_debug_nans and jax_debug_infs do not apply on an "
                "island (its executors run the compiled function as is): check with "
                "jax.experimental.checkify (errors=checkify.float_checks), returning the "
                "error and calling .throw() on it",
                stacklevel=3,
            )

        def fun(*positional: Any, **keywords: Any) -> Any:
            positional, keywords = with_statics(positional, keywords, statics)
            return self.fun(*positional, **keywords)

        # Executors call functions with flat lists of arrays: export a flat view of the
        # function, and keep the user's argument and result structure here.
        try:
            outputs = jax.eval_shape(fun, *avals, **keyword_avals)
        except TypeError as error:  # JAX's own: shapes, dtypes, a value used in Python
            raise self._uncompilable(avals, keyword_avals, error, statics) from error
        except Exception as error:  # the function's own (a KeyError, an assert): as jax.jit
            error.add_note(str(self._uncompilable(avals, keyword_avals, error, statics)))
            raise
        out_tree = jax.tree.structure(outputs)
        for leaf in jax.tree.leaves(outputs):
            if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.extended):
                raise TypeError(
                    f"function {self.name!r} returns an array of {leaf.dtype} (typed PRNG "
                    "keys), which islands cannot hold: return jax.random.key_data(key), and "
                    "make the key again where it is used with jax.random.wrap_key_data"
                )

        traced_tree: list[Any] = []

        def flat(*arguments: Any) -> tuple[Any, ...]:
            positional, keywords = jax.tree.unflatten(tree, arguments)
            results, structure = jax.tree.flatten(fun(*positional, **keywords))
            traced_tree.append(structure)
            return tuple(results)

        if self.slice.size == 1:
            self._check_one_device_shardings(avals, keyword_avals, outputs)
            jitted = jax.jit(flat)
        else:
            if keyword_avals and not _is_spec(self._in_shardings):
                raise TypeError(
                    f"function {self.name!r}: keyword arguments "
                    f"({', '.join(sorted(keyword_avals))}) need in_shardings given as one "
                    "PartitionSpec for every argument (as jax.jit has it): pass them by "
                    "position, or give one PartitionSpec"
                )
            jitted = jax.jit(
                flat,
                in_shardings=self._flat_shardings(
                    self._dynamic_in_shardings(len(avals)),
                    (avals, keyword_avals) if keyword_avals else avals,
                ),
                out_shardings=self._flat_shardings(
                    self._out_shardings, jax.tree.unflatten(out_tree, [0] * out_tree.num_leaves)
                ),
            )
        try:
            exported = jax.export.export(jitted)(*leaves)
        except ValueError as error:  # shardings that do not fit the arguments' ranks
            raise self._uncompilable(avals, keyword_avals, error, statics) from error
        except NotImplementedError as error:  # host callbacks: jax.export cannot carry them
            advice = (
                " (jax.debug.print, jax.debug.callback, pure_callback and io_callback run "
                "Python on the host that compiled them, which an island's executors are not: "
                "return the values and print or compute them in the driver)"
            )
            problem = self._uncompilable(avals, keyword_avals, error, statics)
            raise TypeError(f"{problem}{advice if 'callback' in str(error) else ''}") from error
        specialized = Specialized(
            name=self.name,
            artifact=bytes(exported.serialize()),
            in_avals=tuple(struct_of(a) for a in exported.in_avals),
            out_avals=tuple(struct_of(a) for a in exported.out_avals),
            in_tree=tree,
            # The structure of the trace exported: a result's structure may hold what the
            # trace numbered (checkify's error codes), which the first trace numbered apart.
            out_tree=traced_tree[-1] if traced_tree else out_tree,
            nr_devices=exported.nr_devices,
            in_shardings_hlo=input_shardings(exported),
        )
        self._specialized[key] = specialized
        return specialized

    def _uncompilable(
        self,
        avals: tuple[Any, ...],
        keyword_avals: dict[str, Any],
        error: Exception,
        statics: Statics,
    ) -> TypeError:
        first_line = str(error).split("\n", 1)[0]  # JAX appends advice on its tracebacks
        if not isinstance(error, TypeError):
            first_line = f"{type(error).__name__}: {first_line}"
        if isinstance(error, jax.errors.JAXTypeError) or "concrete values" in first_line:
            first_line += (
                " (an argument the function uses as a Python value, in an if or a shape, must "
                "be static: pw.function(..., static_argnames=(...)))"
            )
        arguments = self._describe_arguments(*with_statics(avals, keyword_avals, statics))
        return TypeError(
            f"function {self.name!r} cannot be compiled for arguments {arguments}: {first_line}"
        )

    def _dynamic_in_shardings(self, count: int) -> Any:
        """``in_shardings`` for ``count`` positional arguments: given one per argument that is
        not static (as ``jax.jit`` takes them), a placeholder goes in each static one's place."""
        given, static = self._in_shardings, self._parameters.static_positions
        if _is_spec(given) or not static:
            return given
        given = tuple(given)
        dynamic = [i for i in range(count) if i not in static]
        if len(given) != len(dynamic) or len(given) == count:
            return given
        specs = iter(given)
        return tuple(None if i in static else next(specs) for i in range(count))

    def _check_one_device_shardings(
        self, avals: tuple[Any, ...], keyword_avals: dict[str, Any], outputs: Any
    ) -> None:
        """Shardings are checked on a slice of one device as on a larger one (as jax.jit
        does), though its one device takes every array whole: an axis its mesh does not
        have, or more entries than an array has axes, is refused here too."""
        checks = [(self._out_shardings, outputs)]
        if _is_spec(self._in_shardings) or not keyword_avals:
            values = (avals, keyword_avals) if keyword_avals else avals
            checks.append((self._dynamic_in_shardings(len(avals)), values))
        for given, values in checks:
            leaves = jax.tree.leaves(values)
            for sharding, leaf in zip(self._flat_shardings(given, values), leaves, strict=True):
                if len(sharding.spec) > len(leaf.shape):
                    raise TypeError(
                        f"function {self.name!r}: sharding {sharding.spec} has "
                        f"{len(sharding.spec)} entries, more than the {len(leaf.shape)} axes "
                        f"of {describe(leaf)}"
                    )

    def _flat_shardings(self, given: Any, values: Any) -> tuple[NamedSharding, ...]:
        """One sharding per leaf of ``values``: ``given`` is one PartitionSpec for all, or a
        prefix of ``values`` (one per argument, as with ``jax.jit``); unspecified means
        replicated."""

        def named(spec: Any) -> NamedSharding:
            if isinstance(spec, NamedSharding):
                return spec
            try:
                return NamedSharding(self.mesh, PartitionSpec() if spec is None else spec)
            except ValueError as error:  # an axis the slice's mesh does not have
                raise TypeError(
                    f"function {self.name!r}: sharding {spec} does not fit slice "
                    f"{self.slice.name!r}: {error}"
                ) from None

        if _is_spec(given):
            return (named(given),) * len(jax.tree.leaves(values))
        if isinstance(given, list):
            given = tuple(given)
        if isinstance(values, list):
            values = tuple(values)
        try:
            expanded = jax.tree.map(
                lambda spec, value: jax.tree.map(lambda _: named(spec), value),
                given,
                values,
                is_leaf=_is_spec,
            )
        except ValueError as error:
            raise TypeError(
                f"function {self.name!r}: shardings {given} do not match the structure of its "
                f"arguments or results: {error}"
            ) from None
        return tuple(jax.tree.leaves(expanded, is_leaf=lambda x: isinstance(x, NamedSharding)))

    # -- calling -----------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from pathways_client.programs import active_trace

        if kwargs:
            args, kwargs = self._parameters.bind(args, kwargs)
        statics: Statics = ()
        if self._parameters.any_static:
            args, kwargs, statics = self._parameters.split_statics(args, kwargs)
        avals = tuple(self._avals(arg, self._parameters.label(i)) for i, arg in enumerate(args))
        keyword_avals = {
            name: self._avals(arg, f"argument {name!r}") for name, arg in kwargs.items()
        }
        self._check_fixed(avals, keyword_avals)
        specialized = self._specialize(avals, keyword_avals, statics)
        leaves = jax.tree.leaves((args, kwargs))
        trace = active_trace()
        if trace is not None:
            outputs = trace.record(self, specialized, leaves)
        else:
            outputs = call(
                self.slice.cluster_or_fail(),
                self.slice,
                specialized,
                leaves,
                node=self.name,
                names=self._leaf_names(args, kwargs),
            )
        return jax.tree.unflatten(specialized.out_tree, outputs)

    def _avals(self, argument: Any, label: str) -> Any:
        """An argument's shapes and dtypes (a pytree like it); ``TypeError`` naming it if a
        leaf is something devices cannot hold."""
        try:
            return jax.tree.map(self._aval, argument)
        except TypeError as error:
            raise TypeError(f"function {self.name!r}: {label}: {error}") from None

    def _aval(self, value: Any) -> jax.ShapeDtypeStruct:
        if isinstance(value, ArrayFuture):
            return value.aval
        aval = getattr(value, "aval", None)  # values traced inside a @program
        if isinstance(aval, jax.ShapeDtypeStruct):
            return aval
        array = host_array(value)
        # A Python number is weakly typed, as in jax.jit (x * 2.0 keeps a bfloat16 x's dtype),
        # as is a jax.Array made of one (jnp.asarray(0.1)).
        return jax.ShapeDtypeStruct(array.shape, array.dtype, weak_type=is_weak(value))

    def _check_fixed(self, avals: tuple[Any, ...], keyword_avals: dict[str, Any]) -> None:
        if self._fixed is None:
            return
        if keyword_avals:
            raise TypeError(
                f"function {self.name!r} has input_specs by position: pass "
                f"{', '.join(sorted(keyword_avals))} by position"
            )
        if len(avals) != len(self._fixed):
            raise TypeError(
                f"function {self.name!r} takes {len(self._fixed)} argument(s), got {len(avals)}"
            )
        for position, (given, expected) in enumerate(zip(avals, self._fixed, strict=True)):
            given_leaves, given_tree = jax.tree.flatten(given)
            expected_leaves, expected_tree = jax.tree.flatten(expected)
            label = self._parameters.label(position)
            if given_tree != expected_tree:
                raise TypeError(
                    f"{label} of function {self.name!r} has structure {given_tree}, expected "
                    f"{expected_tree}"
                )
            for g, e in zip(given_leaves, expected_leaves, strict=True):
                if tuple(g.shape) != tuple(e.shape) or np.dtype(g.dtype) != np.dtype(e.dtype):
                    raise TypeError(
                        f"{label} of function {self.name!r} is {describe(g)}, expected "
                        f"{describe(e)}"
                    )

    def _leaf_names(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[str]:
        """A label per leaf, in the order of ``jax.tree.leaves((args, kwargs))``."""
        names = []
        for position, arg in enumerate(args):
            names.extend([self._parameters.label(position)] * len(jax.tree.leaves(arg)))
        for name in sorted(kwargs):  # a dict's leaves come in sorted key order
            names.extend([f"argument {name!r}"] * len(jax.tree.leaves(kwargs[name])))
        return names

    def _describe_arguments(self, avals: tuple[Any, ...], keyword_avals: dict[str, Any]) -> str:
        """``a=float32[2, 3], b=float32[3]``: each argument by name, leaves by shape."""
        known = self._parameters.names
        names = [*known, *(str(i) for i in range(len(known), len(avals)))]
        named = [*zip(names, avals, strict=False), *sorted(keyword_avals.items())]
        # A pytree's leaves each by its path: params['w1']=float32[4, 4].
        return ", ".join(
            f"{name}{jax.tree_util.keystr(path)}={_describe_leaf(leaf)}"
            for name, aval in named
            for path, leaf in jax.tree_util.tree_flatten_with_path(aval)[0]
        )

    def __repr__(self) -> str:
        return f"CompiledFunction({self.name!r}, slice={self.slice.name!r})"


def function(
    fun: Callable[..., Any] | None = None,
    *,
    slice: Slice,
    in_shardings: Any = None,
    out_shardings: Any = None,
    axes: Sequence[str] | None = None,
    input_specs: Sequence[Any] | None = None,
    name: str | None = None,
    static_argnums: int | Sequence[int] = (),
    static_argnames: str | Sequence[str] = (),
) -> Any:
    """Place a JAX function on ``slice``.

    ``in_shardings`` / ``out_shardings`` are PartitionSpecs over the slice's mesh (axes ``x``,
    ``y``, ... or ``axes``), one per argument or one for all, as with ``jax.jit``; unspecified
    is replicated. ``input_specs`` (``jax.ShapeDtypeStruct`` pytrees, one per argument) fixes
    the signature: calls with other shapes or dtypes raise before anything is dispatched.
    ``static_argnums`` / ``static_argnames`` name arguments passed as Python values, not
    arrays, as with ``jax.jit``: each distinct (hashable) value compiles the function anew.
    """

    def wrap(target: Callable[..., Any]) -> CompiledFunction:
        return CompiledFunction(
            target,
            slice,
            in_shardings=in_shardings,
            out_shardings=out_shardings,
            axes=axes,
            input_specs=input_specs,
            name=name,
            static_argnums=static_argnums,
            static_argnames=static_argnames,
        )

    return wrap if fun is None else wrap(fun)


def _describe_leaf(leaf: Any) -> str:
    """``float32[2, 3]`` for an array's shape, the value of a static argument."""
    return describe(leaf) if isinstance(leaf, jax.ShapeDtypeStruct) else repr(leaf)


def _is_spec(value: Any) -> bool:
    """One sharding for every leaf (None: replicated)."""
    return value is None or isinstance(value, PartitionSpec | NamedSharding)
