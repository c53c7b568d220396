"""Property tests of the pure allocator (``pathways_core.allocator``).

Small random worlds (1-3 islands of at most 16 devices, meshes of rank 1-3, two accelerator
kinds) are driven through random sequences of allocate / release / remap / set_health /
set_quota / add_island (relabel, re-add) / remove_island. After every operation the allocator's
state is checked against an independent model computed here from ``allocator.bindings()``, the
islands and the quotas, and every decision is checked against a brute-force search that shares
no code with the allocator's placement logic.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cache
from types import MappingProxyType

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from mesh_geometry import coords

from pathways_core.accelerators import AcceleratorKind
from pathways_core.allocator import (
    Allocator,
    Binding,
    Bound,
    IslandInventory,
    Pending,
    Rejected,
    Request,
)
from pathways_core.resources import LabelSelector

Shape = tuple[int, ...]

KINDS = (AcceleratorKind.TPU_V4, AcceleratorKind.GPU_H100)
# fmt: off
MESHES: tuple[Shape, ...] = (
    (3,), (4,), (8,), (16,), (1, 4), (2, 2), (2, 3), (2, 4), (4, 2), (4, 4), (2, 2, 2), (2, 2, 4),
)
REQUEST_SHAPES: tuple[Shape, ...] = (
    (1,), (2,), (3,), (4,), (8,), (1, 2), (2, 1), (2, 2), (2, 3), (2, 4), (4, 2), (1, 4), (4, 4),
    (1, 2, 2), (2, 1, 2), (2, 2, 2), (2, 2, 4),
)
# fmt: on
TENANTS = ("t0", "t1")
KEYS = tuple(f"ns/s{i}" for i in range(8))
ZONES = ("east", "west")
ISLAND_NAMES = ("i0", "i1", "i2")

# Keep the whole file well under 30 s on two cores.
SETTINGS = settings(
    max_examples=600,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# -- independent geometry -----------------------------------------------------------------------


def device_id(point: Sequence[int], mesh: Shape) -> int:
    index = 0
    for c, extent in zip(point, mesh, strict=True):
        index = index * extent + c
    return index


def padded(shape: Shape, rank: int) -> Shape | None:
    if len(shape) > rank:
        return None
    return (1,) * (rank - len(shape)) + tuple(shape)


@cache
def box_masks(shape: Shape, mesh: Shape) -> tuple[int, ...]:
    """Every placement of ``shape`` in ``mesh`` as a device bitmask: every axis permutation of the
    shape padded with unit axes to the mesh rank, at every origin (no wrap-around)."""
    full = padded(shape, len(mesh))
    if full is None:
        return ()
    masks = set()
    for block in set(itertools.permutations(full)):
        if any(b > m for b, m in zip(block, mesh, strict=True)):
            continue
        for origin in itertools.product(
            *(range(m - b + 1) for m, b in zip(mesh, block, strict=True))
        ):
            mask = 0
            for delta in itertools.product(*(range(b) for b in block)):
                point = [o + d for o, d in zip(origin, delta, strict=True)]
                mask |= 1 << device_id(point, mesh)
            masks.add(mask)
    return tuple(sorted(masks))


def mask_of(devices) -> int:
    mask = 0
    for d in devices:
        mask |= 1 << d
    return mask


def ever_fits(request: Request, mesh: Shape) -> bool:
    if request.shape is not None:
        return bool(box_masks(request.shape, mesh))
    return request.size <= math.prod(mesh)


def fits(request: Request, mesh: Shape, blocked: int) -> bool:
    """Whether the request has a placement avoiding ``blocked`` devices."""
    size = math.prod(mesh)
    if request.shape is None:
        return size - (blocked & ((1 << size) - 1)).bit_count() >= request.size
    return any(not mask & blocked for mask in box_masks(request.shape, mesh))


def check_box_in_virtual_order(binding: Binding, mesh: Shape) -> None:
    """A shape binding's devices are a full box whose extents are a permutation of the padded
    request shape, listed in the slice's virtual row-major order."""
    shape = binding.request.shape
    assert shape is not None
    rank = len(mesh)
    points = [coords(d, mesh) for d in binding.devices]
    origin = tuple(min(p[a] for p in points) for a in range(rank))
    extents = tuple(max(p[a] for p in points) - origin[a] + 1 for a in range(rank))
    assert len(set(points)) == len(points) == math.prod(extents), (binding, mesh)
    full = padded(shape, rank)
    assert full is not None and sorted(extents) == sorted(full), (binding, mesh)
    assert binding.block == extents, (binding, mesh)
    virtual_cells = list(itertools.product(*(range(e) for e in shape)))
    position = dict(zip(virtual_cells, points, strict=True))
    assert position[(0,) * len(shape)] == origin
    axis_map: dict[int, int] = {}
    for axis, extent in enumerate(shape):
        if extent == 1:
            continue
        unit = tuple(int(i == axis) for i in range(len(shape)))
        step = [b - a for a, b in zip(origin, position[unit], strict=True)]
        assert sorted(step) == [0] * (rank - 1) + [1], (binding, mesh, axis)
        axis_map[axis] = step.index(1)
    assert len(set(axis_map.values())) == len(axis_map)
    for cell, point in position.items():
        expected = list(origin)
        for axis, physical in axis_map.items():
            assert extents[physical] == shape[axis]
            expected[physical] += cell[axis]
        assert tuple(expected) == point, (binding, mesh)


