"""Futures of arrays computed on islands, and the call that produces them.

A future names a buffer on an island's executors. It can feed the next call without a round
trip through the client, be fetched (``result()``), or be deleted; dropping the last reference
deletes the buffer too (after every computation queued before that uses it).
"""

from __future__ import annotations

import contextlib
import math
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import jax
import numpy as np

from pathways_client.errors import DeletedError, NodeFailed
from pathways_client.island_client import IslandClient, IslandError
from pathways_client.slices import Slice
from pathways_core.wire.arrays import Region, native_order, numeric_dtype

# Which shard of an input each device takes under an HLO sharding: JAX's own reading (not a
# public API; without it inputs are uploaded whole, as before).
try:
    from jax._src.op_shardings import op_sharding_to_indices
except ImportError:  # pragma: no cover - another JAX

    def op_sharding_to_indices(*_: Any) -> Any:
        raise NotImplementedError


if TYPE_CHECKING:
    from pathways_client.cluster import Cluster

RESULT_TIMEOUT_SECONDS = 600.0
# False: a sharded host input goes whole to the first executor, the others pulling it from
# there, as before (the transfer benchmark compares the two).
UPLOAD_IN_PARTS = True


@dataclass
class Specialized:
    """A compiled function for one set of input shapes: its artifact and signature."""

    name: str
    artifact: bytes
    in_avals: tuple[jax.ShapeDtypeStruct, ...]
    out_avals: tuple[jax.ShapeDtypeStruct, ...]
    in_tree: Any = None
    out_tree: Any = None
    nr_devices: int = 1
    # Each input's HLO sharding (None: unspecified, replicated), as exported.
    in_shardings_hlo: tuple[Any, ...] = ()
    # Its function id by the session that registered it: a session's island forgets the
    # function once no open session uses it, so each session registers it once.
    ids: weakref.WeakKeyDictionary[IslandClient, str] = field(
        default_factory=weakref.WeakKeyDictionary
    )

    @classmethod
    def from_artifact(cls, name: str, artifact: bytes) -> Specialized:
        """Read a serialized ``jax.export`` artifact's signature."""
        exported = jax.export.deserialize(bytearray(artifact))
        return cls(
            name=name,
            artifact=bytes(artifact),
            in_avals=tuple(struct_of(a) for a in exported.in_avals),
            out_avals=tuple(struct_of(a) for a in exported.out_avals),
            in_tree=exported.in_tree,
            out_tree=exported.out_tree,
            nr_devices=exported.nr_devices,
            in_shardings_hlo=input_shardings(exported),
        )


def input_shardings(exported: jax.export.Exported) -> tuple[Any, ...]:
    """Each input's HLO sharding as exported (None: unspecified), or () if they cannot be
    read. Exports with named shardings (the SDK's) keep them aside, in a private field that
    the executors read too (see ``pathways_executor.functions._mesh``)."""
    try:
        named = exported._in_named_shardings if exported._has_named_shardings else None
        if not named:
            return tuple(exported.in_shardings_hlo)
        return tuple(
            None if sharding is None else sharding._to_xla_hlo_sharding(len(aval.shape))
            for sharding, aval in zip(named, exported.in_avals, strict=True)
        )
    except Exception:  # another JAX: inputs are then uploaded whole
        return ()


def struct_of(aval: Any) -> jax.ShapeDtypeStruct:
    """An exported function's input or output: its shape, dtype and weak type (a result of
    Python numbers alone promotes as one does: a bfloat16 array times it stays bfloat16)."""
    return jax.ShapeDtypeStruct(
        tuple(aval.shape), aval.dtype, weak_type=bool(getattr(aval, "weak_type", False))
    )


def is_weak(value: Any) -> bool:
    """Whether a host value is weakly typed, as JAX has it: a Python number, or a jax.Array
    made of one."""
    return type(value) in (int, float, complex) or bool(getattr(value, "weak_type", False))


def describe(aval: Any) -> str:
    """``float32[4, 8]``."""
    return f"{np.dtype(aval.dtype).name}{list(aval.shape)}"


def host_array(value: Any) -> np.ndarray:
    """A host value as the array JAX would make of it (64-bit types narrowed unless x64);
    ``TypeError`` for what devices cannot hold (strings, objects, dates, typed PRNG keys)."""
    dtype = getattr(value, "dtype", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.extended):
        raise TypeError(
            f"an array of {dtype} (a typed PRNG key, from jax.random.key) cannot be sent to "
            "an island: send jax.random.key_data(key), and make the key again inside the "
            "function with jax.random.wrap_key_data"
        )
    array = native_order(np.asarray(value))
    try:
        numeric_dtype(array.dtype)
    except ValueError as error:
        raise TypeError(
            f"{type(value).__name__} {_short(value)} cannot be sent to an island ({error}): "
            "devices hold numbers and booleans"
        ) from None
    dtype = jax.dtypes.canonicalize_dtype(array.dtype)
    if type(value) is int and dtype != array.dtype:
        limits = np.iinfo(dtype)
        if not limits.min <= value <= limits.max:  # as jax.jit: never wrapped around
            raise OverflowError(f"Python int {value} too large to convert to {dtype.name}")
    return array if array.dtype == dtype else array.astype(dtype)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class Shaped:
    """A value known by its ``aval``: shape and dtype, as on a JAX array."""

    __slots__ = ()
    aval: jax.ShapeDtypeStruct

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.aval.shape)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.aval.dtype)

    @property
    def ndim(self) -> int:
        return len(self.aval.shape)

    @property
    def size(self) -> int:
        return math.prod(self.aval.shape)


HOST_OPERATIONS: dict[str, tuple[str, ...]] = {
    "arithmetic": (
        *("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__"),
        *("__truediv__", "__rtruediv__", "__floordiv__", "__rfloordiv__"),
        *("__matmul__", "__rmatmul__", "__pow__", "__neg__", "__abs__"),
    ),
    "indexing": ("__getitem__",),
    "a comparison": ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__"),
}
"""Python's operations on an array, by what they are: a value the islands hold refuses them."""

S = TypeVar("S", bound=type)


def refuses_host_operations(
    explanation: str, operations: dict[str, tuple[str, ...]] = HOST_OPERATIONS
) -> Callable[[S], S]:
    """A class decorator: each of ``operations`` on an instance raises TypeError naming it
    and the instance, then ``explanation`` (what to do instead)."""

    def refusal(what: str) -> Callable[..., Any]:
        def refuse(self: Any, *_: Any, **__: Any) -> Any:
            raise TypeError(f"{what} of {self!r}{explanation}")

        return refuse

    def decorate(cls: S) -> S:
        for what, names in operations.items():
            for name in names:
                setattr(cls, name, refusal(what))
        cls.__hash__ = object.__hash__  # type: ignore[assignment]  # identity, as before
        return cls

    return decorate


