"""Arrays over the wire: numpy arrays as chunked ``ArrayChunk`` streams and back."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from pathways_core.wire import pb

CHUNK_BYTES = 4 << 20


def to_chunks(
    buffer_id: str, array: np.ndarray, devices: Iterable[int] = ()
) -> Iterator[pb.ArrayChunk]:
    """Split an array into chunks; the first carries dtype, shape and size."""
    array = np.ascontiguousarray(array)
    data = memoryview(array.reshape(-1).view(np.uint8)) if array.size else memoryview(b"")
    total = len(data)
    yield pb.ArrayChunk(
        buffer_id=buffer_id,
        dtype=array.dtype.name,
        shape=array.shape,
        total_bytes=total,
        data=bytes(data[:CHUNK_BYTES]),
        devices=list(devices),
    )
    for offset in range(CHUNK_BYTES, total, CHUNK_BYTES):
        yield pb.ArrayChunk(data=bytes(data[offset : offset + CHUNK_BYTES]))


def from_chunks(chunks: Iterable[pb.ArrayChunk]) -> tuple[pb.ArrayChunk, np.ndarray]:
    """Reassemble an array; returns the first chunk (its metadata) and the array."""
    iterator = iter(chunks)
    first = next(iterator, None)
    if first is None:
        raise ValueError("no array was sent")
    buffer = bytearray(first.total_bytes)
    filled = len(first.data)
    buffer[:filled] = first.data
    for chunk in iterator:
        size = len(chunk.data)
        if filled + size > len(buffer):
            raise ValueError("the array's chunks exceed its announced size")
        buffer[filled : filled + size] = chunk.data
        filled += size
    if filled != len(buffer):
        raise ValueError(f"the array ended after {filled} of {len(buffer)} bytes")
    try:
        dtype = np.dtype(first.dtype)
    except TypeError:
        raise ValueError(f"unknown dtype {first.dtype!r}") from None
    return first, np.frombuffer(buffer, dtype=dtype).reshape(tuple(first.shape))