# -- operations ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Alloc:
    key: str
    tenant: str
    count: int | None
    shape: Shape | None
    kind: AcceleratorKind | None
    island: str | None
    zone: str | None
    priority: int
    preempt: bool

    def request(self) -> Request:
        return Request(
            key=self.key,
            tenant=self.tenant,
            count=self.count,
            shape=self.shape,
            kind=self.kind,
            island=self.island,
            selector=None if self.zone is None else LabelSelector(match_labels={"zone": self.zone}),
            priority=self.priority,
        )


@dataclass(frozen=True)
class Release:
    target: int | None


@dataclass(frozen=True)
class Remap:
    target: int | None
    avoid: frozenset[int]


@dataclass(frozen=True)
class Health:
    island: int
    devices: frozenset[int]


@dataclass(frozen=True)
class Quota:
    tenant: str
    kind: AcceleratorKind
    limit: int | None


@dataclass(frozen=True)
class Relabel:
    """Add an existing island again with another zone label (same mesh and health)."""

    island: int
    zone: str


@dataclass(frozen=True)
class RemoveIsland:
    island: int


@dataclass(frozen=True)
class ReaddIsland:
    """Add a removed island back, as it was first added."""

    island: int


sizes = st.one_of(
    st.integers(1, 10).map(lambda c: (c, None)),
    st.sampled_from(REQUEST_SHAPES).map(lambda s: (None, s)),
)


ANY_PRIORITY = st.integers(0, 3)
EITHER = st.booleans()


@st.composite
def allocs(draw, priorities=ANY_PRIORITY, preempt=EITHER, filters: bool = True) -> Alloc:
    """An allocation; ``filters`` adds occasional kind, island-name and zone constraints."""
    count, shape = draw(sizes)
    return Alloc(
        key=draw(st.sampled_from(KEYS)),
        tenant=draw(st.sampled_from(TENANTS)),
        count=count,
        shape=shape,
        kind=draw(st.sampled_from((None,) * 6 + KINDS)) if filters else None,
        island=draw(st.sampled_from((None,) * 12 + (*ISLAND_NAMES, "i9"))) if filters else None,
        zone=draw(st.sampled_from((None,) * 10 + ZONES)) if filters else None,
        priority=draw(priorities),
        preempt=draw(preempt),
    )


# Release and Remap pick a bound slice by index (``None``: a slice that is not bound).
targets = st.sampled_from((None, 0, 1, 2, 3, 4, 5, 6, 7))


def target_key(allocator: Allocator, target: int | None) -> str:
    keys = sorted(b.key for b in allocator.bindings())
    if target is None or not keys:
        return "ns/unbound"
    return keys[target % len(keys)]


# Mostly allocations, so that islands fill up and preemption gets exercised. (Distinct strategy
# objects: ``one_of`` would collapse repeats of one object.)
operations = st.one_of(
    *[allocs(preempt=st.sampled_from((True, True, False))) for _ in range(6)],
    st.builds(Release, targets),
    st.builds(Remap, targets, st.frozensets(st.integers(0, 15), max_size=4)),
    st.builds(Health, st.integers(0, 2), st.frozensets(st.integers(0, 15), max_size=3)),
    st.builds(
        Quota,
        st.sampled_from(TENANTS),
        st.sampled_from(KINDS),
        st.one_of(st.none(), st.integers(0, 16)),
    ),
    st.one_of(  # island changes, rarer than the rest
        st.builds(Relabel, st.integers(0, 2), st.sampled_from(ZONES)),
        st.builds(RemoveIsland, st.integers(0, 2)),
        st.builds(ReaddIsland, st.integers(0, 2)),
        st.builds(ReaddIsland, st.integers(0, 2)),
    ),
)

