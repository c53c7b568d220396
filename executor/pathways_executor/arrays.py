"""Which regions of a buffer this executor can send (the rest of the codec is in the core)."""

from __future__ import annotations

import jax
import numpy as np

from pathways_core.wire.arrays import Region


def held_whole(value: object) -> np.ndarray | None:
    """The whole buffer as a host array when this process holds all of it, else None."""
    if not isinstance(value, jax.Array) or value.is_fully_addressable:
        return np.asarray(value)
    return None


def local_regions(value: object) -> list[tuple[Region, np.ndarray]]:
    """The regions of a buffer this process can send: the whole array, or for an array spread
    over several hosts the distinct shards held here."""
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
