"""Arrays over gRPC: regions of numpy arrays as chunked ``ArrayChunk`` streams, and back.

A whole array is one region. An executor of a multi-host slice holds only some shards of an
array, so it sends those regions; the receiver assembles the regions of every holder.

A chunk's bytes are never copied into or out of a protobuf message: the method tables carry
``ArrayChunk`` as :class:`ChunkCodec`, which sends ``data`` out of band
(:mod:`pathways_core.wire.fields`), and chunks are :class:`Chunk` objects whose ``data`` is a
view of the array sent or of the message received. Each copy of a 64 MiB array through the
protobuf classes cost ~50 ms on the benchmark host (a page fault per 4 KiB of each new
``bytes``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from pathways_core.wire import pathways_pb2 as pb
from pathways_core.wire.fields import append_bytes_field, split_bytes_field

#: Bytes per chunk. gRPC copies each message it sends into memory of its own: 1 MiB at a time
#: that memory is reused, 16 MiB at a time each copy met fresh pages (a 64 MiB put went from
#: ~690-750 MB/s to ~950-1130, old and new alternated; a get stayed at ~630-750).
CHUNK_BYTES = 1 << 20
#: XLA's CPU runtime takes a host array's memory as a device buffer, instead of copying it,
#: when it is aligned to 64 bytes (NumPy aligns to 16). That pays for large arrays only: a
#: 64 MiB put took ~50 ms, and then ~0.1; but below ~4 MiB a step reading the array took as
#: long or longer (up to +90 µs at 64 KiB) than with a copy of it into XLA's own memory.
DEVICE_ALIGNMENT = 64
ALIGN_FROM_BYTES = 4 << 20

Region = tuple[slice, ...]


def numeric_dtype(spelled: Any) -> np.dtype:
    """The dtype ``spelled`` (a name or a dtype) if arrays of it can live on devices (numbers
    and booleans, bfloat16 and the other ml_dtypes types); otherwise ``ValueError`` saying
    why."""
    try:
        dtype = np.dtype(spelled)
    except Exception:  # numpy's TypeError, or SyntaxError for odd spellings
        raise ValueError(f"dtype {str(spelled)[:64]!r} is not a dtype") from None
    plain = dtype.names is None and dtype.subdtype is None and not dtype.hasobject
    ml_dtype = dtype.kind == "V" and dtype.type is not np.void  # bfloat16, float8_*, int4...
    if not plain or (dtype.kind not in "biufc" and not ml_dtype) or dtype.itemsize == 0:
        raise ValueError(f"dtype {str(spelled)[:64]!r} is not a numeric dtype")
    if dtype.byteorder not in "=|":
        raise ValueError(
            f"dtype {str(spelled)[:64]!r} is not in this machine's byte order (devices read "
            "native bytes): convert the array with .astype(its dtype.newbyteorder('='))"
        )
    return dtype


def native_order(array: np.ndarray) -> np.ndarray:
    """``array`` in this machine's byte order (a copy if it was not), as ``jax.device_put``
    takes a big-endian array."""
    if array.dtype.byteorder in "=|":
        return array
    return array.astype(array.dtype.newbyteorder("="))


def empty_for_devices(shape: tuple[int, ...] | int, dtype: Any) -> np.ndarray:
    """A new array of ``shape`` and ``dtype`` to receive bytes that go onto devices: from
    :data:`ALIGN_FROM_BYTES` on, its memory starts at a multiple of :data:`DEVICE_ALIGNMENT`
    bytes (``MemoryError`` if it cannot be had)."""
    dtype = np.dtype(dtype)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes < ALIGN_FROM_BYTES:
        return np.empty(shape, dtype)
    raw = np.empty(nbytes + DEVICE_ALIGNMENT, np.uint8)
    offset = -raw.ctypes.data % DEVICE_ALIGNMENT
    return raw[offset : offset + nbytes].view(dtype).reshape(shape)


#: ``ArrayChunk.data``'s field number, and the header of a region's chunks after its first.
_DATA = pb.ArrayChunk.DESCRIPTOR.fields_by_name["data"].number
_NO_HEADER = pb.ArrayChunk()


class Chunk:
    """An ``ArrayChunk`` whose ``data`` is a view, not a copy: its other fields are read from
    ``header`` (an ``ArrayChunk`` without data)."""

    __slots__ = ("data", "header")

    def __init__(self, header: pb.ArrayChunk, data: memoryview | bytes) -> None:
        self.header = header
        self.data = data

    def __getattr__(self, name: str) -> Any:
        return getattr(self.header, name)


class ChunkCodec:
    """``ArrayChunk`` as the gRPC method tables use it (a message type's ``FromString``,
    ``SerializeToString`` and ``DESCRIPTOR``), with ``data`` out of band."""

    DESCRIPTOR = pb.ArrayChunk.DESCRIPTOR

    @staticmethod
    def FromString(message: bytes) -> Chunk:
        """A received chunk, its data a view of ``message``; ``ValueError`` if malformed."""
        rest, data = split_bytes_field(message, _DATA)
        return Chunk(pb.ArrayChunk.FromString(rest), data)

    @staticmethod
    def SerializeToString(chunk: Chunk | pb.ArrayChunk) -> bytes:
        """A chunk's bytes on the wire: its header serialized, then its data."""
        if isinstance(chunk, Chunk):
            return append_bytes_field(chunk.header.SerializeToString(), _DATA, chunk.data)
        return chunk.SerializeToString()