@refuses_host_operations(
    ": the array is on its island, so compute with it in a pw.function call, or take its "
    "value with .result() first"
)
class ArrayFuture(Shaped):
    """An array that is, or will be, computed on ``slice``: output ``output`` of ``node``.

    As with a ``jax.Array``, ``np.asarray``, ``float``, ``int`` and ``bool`` fetch its value
    (waiting for it); arithmetic, comparisons and indexing are refused, saying to compute in a
    ``pw.function``."""

    def __init__(
        self,
        cluster: Cluster,
        slice: Slice,
        buffer_id: str,
        aval: jax.ShapeDtypeStruct,
        node: str,
        done: Future[None] | None,
        shared: _Shared | None = None,
    ) -> None:
        self.cluster = cluster
        self.slice = slice
        self.buffer_id = buffer_id
        self.aval = aval
        self.node = node
        self._done = done
        self._shared = shared or _Shared({slice.island: buffer_id})
        self._lock = self._shared.lock
        self._copies = self._shared.copies
        self._deleted = False
        self._value: np.ndarray | None = None  # its value, once taken (as a jax.Array keeps)
        self._finalizer = weakref.finalize(self, _release, cluster, self._shared)

    def alias(self) -> ArrayFuture:
        """Another future of the same array, deleted on its own: the buffer is freed once
        every alias is (a program returning one output in two places)."""
        with self._lock:
            self._shared.holders += 1
        return ArrayFuture(
            self.cluster, self.slice, self.buffer_id, self.aval, self.node, self._done, self._shared
        )

    @property
    def deleted(self) -> bool:
        return self._deleted

    def ready(self) -> bool:
        """Whether the computation producing it has finished (successfully or not)."""
        return self._done is None or self._done.done()

    def wait(self, timeout: float | None = RESULT_TIMEOUT_SECONDS) -> None:
        """Block until computed; raise ``NodeFailed`` if its computation failed."""
        self._check_alive()
        if self._done is None:
            return
        try:
            self._done.result(timeout)
        except IslandError as error:
            self._check_alive()  # closed meanwhile, by another thread: say so
            raise NodeFailed(self.node, self.slice.island, str(error)) from None
        except TimeoutError:
            raise TimeoutError(
                f"{self.node!r} was not computed on island {self.slice.island!r} within "
                f"{timeout:g} s (it is still queued or running; wait longer, or pass "
                "timeout=None to wait as long as it takes)"
            ) from None

    def result(self, timeout: float | None = RESULT_TIMEOUT_SECONDS) -> np.ndarray:
        """The array's value on the host, read-only: fetched once, then kept with the future
        (as ``np.asarray`` of a ``jax.Array`` is); ``.copy()`` it to write to it."""
        value = self._value
        if value is not None and not self._deleted:
            return value
        self.wait(timeout)
        session = self.cluster.session(self.slice.island)
        try:
            value = session.get(self.buffer_id, timeout=timeout or RESULT_TIMEOUT_SECONDS)
        except IslandError as error:
            self._check_alive()  # closed meanwhile, by another thread: say so
            raise NodeFailed(self.node, self.slice.island, str(error)) from None
        value.flags.writeable = False
        self._value = value
        return value

    def block_until_ready(self) -> ArrayFuture:
        """As on a ``jax.Array``: wait until computed (see :meth:`wait`); return itself."""
        self.wait()
        return self

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        value = self.result()
        if dtype is not None:
            return value.astype(dtype)
        return value.copy() if copy else value

    def item(self, *index: int) -> Any:
        """As ``jax.Array.item``: one element as a Python scalar (fetching the value)."""
        return self.result().item(*index)

    def tolist(self) -> Any:
        """As ``jax.Array.tolist``: the value as nested Python lists (fetching it)."""
        return self.result().tolist()

    def __float__(self) -> float:
        return float(self.result())

    def __bool__(self) -> bool:  # as jax.Array: of one element, else ambiguous (ValueError)
        return bool(self.result())

    def __int__(self) -> int:
        return int(self.result())

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError(f"len() of a 0-d array: {self!r}")
        return self.shape[0]

    def delete(self) -> None:
        """Free the buffer on the island (after the computations already queued use it)."""
        with self._lock:
            if self._deleted:
                return
            self._deleted = True
            self._value = None
        self._finalizer()

    def buffer_on(self, island: str) -> str:
        """The buffer id of this array on ``island``. On another island it is announced (once)
        as held by this island's executors, which that island's executors pull it from
        directly over the data-centre network when a computation needs it: no bytes pass
        through the client, and nothing waits for the array to be computed."""
        self._check_alive()
        with self._lock:
            if island in self._copies:
                return self._copies[island]
            here, there = self.cluster.session(self.slice.island), self.cluster.session(island)
            source = here.holders(self.buffer_id)
            # Work there reading it waits in that island's queue until it is made here (its
            # executors waiting for it in island order could wait on this island's, for ever).
            source.pending = True
            self._copies[island] = there.place_remote(source)
            # Once made, or should it never be (its computation failed, its executor or session
            # is gone), that island is told: work there reading it goes, or fails naming why.
            here.export(self.buffer_id, there)
            return self._copies[island]

    def _check_alive(self) -> None:
        if self._deleted:
            raise DeletedError(
                f"the future of output of node {self.node!r} ({describe(self.aval)}) was "
                "deleted; keep it alive while it is still used"
            )
        if self.cluster.closed:
            raise DeletedError(
                f"the future of output of node {self.node!r} ({describe(self.aval)}) belongs "
                "to a closed connection (its 'with pw.connect(...)' block ended): its island "
                "freed it; take results before closing"
            )

    def __repr__(self) -> str:
        state = "deleted" if self._deleted else ("ready" if self.ready() else "pending")
        return (
            f"ArrayFuture({describe(self.aval)}, node={self.node!r}, "
            f"island={self.slice.island!r}, {state})"
        )