# Unfiltered allocations of every priority, all allowed to preempt, with a few releases and
# health changes: islands are always crowded, so preemption decisions dominate.
crowded_operations = st.one_of(
    *[allocs(preempt=st.just(True), filters=False) for _ in range(6)],
    st.builds(Release, targets),
    st.builds(Health, st.integers(0, 2), st.frozensets(st.integers(0, 15), max_size=2)),
)


@st.composite
def island_lists(draw, max_islands: int = 3) -> list[IslandInventory]:
    islands = []
    for name in ISLAND_NAMES[: draw(st.integers(1, max_islands))]:
        mesh = draw(st.sampled_from(MESHES))
        size = math.prod(mesh)
        islands.append(
            IslandInventory(
                name=name,
                kind=draw(st.sampled_from(KINDS)),
                shape=mesh,
                devices_per_host=size,
                labels=MappingProxyType({"zone": draw(st.sampled_from(ZONES))}),
                unhealthy=draw(st.frozensets(st.integers(0, size - 1), max_size=2)),
            )
        )
    return islands


quota_maps = st.dictionaries(
    st.tuples(st.sampled_from(TENANTS), st.sampled_from(KINDS)), st.integers(0, 16), max_size=2
)


# -- the model -----------------------------------------------------------------------------------


class Model:
    """What the allocator should hold, recomputed from its bindings, plus the islands, health
    and quotas this test gave it (tracked here, not read back)."""

    def __init__(self, islands: list[IslandInventory], quotas: dict) -> None:
        self.original = list(islands)
        self.islands = {i.name: i for i in islands}
        self.unhealthy = {i.name: frozenset(i.unhealthy) for i in islands}
        self.quotas = dict(quotas)

    def mesh(self, name: str) -> Shape:
        return self.islands[name].shape

    def size(self, name: str) -> int:
        return math.prod(self.mesh(name))

    def admits(self, request: Request, name: str) -> bool:
        inv = self.islands[name]
        zone = None if request.selector is None else request.selector.match_labels["zone"]
        return (
            (request.kind is None or request.kind == inv.kind)
            and (request.island is None or request.island == name)
            and (zone is None or inv.labels.get("zone") == zone)
        )

    def occupancy(self, bindings: list[Binding]) -> dict[str, int]:
        occ = dict.fromkeys(self.islands, 0)
        for b in bindings:
            occ[b.island] |= mask_of(b.devices)
        return occ

    def blocked(self, name: str, bindings: list[Binding]) -> int:
        return self.occupancy(bindings)[name] | mask_of(self.unhealthy[name])

    def usage(self, bindings: list[Binding]) -> dict[tuple[str, AcceleratorKind], int]:
        usage: dict[tuple[str, AcceleratorKind], int] = {}
        for b in bindings:
            key = (b.request.tenant, self.islands[b.island].kind)
            usage[key] = usage.get(key, 0) + len(b.devices)
        return usage

    def quota_room(self, request: Request, name: str, bindings: list[Binding]) -> bool:
        kind = self.islands[name].kind
        limit = self.quotas.get((request.tenant, kind))
        used = self.usage(bindings).get((request.tenant, kind), 0)
        return limit is None or used + request.size <= limit

    def free(self, name: str, bindings: list[Binding]) -> int:
        return self.size(name) - self.blocked(name, bindings).bit_count()

    def min_evictions(
        self, request: Request, names: list[str], bindings: list[Binding]
    ) -> int | None:
        """Fewest strictly lower-priority bindings (all on one island) whose eviction lets the
        request fit, by brute force over subsets; ``None`` when no subset works."""
        best = None
        for name in names:
            mesh = self.mesh(name)
            here = [b for b in bindings if b.island == name]
            evictable = [b for b in here if b.request.priority < request.priority]
            fixed = mask_of(self.unhealthy[name])
            for b in here:
                if b.request.priority >= request.priority:
                    fixed |= mask_of(b.devices)

            def fits_after(victims, evictable=evictable, fixed=fixed, mesh=mesh) -> bool:
                kept = fixed
                for b in evictable:
                    if b not in victims:
                        kept |= mask_of(b.devices)
                return fits(request, mesh, kept)

            if not fits_after(evictable):
                continue  # evicting more only frees more: no subset works here
            for k in range(len(evictable) + 1):
                if best is not None and k >= best:
                    break
                if any(fits_after(c) for c in itertools.combinations(evictable, k)):
                    best = k
                    break
        return best

    def makes_own_room(self, request: Request, name: str, bindings: list[Binding]) -> bool:
        """Whether evicting the tenant's own strictly lower-priority slices of the island's kind
        makes room in its quota, and evicting every strictly lower-priority slice on the
        island (its own among them) lets the request fit: the allocator then binds it."""
        kind = self.islands[name].kind
        limit = self.quotas.get((request.tenant, kind))
        if limit is None or not ever_fits(request, self.mesh(name)):
            return False
        used = self.usage(bindings).get((request.tenant, kind), 0)
        own = sum(
            len(b.devices)
            for b in bindings
            if b.request.tenant == request.tenant
            and self.islands[b.island].kind == kind
            and b.request.priority < request.priority
        )
        if used - own + request.size > limit:
            return False
        fixed = mask_of(self.unhealthy[name])
        for b in bindings:
            if b.island == name and b.request.priority >= request.priority:
                fixed |= mask_of(b.devices)
        return fits(request, self.mesh(name), fixed)


# -- checks ------------------------------------------------------------------------------------


def check_state(allocator: Allocator, model: Model) -> list[Binding]:
    """Invariants of the allocator's whole state; returns its bindings."""
    bindings = allocator.bindings()
    keys = [b.key for b in bindings]
    assert len(keys) == len(set(keys))
    assert {i.name: i.unhealthy for i in allocator.islands} == model.unhealthy
    seen: dict[str, set[int]] = {name: set() for name in model.islands}
    for b in bindings:
        assert allocator.binding(b.key) == b
        assert b.island in model.islands
        size = model.size(b.island)
        mesh = model.mesh(b.island)
        assert len(b.devices) == b.request.size
        assert len(set(b.devices)) == len(b.devices)
        for d in b.devices:
            assert 0 <= d < size, (b, size)
            assert d not in seen[b.island], f"device {d} of {b.island} bound twice"
            seen[b.island].add(d)
        if b.request.shape is not None:
            check_box_in_virtual_order(b, mesh)
        else:
            assert list(b.devices) == sorted(b.devices)
            if b.block is not None:
                points = [coords(d, mesh) for d in b.devices]
                lo = [min(p[a] for p in points) for a in range(len(mesh))]
                extents = tuple(max(p[a] for p in points) - lo[a] + 1 for a in range(len(mesh)))
                assert extents == b.block and math.prod(extents) == len(b.devices)
    for name in model.islands:
        assert allocator.free_devices(name) == model.free(name, bindings)
    usage = model.usage(bindings)
    for tenant in TENANTS:
        for kind in KINDS:
            assert allocator.usage(tenant, kind) == usage.get((tenant, kind), 0)
            assert allocator.quota(tenant, kind) == model.quotas.get((tenant, kind))
    return bindings


def check_restore(allocator: Allocator, model: Model) -> None:
    """The bindings rebuild an identical fresh allocator; a device bound twice is rejected."""
    bindings = allocator.bindings()
    fresh = Allocator()
    for inventory in allocator.islands:
        fresh.add_island(inventory)
    assert fresh.restore(bindings) == []
    assert fresh.bindings() == bindings
    for name in model.islands:
        assert fresh.free_devices(name) == allocator.free_devices(name)
    for tenant in TENANTS:
        for kind in KINDS:
            assert fresh.usage(tenant, kind) == allocator.usage(tenant, kind)
    if not bindings:
        return
    # A new binding reusing a bound device.
    first = bindings[0]
    dup = Binding(
        Request(key="ns/dup", tenant="t0", count=1), first.island, first.devices[:1], None
    )
    again = Allocator()
    for inventory in allocator.islands:
        again.add_island(inventory)
    rejected = again.restore([*bindings, dup])
    assert [r.binding for r in rejected] == [dup]
    assert "already bound" in rejected[0].message
    assert again.bindings() == bindings
    # An existing binding altered to take a device of an earlier binding on the same island.
    for earlier, later in itertools.combinations(bindings, 2):
        if earlier.island == later.island:
            stolen = earlier.devices[0]
            changed = Binding(
                later.request, later.island, (stolen, *later.devices[1:]), later.block
            )
            if len(set(changed.devices)) != len(changed.devices):
                continue
            third = Allocator()
            for inventory in allocator.islands:
                third.add_island(inventory)
            others = [b for b in bindings if b is not later]
            rejected = third.restore([*others, changed])
            assert rejected == [Rejected(changed, rejected[0].message)]
            assert f"device {stolen}" in rejected[0].message
            break


def expected_pending_reason(
    model: Model, request: Request, before: list[Binding]
) -> tuple[str | None, list[str]]:
    """The Pending reason a fresh request must get before any placement search (``None`` when it
    reaches the search), and the islands the search may use."""
    admitted = [n for n in model.islands if model.admits(request, n)]
    if not admitted:
        return "NoMatchingIsland", []
    room = [n for n in admitted if model.quota_room(request, n, before)]
    if not room:
        return "QuotaExceeded", []
    shaped = [n for n in room if ever_fits(request, model.mesh(n))]
    if not shaped:
        return "ShapeDoesNotFit", []
    return None, shaped


def describe(decision: Bound | Pending, what: str, trivial: bool) -> str:
    """A label of a decision for Hypothesis' statistics (``--hypothesis-show-statistics``)."""
    if trivial:
        return f"{what}: no-op"
    if isinstance(decision, Pending):
        return f"{what}: Pending {decision.reason}"
    if decision.preempted:
        return f"{what}: Bound preempting {len(decision.preempted)}"
    return f"{what}: Bound {'block' if decision.binding.block else 'scattered'}"


def check_allocate(allocator: Allocator, model: Model, op: Alloc) -> None:
    request = op.request()
    before = allocator.bindings()
    existing = allocator.binding(request.key)
    decision = allocator.allocate(request, preempt=op.preempt)
    event(describe(decision, "allocate", existing is not None))
    after = check_state(allocator, model)
    if existing is not None:
        assert decision == Bound(existing)
        assert after == before
        return
    reason, shaped = expected_pending_reason(model, request, before)
    short = [
        n
        for n in model.islands
        if model.admits(request, n) and not model.quota_room(request, n, before)
    ]
    own_room = op.preempt and any(model.makes_own_room(request, n, before) for n in short)
    if reason == "QuotaExceeded" and own_room:
        check_quota_preemption(allocator, model, request, decision, before, short)
        return
    if reason is not None:
        assert isinstance(decision, Pending), decision
        assert (decision.key, decision.reason) == (request.key, reason)
        assert after == before
        return
    # Completeness: a free placement exists on an eligible island iff it is bound without eviction.
    free_fit = [n for n in shaped if fits(request, model.mesh(n), model.blocked(n, before))]
    needed = None
    if not free_fit and op.preempt:
        needed = model.min_evictions(request, shaped, before)
    if not free_fit and needed is None and own_room:
        check_quota_preemption(allocator, model, request, decision, before, short)
        return
    if not free_fit and needed is None:
        assert isinstance(decision, Pending), (decision, before)
        assert (decision.key, decision.reason) == (request.key, "InsufficientDevices")
        assert after == before
        return
    assert isinstance(decision, Bound), (decision, before)
    binding = decision.binding
    assert binding.request == request
    assert binding.island in shaped
    assert allocator.binding(request.key) == binding
    assert not set(binding.devices) & model.unhealthy[binding.island]
    if free_fit:
        assert decision.preempted == ()
    else:
        # Minimal preemption of strictly lower priorities only.
        assert len(decision.preempted) == needed, (decision.preempted, needed, before)
    victims = {b.key for b in decision.preempted}
    for victim in decision.preempted:
        assert victim in before
        assert victim.request.priority < request.priority
        assert victim.island == binding.island
        assert allocator.binding(victim.key) is None
    assert sorted(after, key=lambda b: b.key) == sorted(
        [b for b in before if b.key not in victims] + [binding], key=lambda b: b.key
    )
    # Quota: the tenant's usage of the island's kind stays within its limit.
    kind = model.islands[binding.island].kind
    limit = model.quotas.get((request.tenant, kind))
    if limit is not None:
        assert allocator.usage(request.tenant, kind) <= limit


def check_quota_preemption(
    allocator: Allocator,
    model: Model,
    request: Request,
    decision: Bound | Pending,
    before: list[Binding],
    short: list[str],
) -> None:
    """A request whose tenant makes room in its quota by evicting its own lower-priority
    slices: bound on an island whose kind had no room, evicting only strictly lower
    priorities, elsewhere only the tenant's own of that kind, within the quota after."""
    assert isinstance(decision, Bound), (decision, before)
    event("allocate: Bound making room in its quota")
    binding = decision.binding
    assert binding.island in short
    kind = model.islands[binding.island].kind
    for victim in decision.preempted:
        assert victim in before
        assert victim.request.priority < request.priority
        assert allocator.binding(victim.key) is None
        if victim.island != binding.island:
            assert victim.request.tenant == request.tenant
            assert model.islands[victim.island].kind == kind
    victims = {b.key for b in decision.preempted}
    after = allocator.bindings()
    assert sorted(after, key=lambda b: b.key) == sorted(
        [b for b in before if b.key not in victims] + [binding], key=lambda b: b.key
    )
    limit = model.quotas[(request.tenant, kind)]
    assert allocator.usage(request.tenant, kind) <= limit
    check_no_spare_victim(model, request, binding.island, decision.preempted, before)


def check_no_spare_victim(
    model: Model, request: Request, name: str, victims: Sequence[Binding], before: list[Binding]
) -> None:
    """No victim of a decision making room in its tenant's quota could have been spared: with
    any one of them put back, the quota of the island's kind or the island itself (the
    model's geometry) has no room for the request."""
    for spared in victims:
        gone = {b.key for b in victims if b is not spared}
        rest = [b for b in before if b.key not in gone]
        room = model.quota_room(request, name, rest)
        fits_there = fits(request, model.mesh(name), model.blocked(name, rest))
        assert not (room and fits_there), (spared, victims, before)


def check_release(allocator: Allocator, model: Model, op: Release) -> None:
    key = target_key(allocator, op.target)
    before = allocator.bindings()
    bound = allocator.binding(key)
    free_before = {n: allocator.free_devices(n) for n in model.islands}
    released = allocator.release(key)
    after = check_state(allocator, model)
    if bound is None:
        assert released is None
        assert after == before
        return
    assert released == bound
    assert allocator.binding(key) is None
    assert after == [b for b in before if b.key != key]
    healthy = [d for d in bound.devices if d not in model.unhealthy[bound.island]]
    assert allocator.free_devices(bound.island) == free_before[bound.island] + len(healthy)
    still = {d for b in after if b.island == bound.island for d in b.devices}
    assert not still & set(bound.devices)


def check_remap(allocator: Allocator, model: Model, op: Remap, key: str | None = None) -> None:
    key = key if key is not None else target_key(allocator, op.target)
    before = allocator.bindings()
    bound = allocator.binding(key)
    decision = allocator.remap(key, avoid=op.avoid)
    event(describe(decision, "remap", bound is None))
    after = check_state(allocator, model)
    if bound is None:
        assert isinstance(decision, Pending) and decision.reason == "NotBound"
        assert after == before
        return
    others = [b for b in before if b.key != key]
    avoid = mask_of(d for d in op.avoid if d < model.size(bound.island))
    home_kind = model.islands[bound.island].kind

    def room(n: str) -> bool:
        # Moving within its own kind keeps the tenant's usage as it was (a lowered quota evicts
        # nothing); moving to another kind must fit that kind's quota like a new binding.
        if model.islands[n].kind == home_kind:
            return True
        return model.quota_room(bound.request, n, others)

    def fits_elsewhere(n: str) -> bool:
        blocked = model.blocked(n, others) | (avoid if n == bound.island else 0)
        return model.admits(bound.request, n) and fits(bound.request, model.mesh(n), blocked)

    # Remap preempts nothing and finds a destination whenever one exists.
    allowed = [n for n in model.islands if fits_elsewhere(n) and room(n)]
    if not allowed:
        assert isinstance(decision, Pending), decision
        assert decision.reason == "InsufficientDevices"
        assert allocator.binding(key) == bound
        assert sorted(after, key=lambda b: b.key) == sorted(before, key=lambda b: b.key)
        return
    assert isinstance(decision, Bound), (decision, before)
    moved = decision.binding
    assert decision.preempted == ()
    assert moved.request == bound.request
    assert moved.island in allowed
    assert not set(moved.devices) & model.unhealthy[moved.island]
    if moved.island == bound.island:
        assert not set(moved.devices) & op.avoid
    assert sorted(after, key=lambda b: b.key) == sorted([*others, moved], key=lambda b: b.key)


def check_health(allocator: Allocator, model: Model, op: Health) -> None:
    names = list(model.islands)
    if not names:
        return
    name = names[op.island % len(names)]
    devices = frozenset(d for d in op.devices if d < model.size(name))
    before = allocator.bindings()
    affected = allocator.set_health(name, devices)
    model.unhealthy[name] = devices
    after = check_state(allocator, model)
    assert after == before  # health changes evict nothing
    expected = [b for b in before if b.island == name and set(b.devices) & devices]
    assert sorted(affected, key=lambda b: b.key) == sorted(expected, key=lambda b: b.key)


def check_quota(allocator: Allocator, model: Model, op: Quota) -> None:
    before = allocator.bindings()
    allocator.set_quota(op.tenant, op.kind, op.limit)
    if op.limit is None:
        model.quotas.pop((op.tenant, op.kind), None)
    else:
        model.quotas[(op.tenant, op.kind)] = op.limit
    assert check_state(allocator, model) == before


def check_relabel(allocator: Allocator, model: Model, op: Relabel) -> None:
    names = list(model.islands)
    if not names:
        return
    name = names[op.island % len(names)]
    before = allocator.bindings()
    inventory = replace(
        model.islands[name],
        labels=MappingProxyType({"zone": op.zone}),
        unhealthy=model.unhealthy[name],
    )
    allocator.add_island(inventory)
    model.islands[name] = inventory
    # Relabelling evicts nothing (even slices whose selector no longer matches).
    assert check_state(allocator, model) == before