def to_chunks(buffer_id: str, array: np.ndarray) -> Iterator[Chunk]:
    """Chunks of a whole array."""
    whole = tuple(slice(0, n) for n in array.shape)
    return region_chunks(buffer_id, array.dtype, array.shape, [(whole, array)])


def explicit_region(region: Region, shape: tuple[int, ...]) -> Region:
    """``region`` with every bound given (``slice(None)`` is the whole axis, negative bounds
    count from the end); ``ValueError`` for one that is not a block of the array."""
    if len(region) != len(shape):
        raise ValueError(
            f"region {region!r} has {len(region)} slice(s); the array has {len(shape)} axes"
        )
    bounds = []
    for axis, (part, size) in enumerate(zip(region, shape, strict=True)):
        if not isinstance(part, slice):
            raise ValueError(f"region {region!r}: axis {axis} is not a slice")
        start, stop, step = part.indices(size)
        if step != 1 or stop < start:
            raise ValueError(f"region {region!r}: axis {axis} is not a contiguous block")
        bounds.append(slice(start, stop))
    return tuple(bounds)


def region_chunks(
    buffer_id: str, dtype: np.dtype, shape: tuple[int, ...], regions: Iterable[tuple[Region, Any]]
) -> Iterator[Chunk]:
    """Chunks of some regions (bounds and values) of an array of ``dtype`` and ``shape``,
    their data views of the values."""
    for given, values in regions:
        region = explicit_region(given, shape)
        values = np.ascontiguousarray(values)
        data = memoryview(values.reshape(-1).view(np.uint8)) if values.size else memoryview(b"")
        header = pb.ArrayChunk(
            buffer_id=buffer_id,
            dtype=np.dtype(dtype).name,
            shape=shape,
            total_bytes=len(data),
            begin=True,
            region_start=[s.start for s in region],
            region_stop=[s.stop for s in region],
        )
        yield Chunk(header, data[:CHUNK_BYTES])
        for offset in range(CHUNK_BYTES, len(data), CHUNK_BYTES):
            yield Chunk(_NO_HEADER, data[offset : offset + CHUNK_BYTES])


@dataclass
class Assembly:
    """An array being assembled from regions, possibly sent by several executors."""

    buffer_id: str = ""
    array: np.ndarray | None = None
    written: np.ndarray | None = None  # which elements arrived, once regions are partial
    whole: bool = False

    @property
    def complete(self) -> bool:
        if self.array is None:
            return False
        return self.whole or (self.written is not None and bool(self.written.all()))

    def add(self, chunks: Iterable[Chunk | pb.ArrayChunk]) -> None:
        """Write every region of a gRPC stream into the array."""
        header: Chunk | pb.ArrayChunk | None = None
        parts: list[memoryview | bytes] = []
        for chunk in chunks:
            if chunk.begin:
                self._add_region(header, parts)
                header, parts = chunk, [chunk.data]
            elif header is None:
                raise ValueError("array data arrived before its header")
            else:
                parts.append(chunk.data)
        self._add_region(header, parts)

    def receive(
        self,
        buffer_id: str,
        dtype_name: str,
        shape: tuple[int, ...],
        bounds: tuple[tuple[int, ...], tuple[int, ...]],
        nbytes: int,
        fill: Callable[[memoryview], None],
    ) -> None:
        """Receive one region (``bounds`` is its start and stop per axis): ``fill`` writes its
        ``nbytes`` into the memory it is given. A whole array is received straight into its
        own memory; a shard through a buffer of its shape."""
        try:
            dtype = np.dtype(dtype_name)
        except TypeError:
            raise ValueError(f"unknown dtype {dtype_name!r}") from None
        if self.array is None:
            self.buffer_id = buffer_id
            self.array = empty_for_devices(shape, dtype)
        elif self.array.dtype != dtype or self.array.shape != shape:
            raise ValueError("regions of one array disagree on its dtype or shape")
        if bounds == ((0,) * len(shape), shape):  # the common case, told apart cheaply
            region, whole = (), True
        else:
            region = tuple(slice(a, b) for a, b in zip(*bounds, strict=True))
            extent = self.array[region].shape
            whole = extent == self.array.shape
        target = self.array if whole else np.empty(extent, dtype)
        if target.nbytes != nbytes:
            raise ValueError("a region's size does not match its bounds")
        if target.nbytes:
            fill(memoryview(target.reshape(-1).view(np.uint8)))
        if whole:
            self.whole = True
        else:
            self.array[region] = target
            if self.written is None:
                self.written = np.zeros(self.array.shape, bool)
            self.written[region] = True

    def _add_region(
        self, header: Chunk | pb.ArrayChunk | None, parts: list[memoryview | bytes]
    ) -> None:
        if header is None:
            return
        size = sum(len(part) for part in parts)
        if size != header.total_bytes:
            raise ValueError(f"a region ended after {size} of {header.total_bytes} bytes")

        def fill(view: memoryview) -> None:
            offset = 0
            for part in parts:
                view[offset : offset + len(part)] = part
                offset += len(part)

        bounds = (tuple(header.region_start), tuple(header.region_stop))
        self.receive(header.buffer_id, header.dtype, tuple(header.shape), bounds, size, fill)


def from_chunks(chunks: Iterable[Chunk | pb.ArrayChunk]) -> tuple[str, np.ndarray]:
    """Assemble a whole array sent as one stream; returns its buffer id and value."""
    assembly = Assembly()
    assembly.add(chunks)
    if not assembly.complete:
        raise ValueError("the stream does not cover the whole array")
    assert assembly.array is not None
    return assembly.buffer_id, assembly.array
