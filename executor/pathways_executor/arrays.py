"""Which regions of a buffer this executor can send, and host arrays uploaded in parts (the
rest of the codec is in the core)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import jax
import numpy as np

from pathways_core.wire.arrays import Chunk, Region, empty_for_devices

Bounds = tuple[tuple[int, int], ...]
"""A region as its (start, stop) on each axis."""


@dataclass(frozen=True)
class HostShards:
    """Some regions of a host array: what an executor is sent of an input sharded over a
    slice spanning several executors (each is sent the shards its own devices take)."""

    shape: tuple[int, ...]
    dtype: np.dtype
    regions: dict[Bounds, np.ndarray]

    @property
    def nbytes(self) -> int:
        return sum(values.nbytes for values in self.regions.values())

    def __getitem__(self, index: tuple[slice, ...]) -> np.ndarray:
        """The values at ``index`` (a device's shard), from the region that holds them."""
        wanted = tuple(s.indices(n)[:2] for s, n in zip(index, self.shape, strict=True))
        for bounds, values in self.regions.items():
            pairs = list(zip(bounds, wanted, strict=True))
            if all(a <= start and stop <= b for (a, b), (start, stop) in pairs):
                return values[tuple(slice(start - a, stop - a) for (a, _), (start, stop) in pairs)]
        raise ValueError(
            f"this executor was sent the regions {sorted(self.regions)} of an input of shape "
            f"{list(self.shape)}, not {list(wanted)}: it was split for another layout"
        )


def received_upload(chunks: Iterable[Chunk]) -> tuple[str, np.ndarray | HostShards]:
    """An upload's buffer id and value: the whole array, or the regions sent (checked by the
    caller: one dtype, shape and buffer id, each region inside the shape, sizes that match).
    Each region is written straight into memory of its own, aligned for the devices."""
    buffer_id, shape, dtype = "", (), np.dtype(np.uint8)
    held: dict[Bounds, np.ndarray] = {}
    view, offset = memoryview(b""), 0
    for chunk in chunks:
        if chunk.begin:  # the caller checked the region before ended where it said
            buffer_id, shape, dtype = chunk.buffer_id, tuple(chunk.shape), np.dtype(chunk.dtype)
            starts = tuple(chunk.region_start) or (0,) * len(shape)
            stops = tuple(chunk.region_stop) or shape
            bounds = tuple(zip(starts, stops, strict=True))
            target = empty_for_devices(tuple(b - a for a, b in bounds), dtype)
            held[bounds] = target
            view, offset = memoryview(target.reshape(-1).view(np.uint8)), 0
        view[offset : offset + len(chunk.data)] = chunk.data
        offset += len(chunk.data)
    if offset != len(view):  # the last region: only the stream's end shows it short
        raise ValueError(f"a region ended after {offset} of {len(view)} bytes")
    if not held:
        raise ValueError("the upload holds no array")
    whole = tuple((0, n) for n in shape)
    if list(held) == [whole]:  # the whole array, as most uploads are
        return buffer_id, held[whole]
    return buffer_id, HostShards(shape, dtype, held)


def held_whole(value: object) -> np.ndarray | None:
    """The whole buffer as a host array when this process holds all of it, else None."""
    if isinstance(value, HostShards):
        return None
    if not isinstance(value, jax.Array) or value.is_fully_addressable:
        return np.asarray(value)
    return None


def local_regions(value: object) -> list[tuple[Region, np.ndarray]]:
    """The regions of a buffer this process can send: the whole array, or for an array spread
    over several hosts (or uploaded to them in parts) the distinct shards held here."""
    if isinstance(value, HostShards):
        return [
            (tuple(slice(a, b) for a, b in bounds), values)
            for bounds, values in value.regions.items()
        ]
    array = held_whole(value)
    if array is not None:
        return [(tuple(slice(0, n) for n in array.shape), array)]
    assert isinstance(value, jax.Array)
    regions: dict[tuple[tuple[int, int], ...], tuple[Region, np.ndarray]] = {}
    for shard in value.addressable_shards:
        bounds = tuple(s.indices(n)[:2] for s, n in zip(shard.index, value.shape, strict=True))
        if bounds not in regions:
            regions[bounds] = (tuple(slice(a, b) for a, b in bounds), np.asarray(shard.data))
    return list(regions.values())