def check_remove_island(allocator: Allocator, model: Model, op: RemoveIsland) -> None:
    names = list(model.islands)
    if not names:
        assert allocator.remove_island("i0") == []
        return
    name = names[op.island % len(names)]
    before = allocator.bindings()
    dropped = allocator.remove_island(name)
    del model.islands[name]
    del model.unhealthy[name]
    assert sorted(dropped, key=lambda b: b.key) == sorted(
        [b for b in before if b.island == name], key=lambda b: b.key
    )
    # check_state also checks that the dropped bindings' quota usage is gone.
    assert check_state(allocator, model) == [b for b in before if b.island != name]
    for b in dropped:
        assert allocator.binding(b.key) is None


def check_readd_island(allocator: Allocator, model: Model, op: ReaddIsland) -> None:
    inventory = model.original[op.island % len(model.original)]
    if inventory.name in model.islands:
        return
    before = allocator.bindings()
    allocator.add_island(inventory)
    model.islands[inventory.name] = inventory
    model.unhealthy[inventory.name] = frozenset(inventory.unhealthy)
    assert check_state(allocator, model) == before


CHECKS = {
    Alloc: check_allocate,
    Release: check_release,
    Remap: check_remap,
    Health: check_health,
    Quota: check_quota,
    Relabel: check_relabel,
    RemoveIsland: check_remove_island,
    ReaddIsland: check_readd_island,
}


def build(islands: list[IslandInventory], quotas: dict) -> tuple[Allocator, Model]:
    allocator = Allocator()
    for inventory in islands:
        allocator.add_island(inventory)
    for (tenant, kind), limit in quotas.items():
        allocator.set_quota(tenant, kind, limit)
    return allocator, Model(islands, quotas)


# -- properties ---------------------------------------------------------------------------------


@SETTINGS
@given(
    islands=island_lists(),
    quotas=st.one_of(st.just({}), quota_maps),
    ops=st.lists(operations, min_size=6, max_size=24),
)
def test_operation_sequences_keep_every_invariant(islands, quotas, ops) -> None:
    allocator, model = build(islands, quotas)
    check_state(allocator, model)
    for op in ops:
        CHECKS[type(op)](allocator, model, op)
        check_restore(allocator, model)


@SETTINGS
@given(
    islands=island_lists(max_islands=2),
    ops=st.lists(crowded_operations, min_size=6, max_size=24),
)
def test_crowded_sequences_preempt_minimally(islands, ops) -> None:
    allocator, model = build(islands, {})
    for op in ops:
        CHECKS[type(op)](allocator, model, op)
    check_restore(allocator, model)


@st.composite
def occupied_worlds(draw, max_islands: int = 3, free: bool = True):
    """Islands with arbitrary occupancy (not just what the allocator would have produced):
    each device free (unless ``free`` is false) or held by one of a few slices of random
    priority, restored directly."""
    islands = draw(island_lists(max_islands=max_islands))
    bindings = []
    choices = (None, 0, 1, 2, 3) if free else (0, 1, 2, 3)
    for inventory in islands:
        size = math.prod(inventory.shape)
        owners = draw(st.lists(st.sampled_from(choices), min_size=size, max_size=size))
        bindings += owned_bindings(
            draw, inventory, owners, lambda _: draw(st.sampled_from(TENANTS))
        )
    return islands, bindings


def owned_bindings(draw, inventory, owners, tenant_of) -> list[Binding]:
    """One binding per owner of ``owners`` (a device's owner, or None: free) on ``inventory``,
    of tenant ``tenant_of(owner)`` and a drawn priority."""
    bindings = []
    for owner in sorted({o for o in owners if o is not None}):
        devices = tuple(d for d, o in enumerate(owners) if o == owner)
        request = Request(
            key=f"old/{inventory.name}-{owner}",
            tenant=tenant_of(owner),
            count=len(devices),
            priority=draw(st.integers(0, 3)),
        )
        bindings.append(Binding(request, inventory.name, devices, None))
    return bindings


@SETTINGS
@given(
    world=occupied_worlds(),
    sick=st.lists(st.frozensets(st.integers(0, 15), max_size=4), max_size=3),
    op=allocs(priorities=st.integers(1, 4), preempt=st.sampled_from((True, True, False))),
    quotas=st.one_of(st.just({}), st.just({}), quota_maps),
)
def test_single_allocation_on_arbitrary_occupancy_is_complete_and_minimal(
    world, sick, op, quotas
) -> None:
    islands, bindings = world
    allocator, model = build(islands, quotas)
    assert allocator.restore(bindings) == []
    check_state(allocator, model)
    # Devices failing under bound slices: evicting such a slice frees fewer devices than it holds.
    for index, devices in enumerate(sick):
        check_health(allocator, model, Health(index, devices))
    check_allocate(allocator, model, op)
    check_restore(allocator, model)


