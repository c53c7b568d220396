"""RemapArrays as the island backend takes it: shards relabelled for the same devices listed in
another order, each device keeping its shard; anything else is refused, saying so."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from jax._src.lib import xla_client as xc

from pathways_client.proxy.errors import ProxyError
from pathways_client.proxy.island import _check_devices_kept
from pathways_client.proxy.types import ShardingSpec, relabelled, shard_indices


def split_rows(devices: tuple[int, ...]) -> ShardingSpec:
    """Rows split over ``devices`` in order (as P('x') over a mesh of them)."""
    op = xc.OpSharding()
    op.type = xc.OpSharding.Type.OTHER
    op.tile_assignment_dimensions = [len(devices), 1]
    op.tile_assignment_devices = list(range(len(devices)))
    return ShardingSpec(devices, "device", op.SerializeToString())


def mapping(start: int, end: int, to_start: int, to_end: int, step: int = 1, to_step: int = 1):
    return SimpleNamespace(
        from_start=[start], from_end=[end], from_step=[step],
        to_start=[to_start], to_end=[to_end], to_step=[to_step],
    )  # fmt: skip


def test_each_device_keeps_the_rows_it_holds() -> None:
    before = split_rows((0, 1, 2, 3))
    after = relabelled(before, (3, 2, 1, 0))
    assert after.device_ids == (3, 2, 1, 0)
    rows = dict(zip(before.device_ids, shard_indices(before, (8, 6)), strict=True))
    assert dict(zip(after.device_ids, shard_indices(after, (8, 6)), strict=True)) == rows
    replicated = ShardingSpec((0, 1), "device", None, replicated=True)
    assert relabelled(replicated, (1, 0)).replicated
    with pytest.raises(ValueError, match="are not"):
        relabelled(before, (0, 1, 2, 7))


def test_a_plan_moving_shards_elsewhere_is_refused() -> None:
    before, after = (0, 1, 2, 3), (3, 2, 1, 0)
    _check_devices_kept(mapping(0, 4, 3, -1, to_step=-1), before, after, "out")  # device kept
    for moved in (mapping(0, 4, 0, 4), mapping(0, 2, 2, 4), mapping(0, 4, 3, -1, to_step=-2)):
        with pytest.raises(ProxyError, match="only onto the devices holding them"):
            _check_devices_kept(moved, before, after, "plan.output_specs[0]")


def test_a_mapping_of_more_shards_than_devices_is_refused_before_it_is_built() -> None:
    # 96 bytes on the wire naming a million shards: each pair was built before the refusal
    # (10**7 grew the proxy by 1.3 GB; 10**12 would have taken all its memory).
    import tracemalloc

    tracemalloc.start()
    try:
        with pytest.raises(ProxyError, match="onto the devices holding them"):
            _check_devices_kept(mapping(0, 10**6, 0, 10**6), (0, 1), (1, 0), "mappings[0]")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak
