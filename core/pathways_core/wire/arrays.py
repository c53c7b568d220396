"""Arrays over gRPC: regions of numpy arrays as chunked ``ArrayChunk`` streams, and back.

A whole array is one region. An executor of a multi-host slice holds only some shards of an
array, so it sends those regions; the receiver assembles the regions of every holder.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from pathways_core.wire import pb

CHUNK_BYTES = 16 << 20

Region = tuple[slice, ...]


def to_chunks(buffer_id: str, array: np.ndarray) -> Iterator[pb.ArrayChunk]:
    """Chunks of a whole array."""
    whole = tuple(slice(0, n) for n in array.shape)
    return region_chunks(buffer_id, array.dtype, array.shape, [(whole, array)])


def region_chunks(
    buffer_id: str, dtype: np.dtype, shape: tuple[int, ...], regions: Iterable[tuple[Region, Any]]
) -> Iterator[pb.ArrayChunk]:
    """Chunks of some regions (bounds and values) of an array of ``dtype`` and ``shape``."""
    for region, values in regions:
        values = np.ascontiguousarray(values)
        data = memoryview(values.reshape(-1).view(np.uint8)) if values.size else memoryview(b"")
        yield pb.ArrayChunk(
            buffer_id=buffer_id,
            dtype=np.dtype(dtype).name,
            shape=shape,
            total_bytes=len(data),
            data=bytes(data[:CHUNK_BYTES]),
            begin=True,
            region_start=[s.start for s in region],
            region_stop=[s.stop for s in region],
        )
        for offset in range(CHUNK_BYTES, len(data), CHUNK_BYTES):
            yield pb.ArrayChunk(data=bytes(data[offset : offset + CHUNK_BYTES]))


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

    def add(self, chunks: Iterable[pb.ArrayChunk]) -> None:
        """Write every region of a stream into the array."""
        region: bytearray | None = None
        header: pb.ArrayChunk | None = None
        filled = 0
        for chunk in chunks:
            if chunk.begin:
                self._flush(header, region, filled)
                header, region = chunk, bytearray(chunk.total_bytes)
                filled = 0
            elif region is None:
                raise ValueError("array data arrived before its header")
            size = len(chunk.data)
            if filled + size > len(region):
                raise ValueError("a region's chunks exceed its announced size")
            region[filled : filled + size] = chunk.data
            filled += size
        self._flush(header, region, filled)

    def _flush(self, header: pb.ArrayChunk | None, data: bytearray | None, filled: int) -> None:
        if header is None or data is None:
            return
        if filled != header.total_bytes:
            raise ValueError(f"a region ended after {filled} of {header.total_bytes} bytes")
        try:
            dtype = np.dtype(header.dtype)
        except TypeError:
            raise ValueError(f"unknown dtype {header.dtype!r}") from None
        if self.array is None:
            self.buffer_id = header.buffer_id
            self.array = np.empty(tuple(header.shape), dtype)
        elif self.array.dtype != dtype or self.array.shape != tuple(header.shape):
            raise ValueError("regions of one array disagree on its dtype or shape")
        region = tuple(
            slice(start, stop)
            for start, stop in zip(header.region_start, header.region_stop, strict=True)
        )
        target = self.array[region] if region else self.array
        if target.size * dtype.itemsize != len(data):
            raise ValueError("a region's size does not match its bounds")
        target[...] = np.frombuffer(data, dtype).reshape(target.shape)
        if target.size == self.array.size:
            self.whole = True
        else:
            if self.written is None:
                self.written = np.zeros(self.array.shape, bool)
            self.written[region] = True


def from_chunks(chunks: Iterable[pb.ArrayChunk]) -> tuple[str, np.ndarray]:
    """Assemble a whole array sent as one stream; returns its buffer id and value."""
    assembly = Assembly()
    assembly.add(chunks)
    if not assembly.complete:
        raise ValueError("the stream does not cover the whole array")
    assert assembly.array is not None
    return assembly.buffer_id, assembly.array