@SETTINGS
@given(
    world=occupied_worlds(),
    op=allocs(priorities=st.integers(1, 4), preempt=st.just(True)),
    slack=st.lists(st.integers(-8, 1), min_size=len(KINDS), max_size=len(KINDS)),
)
def test_a_tenant_at_its_quota_makes_room_by_evicting_its_own_lower_priorities(
    world, op, slack
) -> None:
    """Quotas set just short of (or just at) what the request needs, per kind: it is bound
    exactly when its tenant's own lower-priority slices can make room in the quota (and the
    island room for it), evicting only what it may (checked against the model)."""
    islands, bindings = world
    kinds = {inventory.name: inventory.kind for inventory in islands}
    size = op.request().size
    quotas = {}
    for kind, extra in zip(KINDS, slack, strict=True):
        used = sum(
            len(b.devices)
            for b in bindings
            if b.request.tenant == op.tenant and kinds[b.island] == kind
        )
        quotas[(op.tenant, kind)] = max(0, used + size - 1 + extra)
    allocator, model = build(islands, quotas)
    assert allocator.restore(bindings) == []
    check_allocate(allocator, model, op)
    check_restore(allocator, model)


@st.composite
def own_worlds(draw):
    """Islands crowded with many slices of one tenant (``t0``) of varied sizes and priorities,
    among a few of another's: a request of ``t0`` at its quota then has many ways of making
    room in it, most of them evicting more than needed."""
    islands = draw(island_lists())
    bindings = []
    for inventory in islands:
        size = math.prod(inventory.shape)
        owners = draw(
            st.lists(st.sampled_from((None, 0, 1, 2, 3, 4, 5)), min_size=size, max_size=size)
        )
        bindings += owned_bindings(
            draw, inventory, owners, lambda owner: "t1" if owner == 5 else "t0"
        )
    return islands, bindings


@SETTINGS
@given(
    world=own_worlds(),
    count=st.integers(1, 8),
    shape=st.sampled_from((None, (1,), (2,), (2, 2), (1, 2), (4,), (2, 2, 2))),
    priority=st.integers(1, 4),
    short=st.integers(1, 8),
)
def test_a_tenant_at_its_quota_evicts_no_slice_it_could_spare(
    world, count, shape, priority, short
) -> None:
    """A request of a tenant whose quota is ``short`` devices short of it, in a world crowded
    with that tenant's slices: when bound by evicting its own (and, for room, others' on its
    island), no victim could have been put back (``check_no_spare_victim``)."""
    islands, bindings = world
    op = Alloc("ns/new", "t0", None if shape else count, shape, None, None, None, priority, True)
    size = op.request().size
    kinds = {inventory.name: inventory.kind for inventory in islands}
    quotas = {}
    for kind in set(kinds.values()):
        used = sum(
            len(b.devices) for b in bindings if b.request.tenant == "t0" and kinds[b.island] == kind
        )
        quotas[("t0", kind)] = max(0, used + size - short)
    allocator, model = build(islands, quotas)
    assert allocator.restore(bindings) == []
    check_allocate(allocator, model, op)
    check_restore(allocator, model)


@SETTINGS
@given(
    world=occupied_worlds(max_islands=2, free=False),
    sick=st.lists(st.frozensets(st.integers(0, 15), max_size=8), min_size=1, max_size=2),
    count=st.integers(1, 16),
)
def test_count_preemption_is_minimal_when_victims_hold_unhealthy_devices(
    world, sick, count
) -> None:
    """Full islands whose slices sit partly on failed devices: a victim frees only its healthy
    devices, so the fewest victims are not simply the largest slices."""
    islands, bindings = world
    allocator, model = build(islands, {})
    assert allocator.restore(bindings) == []
    for index, devices in enumerate(sick):
        check_health(allocator, model, Health(index, devices))
    op = Alloc("ns/new", "t0", count, None, None, None, None, priority=4, preempt=True)
    check_allocate(allocator, model, op)


@SETTINGS
@given(world=occupied_worlds(), op=allocs(), avoid=st.frozensets(st.integers(0, 15), max_size=4))
def test_remap_on_arbitrary_occupancy(world, op, avoid) -> None:
    islands, bindings = world
    allocator, model = build(islands, {})
    assert allocator.restore(bindings) == []
    check_allocate(allocator, model, op)
    for key in (op.key, *(b.key for b in bindings[:2])):
        check_remap(allocator, model, Remap(None, avoid), key=key)
