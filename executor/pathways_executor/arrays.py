"""Which regions of a buffer this executor can send (the rest of the codec is in the core)."""

from __future__ import annotations

import jax
import numpy as np

from pathways_core.wire.arrays import Region


def local_regions(value: object) -> list[tuple[Region, np.ndarray]]:
    """The regions of a buffer this process can send: the whole array, or for an array spread
    over several hosts the distinct shards held here."""
    if not isinstance(value, jax.Array) or value.is_fully_addressable:
        array = np.asarray(value)
        return [(tuple(slice(0, n) for n in array.shape), array)]
    regions: dict[tuple[tuple[int, int], ...], tuple[Region, np.ndarray]] = {}
    for shard in value.addressable_shards:
        bounds = tuple(s.indices(n)[:2] for s, n in zip(shard.index, value.shape, strict=True))
        if bounds not in regions:
            regions[bounds] = (tuple(slice(a, b) for a, b in bounds), np.asarray(shard.data))
    return list(regions.values())
