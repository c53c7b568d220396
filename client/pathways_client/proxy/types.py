"""IFRT wire types to NumPy and back: dtypes, shapes, byte strides, shardings, layouts.

IFRT serializes polymorphic types (shardings, layouts, programs, compile options) as
``xla.ifrt.Serialized {type_name, data}``; ``data`` is the proto of the named type. The kinds the
stock JAX client sends are handled here; any other kind is refused naming its ``type_name``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from pathways_client.proxy.errors import ProxyError

# DTypeProto.Kind numbers -> NumPy dtypes (ml_dtypes provides the 8- and 16-bit floats).
_DTYPES: dict[int, Any] = {
    1: np.bool_,
    2: np.int8,
    3: np.int16,
    4: np.int32,
    5: np.int64,
    6: np.uint8,
    7: np.uint16,
    8: np.uint32,
    9: np.uint64,
    10: np.float16,
    11: np.float32,
    12: np.float64,
    15: np.complex64,
    18: np.complex128,
}
try:  # ml_dtypes ships with jax
    import ml_dtypes

    _DTYPES.update(
        {
            16: ml_dtypes.bfloat16,
            19: ml_dtypes.float8_e5m2,
            20: ml_dtypes.float8_e4m3fn,
            21: ml_dtypes.int4,
            22: ml_dtypes.uint4,
            23: ml_dtypes.float8_e4m3b11fnuz,
            24: ml_dtypes.float8_e5m2fnuz,
            25: ml_dtypes.float8_e4m3fnuz,
            28: ml_dtypes.float8_e4m3,
            29: ml_dtypes.float8_e3m4,
            31: ml_dtypes.float8_e8m0fnu,
        }
    )
except ImportError:  # pragma: no cover
    pass
_KINDS = {np.dtype(v): k for k, v in _DTYPES.items()}


def to_numpy_dtype(dtype_proto: Any, field: str = "dtype") -> np.dtype:
    """The NumPy dtype of an ``xla.ifrt.DTypeProto``."""
    kind = dtype_proto.kind
    if kind not in _DTYPES:
        name = (
            type(dtype_proto).DESCRIPTOR.fields_by_name["kind"].enum_type.values_by_number.get(kind)
        )
        raise ProxyError(
            "UNIMPLEMENTED",
            f"{field}: dtype {name.name if name else kind} is not supported by the Pathways proxy",
        )
    return np.dtype(_DTYPES[kind])


def dtype_kind(dtype: np.dtype, field: str = "dtype") -> int:
    """The ``DTypeProto.Kind`` of a NumPy dtype; UNIMPLEMENTED naming it when there is none."""
    kind = _KINDS.get(np.dtype(dtype))
    if kind is None:
        raise ProxyError(
            "UNIMPLEMENTED",
            f"{field}: dtype {np.dtype(dtype)} is not supported by the Pathways proxy",
        )
    return kind


def fill_dtype(dtype_proto: Any, dtype: np.dtype) -> None:
    """Fill an ``xla.ifrt.DTypeProto`` from a NumPy dtype."""
    dtype_proto.kind = dtype_kind(dtype)


def from_host_buffer(
    data: np.ndarray, dtype: np.dtype, shape: tuple[int, ...], byte_strides: list[int] | None
) -> np.ndarray:
    """An array over a host buffer (bytes) sent by the client (dense, or with the given byte
    strides)."""
    if any(size < 0 for size in shape):
        # NumPy would infer a -1 from the buffer's size: not the shape the client declared.
        raise ProxyError("INVALID_ARGUMENT", f"shape {list(shape)}: dimensions must be 0 or more")
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if byte_strides is None or list(byte_strides) == _dense_strides(shape, dtype.itemsize):
        needed = count * dtype.itemsize
        if len(data) < needed:
            raise ProxyError(
                "INVALID_ARGUMENT",
                f"host buffer has {len(data)} bytes but shape {list(shape)} of {dtype} needs "
                f"{needed}",
            )
        return np.frombuffer(data, dtype=dtype, count=count).reshape(shape)
    if len(byte_strides) != len(shape):
        raise ProxyError(
            "INVALID_ARGUMENT",
            f"byte_strides has {len(byte_strides)} entries for a shape of rank {len(shape)}",
        )
    if any(s < 0 for s in byte_strides):
        raise ProxyError("UNIMPLEMENTED", f"negative byte_strides {list(byte_strides)}")
    if count == 0:
        return np.zeros(shape, dtype)
    # The buffer is the minimal region covering every element the strides reach.
    needed = sum(s * (n - 1) for s, n in zip(byte_strides, shape, strict=True)) + dtype.itemsize
    if needed > len(data):
        raise ProxyError(
            "INVALID_ARGUMENT",
            f"host buffer of {len(data)} bytes is too small for byte_strides {list(byte_strides)}",
        )
    view = np.ndarray(shape, dtype=dtype, buffer=data, strides=tuple(byte_strides))
    return np.ascontiguousarray(view)


def to_host_buffer(array: np.ndarray, byte_strides: list[int] | None) -> np.ndarray:
    """``array``'s bytes (a 1-D ``uint8`` array) laid out with ``byte_strides`` (dense row-major
    when None): a view of ``array`` when it is laid out so already, which the caller must not
    change afterwards, else a copy."""
    array = np.asarray(array)
    if byte_strides is None or list(byte_strides) == _dense_strides(array.shape, array.itemsize):
        return np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    if len(byte_strides) != array.ndim or any(s < 0 for s in byte_strides):
        raise ProxyError(
            "INVALID_ARGUMENT",
            f"byte_strides {list(byte_strides)} do not fit an array of shape {list(array.shape)}",
        )
    if not array.size:
        return np.empty(0, np.uint8)
    size = sum(s * (n - 1) for s, n in zip(byte_strides, array.shape, strict=True)) + array.itemsize
    out = np.zeros(size, np.uint8)
    np.ndarray(array.shape, dtype=array.dtype, buffer=out, strides=tuple(byte_strides))[...] = array
    return out


def _dense_strides(shape: tuple[int, ...] | list[int], itemsize: int) -> list[int]:
    strides, step = [], itemsize
    for n in reversed(list(shape)):
        strides.append(step)
        step *= max(int(n), 1)
    return strides[::-1]


@dataclass(frozen=True)
class ShardingSpec:
    """An IFRT sharding, decoded: its devices (in order), memory kind and how it splits arrays.

    ``op_sharding`` holds a serialized ``xla.OpSharding`` (HLO shardings); ``None`` means a
    single device, or every device holding the whole array (``replicated``)."""

    device_ids: tuple[int, ...]
    memory_kind: str = ""
    op_sharding: bytes | None = None
    replicated: bool = False


def decode_sharding(p: Any, sharding_proto: Any, field: str = "sharding") -> ShardingSpec:
    """Decode an ``xla.ifrt.ShardingProto`` (a ``Serialized`` IFRT sharding)."""
    serialized = sharding_proto.serialized_sharding
    kind, data = serialized.type_name, serialized.data
    try:
        if kind == "xla::ifrt::SingleDeviceSharding":
            m = p.SingleDeviceShardingProto.FromString(data)
            return ShardingSpec((m.device_id,), m.memory_kind)
        if kind == "xla::ifrt::HloSharding":
            m = p.HloShardingProto.FromString(data)
            return ShardingSpec(
                tuple(m.devices.device_ids), m.memory_kind, m.xla_op_sharding.SerializeToString()
            )
        if kind == "xla::ifrt::ConcreteEvenSharding":
            m = p.ConcreteEvenShardingProto.FromString(data)
            devices = tuple(m.devices.device_ids)
            if m.is_fully_replicated or len(devices) == 1:
                return ShardingSpec(devices, m.memory_kind, replicated=True)
        if kind == "xla::ifrt::OpaqueSharding":
            m = p.OpaqueShardingProto.FromString(data)
            if len(m.devices.device_ids) == 1:
                return ShardingSpec(tuple(m.devices.device_ids), m.memory_kind)
    except ProxyError:
        raise
    except Exception as exc:
        raise ProxyError("INVALID_ARGUMENT", f"{field}: cannot decode {kind}: {exc}") from exc
    raise ProxyError(
        "UNIMPLEMENTED", f"{field}: sharding {kind or '(no type_name)'} is not supported yet"
    )


def sharding_devices(p: Any, sharding_proto: Any, field: str) -> tuple[tuple[int, ...], str]:
    """The devices (in order) and memory kind of an ``xla.ifrt.ShardingProto`` of any kind."""
    serialized = sharding_proto.serialized_sharding
    kind, data = serialized.type_name, serialized.data
    messages = {
        "xla::ifrt::SingleDeviceSharding": p.SingleDeviceShardingProto,
        "xla::ifrt::HloSharding": p.HloShardingProto,
        "xla::ifrt::ConcreteEvenSharding": p.ConcreteEvenShardingProto,
        "xla::ifrt::ConcreteSharding": p.ConcreteShardingProto,
        "xla::ifrt::OpaqueSharding": p.OpaqueShardingProto,
    }
    if kind not in messages:
        raise ProxyError("UNIMPLEMENTED", f"{field}: sharding {kind!r} is not supported yet")
    try:
        m = messages[kind].FromString(data)
    except Exception as exc:
        raise ProxyError("INVALID_ARGUMENT", f"{field}: cannot decode {kind}: {exc}") from exc
    devices = (m.device_id,) if kind == "xla::ifrt::SingleDeviceSharding" else m.devices.device_ids
    return tuple(devices), m.memory_kind


def relabelled(spec: ShardingSpec, devices: tuple[int, ...], memory_kind: str = "") -> ShardingSpec:
    """``spec`` with its devices listed as ``devices`` (the same ones, reordered), each keeping
    the shard it holds: the tile assignment follows the devices to their new places."""
    if sorted(devices) != sorted(spec.device_ids):
        raise ValueError(f"devices {list(devices)} are not {list(spec.device_ids)} reordered")
    memory_kind = memory_kind or spec.memory_kind
    if spec.op_sharding is None or spec.replicated:
        return ShardingSpec(devices, memory_kind, spec.op_sharding, spec.replicated)
    from jax._src.lib import xla_client as xc

    op = xc.OpSharding()
    op.ParseFromString(spec.op_sharding)
    tiles = xc.HloSharding.from_proto(op).tile_assignment_devices()
    place = {device: position for position, device in enumerate(devices)}
    # Whole lists assigned: this OpSharding's list fields are copies (extend() changes none).
    op.tile_assignment_devices = [place[spec.device_ids[logical]] for logical in tiles]
    op.iota_reshape_dims = []
    op.iota_transpose_perm = []
    return ShardingSpec(devices, memory_kind, op.SerializeToString(), spec.replicated)


def encode_hlo_sharding(
    p: Any, out: Any, device_ids: list[int], op_sharding: bytes | None, memory_kind: str
) -> None:
    """Fill an ``xla.ifrt.ShardingProto`` with an HLO sharding (replicated when None)."""
    m = p.HloShardingProto()
    m.devices.device_ids.extend(device_ids)
    if op_sharding is None:
        m.xla_op_sharding.type = m.xla_op_sharding.REPLICATED
    else:
        m.xla_op_sharding.ParseFromString(op_sharding)
    if memory_kind:
        m.memory_kind = memory_kind
    out.serialized_sharding.type_name = "xla::ifrt::HloSharding"
    out.serialized_sharding.data = m.SerializeToString()


def default_layout(rank: int) -> bytes:
    """A serialized PjRt layout, dense row-major (what the CPU devices use).

    The client parses it as XLA's layout text (``{1,0}``: minor-to-major dimensions); it
    aborts the whole client process on anything else, so only this form is ever sent."""
    return ("{" + ",".join(str(d) for d in range(rank - 1, -1, -1)) + "}").encode()


Index = tuple[slice, ...]
"""A shard's place in its array: a slice per axis."""


def shard_indices(spec: ShardingSpec, shape: tuple[int, ...]) -> list[Index]:
    """The index of each device's shard (in the sharding's device order)."""
    count = len(spec.device_ids)
    whole = tuple(slice(0, n) for n in shape)
    if spec.op_sharding is None:
        return [whole] * count
    from jax._src import op_shardings
    from jax._src.lib import xla_client as xc

    op = xc.OpSharding()
    op.ParseFromString(spec.op_sharding)
    try:
        indices = op_shardings.op_sharding_to_indices(xc.HloSharding.from_proto(op), shape, count)
    except Exception as exc:
        raise ProxyError(
            "INVALID_ARGUMENT",
            f"sharding: cannot split an array of shape {list(shape)} over {count} devices: {exc}",
        ) from None
    return [normalized_index(index, shape) for index in indices]


def normalized_index(index: Index | None, shape: tuple[int, ...]) -> Index:
    """An index with explicit bounds (``slice(None)`` -> ``slice(0, n)``)."""
    if index is None:
        return tuple(slice(0, n) for n in shape)
    out = []
    for i, n in enumerate(shape):
        part = index[i] if i < len(index) else slice(None)
        start, stop, _ = part.indices(n)
        out.append(slice(start, stop))
    return tuple(out)
