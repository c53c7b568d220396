"""Example tests of the pure allocator (``pathways_core.allocator``).

Every scenario is built with the small builders below (in the style of Kueue's test wrappers):
``island(...)`` for an island inventory, ``req(...)`` for a request, ``make_allocator(...)`` for an
allocator holding islands, quotas and pre-existing bindings, and ``held(...)`` for a binding that
occupies exact devices (applied through ``restore``, so tests control the occupancy precisely).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType

import pytest
from mesh_geometry import coords

from pathways_core.accelerators import AcceleratorKind
from pathways_core.allocator import (
    Allocator,
    Binding,
    Bound,
    IslandInventory,
    Pending,
    Request,
)
from pathways_core.resources import LabelSelector
from pathways_core.resources.base import LabelSelectorRequirement, SelectorOperator
from pathways_core.resources.virtual_slice import SliceRequest

V4 = AcceleratorKind.TPU_V4
V5E = AcceleratorKind.TPU_V5E
H100 = AcceleratorKind.GPU_H100

Shape = tuple[int, ...]

# -- builders ------------------------------------------------------------------------------------


def island(
    name: str = "a",
    shape: Shape = (4, 4),
    kind: AcceleratorKind = V5E,
    *,
    labels: Mapping[str, str] | None = None,
    unhealthy: Iterable[int] = (),
    devices_per_host: int = 4,
) -> IslandInventory:
    """An island inventory; defaults to a healthy 4x4 TPU v5e island named ``a``."""
    return IslandInventory(
        name=name,
        kind=kind,
        shape=shape,
        devices_per_host=devices_per_host,
        labels=MappingProxyType(dict(labels or {})),
        unhealthy=frozenset(unhealthy),
    )


def req(
    key: str = "ns/slice",
    *,
    count: int | None = None,
    shape: Shape | None = None,
    tenant: str = "team-a",
    kind: AcceleratorKind | None = None,
    on: str | None = None,
    selector: LabelSelector | None = None,
    priority: int = 0,
) -> Request:
    """A request; exactly one of ``count`` and ``shape`` (``on`` names the island)."""
    return Request(
        key=key,
        tenant=tenant,
        count=count,
        shape=shape,
        kind=kind,
        island=on,
        selector=selector,
        priority=priority,
    )


def held(
    island_name: str,
    devices: Sequence[int],
    *,
    key: str,
    tenant: str = "team-z",
    priority: int = 0,
    kind: AcceleratorKind | None = None,
    size: int | None = None,
) -> Binding:
    """A binding of a count request holding exactly ``devices`` (scattered, no block)."""
    request = req(
        key,
        count=size if size is not None else len(devices),
        tenant=tenant,
        kind=kind,
        priority=priority,
    )
    return Binding(request, island_name, tuple(devices), None)


def make_allocator(
    *islands: IslandInventory,
    quotas: Mapping[tuple[str, AcceleratorKind], int] | None = None,
    bindings: Iterable[Binding] = (),
) -> Allocator:
    """An allocator with these islands, quotas and (restored, all accepted) bindings."""
    allocator = Allocator()
    for inventory in islands:
        allocator.add_island(inventory)
    for (tenant, kind), limit in (quotas or {}).items():
        allocator.set_quota(tenant, kind, limit)
    rejected = allocator.restore(list(bindings))
    assert rejected == [], rejected
    return allocator


def selector(match: Mapping[str, str] | None = None, **expressions: Sequence[str]) -> LabelSelector:
    """A label selector: ``match`` labels plus ``key=[values]`` In-expressions."""
    return LabelSelector(
        match_labels=dict(match or {}),
        match_expressions=[
            LabelSelectorRequirement(key=k, operator=SelectorOperator.IN, values=list(v))
            for k, v in expressions.items()
        ],
    )


# -- geometry helpers (independent of the allocator's own placement code) ------------------------


def box_of(devices: Sequence[int], mesh: Shape) -> tuple[Shape, Shape]:
    """(origin, extents) of the devices, asserting they form exactly a full box."""
    points = [coords(d, mesh) for d in devices]
    assert len(set(points)) == len(points), f"devices repeat: {devices}"
    lo = tuple(min(p[axis] for p in points) for axis in range(len(mesh)))
    hi = tuple(max(p[axis] for p in points) for axis in range(len(mesh)))
    extents = tuple(h - low + 1 for low, h in zip(lo, hi, strict=True))
    assert math.prod(extents) == len(points), f"{devices} is not a box in {mesh}"
    return lo, extents


def padded(shape: Shape, rank: int) -> Shape:
    return (1,) * (rank - len(shape)) + tuple(shape)


def assert_virtual_order(binding: Binding, mesh: Shape) -> None:
    """The devices of a shape binding are listed in the slice's virtual row-major order: stepping
    one virtual axis steps one distinct physical axis, by one device."""
    shape = binding.request.shape
    assert shape is not None
    origin, extents = box_of(binding.devices, mesh)
    assert sorted(extents) == sorted(padded(shape, len(mesh)))
    assert binding.block == extents
    virtual_cells = list(itertools.product(*(range(e) for e in shape)))
    position = {
        cell: coords(d, mesh) for cell, d in zip(virtual_cells, binding.devices, strict=True)
    }
    assert position[(0,) * len(shape)] == origin
    used_axes = set()
    for axis, extent in enumerate(shape):
        if extent == 1:
            continue
        unit = tuple(int(i == axis) for i in range(len(shape)))
        step = tuple(b - a for a, b in zip(origin, position[unit], strict=True))
        assert sorted(step) == [0] * (len(mesh) - 1) + [1], f"virtual axis {axis} steps {step}"
        physical = step.index(1)
        assert physical not in used_axes
        assert extents[physical] == extent
        used_axes.add(physical)
        for cell, point in position.items():
            assert point[physical] - origin[physical] == cell[axis]


def occupied(allocator: Allocator, island_name: str) -> set[int]:
    return {d for b in allocator.bindings() if b.island == island_name for d in b.devices}


# -- shapes: contiguous blocks in virtual order ---------------------------------------------------


@pytest.mark.parametrize(
    ("mesh", "shape"),
    [
        ((8,), (4,)),
        ((8,), (8,)),
        ((2, 4), (2,)),
        ((2, 4), (2, 2)),
        ((4, 4), (2, 2)),
        ((4, 4), (2, 4)),
        ((4, 4), (4, 2)),
        ((4, 4), (4, 4)),
        ((4, 4), (3,)),
        ((4, 2), (2, 4)),
        ((2, 2, 2), (2, 2)),
        ((2, 2, 2), (2,)),
        ((2, 2, 4), (2, 2, 2)),
        ((2, 2, 4), (4,)),
        ((2, 2, 4), (4, 2)),
        ((2, 2, 4), (1, 2, 2)),
    ],
)
def test_shape_request_gets_a_contiguous_box_in_virtual_order(mesh: Shape, shape: Shape) -> None:
    allocator = make_allocator(island("a", mesh))
    decision = allocator.allocate(req(shape=shape))
    assert isinstance(decision, Bound)
    binding = decision.binding
    assert binding.island == "a"
    assert len(binding.devices) == math.prod(shape)
    assert_virtual_order(binding, mesh)


def test_2x4_request_on_a_4x2_mesh_lists_devices_in_virtual_row_major_order() -> None:
    # The 2x4 virtual mesh only fits transposed: virtual axis 1 (extent 4) runs along physical
    # axis 0, so virtual row 0 is physical column 0 and virtual row 1 physical column 1.
    allocator = make_allocator(island("a", (4, 2)))
    decision = allocator.allocate(req(shape=(2, 4)))
    assert isinstance(decision, Bound)
    assert decision.binding.block == (4, 2)
    assert decision.binding.devices == (0, 2, 4, 6, 1, 3, 5, 7)


def test_2x4_request_on_a_4x4_mesh_with_only_a_4x2_hole_is_transposed() -> None:
    # Columns 2 and 3 are taken, so only the left 4x2 half is free.
    taken = [r * 4 + c for r in range(4) for c in (2, 3)]
    allocator = make_allocator(island("a", (4, 4)), bindings=[held("a", taken, key="o/x")])
    decision = allocator.allocate(req(shape=(2, 4)))
    assert isinstance(decision, Bound)
    assert decision.binding.block == (4, 2)
    # Virtual (i, j) sits at physical (j, i): row 0 runs down column 0, row 1 down column 1.
    assert decision.binding.devices == (0, 4, 8, 12, 1, 5, 9, 13)
    assert_virtual_order(decision.binding, (4, 4))


def test_rank1_request_on_rank3_mesh_is_padded_with_unit_axes() -> None:
    allocator = make_allocator(island("a", (2, 2, 4)))
    decision = allocator.allocate(req(shape=(4,)))
    assert isinstance(decision, Bound)
    assert decision.binding.block == (1, 1, 4)
    assert_virtual_order(decision.binding, (2, 2, 4))


def test_shape_request_skips_holes_to_find_a_free_box() -> None:
    # Device 5 (row 1, column 1) is taken: no 2x2 block may contain it.
    allocator = make_allocator(island("a", (4, 4)), bindings=[held("a", [5], key="o/x")])
    for n in range(3):
        decision = allocator.allocate(req(f"ns/s{n}", shape=(2, 2)))
        assert isinstance(decision, Bound), decision
        assert 5 not in decision.binding.devices
        assert_virtual_order(decision.binding, (4, 4))
    devices = [d for b in allocator.bindings() for d in b.devices]
    assert len(devices) == len(set(devices))


# -- count requests ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mesh", "count", "blocks"),
    [
        ((4, 4), 4, {(2, 2)}),
        ((4, 4), 8, {(2, 4), (4, 2)}),
        ((4, 4), 2, {(1, 2), (2, 1)}),
        ((4, 4), 3, {(1, 3), (3, 1)}),
        ((4, 4), 16, {(4, 4)}),
        ((2, 2, 2), 4, {(1, 2, 2), (2, 1, 2), (2, 2, 1)}),
        ((2, 2, 4), 8, {(2, 2, 2)}),
        ((8,), 5, {(5,)}),
    ],
)
def test_count_request_prefers_the_most_compact_block(
    mesh: Shape, count: int, blocks: set[Shape]
) -> None:
    allocator = make_allocator(island("a", mesh))
    decision = allocator.allocate(req(count=count))
    assert isinstance(decision, Bound)
    binding = decision.binding
    assert binding.block in blocks
    _, extents = box_of(binding.devices, mesh)
    assert extents == binding.block
    # A count slice lists its devices in the block's row-major order (ascending ids).
    assert list(binding.devices) == sorted(binding.devices)


@pytest.mark.parametrize(
    ("mesh", "taken", "count", "expected"),
    [
        # Alternate devices taken: no two free devices are adjacent.
        ((4,), [1, 3], 2, (0, 2)),
        # 5 devices cannot form a block of a 2x2x2 mesh.
        ((2, 2, 2), [], 5, (0, 1, 2, 3, 4)),
        # A checkerboard leaves no free pair of neighbours.
        ((2, 2), [1, 2], 2, (0, 3)),
    ],
)
def test_count_request_falls_back_to_scattered_devices(
    mesh: Shape, taken: list[int], count: int, expected: tuple[int, ...]
) -> None:
    bindings = [held("a", taken, key="o/x")] if taken else []
    allocator = make_allocator(island("a", mesh), bindings=bindings)
    decision = allocator.allocate(req(count=count))
    assert isinstance(decision, Bound)
    assert decision.binding.block is None
    assert decision.binding.devices == expected


def test_count_request_prefers_a_block_elsewhere_to_scattered_devices_on_a_fuller_island() -> None:
    allocator = make_allocator(
        island("a", (4,)), island("b", (4,)), bindings=[held("a", [1, 3], key="o/x")]
    )
    decision = allocator.allocate(req(count=2))
    assert isinstance(decision, Bound)
    assert decision.binding.island == "b"
    assert decision.binding.block == (2,)


# -- choice of island ----------------------------------------------------------------------------
#
# The allocator fills islands in a fixed order, by name: the first island (in name order) where
# the request fits as a block wins, whatever the other islands' occupancy (``Allocator._candidates``
# and benchmarks/RESULTS.md: this bound more requests than trying the fullest island first).
# NOTE: README.md still describes "best fit" (fullest island first); these tests pin the policy
# the code documents.


def test_island_choice_takes_the_first_island_by_name_that_fits() -> None:
    allocator = make_allocator(
        island("c-most", (4, 4)),
        island("a-empty", (4, 4)),
        island("b-half", (4, 4)),
        bindings=[
            held("b-half", range(8), key="o/half"),
            held("c-most", range(12), key="o/most"),
        ],
    )
    decision = allocator.allocate(req(count=4))
    assert isinstance(decision, Bound)
    assert decision.binding.island == "a-empty"


def test_island_choice_skips_islands_whose_free_devices_do_not_form_the_shape() -> None:
    # "a" has 4 free devices, but on a diagonal: no 2x2 block. "b" has a free 2x4 half.
    diagonal = [0, 5, 10, 15]
    allocator = make_allocator(
        island("a", (4, 4)),
        island("b", (4, 4)),
        island("c", (4, 4)),
        bindings=[
            held("a", [d for d in range(16) if d not in diagonal], key="o/a"),
            held("b", range(8), key="o/b"),
        ],
    )
    decision = allocator.allocate(req(shape=(2, 2)))
    assert isinstance(decision, Bound)
    assert decision.binding.island == "b"
    assert set(decision.binding.devices) <= set(range(8, 16))
    assert_virtual_order(decision.binding, (4, 4))


def test_island_choice_fills_the_first_island_before_the_next() -> None:
    allocator = make_allocator(island("b", (4,)), island("a", (4,)), island("c", (4,)))
    islands = []
    for n in range(6):
        decision = allocator.allocate(req(f"ns/{n}", count=2))
        assert isinstance(decision, Bound)
        islands.append(decision.binding.island)
    assert islands == ["a", "a", "b", "b", "c", "c"]


def test_inside_an_island_placement_is_snug() -> None:
    # Snug placements (against used devices and the mesh edges) let four 2x2 slices tile a 4x4
    # mesh; a 2x2 in the middle, or straddling the halves, would leave no room for the others.
    allocator = make_allocator(island("a", (4, 4)))
    first = allocator.allocate(req("ns/0", shape=(2, 2)))
    assert isinstance(first, Bound)
    origin, _ = box_of(first.binding.devices, (4, 4))
    assert origin in {(0, 0), (0, 2), (2, 0), (2, 2)}
    for n in range(1, 4):
        assert isinstance(allocator.allocate(req(f"ns/{n}", shape=(2, 2))), Bound)
    assert allocator.free_devices("a") == 0


# -- all or nothing: Pending with a reason ------------------------------------------------------


def test_no_matching_island_names_what_was_asked() -> None:
    allocator = make_allocator(island("a", (4, 4), V5E))
    decision = allocator.allocate(req(count=1, kind=H100, on="b"))
    assert isinstance(decision, Pending)
    assert decision.key == "ns/slice"
    assert decision.reason == "NoMatchingIsland"
    assert "kind gpu-h100" in decision.message
    assert "name 'b'" in decision.message


def test_no_matching_island_for_a_selector() -> None:
    allocator = make_allocator(island("a", labels={"zone": "east"}))
    decision = allocator.allocate(req(count=1, selector=selector({"zone": "west"})))
    assert isinstance(decision, Pending)
    assert decision.reason == "NoMatchingIsland"
    assert "selector" in decision.message


def test_no_islands_at_all_is_no_matching_island() -> None:
    decision = Allocator().allocate(req(count=1))
    assert isinstance(decision, Pending)
    assert decision.reason == "NoMatchingIsland"


def test_quota_exceeded_names_tenant_request_and_usage() -> None:
    allocator = make_allocator(
        island("a", (4, 4), V5E),
        quotas={("team-a", V5E): 6},
        bindings=[held("a", [0, 1, 2, 3], key="ns/old", tenant="team-a")],
    )
    decision = allocator.allocate(req(count=4, tenant="team-a"))
    assert isinstance(decision, Pending)
    assert decision.reason == "QuotaExceeded"
    assert "'team-a'" in decision.message
    assert "4 more devices" in decision.message
    assert "uses 4 of 6" in decision.message
    assert "tpu-v5e" in decision.message


@pytest.mark.parametrize(
    ("mesh", "request_", "fragments"),
    [
        ((4, 4), req(shape=(8, 8)), ["8x8", "4x4"]),
        ((4, 4), req(shape=(2, 2, 2)), ["2x2x2", "4x4"]),
        ((2, 2, 2), req(shape=(4,)), ["4 ", "2x2x2"]),
        ((4, 4), req(count=17), ["17", "4x4"]),
    ],
)
def test_shape_does_not_fit_names_the_shape_and_meshes(
    mesh: Shape, request_: Request, fragments: list[str]
) -> None:
    allocator = make_allocator(island("a", mesh))
    decision = allocator.allocate(request_)
    assert isinstance(decision, Pending)
    assert decision.reason == "ShapeDoesNotFit"
    for fragment in fragments:
        assert fragment in decision.message


def test_insufficient_devices_for_a_shape_names_the_block() -> None:
    # Island a keeps 3 free devices, island b 2: neither has a free 2x2 block.
    allocator = make_allocator(
        island("a", (4, 4)),
        island("b", (4, 4)),
        bindings=[
            held("a", [d for d in range(16) if d not in (0, 5, 10)], key="o/a"),
            held("b", [d for d in range(16) if d not in (0, 15)], key="o/b"),
        ],
    )
    before = allocator.bindings()
    decision = allocator.allocate(req(shape=(2, 2)), preempt=False)
    assert isinstance(decision, Pending)
    assert decision.reason == "InsufficientDevices"
    assert decision.message == "needs a free 2x2 block; no matching island has one now"
    # All or nothing: nothing was bound or moved.
    assert allocator.bindings() == before
    assert allocator.free_devices("a") == 3
    assert allocator.free_devices("b") == 2


def test_insufficient_devices_for_a_count_names_the_count() -> None:
    allocator = make_allocator(island("a", (8,)), bindings=[held("a", range(4), key="o/x")])
    decision = allocator.allocate(req(count=5), preempt=False)
    assert isinstance(decision, Pending)
    assert decision.reason == "InsufficientDevices"
    assert decision.message == "needs 5 free devices; no matching island has that many now"
    assert allocator.free_devices("a") == 4
    assert allocator.binding("ns/slice") is None


def test_pending_when_all_healthy_devices_are_too_few() -> None:
    allocator = make_allocator(island("a", (2, 2), unhealthy=[3]))
    decision = allocator.allocate(req(count=4))
    assert isinstance(decision, Pending)
    assert decision.reason == "InsufficientDevices"


# -- filtering: selector, island name, accelerator kind ------------------------------------------


def test_island_selector_restricts_candidates() -> None:
    allocator = make_allocator(
        island("a", (4,), labels={"zone": "east", "tier": "prod"}),
        island("b", (8,), labels={"zone": "west", "tier": "prod"}),
        bindings=[held("b", range(6), key="o/x")],  # b is the fuller island
    )
    decision = allocator.allocate(req(count=2, selector=selector({"tier": "prod"}, zone=["east"])))
    assert isinstance(decision, Bound)
    assert decision.binding.island == "a"


def test_island_name_restricts_candidates() -> None:
    allocator = make_allocator(
        island("a", (4,)), island("b", (8,)), bindings=[held("a", [0, 1], key="o/x")]
    )
    decision = allocator.allocate(req(count=2, on="b"))
    assert isinstance(decision, Bound)
    assert decision.binding.island == "b"


@pytest.mark.parametrize(("kind", "expected"), [(V4, "v4"), (V5E, "v5e"), (None, "v4")])
def test_accelerator_kind_restricts_candidates(kind: AcceleratorKind | None, expected: str) -> None:
    allocator = make_allocator(
        island("v4", (2, 2, 2), V4),
        island("v5e", (4, 4), V5E),
        bindings=[held("v4", [0, 1, 2, 3], key="o/x")],  # v4 is the fuller island
    )
    decision = allocator.allocate(req(count=4, kind=kind))
    assert isinstance(decision, Bound)
    assert decision.binding.island == expected


# -- quotas ----------------------------------------------------------------------------------------


def test_quota_limits_a_tenant_per_kind() -> None:
    allocator = make_allocator(
        island("v5e", (4, 4), V5E), island("v4", (2, 2, 2), V4), quotas={("team-a", V5E): 8}
    )
    assert isinstance(allocator.allocate(req("ns/1", count=4, kind=V5E)), Bound)
    assert isinstance(allocator.allocate(req("ns/2", count=4, kind=V5E)), Bound)
    assert allocator.usage("team-a", V5E) == 8
    over = allocator.allocate(req("ns/3", count=1, kind=V5E))
    assert isinstance(over, Pending)
    assert over.reason == "QuotaExceeded"
    # Another kind for the same tenant, and the same kind for another tenant, are not limited.
    assert isinstance(allocator.allocate(req("ns/4", count=1, kind=V4)), Bound)
    assert isinstance(allocator.allocate(req("ns/5", count=4, kind=V5E, tenant="team-b")), Bound)
    assert allocator.usage("team-a", V4) == 1
    assert allocator.usage("team-b", V5E) == 4
    # A kind-less request skips the island whose kind has no quota left.
    anywhere = allocator.allocate(req("ns/6", count=2))
    assert isinstance(anywhere, Bound)
    assert anywhere.binding.island == "v4"
    # Releasing gives the quota back.
    allocator.release("ns/1")
    assert allocator.usage("team-a", V5E) == 4
    assert isinstance(allocator.allocate(req("ns/3", count=1, kind=V5E)), Bound)


def test_quota_admits_a_request_exactly_at_the_limit() -> None:
    allocator = make_allocator(island("a", (4, 4), V5E), quotas={("team-a", V5E): 4})
    assert isinstance(allocator.allocate(req(count=4)), Bound)
    assert allocator.usage("team-a", V5E) == allocator.quota("team-a", V5E) == 4


def test_zero_quota_blocks_everything_and_none_removes_the_limit() -> None:
    allocator = make_allocator(island("a", (4,), V5E), quotas={("team-a", V5E): 0})
    decision = allocator.allocate(req(count=1))
    assert isinstance(decision, Pending)
    assert decision.reason == "QuotaExceeded"
    allocator.set_quota("team-a", V5E, None)
    assert allocator.quota("team-a", V5E) is None
    assert isinstance(allocator.allocate(req(count=1)), Bound)


def test_negative_quota_is_rejected() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        Allocator().set_quota("team-a", V5E, -1)


def test_lowering_a_quota_below_usage_evicts_nothing() -> None:
    allocator = make_allocator(island("a", (4, 4), V5E))
    assert isinstance(allocator.allocate(req(count=8)), Bound)
    allocator.set_quota("team-a", V5E, 2)
    assert allocator.binding("ns/slice") is not None
    assert allocator.usage("team-a", V5E) == 8
    decision = allocator.allocate(req("ns/more", count=1))
    assert isinstance(decision, Pending)
    assert decision.reason == "QuotaExceeded"


def test_restore_does_not_enforce_quotas_but_counts_usage() -> None:
    allocator = make_allocator(
        island("a", (4, 4), V5E),
        quotas={("team-a", V5E): 2},
        bindings=[held("a", range(8), key="ns/big", tenant="team-a")],
    )
    assert allocator.usage("team-a", V5E) == 8


def test_a_tenant_at_its_quota_preempts_its_own_lower_priority_slices() -> None:
    # Kueue's withinClusterQueue: LowerPriority. The island has room; the quota has none.
    allocator = make_allocator(
        island("a", (4, 4), V5E),
        island("b", (4, 4), V5E),
        quotas={("team-a", V5E): 8},
        bindings=[
            held("a", range(4), key="ns/low-a", tenant="team-a", priority=1),
            held("b", range(4), key="ns/lowest-b", tenant="team-a", priority=0),
            held("b", range(4, 6), key="ns/other", tenant="team-b", priority=0),
        ],
    )
    decision = allocator.allocate(req("ns/urgent", count=4, priority=5))
    assert isinstance(decision, Bound)
    # The lowest priority goes first, wherever it is; another tenant's slice is kept.
    assert [b.key for b in decision.preempted] == ["ns/lowest-b"]
    assert allocator.usage("team-a", V5E) == 8
    assert allocator.binding("ns/other") is not None
    # Equal priority is not lower: the quota stays full and nothing is evicted.
    same = allocator.allocate(req("ns/peer", count=2, priority=1))
    assert isinstance(same, Pending) and same.reason == "QuotaExceeded"
    assert {b.key for b in allocator.bindings()} == {"ns/low-a", "ns/other", "ns/urgent"}
    # Nor does a request that may not preempt evict anything.
    held_back = allocator.allocate(req("ns/polite", count=4, priority=9), preempt=False)
    assert isinstance(held_back, Pending) and held_back.reason == "QuotaExceeded"


def test_quota_preemption_also_makes_room_on_a_full_island() -> None:
    # Making room in the quota frees devices 0 and 4, no 2x2 block: a lower-priority slice of
    # another tenant on the island goes too, as plain preemption would take it.
    allocator = make_allocator(
        island("a", (2, 4), V5E),
        quotas={("team-a", V5E): 4},
        bindings=[
            held("a", (0, 4), key="ns/mine", tenant="team-a", priority=0),
            held("a", (1, 2, 3, 5, 6, 7), key="ns/theirs", tenant="team-b", priority=0),
        ],
    )
    decision = allocator.allocate(req("ns/urgent", shape=(2, 2), priority=3))
    assert isinstance(decision, Bound)
    assert sorted(b.key for b in decision.preempted) == ["ns/mine", "ns/theirs"]
    assert allocator.usage("team-a", V5E) == 4
    assert allocator.usage("team-b", V5E) == 0


def test_quota_preemption_evicts_no_slice_it_does_not_need() -> None:
    # Taken lowest priority first, the 1-device slice makes too little room in the quota and the
    # 4-device one goes too; then the first is not needed any more, and stays.
    allocator = make_allocator(
        island("a", (8,), V5E),
        quotas={("team-a", V5E): 5},
        bindings=[
            held("a", (0,), key="ns/small", tenant="team-a", priority=0),
            held("a", (1, 2, 3, 4), key="ns/big", tenant="team-a", priority=1),
        ],
    )
    decision = allocator.allocate(req("ns/urgent", count=4, priority=2))
    assert isinstance(decision, Bound)
    assert [b.key for b in decision.preempted] == ["ns/big"]
    assert allocator.binding("ns/small") is not None
    assert allocator.usage("team-a", V5E) == 5


@pytest.mark.parametrize("pinned", [True, False])
def test_quota_preemption_prefers_its_own_slice_on_the_island_to_another_tenants(
    pinned: bool,
) -> None:
    # Evicting its lowest-priority slice (on "b") makes room in the quota but none on "a",
    # which would cost team-b's slice there too; its own slice on "a" makes room in both.
    allocator = make_allocator(
        island("a", (2, 2) if not pinned else (4,), V5E),
        island("b", (4,), V5E),
        quotas={("team-a", V5E): 6},
        bindings=[
            held("b", range(4), key="ns/mine-b", tenant="team-a", priority=0),
            held("a", (0, 1), key="ns/mine-a", tenant="team-a", priority=1),
            held("a", (2, 3), key="ns/theirs", tenant="team-b", priority=0),
        ],
    )
    # Unpinned, the 1x2 block fits only the 2x2 island "a" (not the 1-D "b").
    request = (
        req("ns/urgent", count=2, on="a", priority=2)
        if pinned
        else req("ns/urgent", shape=(1, 2), priority=2)
    )
    decision = allocator.allocate(request)
    assert isinstance(decision, Bound)
    assert decision.binding.island == "a"
    assert [b.key for b in decision.preempted] == ["ns/mine-a"]
    assert {b.key for b in allocator.bindings()} == {"ns/mine-b", "ns/theirs", "ns/urgent"}
    assert allocator.usage("team-a", V5E) == 6


def test_a_lowered_quota_lets_a_higher_priority_evict_its_tenants_slices() -> None:
    # Lowering the quota evicts nothing by itself; a higher-priority request of the tenant then
    # evicts as many of its lower-priority slices as its quota needs.
    allocator = make_allocator(island("a", (4, 4), V5E))
    for index in range(4):
        assert isinstance(allocator.allocate(req(f"ns/old{index}", count=4)), Bound)
    allocator.set_quota("team-a", V5E, 6)
    assert len(allocator.bindings()) == 4
    decision = allocator.allocate(req("ns/urgent", count=1, priority=1))
    assert isinstance(decision, Bound)
    # 16 + 1 devices against 6: 11 to free, three slices of 4.
    assert len(decision.preempted) == 3
    assert allocator.usage("team-a", V5E) == 5


def test_quota_preemption_that_cannot_make_room_evicts_nothing() -> None:
    base = [
        held("a", range(2), key="ns/mine", tenant="team-a", priority=0),
        held("a", range(2, 8), key="ns/high", tenant="team-b", priority=9),
    ]
    # The quota could be made room in, but the island could not: nothing moves.
    allocator = make_allocator(island("a", (8,), V5E), quotas={("team-a", V5E): 2}, bindings=base)
    decision = allocator.allocate(req("ns/urgent", count=3, priority=5))
    assert isinstance(decision, Pending) and decision.reason == "QuotaExceeded"
    assert sorted(b.key for b in allocator.bindings()) == ["ns/high", "ns/mine"]
    # Its own slices of lower priority are too few to make room in the quota.
    allocator = make_allocator(
        island("b", (16,), V5E),
        quotas={("team-a", V5E): 3},
        bindings=[
            held("b", range(2), key="ns/low", tenant="team-a", priority=0),
            held("b", (2,), key="ns/top", tenant="team-a", priority=7),
        ],
    )
    decision = allocator.allocate(req("ns/urgent", count=3, priority=5))
    assert isinstance(decision, Pending) and decision.reason == "QuotaExceeded"
    assert allocator.usage("team-a", V5E) == 3


# -- release and idempotent allocate ---------------------------------------------------------


def test_release_returns_exactly_the_bound_devices_and_frees_them() -> None:
    allocator = make_allocator(island("a", (4, 4)))
    bound = allocator.allocate(req(shape=(2, 4)))
    assert isinstance(bound, Bound)
    assert allocator.free_devices("a") == 8
    released = allocator.release("ns/slice")
    assert released == bound.binding
    assert allocator.free_devices("a") == 16
    assert allocator.binding("ns/slice") is None
    assert allocator.bindings() == []
    assert allocator.usage("team-a", V5E) == 0
    assert allocator.release("ns/slice") is None
    assert allocator.release("ns/never") is None


def test_release_of_a_slice_on_unhealthy_devices_frees_only_healthy_ones() -> None:
    allocator = make_allocator(island("a", (4,)), bindings=[held("a", [0, 1], key="ns/s")])
    allocator.set_health("a", [0])
    assert allocator.free_devices("a") == 2
    released = allocator.release("ns/s")
    assert released is not None and released.devices == (0, 1)
    assert allocator.free_devices("a") == 3


def test_devices_of_a_lost_host_are_said_when_a_request_waits_for_them() -> None:
    """ "the most free devices ... is 0" read as every device in use when two were lost."""
    allocator = make_allocator(island("a", (4,)), bindings=[held("a", [0, 1], key="ns/s")])
    allocator.set_health("a", [2, 3])
    decision = allocator.allocate(req("ns/other", count=2))
    assert isinstance(decision, Pending)
    assert decision.message == (
        "needs 2 free devices; no matching island has that many now; devices of lost hosts "
        "are not free (island 'a' has some)"
    )
    allocator.set_health("a", [])
    assert isinstance(allocator.allocate(req("ns/another", count=4)), Pending)
    assert "lost host" not in allocator.allocate(req("ns/another", count=4)).message


def test_allocate_of_an_already_bound_key_returns_its_binding() -> None:
    allocator = make_allocator(island("a", (4, 4)))
    first = allocator.allocate(req(count=4))
    assert isinstance(first, Bound)
    again = allocator.allocate(req(count=4))
    assert again == Bound(first.binding)
    assert allocator.free_devices("a") == 12
    assert allocator.bindings() == [first.binding]
    assert allocator.usage("team-a", V5E) == 4


# -- preemption -------------------------------------------------------------------------------


def test_preemption_evicts_a_strictly_lower_priority_slice() -> None:
    allocator = make_allocator(
        island("a", (8,)), bindings=[held("a", range(8), key="o/low", priority=1)]
    )
    decision = allocator.allocate(req(count=4, priority=2))
    assert isinstance(decision, Bound)
    assert [b.key for b in decision.preempted] == ["o/low"]
    assert allocator.binding("o/low") is None
    assert allocator.usage("team-z", V5E) == 0
    assert allocator.free_devices("a") == 4


@pytest.mark.parametrize("victim_priority", [2, 3])
def test_equal_or_higher_priority_is_never_evicted(victim_priority: int) -> None:
    allocator = make_allocator(
        island("a", (8,)), bindings=[held("a", range(8), key="o/x", priority=victim_priority)]
    )
    decision = allocator.allocate(req(count=4, priority=2))
    assert isinstance(decision, Pending)
    assert decision.reason == "InsufficientDevices"
    assert allocator.binding("o/x") is not None


def test_preempt_false_never_evicts() -> None:
    allocator = make_allocator(
        island("a", (8,)), bindings=[held("a", range(8), key="o/x", priority=0)]
    )
    decision = allocator.allocate(req(count=4, priority=5), preempt=False)
    assert isinstance(decision, Pending)
    assert allocator.binding("o/x") is not None


def test_no_preemption_when_free_devices_suffice() -> None:
    allocator = make_allocator(
        island("a", (8,)), bindings=[held("a", range(4), key="o/x", priority=0)]
    )
    decision = allocator.allocate(req(count=4, priority=5))
    assert isinstance(decision, Bound)
    assert decision.preempted == ()


def test_preemption_picks_the_fewest_victims_for_a_count() -> None:
    allocator = make_allocator(
        island("a", (8,)),
        bindings=[
            held("a", [0, 1], key="o/b"),
            held("a", [2, 3, 4, 5], key="o/big"),
            held("a", [6, 7], key="o/c"),
        ],
    )
    decision = allocator.allocate(req(count=4, priority=1))
    assert isinstance(decision, Bound)
    assert [b.key for b in decision.preempted] == ["o/big"]
    assert sorted(decision.binding.devices) == [2, 3, 4, 5]


def test_preemption_picks_the_fewest_victims_for_a_shape() -> None:
    # A 2x4 mesh: a 2x2 slice on the left half, and one column slice in each of columns 2 and 3.
    allocator = make_allocator(
        island("a", (2, 4)),
        bindings=[
            held("a", [2, 6], key="o/col2"),
            held("a", [3, 7], key="o/col3"),
            held("a", [0, 1, 4, 5], key="o/left"),
        ],
    )
    decision = allocator.allocate(req(shape=(2, 2), priority=1))
    assert isinstance(decision, Bound)
    assert [b.key for b in decision.preempted] == ["o/left"]
    assert sorted(decision.binding.devices) == [0, 1, 4, 5]
    assert allocator.binding("o/col2") is not None and allocator.binding("o/col3") is not None


def test_preemption_evicts_only_lower_priorities_even_if_more_are_needed() -> None:
    allocator = make_allocator(
        island("a", (8,)),
        bindings=[
            held("a", [0, 1, 2, 3], key="o/high", priority=5),
            held("a", [4, 5], key="o/low1", priority=0),
            held("a", [6, 7], key="o/low2", priority=0),
        ],
    )
    decision = allocator.allocate(req(count=4, priority=3))
    assert isinstance(decision, Bound)
    assert sorted(b.key for b in decision.preempted) == ["o/low1", "o/low2"]
    assert allocator.binding("o/high") is not None


def test_preemption_picks_the_island_needing_fewest_victims() -> None:
    allocator = make_allocator(
        island("a", (4,)),
        island("b", (4,)),
        bindings=[
            held("a", [0, 1], key="o/a1"),
            held("a", [2, 3], key="o/a2"),
            held("b", [0, 1, 2, 3], key="o/b"),
        ],
    )
    decision = allocator.allocate(req(count=4, priority=1))
    assert isinstance(decision, Bound)
    assert decision.binding.island == "b"
    assert [b.key for b in decision.preempted] == ["o/b"]


def test_preemption_for_a_shape_cannot_use_unhealthy_devices() -> None:
    # The only low-priority slice covers an unhealthy device; evicting it cannot make a 1x4 row.
    allocator = make_allocator(
        island("a", (2, 4), unhealthy=[1]),
        bindings=[
            held("a", [0, 1, 2, 3], key="o/row0"),
            held("a", [4, 5, 6, 7], key="o/row1", priority=9),
        ],
    )
    decision = allocator.allocate(req(shape=(4,), priority=1))
    assert isinstance(decision, Pending)
    assert decision.reason == "InsufficientDevices"
    assert len(allocator.bindings()) == 2


def test_count_preemption_counts_only_the_healthy_devices_a_victim_frees() -> None:
    # Devices 0-2 of "o/a" are unhealthy: evicting it frees 1 device, evicting "o/b" frees 3.
    allocator = make_allocator(
        island("a", (8,), unhealthy=[0, 1, 2]),
        bindings=[
            held("a", [0, 1, 2, 3], key="o/a"),
            held("a", [4, 5, 6], key="o/b"),
            held("a", [7], key="o/c"),
        ],
    )
    decision = allocator.allocate(req(count=3, priority=1))
    assert isinstance(decision, Bound)
    assert [b.key for b in decision.preempted] == ["o/b"]
    assert set(decision.binding.devices) == {4, 5, 6}


# -- remap -----------------------------------------------------------------------------------


def test_remap_moves_a_slice_off_avoided_devices() -> None:
    allocator = make_allocator(island("a", (4, 4)))
    first = allocator.allocate(req(shape=(2, 2)))
    assert isinstance(first, Bound)
    avoid = [first.binding.devices[0]]
    moved = allocator.remap("ns/slice", avoid=avoid)
    assert isinstance(moved, Bound)
    assert moved.preempted == ()
    assert not set(moved.binding.devices) & set(avoid)
    assert moved.binding.request == first.binding.request
    assert_virtual_order(moved.binding, (4, 4))
    assert allocator.binding("ns/slice") == moved.binding
    assert allocator.free_devices("a") == 12
    assert allocator.usage("team-a", V5E) == 4


def test_remap_may_keep_healthy_devices_it_had() -> None:
    allocator = make_allocator(island("a", (4,)), bindings=[held("a", [0, 1], key="ns/s")])
    moved = allocator.remap("ns/s", avoid=[0])
    assert isinstance(moved, Bound)
    assert 0 not in moved.binding.devices
    assert len(moved.binding.devices) == 2


def test_remap_can_move_to_another_island() -> None:
    allocator = make_allocator(
        island("a", (4,)), island("b", (4,)), bindings=[held("a", [0, 1, 2, 3], key="ns/s")]
    )
    moved = allocator.remap("ns/s", avoid=[0])
    assert isinstance(moved, Bound)
    assert moved.binding.island == "b"
    assert allocator.free_devices("a") == 4


def test_remap_off_unhealthy_devices() -> None:
    allocator = make_allocator(island("a", (2, 4)))
    first = allocator.allocate(req(shape=(2, 2)))
    assert isinstance(first, Bound)
    hit = allocator.set_health("a", [first.binding.devices[-1]])
    assert hit == [first.binding]
    moved = allocator.remap("ns/slice")
    assert isinstance(moved, Bound)
    assert first.binding.devices[-1] not in moved.binding.devices
    assert_virtual_order(moved.binding, (2, 4))


def test_remap_keeps_the_slice_in_place_when_no_devices_can_take_it() -> None:
    allocator = make_allocator(
        island("a", (4, 4)), bindings=[held("a", range(4, 16), key="o/rest")]
    )
    first = allocator.allocate(req(shape=(1, 4)))
    assert isinstance(first, Bound)
    assert first.binding.devices == (0, 1, 2, 3)
    decision = allocator.remap("ns/slice", avoid=[2])
    assert isinstance(decision, Pending)
    assert decision.reason == "InsufficientDevices"
    assert "ns/slice" in decision.message
    assert allocator.binding("ns/slice") == first.binding
    assert allocator.free_devices("a") == 0
    assert allocator.usage("team-a", V5E) == 4
    # The island's state is intact: releasing and allocating again gets the same block back.
    allocator.release("ns/slice")
    again = allocator.allocate(req(shape=(1, 4)))
    assert isinstance(again, Bound)
    assert again.binding.devices == first.binding.devices


def test_remap_preempts_nothing() -> None:
    allocator = make_allocator(
        island("a", (4,)),
        bindings=[held("a", [0, 1], key="ns/s", priority=9), held("a", [2, 3], key="o/low")],
    )
    decision = allocator.remap("ns/s", avoid=[0, 1])
    assert isinstance(decision, Pending)
    assert allocator.binding("o/low") is not None


def test_remap_of_an_unbound_slice_is_pending() -> None:
    decision = make_allocator(island("a")).remap("ns/none")
    assert decision == Pending("ns/none", "NotBound", "slice 'ns/none' is not bound")


@pytest.mark.parametrize(("v5e_quota", "moves"), [(0, False), (3, False), (4, True), (None, True)])
def test_remap_respects_the_quota_of_the_destination_kind(
    v5e_quota: int | None, moves: bool
) -> None:
    quotas = {} if v5e_quota is None else {("team-a", V5E): v5e_quota}
    allocator = make_allocator(island("v4", (4,), V4), island("v5e", (4,), V5E), quotas=quotas)
    first = allocator.allocate(req(count=4))  # a kind-less slice, on v4 (first by name)
    assert isinstance(first, Bound) and first.binding.island == "v4"
    decision = allocator.remap("ns/slice", avoid=[0])
    current = allocator.binding("ns/slice")
    assert current is not None
    if moves:
        assert isinstance(decision, Bound)
        assert current.island == "v5e"
        assert (allocator.usage("team-a", V4), allocator.usage("team-a", V5E)) == (0, 4)
    else:
        # No other v4 devices, and no v5e quota left: the slice stays where it was.
        assert isinstance(decision, Pending)
        assert current == first.binding
        assert (allocator.usage("team-a", V4), allocator.usage("team-a", V5E)) == (4, 0)


def test_remap_within_its_kind_after_quota_lowered() -> None:
    allocator = make_allocator(island("a", (8,), V5E))
    assert isinstance(allocator.allocate(req(count=4)), Bound)  # devices 0-3
    allocator.set_quota("team-a", V5E, 2)  # lowering evicts nothing
    allocator.set_health("a", [0])
    decision = allocator.remap("ns/slice", avoid=[0])
    # Moving within its kind keeps usage at 4: a lowered quota never strands a slice.
    assert isinstance(decision, Bound)
    assert 0 not in decision.binding.devices


# -- health ----------------------------------------------------------------------------------


def test_set_health_makes_devices_unavailable_and_returns_affected_bindings() -> None:
    allocator = make_allocator(
        island("a", (8,)),
        bindings=[held("a", [0, 1], key="o/x"), held("a", [2, 3], key="o/y")],
    )
    affected = allocator.set_health("a", [1, 6])
    assert [b.key for b in affected] == ["o/x"]
    assert allocator.free_devices("a") == 3  # 4, 5, 7
    assert allocator.binding("o/x") is not None  # health does not evict
    decision = allocator.allocate(req(count=3))
    assert isinstance(decision, Bound)
    assert set(decision.binding.devices) == {4, 5, 7}
    assert allocator.islands[0].unhealthy == frozenset({1, 6})


def test_recovered_devices_become_available_again() -> None:
    allocator = make_allocator(island("a", (2, 2)))
    allocator.set_health("a", [0])
    failed = allocator.allocate(req(shape=(2, 2)))
    assert isinstance(failed, Pending)
    assert failed.reason == "InsufficientDevices"
    assert allocator.set_health("a", []) == []
    assert allocator.free_devices("a") == 4
    assert isinstance(allocator.allocate(req(shape=(2, 2))), Bound)


def test_set_health_rejects_unknown_devices_and_islands() -> None:
    allocator = make_allocator(island("a", (4,)))
    with pytest.raises(ValueError, match="no device 4"):
        allocator.set_health("a", [4])
    with pytest.raises(KeyError, match="nope"):
        allocator.set_health("nope", [])
    assert allocator.free_devices("a") == 4


def test_island_added_with_unhealthy_devices_never_binds_them() -> None:
    allocator = make_allocator(island("a", (4,), unhealthy=[0, 3]))
    assert allocator.free_devices("a") == 2
    decision = allocator.allocate(req(count=2))
    assert isinstance(decision, Bound)
    assert decision.binding.devices == (1, 2)


# -- restore ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bad", "fragment"),
    [
        (held("a", [0, 0], key="ns/bad"), "twice"),
        (held("a", [1, 4], key="ns/bad"), "already bound to 'ns/ok'"),
        (held("nowhere", [8], key="ns/bad"), "island 'nowhere' does not exist"),
        (held("a", [16], key="ns/bad"), "no device 16"),
        (held("a", [-1], key="ns/bad"), "no device -1"),
        (held("a", [8, 9], key="ns/bad", size=3), "2 devices bound for a request of 3"),
        (held("a", [8], key="ns/ok"), "'ns/ok' is already bound"),
        (held("a", [8], key="ns/bad", kind=V4), "tpu-v4"),
    ],
    ids=[
        "device-twice",
        "device-taken",
        "unknown-island",
        "out-of-range",
        "negative",
        "wrong-size",
        "duplicate-key",
        "wrong-kind",
    ],
)
def test_restore_rejects_inconsistent_bindings(bad: Binding, fragment: str) -> None:
    allocator = make_allocator(island("a", (4, 4), V5E))
    ok = held("a", [0, 1, 2, 3], key="ns/ok")
    later = held("a", [12, 13], key="ns/later")
    rejected = allocator.restore([ok, bad, later])
    assert [r.binding for r in rejected] == [bad]
    assert fragment in rejected[0].message
    assert sorted(b.key for b in allocator.bindings()) == ["ns/later", "ns/ok"]
    assert allocator.binding("ns/ok") == ok
    assert allocator.free_devices("a") == 10
    assert allocator.usage("team-z", V5E) == 6


def test_restore_round_trips_an_allocators_bindings() -> None:
    islands = [island("a", (4, 4)), island("b", (2, 2, 2), V4, unhealthy=[7])]
    allocator = make_allocator(*islands)
    for n, request in enumerate([req(shape=(2, 4)), req(count=3), req(shape=(2, 2), kind=V4)]):
        assert isinstance(
            allocator.allocate(
                req(f"ns/{n}", count=request.count, shape=request.shape, kind=request.kind)
            ),
            Bound,
        )
    fresh = make_allocator(*allocator.islands)
    assert fresh.restore(allocator.bindings()) == []
    assert fresh.bindings() == allocator.bindings()
    for name in ("a", "b"):
        assert fresh.free_devices(name) == allocator.free_devices(name)
    assert fresh.usage("team-a", V5E) == allocator.usage("team-a", V5E) == 11
    assert fresh.usage("team-a", V4) == 4


# -- islands: add, update, remove -------------------------------------------------------------


def test_remove_island_drops_its_bindings_and_their_quota_usage() -> None:
    allocator = make_allocator(
        island("a", (4,), V5E),
        island("b", (4,), V5E),
        quotas={("team-a", V5E): 4},
        bindings=[
            held("a", [0, 1, 2], key="ns/a1", tenant="team-a"),
            held("b", [0], key="ns/b1", tenant="team-a"),
        ],
    )
    dropped = allocator.remove_island("a")
    assert [b.key for b in dropped] == ["ns/a1"]
    assert [b.key for b in allocator.bindings()] == ["ns/b1"]
    assert allocator.binding("ns/a1") is None
    assert allocator.usage("team-a", V5E) == 1
    assert [i.name for i in allocator.islands] == ["b"]
    assert allocator.remove_island("a") == []
    # The freed quota can be used again, on the remaining island.
    decision = allocator.allocate(req("ns/a1", count=3, tenant="team-a"))
    assert isinstance(decision, Bound)
    assert decision.binding.island == "b"


def test_add_island_updates_labels_and_health_but_not_topology() -> None:
    allocator = make_allocator(island("a", (4,)), bindings=[held("a", [0], key="o/x")])
    allocator.add_island(island("a", (4,), labels={"zone": "east"}, unhealthy=[3]))
    assert allocator.binding("o/x") is not None
    assert allocator.free_devices("a") == 2
    decision = allocator.allocate(req(count=1, selector=selector({"zone": "east"})))
    assert isinstance(decision, Bound)
    with pytest.raises(ValueError, match="topology"):
        allocator.add_island(island("a", (2, 2)))
    with pytest.raises(ValueError, match="topology"):
        allocator.add_island(island("a", (4,), V4))


# -- requests ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"count": 2, "shape": (2,)}, {"count": 0}, {"shape": (2, 0)}],
    ids=["neither", "both", "zero-count", "zero-extent"],
)
def test_request_needs_exactly_one_positive_size(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        Request(key="ns/x", tenant="t", **kwargs)


def test_request_from_spec_parses_the_shape() -> None:
    spec = SliceRequest(shape="2x4", accelerator_kind=V5E, island="a")
    request = Request.from_spec("ns/x", "team-a", spec, priority=3)
    assert request == req("ns/x", shape=(2, 4), kind=V5E, on="a", priority=3)
    assert request.size == 8
    counted = Request.from_spec("ns/y", "team-a", SliceRequest(devices=3))
    assert counted.count == 3 and counted.shape is None