class _Shared:
    """What the aliases of one array share: island -> buffer id of the array and of its
    copies on other islands, freed together with the last alias."""

    def __init__(self, copies: dict[str, str]) -> None:
        self.copies = copies
        self.holders = 1
        self.lock = threading.Lock()


def hold_until_done(done: Future[None], held: list[ArrayFuture]) -> None:
    """Keep the arrays of ``held`` (aliases of inputs from other islands) until ``done``: a
    user's ``delete`` of one meanwhile freed it on its island before the work reading it here
    had pulled it, which then failed, or waited for good for it to be made."""
    if held:
        done.add_done_callback(lambda _: release_aliases(held))


def release_aliases(held: list[ArrayFuture]) -> None:
    for alias in held:
        alias.delete()


def _release(cluster: Cluster, shared: _Shared) -> None:
    with shared.lock:
        shared.holders -= 1
        if shared.holders:
            return
    for island, buffer_id in list(shared.copies.items()):
        # Without a session there is nothing to free: an island deletes a departed client's
        # buffers itself.
        session = cluster.open_session(island)
        if session is not None:
            with contextlib.suppress(Exception):
                session.delete([buffer_id])


def put(value: Any, slice: Slice) -> Any:
    """Upload a host value to ``slice`` once, as a future any number of calls can use (the
    order of ``jax.device_put``'s arguments); a pytree of values (a dict, a list, ...) as the
    same pytree of futures, as ``jax.device_put`` does."""
    if not isinstance(slice, Slice):
        raise TypeError(f"put: slice must be a Slice from cluster.slice(...) (got {slice!r})")
    cluster = slice.cluster_or_fail()
    leaves, tree = jax.tree_util.tree_flatten_with_path(value)
    if jax.tree_util.treedef_is_leaf(tree):
        return _put_one(cluster, _host_array("put", value), slice, is_weak(value))
    # Every leaf checked before any is uploaded.
    arrays = [_host_array(f"put: value{jax.tree_util.keystr(path)}", leaf) for path, leaf in leaves]
    futures = [
        _put_one(cluster, array, slice, is_weak(leaf))
        for array, (_, leaf) in zip(arrays, leaves, strict=True)
    ]
    return jax.tree_util.tree_unflatten(tree, futures)


def _host_array(what: str, value: Any) -> np.ndarray:
    try:
        return host_array(value)
    except TypeError as error:
        raise TypeError(f"{what}: {error}") from None


def _put_one(cluster: Cluster, array: np.ndarray, slice: Slice, weak: bool) -> ArrayFuture:
    buffer_id = _upload(cluster.session(slice.island), array, slice, "put")
    aval = jax.ShapeDtypeStruct(array.shape, array.dtype, weak_type=weak)
    return ArrayFuture(cluster, slice, buffer_id, aval, node="put", done=None)


def call(
    cluster: Cluster,
    slice: Slice,
    function: Specialized,
    inputs: Sequence[Any],
    node: str,
    names: Sequence[str] = (),
) -> list[ArrayFuture]:
    """Dispatch one call of ``function`` on ``slice``; returns its outputs' futures at once.

    ``inputs`` are futures (used where they are, or moved from another island) or host values
    (uploaded to the slice). ``names`` name the inputs in errors.
    """
    session = cluster.session(slice.island)
    function_id = function_id_on(session, function, slice.island)
    uploads: list[str] = []
    buffer_ids: list[str] = []
    foreign: list[ArrayFuture] = []
    try:
        for position, value in enumerate(inputs):
            if isinstance(value, ArrayFuture):
                try:
                    buffer_ids.append(value.buffer_on(slice.island))
                except DeletedError as error:
                    label = names[position] if position < len(names) else f"input {position}"
                    raise DeletedError(f"{label} of {node!r}: {error}") from None
                if value.slice.island != slice.island:
                    foreign.append(value.alias())
            else:
                shardings = function.in_shardings_hlo
                sharding = shardings[position] if position < len(shardings) else None
                buffer_id = _upload(session, host_array(value), slice, node, sharding)
                uploads.append(buffer_id)
                buffer_ids.append(buffer_id)
        submitted = session.submit(
            function_id, slice.devices, buffer_ids, len(function.out_avals), name=node
        )
    except BaseException:
        release_aliases(foreign)
        raise
    finally:
        if uploads:  # freed once the computation has used them (or at once, if not sent)
            session.delete(uploads)
    hold_until_done(submitted.done, foreign)
    return [
        ArrayFuture(cluster, slice, buffer_id, aval, node, submitted.done)
        for buffer_id, aval in zip(submitted.outputs, function.out_avals, strict=True)
    ]


def _upload(
    session: IslandClient, array: np.ndarray, slice: Slice, node: str, sharding: Any = None
) -> str:
    """Upload an input to the executor of the slice's first device or, sharded (``sharding``:
    its HLO sharding) over a slice spanning executors, to each executor the shards its devices
    take; a dead executor fails the node."""
    try:
        regions = (
            executor_regions(sharding, array.shape, slice.devices, session.device_owner)
            if UPLOAD_IN_PARTS
            else None
        )
        if regions is not None:
            return session.put_shards(array, regions)
        return session.put(array, slice.devices[0])
    except IslandError as error:
        raise NodeFailed(node, slice.island, f"uploading an input failed: {error}") from None


def executor_regions(
    sharding: Any, shape: tuple[int, ...], devices: Sequence[int], owners: Mapping[int, int]
) -> dict[int, list[Region]] | None:
    """The regions of an input of ``shape`` each executor owning some of ``devices`` (in the
    function's device order) takes under ``sharding``, an input's HLO sharding; None when one
    of them takes it whole (replicated, unspecified, or all on one executor)."""
    on_several = set(devices) <= owners.keys() and len({owners[d] for d in devices}) > 1
    if sharding is None or not shape or not on_several:
        return None
    try:
        indices = op_sharding_to_indices(sharding, shape, len(devices))
    except Exception:  # a sharding this version of JAX cannot map: the input goes whole
        return None
    taken: dict[int, dict[tuple[tuple[int, int], ...], None]] = {}
    for device, index in zip(devices, indices, strict=True):
        bounds = tuple(s.indices(n)[:2] for s, n in zip(index, shape, strict=True))
        taken.setdefault(owners[device], {})[bounds] = None
    # An executor taking every element (tiles are disjoint) is sent the array whole.
    size = math.prod(shape)
    if any(sum(math.prod(b - a for a, b in r) for r in held) >= size for held in taken.values()):
        return None
    return {
        executor: [tuple(slice(a, b) for a, b in bounds) for bounds in held]
        for executor, held in taken.items()
    }


def function_id_on(session: IslandClient, function: Specialized, island: str) -> str:
    """``function``'s id on ``island``, registered with this session the first time."""
    function_id = function.ids.get(session)
    if function_id is None:
        try:
            function_id = session.register(function.artifact, function.name)
        except IslandError as error:
            raise NodeFailed(function.name, island, f"registration refused: {error}") from None
        function.ids[session] = function_id
    return function_id
